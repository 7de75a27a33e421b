//! A create request with every default filled in: the template's (a built template's image,
//! limits and policy), the policy's, the daemon's; and the runtime configuration it becomes.
//!
//! A container-tier sandbox's image is resolved to a digest here and stored in the request,
//! so that a resume or a snapshot's sandbox runs on the very layers its files were made on,
//! whatever the name or the template points at later. The lease that keeps the image from
//! `prune` is taken once the sandbox has an id ([`Daemon::attach_image`]).

use std::path::{Path, PathBuf};

use airlock_api::v1::{CreateSandboxRequest, ErrorCode, Template, Workspace};
use airlock_api::{ResourceLimits, SandboxConfig, Tier, WorkspaceSource};
use airlock_policy::{Limit, Policy};
use airlock_runtime::VolumeSource;

use super::{Daemon, checks};
use crate::error::ApiError;
use crate::store::BASE_TEMPLATE;

/// What [`Daemon::normalize`] makes of a request.
#[derive(Debug)]
pub(crate) struct Normalized {
    pub request: CreateSandboxRequest,
    pub config: SandboxConfig,
    pub volume: VolumeSource,
    /// The template the sandbox is made from (its start command and ready check run at
    /// create and at a resume on files).
    pub template: Template,
    /// The user a policy names, which wins over an image's own.
    pub user: Option<airlock_api::UserSpec>,
}

/// The lease holder of a sandbox's image.
pub(crate) fn image_holder(id: &str) -> String {
    format!("sandbox:{id}")
}

impl Daemon {
    /// A template by `NAME:TAG` or exact name, else `NAME`'s `latest` tag, else its newest.
    pub fn find_template(&self, name: &str) -> Result<Option<Template>, ApiError> {
        if let Some(template) = self.store.get_template(name)? {
            return Ok(Some(template));
        }
        if name.contains(':') {
            return Ok(None);
        }
        let latest = format!("{name}:{}", airlock_api::v1::DEFAULT_TAG);
        if let Some(template) = self.store.get_template(&latest)? {
            return Ok(Some(template));
        }
        Ok(self.store.family_templates(name)?.into_iter().next())
    }

