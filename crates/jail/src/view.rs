//! Builds the sandbox's filesystem view in its fresh mount namespace, then pivots into it.
//!
//! The new root is a small tmpfs holding one read-only recursive bind per top-level entry of the
//! rootfs (or only the plan's binds: `view_binds.rs`), so that Airlock can add mount points (`/workspace`) that the rootfs lacks without
//! writing to it. Secrets are masked, the whole tree is made read-only, nosuid and nodev in one
//! call, and only then are the writable and virtual filesystems mounted on top.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use airlock_policy::image_user::ResolvedUser;
use airlock_policy::{
    IdentityPlan, Mask, MaskKind, RootPlan, ScratchPlan, ViewPlan, WorkspacePlan,
};

use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// Where the new root is assembled, inside the sandbox's own mount namespace only.
const STAGE: &str = "/tmp";
const MASK_DIR: &str = ".airlock-mask-dir";
const EMPTY_DIR: &str = ".airlock-empty-dir";
const MASK_FILE: &str = ".airlock-mask-file";
/// Top-level entries Airlock provides itself. `/run` is an empty directory: binding the host's,
/// even under a mask, would still list the names of its submounts in `/proc/self/mountinfo`.
pub(crate) const PROVIDED: &[&str] = &["proc", "sys", "dev", "tmp", "workspace", "run"];
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// A step of the view that failed.
#[derive(Debug, thiserror::Error)]
#[error("{step}")]
pub struct ViewError {
    pub step: String,
    #[source]
    pub source: io::Error,
}

pub(crate) fn step<T>(
    what: impl FnOnce() -> String,
    result: io::Result<T>,
) -> Result<T, ViewError> {
    result.map_err(|source| ViewError {
        step: what(),
        source,
    })
}

/// The workspace, prepared before the view is built (it may live under the staging path).
#[derive(Debug)]
pub enum PreparedWorkspace {
    /// An empty directory of the scratch space.
    Fresh,
    Tree(OwnedFd),
}

/// Detaches a copy of a host workspace, unless the helper already made an idmapped one.
pub fn prepare_workspace(
    plan: &WorkspacePlan,
    idmapped: Option<OwnedFd>,
) -> Result<PreparedWorkspace, ViewError> {
    match (plan, idmapped) {
        (WorkspacePlan::Fresh, _) => Ok(PreparedWorkspace::Fresh),
        (WorkspacePlan::Host { .. }, Some(tree)) => Ok(PreparedWorkspace::Tree(tree)),
        (WorkspacePlan::Host { path, .. }, None) => {
            let tree = step(
                || format!("binding workspace {}", path.display()),
                sys::open_tree_clone(None, path, true),
            )?;
            Ok(PreparedWorkspace::Tree(tree))
        }
    }
}

/// The scratch space (`/tmp` and a fresh `/workspace`), as the view receives it.
#[derive(Debug)]
pub enum PreparedScratch<'a> {
    /// One tmpfs of this size, made by init.
    Memory { size_bytes: u64 },
    /// A tmpfs the helper made (it holds the container tier's upper directory too).
    MemoryMount(&'a OwnedFd),
    /// Detached clones of the on-disk scratch directories, made by the helper on the host.
    Disk {
        tmp: &'a OwnedFd,
        workspace: &'a OwnedFd,
    },
}

/// Builds the view and pivots into it. `uid`/`gid` own a fresh workspace.
/// `join_network` moves the caller into the sandbox's network namespace; it runs just before
/// sysfs is mounted, since sysfs shows the mounter's network namespace.
/// Detached mounts the helper opened on the host, attached in the view.
#[derive(Debug, Default)]
pub struct Attachments<'a> {
    /// Where `/tmp` and a fresh `/workspace` come from.
    pub scratch: Option<PreparedScratch<'a>>,
    /// The agent's binary, at `AGENT_PATH`.
    pub agent_binary: Option<&'a OwnedFd>,
    /// The egress directory, at `EGRESS_DIR`.
    pub egress_dir: Option<&'a OwnedFd>,
    /// The trust bundle with the sandbox's CA, over `SYSTEM_TRUST_STORE` when the view has it.
    pub trust_bundle: Option<&'a OwnedFd>,
    /// The container tier's root: the image's overlay, made by the helper.
    pub image_root: Option<&'a OwnedFd>,
    /// The microvm tier's files, under `VMM_FILES_DIR` (see `view_vmm`).
    pub vmm_files: &'a [(String, OwnedFd)],
    /// The microvm tier's disks, read-write under `VMM_FILES_DIR`.
    pub vmm_disks: &'a [(String, OwnedFd)],
    /// The process tier's root, made ahead by the runtime (see `view_template`).
    pub template: Option<&'a OwnedFd>,
    /// A sysfs of the sandbox's network namespace, when the host made the namespace (and the
    /// sandbox, holding no capability over it, could not mount one).
    pub sysfs: Option<&'a OwnedFd>,
}

