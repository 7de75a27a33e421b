//! Templates: one build engine fed with steps (`FROM` an image or a template, `RUN`, `COPY`,
//! `ENV`, `WORKDIR`, `USER`) by the native API and by E2B's `Template.build`, and the
//! templates it makes: an image plus sandbox defaults (limits, a start command, a ready check,
//! a policy).
//!
//! - **Builds** ([`engine`]) run on a blocking thread. Each step makes an image: `RUN` in a
//!   container-tier sandbox over the layers so far (`Runtime::run_keeping_scratch`), whose
//!   upper directory becomes the step's layer; `COPY` from an uploaded file context; `ENV`,
//!   `WORKDIR` and `USER` change the config (`WORKDIR` makes the directory when missing).
//!   Every step is cached by its parent image, the step and its files' hash, so an unchanged
//!   rebuild runs nothing; `force` skips the cache from that step on.
//! - **State** is the daemon's store: a build's row and progress, its log (which followers
//!   read as it grows), the cache's keys, the templates. The images live in the image store,
//!   leased: by `cache:<key>`, by `template:<NAME:TAG>`, by `build:<id>` while a build runs.
//!   A daemon that stops mid-build fails the build at its next start (its one-shot sandbox
//!   died with it; its scratch volume goes with the start-up sweep).
//! - **File contexts** ([`files`]): a `COPY` names the hash of its files, uploaded before the
//!   build as a tar (or tar.gz) to `PUT /v1/template-files/{hash}` or, for E2B, to a one-time
//!   URL of this daemon; they are kept decompressed in `<state>/builds/files/`.

pub mod engine;
pub mod files;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use airlock_api::v1::{
    BuildFailure, BuildLogEntry, BuildState, BuildStep, BuildTemplateRequest, DEFAULT_TAG,
    ErrorCode, LogLevel, MAX_READY_TIMEOUT_MS, MAX_STEPS, StepKind, Template, TemplateBuild,
};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::lifecycle::Daemon;
use crate::store::{BuildRow, now_ms};

/// Builds' shared state in the daemon: a counter bumped at every log line and state change
/// (followers wait on it), and E2B's one-time upload tokens.
#[derive(Debug)]
pub struct Builds {
    changed: watch::Sender<u64>,
    /// Hash of a token -> (files hash, expiry in Unix ms).
    uploads: Mutex<HashMap<String, (String, u64)>>,
}

impl Default for Builds {
    fn default() -> Builds {
        Builds {
            changed: watch::channel(0).0,
            uploads: Mutex::new(HashMap::new()),
        }
    }
}

