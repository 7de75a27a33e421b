//! Where sandboxes' scratch space lives (`--scratch`): the disk storage of the state directory,
//! or a tmpfs per sandbox. `auto` takes the disk when this host can give it, and says which.

use airlock_runtime::Storage;

use super::LifecycleError;
use crate::config::{Config, ScratchMode};

/// Opens the disk storage when `--scratch` asks for it (or `auto` finds it possible).
pub(super) fn open_storage(config: &Config) -> Result<Option<Storage>, LifecycleError> {
    if config.scratch == ScratchMode::Memory {
        tracing::info!(
            scratch = "memory",
            "scratch space in memory (--scratch memory)"
        );
        return Ok(None);
    }
    let opened = disk_unavailable().map_or_else(
        || {
            let size = match config.storage_size_bytes {
                Some(bytes) => bytes,
                None => Storage::default_size(&config.state_dir)
                    .map_err(|e| format!("reading the free space of the state directory: {e}"))?,
            };
            Storage::open(&config.state_dir, size).map_err(|e| airlock_runtime::error_chain(&e))
        },
        Err,
    );
    match (opened, config.scratch) {
        (Ok(storage), _) => {
            tracing::info!(
                scratch = "disk",
                storage = %storage.mount_point().display(),
                "scratch space on disk, one volume with a quota per sandbox"
            );
            Ok(Some(storage))
        }
        (Err(reason), ScratchMode::Auto) => {
            tracing::warn!(
                scratch = "memory",
                reason = %reason,
                "scratch space in memory: no disk storage"
            );
            Ok(None)
        }
        (Err(reason), _) => Err(LifecycleError::Storage(reason)),
    }
}

/// Why this host cannot have disk scratch storage, if it cannot: the loop device and the
/// mount need root, and the image is formatted by `mkfs.btrfs`.
fn disk_unavailable() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
        return Some("it needs root".to_owned());
    }
    if !std::path::Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control".to_owned());
    }
    airlock_runtime::storage::mkfs_btrfs()
        .is_none()
        .then(|| "mkfs.btrfs is not installed (Debian: btrfs-progs)".to_owned())
}
