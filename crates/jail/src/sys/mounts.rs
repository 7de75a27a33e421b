//! The mount API: `mount(2)`, `pivot_root` and the new API's detached trees (`open_tree`,
//! `mount_setattr`, `move_mount`), and opening paths beneath a root the view must not escape.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::{check, check_int, cpath};

/// `mount(2)` with optional source, fstype and data.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let target = cpath(target)?;
    let cstr = |s: Option<&str>| s.map(CString::new).transpose();
    let bad = |_| io::Error::new(io::ErrorKind::InvalidInput, "mount argument contains NUL");
    let source = cstr(source).map_err(bad)?;
    let fstype = cstr(fstype).map_err(bad)?;
    let data = cstr(data).map_err(bad)?;
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call.
    check_int(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })
    .map(drop)
}

pub fn umount_detach(target: &Path) -> io::Result<()> {
    let target = cpath(target)?;
    // SAFETY: `target` is a valid NUL-terminated string.
    check_int(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// `pivot_root(".", ".")`: stacks the old root on the new one, to be detached right after.
pub fn pivot_root_here() -> io::Result<()> {
    let dot = c".";
    // SAFETY: both arguments are valid NUL-terminated strings.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) }).map(drop)
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `open_tree(OPEN_TREE_CLONE)`: a detached copy of the mount at `path` (relative to `dir`, or
/// to the working directory), recursive if asked.
pub fn open_tree_clone(dir: Option<&OwnedFd>, path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let path = cpath(path)?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `path` is a valid string and `dirfd` a live descriptor or AT_FDCWD; the returned
    // descriptor is new and ours alone.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) })?;
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)` of the whole tree `tree` is the root of (a
/// detached template, say): a fresh detached copy.
pub fn clone_tree(tree: &OwnedFd) -> io::Result<OwnedFd> {
    let flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint
        | libc::AT_EMPTY_PATH as libc::c_uint;
    // SAFETY: `tree` is a live descriptor and the path the empty string; the returned
    // descriptor is new and ours alone.
    let fd = check(unsafe {
        libc::syscall(libc::SYS_open_tree, tree.as_raw_fd(), c"".as_ptr(), flags)
    })?;
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens `path` beneath `root` as an `O_PATH` descriptor, resolving symlinks and `..` as if
/// `root` were `/`, so a hostile symlink in the view cannot point the caller outside it.
pub fn open_in_root(root: &OwnedFd, path: &Path) -> io::Result<OwnedFd> {
    open_in_root_with(root, path, libc::O_PATH)
}

/// Like [`open_in_root`], but opens a directory for reading, so that it can be listed.
pub fn open_dir_in_root(root: &OwnedFd, path: &Path) -> io::Result<OwnedFd> {
    open_in_root_with(root, path, libc::O_RDONLY | libc::O_DIRECTORY)
}

fn open_in_root_with(root: &OwnedFd, path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_IN_ROOT: u64 = 0x10;
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    let path = cpath(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `root` is live, `path` valid, `how` is an open_how of the size we pass.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens a directory as an `O_PATH` descriptor.
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    open_path_with(path, 0)
}

/// [`open_path`] with more `flags` (`O_NOFOLLOW`).
pub fn open_path_with(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = cpath(path)?;
    let flags = libc::O_PATH | libc::O_CLOEXEC | flags;
    // SAFETY: `path` is a valid string; the descriptor returned is ours.
    let fd = check_int(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel's `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr` on a mount (tree) given by descriptor.
pub fn mount_setattr(
    tree: &OwnedFd,
    recursive: bool,
    attr_set: u64,
    userns: Option<&OwnedFd>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    set_mount_attr(tree, recursive, &attr)
}

/// Makes every mount of the tree `tree` private: no mount event propagates into or out of it.
pub fn make_private(tree: &OwnedFd) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: 0,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    set_mount_attr(tree, true, &attr)
}

fn set_mount_attr(tree: &OwnedFd, recursive: bool, attr: &MountAttr) -> io::Result<()> {
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `tree` is a live mount descriptor, the path is the empty string, and `attr` is a
    // valid mount_attr whose size we pass.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            attr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Attaches a detached mount tree at `target`.
pub fn move_mount(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let target = cpath(target)?;
    // SAFETY: `tree` is a live mount descriptor, both strings are valid.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Attaches a detached mount tree on top of the object `target` refers to.
pub fn move_mount_onto(tree: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: both descriptors are live; the paths are empty strings.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}