pub fn build(
    plan: &ViewPlan,
    workspace: PreparedWorkspace,
    attachments: Attachments<'_>,
    identity: &IdentityPlan,
    join_network: impl FnOnce() -> io::Result<()>,
) -> Result<Option<ResolvedUser>, ViewError> {
    let stage = Path::new(STAGE);
    step(
        || "making mounts private".into(),
        sys::mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        ),
    )?;
    // A template already holds the mount points and is read-only.
    let prebuilt = attachments.template.is_some() && matches!(plan.root, RootPlan::Host { .. });
    let image = match (&plan.root, attachments.image_root) {
        (RootPlan::Host { path }, _) => {
            match attachments.template {
                Some(template) => crate::view_template::attach(stage, template)?,
                None => stage_host_root(stage, path, &plan.masks)?,
            }
            false
        }
        (RootPlan::Binds { binds }, _) => {
            crate::view_binds::stage_bind_root(stage, binds, &plan.masks)?;
            false
        }
        (RootPlan::Overlay { .. }, Some(overlay)) => {
            crate::view_image::attach_root(stage, overlay)?;
            if !plan.masks.is_empty() {
                apply_masks(stage, &plan.masks)?;
            }
            true
        }
        (RootPlan::Overlay { .. }, None) => {
            return step(
                || "the image's root was not prepared".into(),
                Err(io::ErrorKind::NotFound.into()),
            );
        }
    };
    // The container tier's user comes from the image's own files, read before anything of
    // Airlock's is mounted in it.
    let resolved = if identity.lookup.is_some() {
        Some(crate::view_image::lookup_user(stage, identity)?)
    } else {
        None
    };
    let (uid, gid) = resolved
        .as_ref()
        .map_or((identity.uid, identity.gid), |user| (user.uid, user.gid));
    if let Some(binary) = attachments.agent_binary {
        attach_agent(stage, binary, image, prebuilt)?;
    }
    crate::view_vmm::attach_files(stage, attachments.vmm_files, false)?;
    crate::view_vmm::make_targets(stage, attachments.vmm_disks)?;
    if let Some(dir) = attachments.egress_dir {
        attach_egress(stage, dir, attachments.trust_bundle, image)?;
    }
    if !image && !prebuilt {
        let root = step(|| "opening the new root".into(), sys::open_path(stage))?;
        step(
            || "making the view read-only".into(),
            sys::mount_setattr(
                &root,
                true,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                None,
            ),
        )?;
    }
    // The microvm tier's own disks: writable, on top of the read-only view.
    crate::view_vmm::attach_files(stage, attachments.vmm_disks, true)?;
    let fresh = matches!(workspace, PreparedWorkspace::Fresh);
    let scratch = match (attachments.scratch, &plan.scratch) {
        (Some(prepared), _) => prepared,
        (None, ScratchPlan::Memory { size_bytes }) => PreparedScratch::Memory {
            size_bytes: *size_bytes,
        },
        (None, ScratchPlan::Disk { host_dir }) => {
            return step(
                || format!("the scratch space at {} was not opened", host_dir.display()),
                Err(io::ErrorKind::NotFound.into()),
            );
        }
    };
    // The runtime could not know the image's user when it made the volume: hand the fresh
    // workspace to it now (init is root of the namespace, and both owners are mapped).
    if let (true, true, PreparedScratch::Disk { workspace, .. }) = (image, fresh, &scratch) {
        step(
            || "handing the fresh workspace to the image's user".into(),
            std::os::unix::fs::chown(
                format!("/proc/self/fd/{}", workspace.as_raw_fd()),
                Some(uid),
                Some(gid),
            ),
        )?;
    }
    attach_scratch(stage, scratch, fresh, uid, gid)?;
    mount_proc(stage, image)?;
    mount_dev(stage)?;
    if let PreparedWorkspace::Tree(tree) = workspace {
        attach_host_workspace(stage, &tree)?;
    }
    // Joined as late as possible, so that the thread building the namespace has had the most
    // time: only sysfs needs it.
    step(|| "creating the network namespace".into(), join_network())?;
    // A fresh sysfs shows this network namespace, not the host's. It is optional: without it
    // /sys is an empty directory, which hides more, not less. A view of binds only shows none
    // (sysfs still describes the host's devices).
    let sysfs_flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
    if let Some(sysfs) = attachments.sysfs {
        step(
            || "attaching sysfs".into(),
            sys::move_mount(sysfs, &stage.join("sys")),
        )?;
    } else if !matches!(plan.root, RootPlan::Binds { .. }) {
        let _ = sys::mount(
            Some("sysfs"),
            &stage.join("sys"),
            Some("sysfs"),
            sysfs_flags,
            None,
        );
    }
    protect_read_only(stage, &plan.read_only_paths)?;
    step(|| "entering the new root".into(), sys::chdir(stage))?;
    step(|| "pivot_root".into(), sys::pivot_root_here())?;
    step(
        || "detaching the host root".into(),
        sys::umount_detach(Path::new(".")),
    )?;
    step(|| "chdir /".into(), sys::chdir(Path::new("/")))?;
    Ok(resolved)
}

