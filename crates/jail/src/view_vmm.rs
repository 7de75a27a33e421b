//! The microvm tier's part of the view: the VMM's files (kernel, initramfs, a snapshot's
//! directory, an image's root disk), detached mounts the helper opened on the host, attached
//! read-only under `VMM_FILES_DIR`, and the sandbox's own disks (its overlay disk) there
//! read-write. The tier's root is an empty directory, so these, the VMM binary and
//! Airlock's own `/dev`, `/proc` and scratch are all the VMM sees.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};
use crate::view::{ViewError, step};

/// Whether `name` may name a file under `VMM_FILES_DIR`: one plain path component.
pub fn is_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Creates the mount points of `files` under `VMM_FILES_DIR` in the staged root: for the
/// disks, before the view is made read-only (they are attached after it, read-write).
pub fn make_targets(stage: &Path, files: &[(String, OwnedFd)]) -> Result<(), ViewError> {
    if files.is_empty() {
        return Ok(());
    }
    let dir = stage.join(crate::spec::VMM_FILES_DIR.trim_start_matches('/'));
    step(
        || format!("creating {}", dir.display()),
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir),
    )?;
    for (name, tree) in files {
        let shown = || format!("attaching the VMM's {name}");
        if !is_file_name(name) {
            return step(shown, Err(std::io::ErrorKind::InvalidInput.into()));
        }
        let target = dir.join(name);
        if step(shown, sys::fstat_is_dir(tree))? {
            step(shown, fs::DirBuilder::new().mode(0o755).create(&target))?;
        } else {
            step(shown, fs::write(&target, b""))?;
        }
    }
    Ok(())
}

/// Attaches each file at `VMM_FILES_DIR/<name>` in the staged root, read-only (the kernel,
/// the initramfs, a snapshot, an image's root disk), or read-write if `writable` (the
/// sandbox's own disks, regular files, attached once the view is read-only, on mount points
/// [`make_targets`] made before).
pub fn attach_files(
    stage: &Path,
    files: &[(String, OwnedFd)],
    writable: bool,
) -> Result<(), ViewError> {
    if !writable {
        make_targets(stage, files)?;
    }
    let dir = stage.join(crate::spec::VMM_FILES_DIR.trim_start_matches('/'));
    for (name, tree) in files {
        let shown = || format!("attaching the VMM's {name}");
        if writable && step(shown, sys::fstat_is_dir(tree))? {
            return step(shown, Err(std::io::ErrorKind::IsADirectory.into()));
        }
        // Host files: never executable from inside, writable only if a sandbox's own disk.
        let read_only = if writable { 0 } else { MOUNT_ATTR_RDONLY };
        step(
            shown,
            sys::mount_setattr(
                tree,
                true,
                read_only | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                None,
            ),
        )?;
        let target_fd = step(shown, sys::open_path(&dir.join(name)))?;
        step(shown, sys::move_mount_onto(tree, &target_fd))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_file_name;

    #[test]
    fn test_vmm_file_names_are_single_plain_components() {
        for good in ["kernel", "initrd.cpio", "snapshot", "vmlinux-6.1_x"] {
            assert!(is_file_name(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "/kernel", "sp ace", "x\0"] {
            assert!(!is_file_name(bad), "{bad:?}");
        }
    }
}
