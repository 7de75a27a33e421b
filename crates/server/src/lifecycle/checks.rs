//! Checks of a create request: host workspaces, limits and maps.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Daemon;
use crate::error::ApiError;

impl Daemon {
    /// A host workspace is allowed only beneath `--workspace-root`, checked after resolving
    /// symlinks, so that no API key opens the rest of the host.
    pub(super) fn host_workspace(&self, path: &str) -> Result<PathBuf, ApiError> {
        let Some(root) = &self.config.workspace_root else {
            return Err(ApiError::unprocessable(
                "host workspaces are disabled; start airlockd with --workspace-root DIR to allow directories beneath DIR",
            ));
        };
        let requested = PathBuf::from(path);
        let resolved = std::fs::canonicalize(&requested)
            .ok()
            .filter(|p| requested.is_absolute() && p.is_dir());
        match resolved {
            Some(resolved) if resolved.starts_with(root) => Ok(resolved),
            Some(_) => Err(ApiError::unprocessable(format!(
                "workspace {path} is not beneath the daemon's --workspace-root {}",
                root.display()
            ))),
            None => Err(ApiError::unprocessable(format!(
                "workspace {path} is not an absolute path to a host directory"
            ))),
        }
    }
}

pub(super) fn check_min(name: &str, value: Option<u64>, min: u64) -> Result<(), ApiError> {
    match value {
        Some(v) if v < min => Err(ApiError::unprocessable(format!(
            "{name} must be at least {min}, got {v}"
        ))),
        _ => Ok(()),
    }
}

pub(super) fn check_map(
    name: &str,
    map: &BTreeMap<String, String>,
    max_entries: usize,
    key_ok: impl Fn(&str) -> bool,
) -> Result<(), ApiError> {
    if map.len() > max_entries {
        return Err(ApiError::unprocessable(format!(
            "{name} has more than {max_entries} entries"
        )));
    }
    for (key, value) in map {
        if !key_ok(key) || value.contains('\0') || value.len() > 32 << 10 {
            return Err(ApiError::unprocessable(format!(
                "{name} entry {key:?} is not allowed"
            )));
        }
    }
    Ok(())
}