impl Builds {
    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Waits for the next log line or state change of any build.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn uploads(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, u64)>> {
        self.uploads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How long an E2B upload URL stays valid.
const UPLOAD_TTL_MS: u64 = 60 * 60 * 1000;

/// `NAME[:TAG]` split, with the tag defaulted; `None` when it is not a template name.
pub fn split_name(text: &str) -> Option<(String, String)> {
    let (name, tag) = match text.split_once(':') {
        Some((name, tag)) => (name, tag),
        None => (text, DEFAULT_TAG),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    tag_ok(tag)
        .then_some(())
        .filter(|()| name_ok)
        .map(|()| (name.to_owned(), tag.to_owned()))
}

fn tag_ok(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A new build id: a random UUID (version 4), as E2B's SDK expects.
pub fn new_build_id() -> Result<String, ApiError> {
    let mut bytes = crate::auth::random_bytes::<16>()
        .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = crate::auth::hex(&bytes);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::unprocessable(message)
}

/// The request's problems the build would only meet later.
fn check_request(request: &BuildTemplateRequest) -> Result<(), ApiError> {
    if split_name(&request.name).is_none() {
        return Err(invalid(format!(
            "name {:?} is not NAME[:TAG] (a name of lower-case letters, digits, `.`, `_` and `-`)",
            request.name
        )));
    }
    if let Some(tag) = request.tags.iter().find(|t| !tag_ok(t)) {
        return Err(invalid(format!(
            "tag {tag:?} is not letters, digits, `.`, `_` and `-`"
        )));
    }
    if request.from_image.is_some() && request.from_template.is_some() {
        return Err(invalid("give from_image or from_template, not both"));
    }
    if request.steps.len() > MAX_STEPS {
        return Err(invalid(format!("more than {MAX_STEPS} steps")));
    }
    // What api/openapi.json states of the request, checked as it states it.
    if request.tags.len() > 16 {
        return Err(invalid("more than 16 tags"));
    }
    if request
        .description
        .as_ref()
        .is_some_and(|d| d.chars().count() > 1024)
    {
        return Err(invalid("description is longer than 1024 characters"));
    }
    if let Some(ms) = request.ready_timeout_ms
        && !(1..=MAX_READY_TIMEOUT_MS).contains(&ms)
    {
        return Err(invalid(format!(
            "ready_timeout_ms must be 1 to {MAX_READY_TIMEOUT_MS}, got {ms}"
        )));
    }
    if let Some(image) = &request.from_image
        && (image.is_empty() || image.chars().count() > 1024 || image.contains('\0'))
    {
        return Err(invalid(
            "from_image must be 1 to 1024 characters without NUL",
        ));
    }
    for (field, text) in [
        ("start_cmd", &request.start_cmd),
        ("ready_cmd", &request.ready_cmd),
    ] {
        if text
            .as_ref()
            .is_some_and(|t| t.is_empty() || t.contains('\0'))
        {
            return Err(invalid(format!("{field} must be non-empty, without NUL")));
        }
    }
    if let Some(name) = &request.from_template
        && split_name(name).is_none()
    {
        return Err(invalid(format!("from_template {name:?} is not NAME[:TAG]")));
    }
    crate::lifecycle::check_resources(&request.resources)?;
    for (n, step) in request.steps.iter().enumerate() {
        if let Some(hash) = &step.files_hash
            && !files::is_hash(hash)
        {
            return Err(invalid(format!(
                "step {}: files_hash must be 64 lower-case hex digits",
                n + 1
            )));
        }
    }
    for (field, policy) in [
        ("build_policy", &request.build_policy),
        ("policy", &request.policy),
    ] {
        if let Some(document) = policy {
            let policy = airlock_policy::Policy::from_document(document)
                .map_err(|e| invalid(format!("{field}: invalid policy: {e}")))?;
            if field == "build_policy"
                && airlock_policy::egress_plan(&policy).mode
                    == airlock_policy::egress::NetworkMode::Full
            {
                return Err(invalid(
                    "build_policy: network mode full is not supported; use proxy with egress rules",
                ));
            }
        }
    }
    Ok(())
}

impl Daemon {
    /// A log line of build `id`, for followers too.
    pub(crate) fn build_log(&self, id: &str, level: LogLevel, step: Option<&str>, message: &str) {
        let _ = self.store.append_build_log(id, level, step, message);
        self.builds.notify();
    }

    fn save_build(&self, build: &TemplateBuild) {
        let _ = self.store.update_build(build);
        self.builds.notify();
    }

    /// Accepts a build that waits for its steps (E2B's `POST /v3/templates`); `request`
    /// holds what is known so far (name, tags, limits).
    pub fn create_build(&self, request: BuildTemplateRequest) -> Result<TemplateBuild, ApiError> {
        let name = request.name.clone();
        let (family, tag) = split_name(&name).ok_or_else(|| {
            invalid(format!(
                "{name:?} is not NAME[:TAG] (lower-case letters, digits, `.`, `_`, `-`)"
            ))
        })?;
        let build = TemplateBuild {
            id: new_build_id()?,
            template: format!("{family}:{tag}"),
            state: BuildState::Waiting,
            steps_done: 0,
            steps_cached: 0,
            steps_total: 0,
            image: None,
            reason: None,
            created_at_ms: now_ms(),
            finished_at_ms: None,
        };
        self.store.insert_build(&BuildRow {
            build: build.clone(),
            request,
        })?;
        Ok(build)
    }

    /// Starts a build (`POST /v1/templates`) and returns it at once; it runs on.
    pub fn build_template(
        self: &Arc<Self>,
        request: BuildTemplateRequest,
    ) -> Result<TemplateBuild, ApiError> {
        check_request(&request)?;
        let build = self.create_build(request.clone())?;
        self.run_build(build, request)
    }

    /// Starts the steps of a waiting build (E2B's trigger, or right after `create_build`).
    pub fn run_build(
        self: &Arc<Self>,
        mut build: TemplateBuild,
        request: BuildTemplateRequest,
    ) -> Result<TemplateBuild, ApiError> {
        check_request(&request)?;
        if build.state != BuildState::Waiting {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("build {} was already started", build.id),
            ));
        }
        build.state = BuildState::Building;
        build.steps_total = request.steps.len() as u64 + 1;
        self.store.set_build_request(&build.id, &request)?;
        self.store.update_build(&build)?;
        self.builds.notify();
        let daemon = self.clone();
        let running = build.clone();
        tokio::task::spawn_blocking(move || {
            let mut build = running;
            let result = engine::Engine::new(&daemon, &mut build, &request).run();
            build.finished_at_ms = Some(now_ms());
            match result {
                Ok(image) => {
                    build.state = BuildState::Ready;
                    build.image = Some(image);
                }
                Err(failure) => {
                    daemon.build_log(
                        &build.id,
                        LogLevel::Error,
                        failure.step.as_deref(),
                        &format!("build failed: {}", failure.message),
                    );
                    build.state = BuildState::Error;
                    build.reason = Some(failure);
                }
            }
            daemon.save_build(&build);
            let _ = daemon.images.release(&format!("build:{}", build.id));
        });
        Ok(build)
    }

    pub fn get_build(&self, id: &str) -> Result<TemplateBuild, ApiError> {
        self.store
            .get_build(id)?
            .map(|row| row.build)
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no build {id:?}")))
    }

    pub fn get_build_row(&self, id: &str) -> Result<BuildRow, ApiError> {
        self.store
            .get_build(id)?
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no build {id:?}")))
    }

    pub fn build_logs(
        &self,
        id: &str,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<BuildLogEntry>, ApiError> {
        Ok(self.store.build_logs(id, offset, limit)?)
    }

    /// A template by exact name or `NAME` (see `find_template`), or 404.
    pub fn template(&self, name: &str) -> Result<Template, ApiError> {
        self.find_template(name)?
            .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no template {name:?}")))
    }

    /// Deletes `NAME:TAG`, or every tag of `NAME`; returns the names deleted. The images go
    /// with the next prune, unless a sandbox still runs on one.
    pub fn delete_template(&self, name: &str) -> Result<Vec<String>, ApiError> {
        if let Some(template) = self.store.get_template(name)?
            && template.builtin
        {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("template {name:?} is built in and cannot be deleted"),
            ));
        }
        let names: Vec<String> = if self.store.get_template(name)?.is_some() {
            vec![name.to_owned()]
        } else if name.contains(':') {
            Vec::new()
        } else {
            self.store
                .family_templates(name)?
                .into_iter()
                .map(|t| t.name)
                .collect()
        };
        if names.is_empty() {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("no template {name:?}"),
            ));
        }
        for name in &names {
            self.store.delete_template(name)?;
            let _ = self.images.release(&format!("template:{name}"));
            self.event(
                None,
                "template_deleted",
                &format!("template {name} deleted"),
            );
        }
        Ok(names)
    }

    /// At start-up: builds the previous daemon left unfinished fail, their leases and work
    /// directories go.
    pub(crate) fn recover_builds(&self) {
        let message = "interrupted: the daemon stopped during the build";
        for id in self.store.interrupt_builds(message).unwrap_or_default() {
            self.event(None, "build_interrupted", &format!("build {id}: {message}"));
        }
        for holder in self.images.holders().unwrap_or_default() {
            if holder.starts_with("build:") {
                let _ = self.images.release(&holder);
            }
        }
        let _ = std::fs::remove_dir_all(self.config.builds_dir().join(engine::WORK_DIR));
    }

    /// A one-time upload URL's token for E2B's file upload of `hash`.
    pub fn upload_token(&self, hash: &str) -> Result<String, ApiError> {
        let token = crate::auth::new_access_token()
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        let now = now_ms();
        let mut uploads = self.builds.uploads();
        uploads.retain(|_, (_, expires)| *expires > now);
        uploads.insert(
            crate::auth::hash_secret(&token),
            (hash.to_owned(), now + UPLOAD_TTL_MS),
        );
        Ok(token)
    }

    /// The files hash a one-time token was issued for; the token is used up.
    pub fn take_upload_token(&self, token: &str) -> Option<String> {
        let (hash, expires) = self
            .builds
            .uploads()
            .remove(&crate::auth::hash_secret(token))?;
        (expires > now_ms()).then_some(hash)
    }
}

