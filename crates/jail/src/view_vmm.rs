//! The microvm tier's part of the view: the VMM's files (kernel, initramfs, a snapshot's
//! directory), detached mounts the helper opened on the host, attached read-only under
//! `VMM_FILES_DIR`. The tier's root is an empty directory, so these, the VMM binary and
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

/// Attaches each file at `VMM_FILES_DIR/<name>` in the staged root.
pub fn attach_files(stage: &Path, files: &[(String, OwnedFd)]) -> Result<(), ViewError> {
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
        // Host files: never writable nor executable from inside.
        step(
            shown,
            sys::mount_setattr(
                tree,
                true,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                None,
            ),
        )?;
        let target_fd = step(shown, sys::open_path(&target))?;
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