/// The process tier's root: a small tmpfs at the staging path holding one read-only bind of
/// each top-level entry of `rootfs`, the mount points Airlock provides, and the masks.
fn stage_host_root(stage: &Path, rootfs: &Path, masks: &[Mask]) -> Result<(), ViewError> {
    // Opened first: the staging tmpfs may hide it.
    let rootfs_fd = step(
        || format!("opening rootfs {}", rootfs.display()),
        sys::open_path(rootfs),
    )?;
    mount_stage(stage)?;
    fill_host_root(stage, &rootfs_fd, masks, || Ok(()))
}

/// The entries of `rootfs`, Airlock's mount points and the masks, in the empty tmpfs at
/// `stage` (the sandbox's own, or a template's). `then` runs after the masks, while their
/// sources are still there: a masked directory is one of them.
pub(crate) fn fill_host_root(
    stage: &Path,
    rootfs: &OwnedFd,
    masks: &[Mask],
    then: impl FnOnce() -> Result<(), ViewError>,
) -> Result<(), ViewError> {
    let rootfs_path = PathBuf::from(format!("/proc/self/fd/{}", rootfs.as_raw_fd()));
    bind_top_level(rootfs, &rootfs_path, stage)?;
    for dir in PROVIDED {
        mkdir(&stage.join(dir), 0o755)?;
    }
    mask_from_sources(stage, masks)?;
    then()?;
    remove_mask_sources(stage);
    Ok(())
}

/// The small tmpfs at the staging path that becomes the view's root.
pub(crate) fn mount_stage(stage: &Path) -> Result<(), ViewError> {
    step(
        || "mounting the staging root".into(),
        sys::mount(
            Some("airlock"),
            stage,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some("mode=0755,size=1m,nr_inodes=4096"),
        ),
    )
}

pub(crate) fn mkdir(path: &Path, mode: u32) -> Result<(), ViewError> {
    let result = fs::DirBuilder::new().mode(mode).create(path);
    match result {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => step(|| format!("creating {}", path.display()), other),
    }
}

/// `dir` and its missing parents, mode 0755.
pub(crate) fn mkdir_all(dir: &Path) -> Result<(), ViewError> {
    step(
        || format!("creating {}", dir.display()),
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir),
    )
}

