//! The container tier's part of the view: the image's overlay as the root, mount points made
//! safe against a hostile image, and the image's user looked up in its own files.
//!
//! The image is untrusted, and everything here runs in init, inside the sandbox's user and
//! mount namespaces but before any confinement: a mount point is never reached through a
//! symbolic link of the image (the link is replaced by a directory, in the sandbox's upper
//! directory), and `/etc/passwd` and `/etc/group` are read only as regular files, resolved
//! inside the root, and bounded in size. No other process runs in the sandbox yet, so nothing
//! can swap a path between the check and the mount.

use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use airlock_policy::IdentityPlan;
use airlock_policy::image_user::{self, MAX_FILE_BYTES, ResolvedUser};

use crate::sys;
use crate::view::{ViewError, step};

/// Mount points the container view provides itself; the image's `/run` stays its own.
pub const PROVIDED: &[&str] = &["proc", "sys", "dev", "tmp", "workspace"];

/// Attaches the overlay at the staging path and makes every provided mount point a real
/// directory of the root.
pub fn attach_root(stage: &Path, overlay: &OwnedFd) -> Result<(), ViewError> {
    step(
        || "attaching the image's root".into(),
        sys::move_mount(overlay, stage),
    )?;
    for name in PROVIDED {
        ensure_dir(stage, Path::new(name), 0o755)?;
    }
    Ok(())
}

/// Makes `relative` (below `stage`) a directory, component by component, without following
/// any symbolic link: a link, file or device of the image where a directory must be is
/// removed and replaced (in the upper directory; the layers stay as they are).
pub fn ensure_dir(stage: &Path, relative: &Path, mode: u32) -> Result<PathBuf, ViewError> {
    let mut path = stage.to_path_buf();
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return step(
                || format!("creating {}", relative.display()),
                Err(io::ErrorKind::InvalidInput.into()),
            );
        };
        path.push(name);
        let shown = || {
            format!(
                "creating /{}",
                path.strip_prefix(stage).unwrap_or(&path).display()
            )
        };
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => step(shown, fs::remove_file(&path))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return step(shown, Err(e)),
        }
        step(shown, fs::DirBuilder::new().mode(mode).create(&path))?;
        step(
            shown,
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)),
        )?;
    }
    Ok(path)
}

/// Makes `relative` an empty regular file to mount a file on, its parents as
/// [`ensure_dir`] makes them; whatever the image has there goes.
pub fn ensure_file(stage: &Path, relative: &Path) -> Result<PathBuf, ViewError> {
    if let Some(parent) = relative.parent() {
        ensure_dir(stage, parent, 0o755)?;
    }
    let path = stage.join(relative);
    let shown = || format!("creating /{}", relative.display());
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_dir() => step(shown, fs::remove_dir_all(&path))?,
        Ok(_) => step(shown, fs::remove_file(&path))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return step(shown, Err(e)),
    }
    step(
        shown,
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path),
    )?;
    Ok(path)
}

/// Reads an image file for the user lookup: resolved inside `root`, a regular file only
/// (never a FIFO or device that would block or never end), at most [`MAX_FILE_BYTES`].
/// `None` when the image has no such file.
fn read_image_file(root: &OwnedFd, relative: &str) -> Result<Option<String>, ViewError> {
    let shown = || format!("reading the image's /{relative}");
    let target = match sys::open_in_root(root, Path::new(relative)) {
        Ok(target) => target,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
            return Ok(None);
        }
        Err(e) => return step(shown, Err(e)),
    };
    let through = format!("/proc/self/fd/{}", target.as_raw_fd());
    let meta = step(shown, fs::metadata(&through))?;
    if !meta.is_file() {
        return step(shown, Err(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let file = step(
        shown,
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&through),
    )?;
    let mut bytes = Vec::new();
    step(shown, file.take(MAX_FILE_BYTES).read_to_end(&mut bytes))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The user the workload runs as: the plan's lookup resolved in the image at `stage`.
pub fn lookup_user(stage: &Path, identity: &IdentityPlan) -> Result<ResolvedUser, ViewError> {
    let spec = identity.lookup.as_ref().and_then(|l| l.spec.as_deref());
    let root = step(|| "opening the image's root".into(), sys::open_path(stage))?;
    let passwd = read_image_file(&root, "etc/passwd")?;
    let group = read_image_file(&root, "etc/group")?;
    image_user::resolve(
        spec,
        (identity.uid, identity.gid),
        passwd.as_deref(),
        group.as_deref(),
    )
    .map_err(|e| ViewError {
        step: "looking up the image's user".into(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    })
}