    /// Fills defaults in and checks a create request; returns it and the runtime config.
    pub(crate) fn normalize(
        &self,
        mut request: CreateSandboxRequest,
    ) -> Result<Normalized, ApiError> {
        if let Some(problem) = request.lifecycle.problem() {
            return Err(ApiError::invalid(format!("lifecycle: {problem}")));
        }
        // A snapshot's name or id as the template: its source's settings, its files.
        let volume = match self.snapshot_template(&mut request)? {
            Some(snapshot) => VolumeSource::Snapshot(snapshot),
            None => VolumeSource::Empty,
        };
        let template_name = request
            .template
            .clone()
            .unwrap_or_else(|| BASE_TEMPLATE.to_owned());
        let template = match self.find_template(&template_name)? {
            Some(template) => template,
            // A sandbox that already runs on an image (a resume) outlives its template.
            None if request.image.is_some() => Template {
                name: template_name.clone(),
                ..Template::default()
            },
            None => {
                return Err(ApiError::new(
                    ErrorCode::NotFound,
                    format!("no template {template_name:?} (GET /v1/templates lists them)"),
                ));
            }
        };
        request.template = Some(template.name.clone());
        if template.builtin && template.name == super::DESKTOP_TEMPLATE {
            super::desktop::check_root(Path::new("/"))?;
            super::desktop::apply_env(&mut request.env);
            if let Some(resolution) = request.metadata.get(super::RESOLUTION_KEY) {
                super::parse_resolution(resolution).map_err(ApiError::unprocessable)?;
            }
        }
        // The template's limits and policy fill in what the request leaves out.
        let r = &mut request.resources;
        let t = &template.resources;
        r.memory_bytes = r.memory_bytes.or(t.memory_bytes);
        r.pids_max = r.pids_max.or(t.pids_max);
        r.cpu_millis = r.cpu_millis.or(t.cpu_millis);
        r.disk_bytes = r.disk_bytes.or(t.disk_bytes);
        if request.policy.is_none() {
            request.policy = template.policy.clone();
        }
        let base_image = (template.builtin && template.name == BASE_TEMPLATE)
            .then(|| self.config.base_image.clone())
            .flatten();
        let image = match request.image.clone().or(template.image.clone()).or(base_image) {
            Some(reference) => Some(self.images.digest_of(&reference).map_err(|err| {
                match err {
                    airlock_image::StoreError::NotFound(_) | airlock_image::StoreError::Reference(_) => {
                        ApiError::new(
                            ErrorCode::NotFound,
                            format!("no image {reference:?} in the daemon's store (GET /v1/images lists them; POST /v1/images/pull adds one)"),
                        )
                    }
                    other => ApiError::from_chain(ErrorCode::Internal, &other),
                }
            })?),
            None => None,
        };
        request.image = image;
        // A policy fills in what the request leaves out and sets the weakest tier.
        let policy = match &request.policy {
            Some(document) => Some(
                Policy::from_document(document)
                    .map_err(|e| ApiError::unprocessable(format!("invalid policy: {e}")))?,
            ),
            None => None,
        };
        let settings = policy.as_ref().map(Policy::settings).unwrap_or_default();
        if settings.memory == Some(Limit::Max) || settings.pids == Some(Limit::Max) {
            return Err(ApiError::unprocessable(
                "invalid policy: the daemon does not lift limits; give resources.memory and resources.pids as values, not max",
            ));
        }
        if let Some(tier) = settings.tier
            && tier.strength() > request.tier.strength()
        {
            request.tier = tier;
        }
        match (request.image.is_some(), request.tier) {
            (true, Tier::Process) => request.tier = Tier::Container,
            (false, Tier::Container) => {
                return Err(ApiError::unprocessable(
                    "the container tier needs an image: give `image`, or a template built from one",
                ));
            }
            _ => {}
        }
        let unavailable = self.runtime.backend(request.tier).map_or_else(
            || Some("not supported by this daemon".to_owned()),
            |b| b.unavailable,
        );
        if let Some(reason) = unavailable {
            return Err(ApiError::unprocessable(format!(
                "the {} tier is unavailable: {reason}",
                request.tier.as_str()
            )));
        }
        let timeout_ms = request
            .timeout_ms
            .or(settings.timeout_ms)
            .unwrap_or(self.config.default_timeout_ms);
        self.check_timeout(timeout_ms)?;
        request.timeout_ms = Some(timeout_ms);
        let defaults = ResourceLimits::default();
        let r = &mut request.resources;
        let policy_or = |limit: Option<Limit>, default| limit.map_or(default, Limit::as_option);
        r.memory_bytes = r
            .memory_bytes
            .or(policy_or(settings.memory, defaults.memory_bytes));
        r.pids_max = r.pids_max.or(policy_or(settings.pids, defaults.pids_max));
        r.cpu_millis = r.cpu_millis.or(settings.cpu_milli);
        r.disk_bytes = Some(
            r.disk_bytes
                .or(settings.disk_bytes)
                .unwrap_or(defaults.disk_bytes),
        );
        checks::check_limits(r, &request.env, &request.metadata)?;
        let workspace = match &request.workspace {
            Workspace::Fresh => WorkspaceSource::Fresh,
            Workspace::Host { path } => WorkspaceSource::Host {
                path: self.host_workspace(path)?,
            },
            // Cloned into the fresh workspace once the sandbox runs (`lifecycle::git`).
            Workspace::Git { .. } => WorkspaceSource::Fresh,
        };
        let mut config = SandboxConfig::new(Vec::new());
        config.tier = request.tier;
        config.rootfs = template.rootfs.as_ref().map(PathBuf::from);
        config.workspace = workspace;
        config.resources = ResourceLimits {
            memory_bytes: r.memory_bytes,
            pids_max: r.pids_max,
            cpu_milli: r.cpu_millis,
            disk_bytes: r.disk_bytes.unwrap_or(defaults.disk_bytes),
        };
        config.env = request
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(policy) = &policy {
            config.user = settings.user.unwrap_or_default();
            config.policy = Some(Box::new(policy.document().clone()));
        }
        // A wasm sandbox sees nothing of the host but what its worker needs.
        if super::is_wasm_template(&template.name) {
            let preopens = super::wasm::preopens(request.policy.as_deref())
                .map_err(ApiError::unprocessable)?;
            config.root_binds = Some(super::wasm::view_binds(&preopens)?);
        }
        Ok(Normalized {
            request,
            config,
            volume,
            template,
            user: settings.user,
        })
    }

    /// Where a sandbox of `request` starts commands by default: its image's working
    /// directory, else `/workspace`.
    pub(crate) fn sandbox_cwd(&self, request: &CreateSandboxRequest) -> String {
        match &request.image {
            Some(digest) => self
                .images
                .resolve(digest)
                .ok()
                .and_then(|rootfs| rootfs.config.working_dir)
                .filter(|dir| !dir.is_empty())
                .unwrap_or_else(|| "/".to_owned()),
            None => "/workspace".to_owned(),
        }
    }

    /// Puts the request's image (a digest, see [`Daemon::normalize`]) under the sandbox:
    /// leased for it, its layers and config applied as `SandboxConfig::for_image` applies
    /// them (the request's env wins over the image's; a policy's user over the image's).
    pub(crate) fn attach_image(
        &self,
        config: &mut SandboxConfig,
        digest: &str,
        user: Option<airlock_api::UserSpec>,
        id: &str,
    ) -> Result<(), ApiError> {
        let rootfs = self
            .images
            .resolve_leased(digest, &image_holder(id))
            .map_err(|e| ApiError::from_chain(ErrorCode::Unprocessable, &e))?;
        let mut with_image = SandboxConfig::for_image(rootfs, &[]);
        if config.tier == Tier::Microvm {
            // The guest boots the image from its ext4 disk, made from the layers once per image.
            let disk = self
                .images
                .root_disk(digest)
                .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
            with_image.tier = Tier::Microvm;
            with_image.root_disk = Some(disk.path);
        }
        with_image.env.append(&mut config.env);
        with_image.workspace = config.workspace.clone();
        with_image.resources = config.resources;
        with_image.policy = config.policy.take();
        if let Some(user) = user {
            with_image.set_user(user);
        }
        *config = with_image;
        Ok(())
    }
}