/// One recursive bind per top-level entry; symlinks are recreated, special files skipped.
fn bind_top_level(rootfs: &OwnedFd, rootfs_path: &Path, stage: &Path) -> Result<(), ViewError> {
    let entries = step(|| "listing the rootfs".into(), fs::read_dir(rootfs_path))?;
    for entry in entries {
        let entry = step(|| "listing the rootfs".into(), entry)?;
        let name = entry.file_name();
        let Some(text) = name.to_str() else { continue };
        if PROVIDED.contains(&text) {
            continue;
        }
        let target = stage.join(&name);
        let kind = step(|| format!("inspecting /{text}"), entry.file_type())?;
        if kind.is_symlink() {
            let link = step(|| format!("reading /{text}"), fs::read_link(entry.path()))?;
            step(
                || format!("linking /{text}"),
                std::os::unix::fs::symlink(link, &target),
            )?;
        } else if kind.is_dir() || kind.is_file() {
            if kind.is_dir() {
                mkdir(&target, 0o755)?;
            } else {
                step(|| format!("creating /{text}"), fs::write(&target, b""))?;
            }
            let tree = step(
                || format!("binding /{text}"),
                sys::open_tree_clone(Some(rootfs), Path::new(&name), true),
            )?;
            step(
                || format!("attaching /{text}"),
                sys::move_mount(&tree, &target),
            )?;
        }
    }
    Ok(())
}

/// What listing a directory of the view found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listing {
    Names(Vec<OsString>),
    /// The directory exists but cannot be listed. Its entries may still be reachable by name
    /// (mode 0711), so the whole directory must be masked: fail closed.
    Unlistable,
}

fn list_in_root(root: &OwnedFd, dir: &Path) -> Listing {
    let opened = match sys::open_dir_in_root(root, dir) {
        Ok(opened) => opened,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
            return Listing::Names(Vec::new());
        }
        Err(_) => return Listing::Unlistable,
    };
    match fs::read_dir(format!("/proc/self/fd/{}", opened.as_raw_fd())) {
        Ok(entries) => Listing::Names(entries.flatten().map(|e| e.file_name()).collect()),
        Err(_) => Listing::Unlistable,
    }
}

/// Expands `*` components against the staged tree, listing each directory once. Directories are
/// resolved inside the tree (`root`), so a symlinked `/home` is listed where it really points
/// within the view, not on the host. A directory that cannot be listed is itself a result.
pub(crate) fn expand(
    root: &OwnedFd,
    pattern: &str,
    listings: &mut HashMap<PathBuf, Listing>,
) -> Vec<PathBuf> {
    let mut found = vec![PathBuf::new()];
    let mut whole = Vec::new();
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &found {
            if component != "*" {
                next.push(base.join(component));
                continue;
            }
            let listing = listings
                .entry(base.clone())
                .or_insert_with(|| list_in_root(root, base));
            match listing {
                Listing::Names(names) => next.extend(names.iter().map(|name| base.join(name))),
                Listing::Unlistable => whole.push(base.clone()),
            }
        }
        found = next;
    }
    found.extend(whole);
    found
}

pub(crate) fn apply_masks(stage: &Path, masks: &[Mask]) -> Result<(), ViewError> {
    mask_from_sources(stage, masks)?;
    remove_mask_sources(stage);
    Ok(())
}

/// The masks, each a bind of one of three sources made in the staging root.
fn mask_from_sources(stage: &Path, masks: &[Mask]) -> Result<(), ViewError> {
    let sources = [(MASK_DIR, 0o000), (EMPTY_DIR, 0o755)];
    for (name, mode) in sources {
        mkdir(&stage.join(name), mode)?;
        step(
            || format!("chmod {name}"),
            fs::set_permissions(stage.join(name), fs::Permissions::from_mode(mode)),
        )?;
    }
    step(
        || "creating the mask file".into(),
        fs::write(stage.join(MASK_FILE), b""),
    )?;
    step(
        || "chmod mask file".into(),
        fs::set_permissions(stage.join(MASK_FILE), fs::Permissions::from_mode(0o000)),
    )?;
    let root = step(|| "opening the staging root".into(), sys::open_path(stage))?;
    let mut listings = HashMap::new();
    for mask in masks {
        for path in expand(&root, &mask.path, &mut listings) {
            let shown = || format!("masking /{}", path.display());
            // Resolve inside the view: a symlinked secret is masked where it really lives. A
            // path init cannot reach is out of the workload's reach too, since the workload ends
            // up with fewer privileges than init has now.
            let target = match sys::open_in_root(&root, &path) {
                Ok(target) => target,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES)
                    ) =>
                {
                    continue;
                }
                Err(e) => return step(shown, Err(e)),
            };
            // Every path gets its own mask, even one reaching an object already masked through
            // another name (a hard link, a bind): a mask covers one path, not the object.
            let is_dir = step(shown, sys::fstat_is_dir(&target))?;
            let source = match (is_dir, mask.kind) {
                (true, MaskKind::Secret) => MASK_DIR,
                (true, MaskKind::Empty) => EMPTY_DIR,
                (false, _) => MASK_FILE,
            };
            let tree = step(
                shown,
                sys::open_tree_clone(Some(&root), Path::new(source), false),
            )?;
            step(shown, sys::move_mount_onto(&tree, &target))?;
        }
    }
    Ok(())
}

