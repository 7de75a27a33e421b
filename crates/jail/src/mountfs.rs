//! The new mount API (`fsopen`, `fsconfig`, `fsmount`) for the container tier, run by the
//! helper on the host's side: an overlayfs root from an image's layer directories, each
//! presented through an idmapped mount in the sandbox's user namespace, over a fresh upper
//! directory; and the scratch tmpfs that holds that upper directory when the scratch space is
//! in memory. Every mount made here is detached: it is attached nowhere on the host, and init
//! receives it as a descriptor.
//!
//! Why the helper: the layers are unpacked by real root and carry `trusted.overlay.*` xattrs
//! (opaque directories), which only an overlay mounted in the host's user namespace honours;
//! an overlay itself cannot be idmapped (EINVAL), so each layer is idmapped before the
//! overlay is composed, and the upper directory keeps the sandbox's host ids.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::sys::{
    self, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
};

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_SET_FD: libc::c_uint = 5;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

/// What failed while composing a sandbox's root or its scratch space.
#[derive(Debug, thiserror::Error)]
pub enum MountFsError {
    #[error("opening image layer {path}")]
    Layer {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("idmapping image layers under {path} (its filesystem must support idmapped mounts)")]
    Idmap {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("configuring the {fs} mount ({what}){log}")]
    Configure {
        fs: &'static str,
        what: String,
        /// The kernel's own messages about the failure, if it left any.
        log: String,
        #[source]
        source: io::Error,
    },
    #[error("preparing the scratch space ({what})")]
    Scratch {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// A filesystem context being configured (`fsopen`).
struct Context {
    fd: OwnedFd,
    fs: &'static str,
}

impl Context {
    fn open(fs: &'static str) -> Result<Context, MountFsError> {
        let name = CString::new(fs).unwrap_or_default();
        // SAFETY: `name` is a valid C string; the descriptor returned is new and ours alone.
        let fd = unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) };
        if fd == -1 {
            return Err(MountFsError::Configure {
                fs,
                what: "fsopen".into(),
                log: String::new(),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: the kernel returned a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Context { fd, fs })
    }

    fn call(
        &self,
        command: libc::c_uint,
        key: Option<&str>,
        value: Option<&str>,
        aux: RawFd,
    ) -> Result<(), MountFsError> {
        let what = || match (key, value) {
            (Some(key), Some(value)) => format!("{key}={value}"),
            (Some(key), None) => key.to_owned(),
            _ => "create".to_owned(),
        };
        let bad = |_| MountFsError::Configure {
            fs: self.fs,
            what: what(),
            log: String::new(),
            source: io::ErrorKind::InvalidInput.into(),
        };
        let key_c = key.map(CString::new).transpose().map_err(bad)?;
        let value_c = value.map(CString::new).transpose().map_err(bad)?;
        // SAFETY: the context descriptor is live; key and value are valid C strings or null,
        // as the command expects; `aux` is a live descriptor for FSCONFIG_SET_FD, else 0.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                command,
                key_c.as_ref().map_or(std::ptr::null(), |k| k.as_ptr()),
                value_c.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                aux,
            )
        };
        if ret == -1 {
            let source = io::Error::last_os_error();
            return Err(MountFsError::Configure {
                fs: self.fs,
                what: what(),
                log: self.kernel_log(),
                source,
            });
        }
        Ok(())
    }

    fn set_string(&self, key: &str, value: &str) -> Result<(), MountFsError> {
        self.call(FSCONFIG_SET_STRING, Some(key), Some(value), 0)
    }

    fn set_flag(&self, key: &str) -> Result<(), MountFsError> {
        self.call(FSCONFIG_SET_FLAG, Some(key), None, 0)
    }

    fn set_fd(&self, key: &str, fd: &OwnedFd) -> Result<(), MountFsError> {
        self.call(FSCONFIG_SET_FD, Some(key), None, fd.as_raw_fd())
    }

