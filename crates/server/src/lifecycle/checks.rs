//! Checks of a create request: host workspaces, limits and maps.

use std::collections::BTreeMap;
use std::path::PathBuf;

use airlock_api::v1::{self, ErrorCode, MAX_VALUE_CHARS, Resources};

use super::Daemon;
use crate::error::ApiError;

impl Daemon {
    pub fn check_timeout(&self, timeout_ms: u64) -> Result<(), ApiError> {
        // --max-timeout is at most v1::MAX_TIMEOUT_MS (config), so this is the spec's range too.
        if timeout_ms == 0 || timeout_ms > self.config.max_timeout_ms {
            return Err(ApiError::unprocessable(format!(
                "timeout_ms must be between 1 and {} (--max-timeout), got {timeout_ms}",
                self.config.max_timeout_ms
            )));
        }
        Ok(())
    }

    /// A host workspace is allowed only beneath `--workspace-root`, checked after resolving
    /// symlinks, so that no API key opens the rest of the host. Refusals by that rule are 403
    /// (the request is fine, this daemon does not permit it); a path that is no directory, 422.
    pub(super) fn host_workspace(&self, path: &str) -> Result<PathBuf, ApiError> {
        let requested = PathBuf::from(path);
        if !requested.is_absolute() {
            return Err(ApiError::unprocessable(format!(
                "workspace {path:?} is not an absolute path"
            )));
        }
        let Some(root) = &self.config.workspace_root else {
            return Err(ApiError::new(
                ErrorCode::PermissionDenied,
                "host workspaces are disabled; start airlockd with --workspace-root DIR to allow directories beneath DIR",
            ));
        };
        let resolved = std::fs::canonicalize(&requested)
            .ok()
            .filter(|p| p.is_dir());
        match resolved {
            Some(resolved) if resolved.starts_with(root) => Ok(resolved),
            Some(_) => Err(ApiError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "workspace {path} is not beneath the daemon's --workspace-root {}",
                    root.display()
                ),
            )),
            None => Err(ApiError::unprocessable(format!(
                "workspace {path} is not an absolute path to a host directory"
            ))),
        }
    }
}

/// Limits alone, as `api/openapi.json` states them (a template's defaults).
pub fn check_resources(r: &Resources) -> Result<(), ApiError> {
    check_limits(r, &BTreeMap::new(), &BTreeMap::new())
}

/// A create request's limits and maps, as `api/openapi.json` states them.
pub(super) fn check_limits(
    r: &Resources,
    env: &BTreeMap<String, String>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    check_min(
        "resources.memory_bytes",
        r.memory_bytes,
        v1::MIN_MEMORY_BYTES,
    )?;
    check_min("resources.pids_max", r.pids_max, v1::MIN_PIDS)?;
    check_max("resources.pids_max", r.pids_max, v1::MAX_PIDS)?;
    check_min("resources.disk_bytes", r.disk_bytes, v1::MIN_DISK_BYTES)?;
    check_min(
        "resources.cpu_millis",
        r.cpu_millis.map(u64::from),
        u64::from(v1::MIN_CPU_MILLIS),
    )?;
    check_map("env", env, v1::MAX_ENV_ENTRIES, env_key_ok).map_err(ApiError::unprocessable)?;
    check_map("metadata", metadata, v1::MAX_METADATA_ENTRIES, |key| {
        !key.is_empty() && !key.contains('\0') && key.chars().count() <= v1::MAX_METADATA_KEY_CHARS
    })
    .map_err(ApiError::unprocessable)?;
    Ok(())
}

pub(super) fn check_min(name: &str, value: Option<u64>, min: u64) -> Result<(), ApiError> {
    match value {
        Some(v) if v < min => Err(ApiError::unprocessable(format!(
            "{name} must be at least {min}, got {v}"
        ))),
        _ => Ok(()),
    }
}

pub(super) fn check_max(name: &str, value: Option<u64>, max: u64) -> Result<(), ApiError> {
    match value {
        Some(v) if v > max => Err(ApiError::unprocessable(format!(
            "{name} must be at most {max}, got {v}"
        ))),
        _ => Ok(()),
    }
}

/// An environment variable's name: non-empty, without `=` or NUL (`api/openapi.json` says so).
pub fn env_key_ok(key: &str) -> bool {
    !key.is_empty() && !key.contains('=') && !key.contains('\0')
}

/// Checks a string map against the limits the spec states; the error names the entry.
pub fn check_map(
    name: &str,
    map: &BTreeMap<String, String>,
    max_entries: usize,
    key_ok: impl Fn(&str) -> bool,
) -> Result<(), String> {
    if map.len() > max_entries {
        return Err(format!("{name} has more than {max_entries} entries"));
    }
    for (key, value) in map {
        if !key_ok(key) || value.contains('\0') || value.chars().count() > MAX_VALUE_CHARS {
            return Err(format!("{name} entry {key:?} is not allowed"));
        }
    }
    Ok(())
}