/// The sources stay reachable only through the masks; removes their names from the root. (The
/// empty directory's stays when something was made in a directory masked with it.)
fn remove_mask_sources(stage: &Path) {
    let _ = fs::remove_dir(stage.join(MASK_DIR));
    let _ = fs::remove_dir(stage.join(EMPTY_DIR));
    let _ = fs::remove_file(stage.join(MASK_FILE));
}

/// Attaches the agent's binary at `AGENT_PATH`, in the empty `/run` Airlock provides. It becomes
/// read-only with the rest of the view.
/// Attaches the egress directory (the proxy's socket, the trust bundles) at `EGRESS_DIR`, and
/// the trust bundle over the system trust store, so that every TLS client in the sandbox
/// trusts the proxy's per-sandbox CA. Both become read-only with the rest of the view.
fn attach_egress(
    stage: &Path,
    dir: &OwnedFd,
    trust_bundle: Option<&OwnedFd>,
    image: bool,
) -> Result<(), ViewError> {
    let relative = airlock_policy::EGRESS_DIR.trim_start_matches('/');
    let target = if image {
        crate::view_image::ensure_dir(stage, Path::new(relative), 0o755)?
    } else {
        let target = stage.join(relative);
        mkdir_all(&target)?;
        target
    };
    // Read-only on every tier: the container tier's root is writable.
    for tree in std::iter::once(dir).chain(trust_bundle) {
        step(
            || "securing the egress directory".into(),
            sys::mount_setattr(
                tree,
                false,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                None,
            ),
        )?;
    }
    let target_fd = step(
        || "opening the egress mount point".into(),
        sys::open_path(&target),
    )?;
    step(
        || "attaching the egress directory".into(),
        sys::move_mount_onto(dir, &target_fd),
    )?;
    let Some(bundle) = trust_bundle else {
        return Ok(());
    };
    let root = step(|| "opening the staging root".into(), sys::open_path(stage))?;
    let store = Path::new(airlock_policy::SYSTEM_TRUST_STORE.trim_start_matches('/'));
    match sys::open_in_root(&root, store) {
        Ok(store_fd) => step(
            || format!("replacing {}", airlock_policy::SYSTEM_TRUST_STORE),
            sys::move_mount_onto(bundle, &store_fd),
        ),
        // A rootfs without the system store: SSL_CERT_FILE still points at the bundle.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(()),
        Err(e) => step(
            || format!("opening {}", airlock_policy::SYSTEM_TRUST_STORE),
            Err(e),
        ),
    }
}

fn attach_agent(
    stage: &Path,
    binary: &OwnedFd,
    image: bool,
    prebuilt: bool,
) -> Result<(), ViewError> {
    let relative = crate::spec::AGENT_PATH.trim_start_matches('/');
    let target = if image {
        crate::view_image::ensure_file(stage, Path::new(relative))?
    } else if prebuilt {
        stage.join(relative)
    } else {
        let target = stage.join(relative);
        if let Some(dir) = target.parent() {
            mkdir_all(dir)?;
        }
        step(
            || "creating the agent's mount point".into(),
            fs::write(&target, b""),
        )?;
        target
    };
    // A host binary: never writable from inside, on any tier (CVE-2019-5736's lesson).
    step(
        || "securing the agent".into(),
        sys::mount_setattr(
            binary,
            false,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            None,
        ),
    )?;
    let target_fd = step(
        || "opening the agent's mount point".into(),
        sys::open_path(&target),
    )?;
    step(
        || "attaching the agent".into(),
        sys::move_mount_onto(binary, &target_fd),
    )
}