    /// Creates the superblock and returns it as a detached mount with `attributes`.
    fn mount(self, attributes: u64) -> Result<OwnedFd, MountFsError> {
        self.call(FSCONFIG_CMD_CREATE, None, None, 0)?;
        // SAFETY: the context descriptor is live and configured; the descriptor returned is
        // new and ours alone.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.fd.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attributes as libc::c_uint,
            )
        };
        if fd == -1 {
            return Err(MountFsError::Configure {
                fs: self.fs,
                what: "fsmount".into(),
                log: self.kernel_log(),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: the kernel returned a fresh descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// The messages the kernel queued on the context (`e overlay: ...`), as `: a; b`.
    fn kernel_log(&self) -> String {
        let mut messages = Vec::new();
        let mut buf = [0u8; 512];
        for _ in 0..8 {
            // SAFETY: `buf` is writable for its length; the descriptor is live.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else { break };
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]);
            messages.push(text.chars().filter(|c| !c.is_control()).collect::<String>());
        }
        if messages.is_empty() {
            String::new()
        } else {
            format!(": {}", messages.join("; "))
        }
    }
}

/// A path through a descriptor, for std's path-based calls on a detached mount.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Opens `name` in `dir` as an `O_PATH` directory descriptor without following a symlink.
fn open_child_dir(dir: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    let name = sys::cpath(Path::new(name))?;
    // SAFETY: `dir` is live and `name` a valid C string; the descriptor returned is ours.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Each layer as a descriptor inside an idmapped mount. Layers that share a parent directory
/// (an image store's `layers/`) share one idmapped clone of it, so a deep image costs one
/// idmap instead of one per layer; a layer the clone does not show as it is on the host (a
/// mount point below the parent) gets a clone of its own. The clones come back too: closing
/// one dissolves its detached tree, and overlayfs can only take layers from a live one.
fn idmapped_layers(
    layers: &[PathBuf],
    userns: &OwnedFd,
) -> Result<(Vec<OwnedFd>, Vec<OwnedFd>), MountFsError> {
    let idmap = |path: &Path| -> Result<OwnedFd, MountFsError> {
        let tree =
            sys::open_tree_clone(None, path, false).map_err(|source| MountFsError::Layer {
                path: path.to_path_buf(),
                source,
            })?;
        sys::mount_setattr(&tree, false, MOUNT_ATTR_IDMAP, Some(userns)).map_err(|source| {
            MountFsError::Idmap {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(tree)
    };
    let mut parents: HashMap<PathBuf, OwnedFd> = HashMap::new();
    let mut fds = Vec::with_capacity(layers.len());
    for layer in layers {
        let layer_error = |source| MountFsError::Layer {
            path: layer.clone(),
            source,
        };
        let host = std::fs::symlink_metadata(layer).map_err(layer_error)?;
        if !host.is_dir() {
            return Err(layer_error(io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        let (Some(parent), Some(name)) = (layer.parent(), layer.file_name()) else {
            fds.push(idmap(layer)?);
            continue;
        };
        if !parents.contains_key(parent) {
            parents.insert(parent.to_path_buf(), idmap(parent)?);
        }
        let shared = parents
            .get(parent)
            .and_then(|clone| open_child_dir(clone, name).ok())
            .filter(|fd| {
                std::fs::metadata(fd_path(fd))
                    .is_ok_and(|m| m.dev() == host.dev() && m.ino() == host.ino())
            });
        fds.push(match shared {
            Some(fd) => fd,
            None => idmap(layer)?,
        });
    }
    Ok((fds, parents.into_values().collect()))
}

/// The container tier's root: an overlay of `layers` (lowest first), each idmapped with
/// `userns`, over `upper` and `work` (directories on one filesystem; `upper`'s root gives the
/// root directory its owner and mode). Detached, nosuid and nodev. Redirects are never
/// followed and nothing is indexed: a layer cannot point the overlay at another path, and
/// `volatile` skips the syncs a throw-away upper directory does not need.
pub fn image_root(
    layers: &[PathBuf],
    userns: &OwnedFd,
    upper: &OwnedFd,
    work: &OwnedFd,
) -> Result<OwnedFd, MountFsError> {
    let (lowers, _trees) = idmapped_layers(layers, userns)?;
    let context = Context::open("overlay")?;
    // `lowerdir+` stacks downwards: the first one given is the topmost.
    for lower in lowers.iter().rev() {
        context.set_fd("lowerdir+", lower)?;
    }
    context.set_fd("upperdir", upper)?;
    context.set_fd("workdir", work)?;
    context.set_string("redirect_dir", "nofollow")?;
    context.set_string("index", "off")?;
    context.set_string("metacopy", "off")?;
    context.set_flag("volatile")?;
    context.mount(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
}

/// An image's `layers` (lowest first) merged read-only, as a detached overlay with no upper
/// directory: what the microvm tier copies into the image's root filesystem disk. Not
/// idmapped (a root-owned store keeps the image's ids as host ids). `empty`, an empty
/// directory, goes below them, since overlayfs wants two layers when it has no upper one.
/// The overlay is attached nowhere; it dissolves when the descriptor is closed.
pub fn merged_layers(layers: &[PathBuf], empty: &Path) -> Result<OwnedFd, MountFsError> {
    let open = |path: &Path| {
        sys::open_path(path).map_err(|source| MountFsError::Layer {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut lowers = layers
        .iter()
        .rev()
        .map(|layer| open(layer))
        .collect::<Result<Vec<_>, _>>()?;
    lowers.push(open(empty)?);
    let context = Context::open("overlay")?;
    // `lowerdir+` stacks downwards: the first one given is the topmost.
    for lower in &lowers {
        context.set_fd("lowerdir+", lower)?;
    }
    context.set_string("redirect_dir", "nofollow")?;
    context.set_string("index", "off")?;
    context.set_string("metacopy", "off")?;
    context.mount(sys::MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
}

/// A container tier's scratch space in memory: one tmpfs of `size_bytes`, made by the helper
/// so that the overlay's upper directory can live in it too (the whole sandbox then writes
/// into one budget). It holds `upper/` (owned by `root_owner`, the sandbox's root in host
/// ids, like the image's `/`) and `work/`; init adds `tmp/` and `workspace/`.
#[derive(Debug)]
pub struct MemoryScratch {
    pub mount: OwnedFd,
    pub upper: OwnedFd,
    pub work: OwnedFd,
}

pub fn memory_scratch(
    size_bytes: u64,
    root_owner: (u32, u32),
) -> Result<MemoryScratch, MountFsError> {
    let context = Context::open("tmpfs")?;
    context.set_string("size", &size_bytes.to_string())?;
    context.set_string("mode", "0755")?;
    // Owned by the sandbox's root, so that init can add `tmp/` and `workspace/`.
    context.set_string("uid", &root_owner.0.to_string())?;
    context.set_string("gid", &root_owner.1.to_string())?;
    let mount = context.mount(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
    let base = fd_path(&mount);
    let scratch_error = |what: &str| {
        let what = what.to_owned();
        move |source| MountFsError::Scratch { what, source }
    };
    for (name, mode, owner) in [
        (airlock_policy::SCRATCH_UPPER, 0o755, Some(root_owner)),
        (airlock_policy::SCRATCH_WORK, 0o700, None),
    ] {
        let path = base.join(name);
        std::fs::create_dir(&path).map_err(scratch_error(name))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(scratch_error(name))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(scratch_error(name))?;
        }
    }
    let open = |name: &str| open_child_dir(&mount, name.as_ref()).map_err(scratch_error(name));
    let upper = open(airlock_policy::SCRATCH_UPPER)?;
    let work = open(airlock_policy::SCRATCH_WORK)?;
    Ok(MemoryScratch { mount, upper, work })
}

/// A small detached tmpfs for a view's root (see `view_template`).
pub fn stage_tmpfs() -> Result<OwnedFd, MountFsError> {
    let context = Context::open("tmpfs")?;
    context.set_string("mode", "0755")?;
    context.set_string("size", "1m")?;
    context.set_string("nr_inodes", "4096")?;
    context.mount(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
}

/// A detached, read-only sysfs. It shows the caller's network namespace, and only a caller
/// with `CAP_SYS_ADMIN` over that namespace's owner may make it.
pub fn sysfs() -> Result<OwnedFd, MountFsError> {
    Context::open("sysfs")?
        .mount(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
}

/// The upper and work directories of an on-disk scratch volume (see `ScratchPlan::Disk`).
/// Not idmapped: overlayfs refuses an idmapped upper directory (EINVAL, measured on 6.18), so
/// `upper/` keeps the sandbox's host ids (the runtime shifts them when a volume changes
/// range).
pub fn disk_upper(host_dir: &Path) -> io::Result<(OwnedFd, OwnedFd)> {
    let dir = sys::open_path(host_dir)?;
    Ok((
        open_child_dir(&dir, airlock_policy::SCRATCH_UPPER.as_ref())?,
        open_child_dir(&dir, airlock_policy::SCRATCH_WORK.as_ref())?,
    ))
}

/// Whether this kernel can build the container tier's root: overlayfs takes layers as
/// descriptors (`FSCONFIG_SET_FD` for `lowerdir+`, Linux 6.13 and later, with detached
/// layers from 6.15). Probed without mounting: a layer descriptor is accepted or refused at
/// configuration time.
pub fn overlay_takes_layer_fds() -> Result<(), String> {
    let context = Context::open("overlay").map_err(|e| crate::error_chain(&e))?;
    let root = sys::open_path(Path::new("/")).map_err(|e| e.to_string())?;
    context
        .set_fd("lowerdir+", &root)
        .map_err(|e| crate::error_chain(&e))
}

/// Where the container tier's upper and work directories are, as the helper holds them.
#[derive(Debug)]
pub enum ImageUpper {
    /// In the on-disk scratch volume (`upper/` and `work/`), opened once the sandbox's user
    /// namespace exists.
    Disk { host_dir: PathBuf },
    /// In the scratch tmpfs the helper made, which init then attaches for `/tmp` and a fresh
    /// `/workspace`.
    Memory(MemoryScratch),
}

impl ImageUpper {
    /// Opens (on disk) or makes (in memory) the upper directory of `plan`'s image root;
    /// `None` on the process tier.
    pub fn prepare(plan: &airlock_policy::Plan) -> Result<Option<ImageUpper>, MountFsError> {
        if !plan.has_image_root() {
            return Ok(None);
        }
        Ok(Some(match &plan.view.scratch {
            airlock_policy::ScratchPlan::Disk { host_dir } => ImageUpper::Disk {
                host_dir: host_dir.clone(),
            },
            airlock_policy::ScratchPlan::Memory { size_bytes } => {
                let root = |maps: &[airlock_policy::IdMap]| {
                    maps.iter().find(|m| m.inside == 0).map_or(0, |m| m.outside)
                };
                let owner = (root(&plan.identity.uid_map), root(&plan.identity.gid_map));
                ImageUpper::Memory(memory_scratch(*size_bytes, owner)?)
            }
        }))
    }

    /// The upper and work directories, as the overlay takes them.
    pub fn dirs(&self) -> io::Result<(OwnedFd, OwnedFd)> {
        match self {
            ImageUpper::Disk { host_dir } => disk_upper(host_dir),
            ImageUpper::Memory(scratch) => {
                Ok((scratch.upper.try_clone()?, scratch.work.try_clone()?))
            }
        }
    }
}
