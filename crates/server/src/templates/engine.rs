//! The build engine: runs one build's steps on a blocking thread (see the module docs of
//! [`super`]). Steps are numbered as E2B numbers them in a failure's `step`: `base` for the
//! FROM, `1`..`N`, `finalize` for making the template.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_api::v1::{
    BuildFailure, BuildStep, BuildTemplateRequest, LogLevel, StepKind, Template, TemplateBuild,
};
use airlock_api::{ImageConfig, ImageRootfs, ResourceLimits, SandboxConfig};
use airlock_image::Derivation;
use airlock_image::capture::{HostIds, capture_upper};
use airlock_image::copy::{CopySpec, copy_layer};
use airlock_image::stack::{Found, LayerStack};
use airlock_image::tarball::{Meta, TarWriter};
use sha2::{Digest as _, Sha256};

use super::failure;
use crate::lifecycle::Daemon;
use crate::store::now_ms;

/// Builds' scratch files (step tars, fallback scratch directories), per build.
pub const WORK_DIR: &str = "work";
/// A `RUN`'s default limits: room for package installs.
const RUN_MEMORY_BYTES: u64 = 2 << 30;
const RUN_DISK_BYTES: u64 = 4 << 30;
/// The longest output line kept in the log.
const MAX_LINE_CHARS: usize = 4096;

/// The state a step starts from: the image so far (none: an empty root) and its config.
#[derive(Debug, Clone)]
struct State {
    image: Option<String>,
    config: ImageConfig,
}

pub struct Engine<'a> {
    daemon: &'a Arc<Daemon>,
    build: &'a mut TemplateBuild,
    request: &'a BuildTemplateRequest,
    /// Leases every image the build makes while it runs.
    holder: String,
    work: PathBuf,
    /// The FROM template, when there is one (its defaults are inherited).
    base_template: Option<Template>,
}

type StepResult<T> = Result<T, BuildFailure>;

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("build", &self.build.id)
            .finish()
    }
}