/// A fresh `/proc`. Read-only on the container tier, whose Landlock grants writes on `/`
/// and so cannot keep the workload off `/proc` (the process tier's Landlock does).
fn mount_proc(stage: &Path, read_only: bool) -> Result<(), ViewError> {
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    step(
        || "mounting /proc".into(),
        sys::mount(Some("proc"), &stage.join("proc"), Some("proc"), flags, None),
    )
}

fn mount_dev(stage: &Path) -> Result<(), ViewError> {
    let dev = stage.join("dev");
    step(
        || "mounting /dev".into(),
        sys::mount(
            Some("tmpfs"),
            &dev,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("mode=0755,size=64k,nr_inodes=64"),
        ),
    )?;
    for name in DEVICES {
        let target = dev.join(name);
        step(|| format!("creating /dev/{name}"), fs::write(&target, b""))?;
        let source = format!("/dev/{name}");
        step(
            || format!("binding /dev/{name}"),
            sys::mount(Some(&source), &target, None, libc::MS_BIND, None),
        )?;
    }
    for (name, mode) in [("pts", 0o755), ("shm", 0o1777)] {
        mkdir(&dev.join(name), mode)?;
    }
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        step(
            || format!("linking /dev/{name}"),
            std::os::unix::fs::symlink(target, dev.join(name)),
        )?;
    }
    // Read-only down to the device binds: I/O on a device ignores it, but the host's device
    // inodes must not take new timestamps or modes. pts and shm are mounted afterwards.
    let dev_fd = step(|| "opening /dev".into(), sys::open_path(&dev))?;
    step(
        || "making /dev read-only".into(),
        sys::mount_setattr(
            &dev_fd,
            true,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            None,
        ),
    )?;
    step(
        || "mounting /dev/pts".into(),
        sys::mount(
            Some("devpts"),
            &dev.join("pts"),
            Some("devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        ),
    )?;
    step(
        || "mounting /dev/shm".into(),
        sys::mount(
            Some("tmpfs"),
            &dev.join("shm"),
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some("mode=1777,size=64m"),
        ),
    )
}

/// Mounts `/tmp` and, when `fresh`, `/workspace` from the scratch space. A tmpfs is mounted
/// for a moment on the still-empty `/proc`, its two directories are bound into place, and it
/// is detached again: `/tmp` and `/workspace` then share one size limit and nothing else of
/// the tmpfs is reachable. Must run before `/proc` is mounted.
fn attach_scratch(
    stage: &Path,
    scratch: PreparedScratch<'_>,
    fresh: bool,
    uid: u32,
    gid: u32,
) -> Result<(), ViewError> {
    let tmp = stage.join("tmp");
    let workspace = stage.join("workspace");
    match scratch {
        PreparedScratch::Memory { .. } | PreparedScratch::MemoryMount(_) => {
            let holder = stage.join("proc");
            match scratch {
                PreparedScratch::MemoryMount(mount) => step(
                    || "attaching the scratch space".into(),
                    sys::move_mount(mount, &holder),
                )?,
                PreparedScratch::Memory { size_bytes } => step(
                    || "mounting the scratch space".into(),
                    sys::mount(
                        Some("airlock"),
                        &holder,
                        Some("tmpfs"),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        Some(&format!("mode=0755,size={size_bytes}")),
                    ),
                )?,
                PreparedScratch::Disk { .. } => {}
            }
            let bind = |name: &str, mode: u32, owner: Option<(u32, u32)>, target: &Path| {
                let source = holder.join(name);
                mkdir(&source, mode)?;
                // The mode as given, whatever init's umask.
                step(
                    || format!("setting the mode of the scratch {name}"),
                    fs::set_permissions(&source, fs::Permissions::from_mode(mode)),
                )?;
                if let Some((uid, gid)) = owner {
                    step(
                        || format!("handing the scratch {name} to {uid}:{gid}"),
                        std::os::unix::fs::chown(&source, Some(uid), Some(gid)),
                    )?;
                }
                step(
                    || format!("binding the scratch {name}"),
                    sys::mount(source.to_str(), target, None, libc::MS_BIND, None),
                )
            };
            bind("tmp", 0o1777, None, &tmp)?;
            if fresh {
                bind("workspace", 0o755, Some((uid, gid)), &workspace)?;
            }
            step(
                || "detaching the scratch space".into(),
                sys::umount_detach(&holder),
            )
        }
        PreparedScratch::Disk {
            tmp: tmp_tree,
            workspace: workspace_tree,
        } => {
            let mut attach = vec![(tmp_tree, &tmp, "/tmp")];
            if fresh {
                attach.push((workspace_tree, &workspace, "/workspace"));
            }
            for (tree, target, name) in attach {
                step(
                    || format!("securing {name}"),
                    sys::mount_setattr(tree, true, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, None),
                )?;
                step(
                    || format!("attaching {name}"),
                    sys::move_mount(tree, target),
                )?;
            }
            Ok(())
        }
    }
}

fn attach_host_workspace(stage: &Path, tree: &OwnedFd) -> Result<(), ViewError> {
    step(
        || "securing /workspace".into(),
        sys::mount_setattr(tree, true, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, None),
    )?;
    step(
        || "attaching /workspace".into(),
        sys::move_mount(tree, &stage.join("workspace")),
    )
}

/// A policy's protected paths inside the writable filesystems (`.git/hooks`, say): each one
/// that exists gets a read-only bind over itself. Its parent directories below the top level
/// are first bound onto themselves, because a mount point cannot be renamed: otherwise the
/// workload could rename `.git` away and create a writable one. A symbolic link on the way is
/// refused, since the link itself could be swapped after the mount. A path created later is
/// not protected; `airlock policy explain` says so.
fn protect_read_only(stage: &Path, paths: &[PathBuf]) -> Result<(), ViewError> {
    if paths.is_empty() {
        return Ok(());
    }
    let root = step(|| "opening the staging root".into(), sys::open_path(stage))?;
    let mut pins: Vec<PathBuf> = Vec::new();
    let mut existing: Vec<&Path> = Vec::new();
    'paths: for path in paths {
        let relative = path.strip_prefix("/").unwrap_or(path);
        let mut prefix = PathBuf::new();
        for component in relative.components() {
            prefix.push(component);
            match fs::symlink_metadata(stage.join(&prefix)) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(ViewError {
                        step: format!(
                            "protecting {}: /{} is a symbolic link",
                            path.display(),
                            prefix.display()
                        ),
                        source: io::Error::from_raw_os_error(libc::ELOOP),
                    });
                }
                Ok(_) => {}
                // Missing, or out of init's reach and so of the workload's too.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES)
                    ) =>
                {
                    continue 'paths;
                }
                Err(e) => return step(|| format!("protecting {}", path.display()), Err(e)),
            }
        }
        let parents: Vec<&Path> = relative.ancestors().skip(1).collect();
        for parent in parents.into_iter().rev() {
            if parent.components().count() >= 2 && !pins.iter().any(|p| p == parent) {
                pins.push(parent.to_path_buf());
            }
        }
        existing.push(relative);
    }
    // Pins first: a later, non-recursive view of a parent would hide the read-only binds.
    for (path, read_only) in pins
        .iter()
        .map(|p| (p.as_path(), false))
        .chain(existing.into_iter().map(|p| (p, true)))
    {
        let shown = || format!("protecting /{}", path.display());
        let target = step(shown, sys::open_in_root(&root, path))?;
        let tree = step(shown, sys::open_tree_clone(Some(&root), path, true))?;
        if read_only {
            step(
                shown,
                sys::mount_setattr(&tree, true, MOUNT_ATTR_RDONLY, None),
            )?;
        }
        step(shown, sys::move_mount_onto(&tree, &target))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_expand_matches_star_components_listing_each_directory_once() {
        let dir = std::env::temp_dir().join(format!("airlock-view-test-{}", std::process::id()));
        fs::create_dir_all(dir.join("home/a/.ssh")).unwrap();
        fs::create_dir_all(dir.join("home/b")).unwrap();
        let mut listings = HashMap::new();
        let root = sys::open_path(&dir).unwrap();
        let mut found = expand(&root, "/home/*/.ssh", &mut listings);
        found.sort();
        assert_eq!(
            found,
            vec![PathBuf::from("home/a/.ssh"), PathBuf::from("home/b/.ssh")]
        );
        assert_eq!(
            expand(&root, "/missing", &mut listings),
            vec![PathBuf::from("missing")]
        );
        assert_eq!(listings.len(), 1, "each directory is listed once");
        fs::remove_dir_all(&dir).unwrap();
    }
}