/// What a step lacks to be run, if anything (the build fails at that step).
pub(crate) fn step_problem(step: &BuildStep) -> Option<&'static str> {
    let first_empty = step.args.first().is_none_or(String::is_empty);
    match step.kind {
        StepKind::Run if first_empty => Some("RUN needs a command"),
        StepKind::Copy if step.args.len() < 2 => Some("COPY needs a source and a destination"),
        StepKind::Copy if step.files_hash.is_none() => {
            Some("COPY needs files_hash (upload its files first)")
        }
        StepKind::Env if step.args.is_empty() || !step.args.len().is_multiple_of(2) => {
            Some("ENV needs name, value pairs")
        }
        StepKind::Workdir if first_empty => Some("WORKDIR needs a directory"),
        StepKind::User if first_empty => Some("USER needs a user"),
        kind if kind != StepKind::Copy && step.files_hash.is_some() => {
            Some("only COPY has files_hash")
        }
        _ => None,
    }
}

/// A failure at `step` (`base`, `1`..`N`, `finalize`).
pub(crate) fn failure(step: &str, message: impl Into<String>) -> BuildFailure {
    BuildFailure {
        message: message.into(),
        step: Some(step.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_template_names_split_with_a_default_tag() {
        assert_eq!(split_name("web"), Some(("web".into(), "latest".into())));
        assert_eq!(
            split_name("my-tpl:v1"),
            Some(("my-tpl".into(), "v1".into()))
        );
        assert_eq!(
            split_name("a.b_c:V1.2-x"),
            Some(("a.b_c".into(), "V1.2-x".into()))
        );
        for bad in [
            "", "Web", "-web", "web:", "web:a:b", "we b", "web:ta g", ":v1",
        ] {
            assert_eq!(split_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn test_build_ids_are_version_4_uuids() {
        let id = new_build_id().unwrap();
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
        assert_ne!(id, new_build_id().unwrap());
    }
}