/// `key=value` entries with `key` set to `value` (replaced in place, or appended).
fn set_env(env: &mut Vec<String>, key: &str, value: &str) {
    let entry = format!("{key}={value}");
    match env
        .iter_mut()
        .find(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
    {
        Some(existing) => *existing = entry,
        None => env.push(entry),
    }
}

/// `path` made absolute against `workdir`, normalised.
fn absolute(workdir: Option<&str>, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{}/{path}", workdir.unwrap_or("/"))
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let mut out = format!("/{}", parts.join("/"));
    if path.ends_with('/') && out != "/" {
        out.push('/');
    }
    out
}

fn describe(step: &BuildStep) -> String {
    let kind = match step.kind {
        StepKind::Run => "RUN",
        StepKind::Copy => "COPY",
        StepKind::Env => "ENV",
        StepKind::Workdir => "WORKDIR",
        StepKind::User => "USER",
    };
    format!("{kind} {}", step.args.join(" "))
}

impl<'a> Engine<'a> {
    pub fn new(
        daemon: &'a Arc<Daemon>,
        build: &'a mut TemplateBuild,
        request: &'a BuildTemplateRequest,
    ) -> Engine<'a> {
        let holder = format!("build:{}", build.id);
        let work = daemon.config.builds_dir().join(WORK_DIR).join(&build.id);
        Engine {
            daemon,
            build,
            request,
            holder,
            work,
            base_template: None,
        }
    }

    fn log(&self, level: LogLevel, step: &str, message: &str) {
        self.daemon
            .build_log(&self.build.id, level, Some(step), message);
    }

    fn progress(&mut self, cached: bool) {
        self.build.steps_done += 1;
        if cached {
            self.build.steps_cached += 1;
        }
        let _ = self.daemon.store.update_build(self.build);
        self.daemon.builds.notify();
    }

    /// Runs every step and makes the template; returns its image's digest.
    pub fn run(mut self) -> StepResult<String> {
        std::fs::create_dir_all(&self.work).map_err(|e| {
            failure(
                "base",
                format!("cannot create {}: {e}", self.work.display()),
            )
        })?;
        let result = self.run_steps();
        let _ = std::fs::remove_dir_all(&self.work);
        result
    }

    fn run_steps(&mut self) -> StepResult<String> {
        let mut state = self.from()?;
        self.progress(false);
        let total = self.request.steps.len();
        let mut forced = self.request.force;
        for (index, step) in self.request.steps.iter().enumerate() {
            let name = (index + 1).to_string();
            forced |= step.force;
            self.log(
                LogLevel::Info,
                &name,
                &format!("[{name}/{total}] {}", describe(step)),
            );
            let key = self.cache_key(&state, step);
            let cached = if forced { None } else { self.cached(&key) };
            let cached_hit = cached.is_some();
            state = match cached {
                Some(hit) => {
                    self.log(
                        LogLevel::Info,
                        &name,
                        &format!(
                            "[{name}/{total}] CACHED {}",
                            hit.image.as_deref().unwrap_or("")
                        ),
                    );
                    hit
                }
                None => {
                    let next = self.step(&name, step, &state)?;
                    let digest = next.image.clone().unwrap_or_default();
                    let cache_holder = format!("cache:{key}");
                    let _ = self.daemon.images.release(&cache_holder);
                    let _ = self.daemon.images.lease(&digest, &cache_holder);
                    let _ = self.daemon.store.cache_step(&key, &digest);
                    self.log(
                        LogLevel::Info,
                        &name,
                        &format!("[{name}/{total}] done: {digest}"),
                    );
                    next
                }
            };
            self.progress(cached_hit);
        }
        self.finalize(&state)
    }

    /// The image a cache key points at, if it is still in the store.
    fn cached(&self, key: &str) -> Option<State> {
        let digest = self.daemon.store.cached_step(key).ok().flatten()?;
        let rootfs = self.daemon.images.resolve(&digest).ok()?;
        self.daemon.images.lease(&digest, &self.holder).ok()?;
        Some(State {
            image: Some(digest),
            config: rootfs.config,
        })
    }

    /// The cache key: the parent image, the step (its files' hash included), and for `RUN`
    /// the network the build policy gives it.
    fn cache_key(&self, state: &State, step: &BuildStep) -> String {
        let network = (step.kind == StepKind::Run)
            .then(|| {
                self.request
                    .build_policy
                    .as_ref()
                    .and_then(|p| serde_json::to_value(&p.network).ok())
            })
            .flatten();
        let key = serde_json::json!({
            "v": 1,
            "parent": state.image,
            "type": step.kind,
            "args": step.args,
            "files": step.files_hash,
            "network": network,
        });
        let mut hasher = Sha256::new();
        hasher.update(key.to_string().as_bytes());
        crate::auth::hex(&hasher.finalize())
    }

    // --- FROM ---

    fn from(&mut self) -> StepResult<State> {
        if let Some(name) = &self.request.from_template {
            self.log(
                LogLevel::Info,
                "base",
                &format!("[base] FROM template {name}"),
            );
            let template = self
                .daemon
                .find_template(name)
                .map_err(|e| failure("base", e.message))?
                .ok_or_else(|| failure("base", format!("no template {name:?}")))?;
            let Some(image) = template.image.clone() else {
                return Err(failure(
                    "base",
                    format!("template {name:?} has no image to build on (it is the host's root)"),
                ));
            };
            self.base_template = Some(template);
            return self.state_of(&image, "base");
        }
        let Some(reference) = &self.request.from_image else {
            self.log(
                LogLevel::Info,
                "base",
                "[base] FROM scratch (an empty root)",
            );
            return Ok(State {
                image: None,
                config: ImageConfig::default(),
            });
        };
        self.log(LogLevel::Info, "base", &format!("[base] FROM {reference}"));
        if self.daemon.images.digest_of(reference).is_err() {
            self.pull(reference)?;
        }
        let digest = self
            .daemon
            .images
            .digest_of(reference)
            .map_err(|e| failure("base", airlock_runtime::error_chain(&e)))?;
        self.state_of(&digest, "base")
    }

    fn pull(&self, text: &str) -> StepResult<()> {
        let reference = airlock_image::Reference::parse(text).map_err(|e| {
            failure(
                "base",
                format!("{text:?} is neither in the store nor a registry reference: {e}"),
            )
        })?;
        self.log(
            LogLevel::Info,
            "base",
            &format!("[base] pulling {reference}"),
        );
        let handle = tokio::runtime::Handle::current();
        let report = handle
            .block_on(self.daemon.images.pull(
                &reference,
                &airlock_image::PullOptions::default(),
                None,
            ))
            .map_err(|e| {
                failure(
                    "base",
                    format!("pull: {}", airlock_runtime::error_chain(&e)),
                )
            })?;
        let downloaded: u64 = report.layers.iter().map(|l| l.downloaded_bytes).sum();
        self.log(
            LogLevel::Info,
            "base",
            &format!(
                "[base] pulled {} ({}, {} layers, {downloaded} bytes downloaded)",
                report.name,
                report.digest,
                report.layers.len()
            ),
        );
        Ok(())
    }

    fn state_of(&self, digest: &str, step: &str) -> StepResult<State> {
        self.daemon
            .images
            .lease(digest, &self.holder)
            .map_err(|e| failure(step, airlock_runtime::error_chain(&e)))?;
        let rootfs = self
            .daemon
            .images
            .resolve(digest)
            .map_err(|e| failure(step, airlock_runtime::error_chain(&e)))?;
        Ok(State {
            image: Some(digest.to_owned()),
            config: rootfs.config,
        })
    }

    // --- the steps ---

    fn rootfs(&self, state: &State, step: &str) -> StepResult<ImageRootfs> {
        match &state.image {
            Some(digest) => self
                .daemon
                .images
                .resolve(digest)
                .map_err(|e| failure(step, airlock_runtime::error_chain(&e))),
            None => Ok(ImageRootfs {
                digest: "scratch".into(),
                layers: Vec::new(),
                config: ImageConfig::default(),
            }),
        }
    }

    /// Records `state.image` plus `layers` with `config` as the step's image.
    fn derive(
        &self,
        step: &str,
        state: &State,
        layers: &[PathBuf],
        config: ImageConfig,
        created_by: String,
    ) -> StepResult<State> {
        let derivation = Derivation {
            config: config.clone(),
            created_by,
        };
        let digest = self
            .daemon
            .images
            .derive(state.image.as_deref(), layers, &derivation, &self.holder)
            .map_err(|e| failure(step, airlock_runtime::error_chain(&e)))?;
        for layer in layers {
            let _ = std::fs::remove_file(layer);
        }
        Ok(State {
            image: Some(digest),
            config,
        })
    }

    fn step(&self, name: &str, step: &BuildStep, state: &State) -> StepResult<State> {
        if let Some(problem) = super::step_problem(step) {
            return Err(failure(name, problem));
        }
        let created_by = describe(step);
        let mut config = state.config.clone();
        match step.kind {
            StepKind::Env => {
                for pair in step.args.chunks(2) {
                    if let [key, value] = pair {
                        if !crate::lifecycle::env_key_ok(key) {
                            return Err(failure(
                                name,
                                format!("ENV: {key:?} is not a variable name"),
                            ));
                        }
                        set_env(&mut config.env, key, value);
                    }
                }
                self.derive(name, state, &[], config, created_by)
            }
            StepKind::User => {
                let spec = &step.args[0];
                let rootfs = self.rootfs(state, name)?;
                LayerStack::new(&rootfs.layers).user(spec).map_err(|e| {
                    failure(
                        name,
                        format!("USER {spec}: {e} (Airlock creates no accounts: add one with a RUN step first, e.g. `RUN adduser -D {spec}`)"),
                    )
                })?;
                config.user = Some(spec.clone());
                self.derive(name, state, &[], config, created_by)
            }
            StepKind::Workdir => {
                let path = absolute(config.working_dir.as_deref(), &step.args[0]);
                let path = path.trim_end_matches('/').to_owned();
                let path = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                let layer = self.workdir_layer(name, state, &path)?;
                config.working_dir = Some(path);
                self.derive(name, state, &layer, config, created_by)
            }
            StepKind::Copy => {
                let layer = self.copy(name, step, state)?;
                self.derive(name, state, &[layer], config, created_by)
            }
            StepKind::Run => {
                let layer = self.run_step(name, step, state)?;
                self.derive(name, state, &[layer], config, created_by)
            }
        }
    }

    /// The current user's ids in the image (root without one).
    fn owner(&self, stack: &LayerStack, spec: Option<&str>, step: &str) -> StepResult<(u32, u32)> {
        match spec.filter(|s| !s.is_empty()) {
            None => Ok((0, 0)),
            Some(spec) => stack
                .user(spec)
                .map(|user| (user.uid, user.gid))
                .map_err(|e| failure(step, format!("{spec}: {e}"))),
        }
    }

    /// A layer that makes the working directory, when the image lacks it.
    fn workdir_layer(&self, step: &str, state: &State, path: &str) -> StepResult<Vec<PathBuf>> {
        let rootfs = self.rootfs(state, step)?;
        let stack = LayerStack::new(&rootfs.layers);
        let (resolved, found) = stack
            .resolve(path, true)
            .map_err(|e| failure(step, format!("WORKDIR {path}: {e}")))?;
        match found {
            Found::Dir(_) => return Ok(Vec::new()),
            Found::Missing => {}
            _ => {
                return Err(failure(
                    step,
                    format!("WORKDIR {path}: it exists and is not a directory"),
                ));
            }
        }
        let (uid, gid) = self.owner(&stack, state.config.user.as_deref(), step)?;
        let out = self.work.join(format!("step-{step}.tar"));
        let write = |e: std::io::Error| failure(step, format!("cannot write the layer: {e}"));
        let file = std::fs::File::create(&out).map_err(write)?;
        let mut tar = TarWriter::new(file);
        let meta = Meta {
            mode: 0o755,
            uid,
            gid,
            mtime: now_ms() / 1000,
        };
        tar.dir(resolved.trim_start_matches('/'), meta, &[])
            .map_err(write)?;
        tar.finish().map_err(write)?;
        Ok(vec![out])
    }

    fn copy(&self, step: &str, build_step: &BuildStep, state: &State) -> StepResult<PathBuf> {
        let hash = build_step.files_hash.as_deref().unwrap_or_default();
        let files = self.daemon.files_path(hash);
        if !files.is_file() {
            return Err(failure(
                step,
                format!(
                    "COPY: the files {hash} were never uploaded (PUT /v1/template-files/{hash})"
                ),
            ));
        }
        let rootfs = self.rootfs(state, step)?;
        let stack = LayerStack::new(&rootfs.layers);
        let args = &build_step.args;
        let owner_spec = args
            .get(2)
            .filter(|s| !s.is_empty())
            .or(state.config.user.as_ref());
        let owner = self.owner(&stack, owner_spec.map(String::as_str), step)?;
        let mode = match args.get(3).filter(|s| !s.is_empty()) {
            Some(text) => Some(
                u32::from_str_radix(text, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        failure(
                            step,
                            format!("COPY: mode {text:?} is not octal (e.g. 0755)"),
                        )
                    })?,
            ),
            None => None,
        };
        let spec = CopySpec {
            source: args[0].clone(),
            destination: absolute(state.config.working_dir.as_deref(), &args[1]),
            owner,
            mode,
        };
        let out = self.work.join(format!("step-{step}.tar"));
        let file = std::fs::File::create(&out)
            .map_err(|e| failure(step, format!("cannot write the layer: {e}")))?;
        let (_, report) = copy_layer(&files, &spec, &stack, file)
            .map_err(|e| failure(step, format!("COPY: {}", airlock_runtime::error_chain(&e))))?;
        for warning in &report.warnings {
            self.log(LogLevel::Warn, step, warning);
        }
        self.log(
            LogLevel::Info,
            step,
            &format!("copied {} entries", report.entries),
        );
        Ok(out)
    }

    /// Runs the command in a container-tier sandbox over the layers so far; returns its upper
    /// directory as a layer tar.
    fn run_step(&self, step: &str, build_step: &BuildStep, state: &State) -> StepResult<PathBuf> {
        let mut rootfs = self.rootfs(state, step)?;
        if rootfs.layers.is_empty() {
            return Err(failure(
                step,
                "RUN needs a base image with a shell (FROM an image)",
            ));
        }
        let command = build_step.args[0].clone();
        rootfs.config = ImageConfig {
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            user: build_step
                .args
                .get(1)
                .filter(|u| !u.is_empty())
                .cloned()
                .or(state.config.user.clone()),
            ..state.config.clone()
        };
        let mut config =
            SandboxConfig::for_image(rootfs, &["/bin/sh".into(), "-c".into(), command]);
        let limits = &self.request.resources;
        config.resources = ResourceLimits {
            memory_bytes: Some(limits.memory_bytes.unwrap_or(RUN_MEMORY_BYTES)),
            pids_max: limits.pids_max.or(ResourceLimits::default().pids_max),
            cpu_milli: limits.cpu_millis,
            disk_bytes: limits.disk_bytes.unwrap_or(RUN_DISK_BYTES),
        };
        config.timeout_ms = Some(self.daemon.config.build_step_timeout_ms);
        config.policy = self.request.build_policy.clone();
        let (reader, writer) = std::io::pipe()
            .map_err(|e| failure(step, format!("cannot make the output pipe: {e}")))?;
        let pipe_error =
            |e: std::io::Error| failure(step, format!("cannot make the output pipe: {e}"));
        let stdio = airlock_runtime::Stdio {
            stdin: std::fs::File::open("/dev/null").map_err(pipe_error)?.into(),
            stdout: writer.try_clone().map_err(pipe_error)?.into(),
            stderr: writer.into(),
        };
        let relay = {
            let daemon = self.daemon.clone();
            let build = self.build.id.clone();
            let step = step.to_owned();
            std::thread::spawn(move || {
                let mut lines = BufReader::new(reader);
                let mut line = Vec::new();
                while lines.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                    let text = String::from_utf8_lossy(&line);
                    let text: String = text
                        .trim_end_matches(['\n', '\r'])
                        .chars()
                        .take(MAX_LINE_CHARS)
                        .collect();
                    daemon.build_log(&build, LogLevel::Info, Some(&step), &text);
                    line.clear();
                }
            })
        };
        let scratch_id = format!(
            "b{}",
            crate::auth::hex(
                &crate::auth::random_bytes::<12>()
                    .map_err(|e| failure(step, airlock_runtime::error_chain(&e)))?
            )
        );
        let egress = &self.daemon.config.egress;
        let options = airlock_runtime::StepOptions {
            fallback_dir: self.work.join(&scratch_id),
            scratch_id,
            stdio: Some(Arc::new(stdio)),
            egress: airlock_runtime::EgressOptions {
                test_resolver: egress.test_resolver.clone(),
                extra_upstream_roots_pem: egress.test_roots_pem.clone(),
                ..airlock_runtime::EgressOptions::default()
            },
        };
        let ran = self
            .daemon
            .runtime()
            .run_keeping_scratch(&config, options, |warning| {
                self.log(LogLevel::Warn, step, warning);
            });
        let _ = relay.join();
        let (outcome, scratch) = ran.map_err(|e| {
            failure(
                step,
                format!("RUN could not start: {}", airlock_runtime::error_chain(&e)),
            )
        })?;
        match &outcome.ending {
            airlock_runtime::Ending::Exited(0) => {}
            airlock_runtime::Ending::SetupFailed { message, .. } => {
                return Err(failure(
                    step,
                    format!("RUN could not start its sandbox: {message}"),
                ));
            }
            airlock_runtime::Ending::TimedOut => {
                return Err(failure(
                    step,
                    format!(
                        "RUN `{}` was killed after {} ms (--build-step-timeout)",
                        build_step.args[0], self.daemon.config.build_step_timeout_ms
                    ),
                ));
            }
            _ => {
                return Err(failure(
                    step,
                    format!(
                        "RUN `{}` failed with exit code {}{} (its output is in the build log)",
                        build_step.args[0],
                        outcome.exit_code(),
                        if outcome.oom_killed {
                            ", out of memory"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        self.capture(step, &scratch.upper())
    }

    fn capture(&self, step: &str, upper: &Path) -> StepResult<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(upper)
            .map_err(|e| failure(step, format!("the step's upper directory is gone: {e}")))?;
        let ids = HostIds {
            uid_base: meta.uid(),
            gid_base: meta.gid(),
        };
        let out = self.work.join(format!("step-{step}.tar"));
        let file = std::fs::File::create(&out)
            .map_err(|e| failure(step, format!("cannot write the layer: {e}")))?;
        let (_, report) = capture_upper(upper, ids, file).map_err(|e| {
            failure(
                step,
                format!(
                    "capturing the step's changes: {}",
                    airlock_runtime::error_chain(&e)
                ),
            )
        })?;
        for warning in &report.warnings {
            self.log(LogLevel::Warn, step, warning);
        }
        self.log(
            LogLevel::Info,
            step,
            &format!(
                "the step changed {} entries ({} bytes of files)",
                report.entries, report.file_bytes
            ),
        );
        Ok(out)
    }

    // --- the template ---

    fn finalize(&self, state: &State) -> StepResult<String> {
        let Some(image) = state.image.clone() else {
            return Err(failure(
                "finalize",
                "nothing to build: no FROM and no step made an image",
            ));
        };
        let (family, tag) = super::split_name(&self.request.name)
            .ok_or_else(|| failure("finalize", format!("bad name {:?}", self.request.name)))?;
        let base = self.base_template.clone().unwrap_or_default();
        let request = self.request;
        let mut tags = vec![tag];
        tags.extend(request.tags.iter().cloned());
        tags.dedup();
        for tag in tags {
            let name = format!("{family}:{tag}");
            let template = Template {
                name: name.clone(),
                description: request
                    .description
                    .clone()
                    .unwrap_or_else(|| format!("built by build {}", self.build.id)),
                rootfs: None,
                builtin: false,
                image: Some(image.clone()),
                build_id: Some(self.build.id.clone()),
                start_cmd: request.start_cmd.clone().or(base.start_cmd.clone()),
                ready_cmd: request.ready_cmd.clone().or(base.ready_cmd.clone()),
                ready_timeout_ms: request.ready_timeout_ms.or(base.ready_timeout_ms),
                resources: if request.resources == Default::default() {
                    base.resources
                } else {
                    request.resources
                },
                policy: request.policy.clone().or(base.policy.clone()),
                updated_at_ms: now_ms(),
            };
            let holder = format!("template:{name}");
            let _ = self.daemon.images.release(&holder);
            self.daemon
                .images
                .lease(&image, &holder)
                .map_err(|e| failure("finalize", airlock_runtime::error_chain(&e)))?;
            self.daemon
                .store
                .put_template(&template, &family)
                .map_err(|e| failure("finalize", airlock_runtime::error_chain(&e)))?;
            self.log(
                LogLevel::Info,
                "finalize",
                &format!("template {name} is ready: {image}"),
            );
        }
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths_are_made_absolute_against_the_workdir() {
        assert_eq!(absolute(Some("/app"), "src"), "/app/src");
        assert_eq!(absolute(Some("/app"), "./src/"), "/app/src/");
        assert_eq!(absolute(None, "x"), "/x");
        assert_eq!(absolute(Some("/app"), "/etc/../opt"), "/opt");
        assert_eq!(absolute(Some("/a/b"), "../../.."), "/");
    }

    #[test]
    fn test_env_entries_are_replaced_in_place() {
        let mut env = vec!["PATH=/bin".to_owned(), "A=1".to_owned()];
        set_env(&mut env, "A", "2");
        set_env(&mut env, "B", "x=y");
        assert_eq!(env, ["PATH=/bin", "A=2", "B=x=y"]);
    }
}
