//! File operations confined beneath a directory handle, for code that writes a tree whose
//! shape an attacker chose (the image store's layer applier).
//!
//! Every operation takes a parent directory descriptor and one path component (`name`), never
//! a path: [`component`] refuses `""`, `.`, `..`, a `/` or a NUL, so the kernel resolves
//! exactly one name inside `parent` and the last component is never followed (`O_NOFOLLOW`,
//! `O_EXCL`, `AT_SYMLINK_NOFOLLOW`, or calls that never follow by definition). Multi-component
//! paths are only opened through [`open_dir_in_root`], whose `openat2(RESOLVE_IN_ROOT)` keeps
//! every symlink and `..` inside the root: the kernel, not a string check, decides.
//!
//! There is deliberately no way to create a device node or a FIFO here except the overlay
//! whiteout (a character device 0/0, which the kernel lets anyone create).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn check_int(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Checks that `name` is exactly one path component and converts it for the kernel.
pub fn component(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." {
        return Err(invalid("not a single path component (empty, `.` or `..`)"));
    }
    if bytes.contains(&b'/') {
        return Err(invalid("a path component contains `/`"));
    }
    CString::new(bytes).map_err(|_| invalid("a path component contains a NUL byte"))
}

fn c_bytes(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| invalid("contains a NUL byte"))
}

/// The kernel's `struct open_how` (libc's is non-exhaustive, so it cannot be built here).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(2)`; the kernel checks `resolve` for every component it walks.
fn openat2(
    dir: BorrowedFd<'_>,
    path: &CString,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: u64::from((flags | libc::O_CLOEXEC).cast_unsigned()),
        mode: u64::from(mode),
        resolve,
    };
    // SAFETY: `path` is a NUL-terminated string and `how` a fully initialised `open_how` whose
    // size we pass; both outlive the call. `dir` is a live descriptor we borrow.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &raw const how,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd =
        i32::try_from(fd).map_err(|_| io::Error::other("openat2 returned a bad descriptor"))?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Walking one component: no symlink at all, no magic link, no mount crossing, never above.
const ONE_COMPONENT: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// Opens the directory at `path` (relative or absolute) as if `root` were `/`: symlinks and
/// `..` are followed but can never leave `root` (`RESOLVE_IN_ROOT`), magic links and mount
/// crossings are refused. An empty `path` opens `root` itself.
pub fn open_dir_in_root(root: BorrowedFd<'_>, path: &Path) -> io::Result<OwnedFd> {
    let bytes = path.as_os_str().as_bytes();
    let path = c_bytes(if bytes.is_empty() { b"." } else { bytes })?;
    openat2(
        root,
        &path,
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_XDEV,
    )
}

/// Opens the directory `name` in `parent`, refusing a symlink.
pub fn open_dir(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let name = component(name)?;
    openat2(
        parent,
        &name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
        ONE_COMPONENT,
    )
}

/// Opens whatever `name` in `parent` is, without following it (`O_PATH`): for `fstat`.
pub fn open_entry(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<File> {
    let name = component(name)?;
    let fd = openat2(
        parent,
        &name,
        libc::O_PATH | libc::O_NOFOLLOW,
        0,
        ONE_COMPONENT,
    )?;
    Ok(File::from(fd))
}

/// Opens the regular file `name` in `parent` for reading, refusing a symlink.
pub fn open_file(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<File> {
    let name = component(name)?;
    let fd = openat2(
        parent,
        &name,
        libc::O_RDONLY | libc::O_NOFOLLOW,
        0,
        ONE_COMPONENT,
    )?;
    Ok(File::from(fd))
}

/// Creates the regular file `name` in `parent`; fails if anything already has that name
/// (`O_EXCL` never follows a symlink).
pub fn create_file(parent: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<File> {
    let name = component(name)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let fd = openat2(parent, &name, flags, mode & 0o7777, ONE_COMPONENT)?;
    Ok(File::from(fd))
}

/// `mkdirat(2)`: creates the directory `name` in `parent`.
pub fn mkdir(parent: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let name = component(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call; `parent` is a live descriptor.
    check_int(unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), mode & 0o7777) })?;
    Ok(())
}

/// `symlinkat(2)`: creates `name` in `parent` pointing at `target`, stored verbatim (it is
/// never followed here).
pub fn symlink(target: &OsStr, parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let name = component(name)?;
    let target = c_bytes(target.as_bytes())?;
    // SAFETY: both strings are NUL-terminated and outlive the call; `parent` is live.
    check_int(unsafe { libc::symlinkat(target.as_ptr(), parent.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// `linkat(2)` without `AT_SYMLINK_FOLLOW`: a new name for the inode `old_name` in
/// `old_parent` (a symlink is linked itself, never its target).
pub fn hard_link(
    old_parent: BorrowedFd<'_>,
    old_name: &OsStr,
    new_parent: BorrowedFd<'_>,
    new_name: &OsStr,
) -> io::Result<()> {
    let old_name = component(old_name)?;
    let new_name = component(new_name)?;
    // SAFETY: both names are NUL-terminated and outlive the call; both descriptors are live.
    check_int(unsafe {
        libc::linkat(
            old_parent.as_raw_fd(),
            old_name.as_ptr(),
            new_parent.as_raw_fd(),
            new_name.as_ptr(),
            0,
        )
    })?;
    Ok(())
}

/// Creates an overlayfs whiteout (a character device 0/0, mode 0) named `name` in `parent`.
pub fn whiteout(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let name = component(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call; the device number is 0/0, the
    // one device the kernel lets anyone create (`vfs: allow unprivileged whiteout creation`).
    check_int(unsafe { libc::mknodat(parent.as_raw_fd(), name.as_ptr(), libc::S_IFCHR, 0) })?;
    Ok(())
}

/// `unlinkat(2)`: removes the file, symlink or (with `directory`) empty directory `name`.
pub fn unlink(parent: BorrowedFd<'_>, name: &OsStr, directory: bool) -> io::Result<()> {
    let name = component(name)?;
    let flags = if directory { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is NUL-terminated and outlives the call; `parent` is live.
    check_int(unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

/// `renameat2(RENAME_NOREPLACE)`: moves `old_name` to `new_name`, failing if that exists.
pub fn rename_noreplace(
    old_parent: BorrowedFd<'_>,
    old_name: &OsStr,
    new_parent: BorrowedFd<'_>,
    new_name: &OsStr,
) -> io::Result<()> {
    let old_name = component(old_name)?;
    let new_name = component(new_name)?;
    // SAFETY: both names are NUL-terminated and outlive the call; both descriptors are live.
    check_int(unsafe {
        libc::renameat2(
            old_parent.as_raw_fd(),
            old_name.as_ptr(),
            new_parent.as_raw_fd(),
            new_name.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })?;
    Ok(())
}

/// `fsetxattr(2)` on an open file or directory.
pub fn set_xattr(file: BorrowedFd<'_>, name: &str, value: &[u8]) -> io::Result<()> {
    let name = c_bytes(name.as_bytes())?;
    // SAFETY: `name` is NUL-terminated, `value` is a valid buffer of `value.len()` bytes, both
    // outlive the call; `file` is live.
    check_int(unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })?;
    Ok(())
}

/// `fgetxattr(2)`: the value of `name`, or `None` when the file has no such attribute.
pub fn get_xattr(file: BorrowedFd<'_>, name: &str) -> io::Result<Option<Vec<u8>>> {
    let name = c_bytes(name.as_bytes())?;
    let mut value = vec![0u8; 4096];
    // SAFETY: `name` is NUL-terminated; `value` is a writable buffer of `value.len()` bytes;
    // both outlive the call; `file` is live.
    let len = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if len < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(error),
        };
    }
    value.truncate(len.cast_unsigned());
    Ok(Some(value))
}

/// `flistxattr(2)`: the names of every extended attribute of an open file or directory
/// (those this process may see; `trusted.*` only as real root).
pub fn list_xattrs(file: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let mut buffer = vec![0u8; 4096];
    loop {
        // SAFETY: `buffer` is a writable buffer of `buffer.len()` bytes that outlives the
        // call; `file` is live.
        let len =
            unsafe { libc::flistxattr(file.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
        if len >= 0 {
            buffer.truncate(len.cast_unsigned());
            return Ok(buffer
                .split(|b| *b == 0)
                .filter(|name| !name.is_empty())
                .map(|name| String::from_utf8_lossy(name).into_owned())
                .collect());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            // The list grew or is longer than the buffer: ask for its size, then again.
            Some(libc::ERANGE) if buffer.len() < 1 << 20 => {
                buffer.resize(buffer.len() * 4, 0);
            }
            _ => return Err(error),
        }
    }
}

/// `fchownat(AT_SYMLINK_NOFOLLOW)`: sets the owner of `name` itself (a symlink is not followed).
pub fn chown_nofollow(parent: BorrowedFd<'_>, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
    let name = component(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call; `parent` is live.
    check_int(unsafe {
        libc::fchownat(
            parent.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// `utimensat(AT_SYMLINK_NOFOLLOW)`: sets the access and modification times of `name` itself.
pub fn set_times_nofollow(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    seconds: i64,
    nanoseconds: u32,
) -> io::Result<()> {
    let name = component(name)?;
    let time = libc::timespec {
        tv_sec: seconds,
        tv_nsec: i64::from(nanoseconds.min(999_999_999)),
    };
    let times = [time, time];
    // SAFETY: `name` is NUL-terminated, `times` an array of two initialised timespecs; both
    // outlive the call; `parent` is live.
    check_int(unsafe {
        libc::utimensat(
            parent.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    fn scratch(tag: &str) -> (std::path::PathBuf, OwnedFd) {
        let base =
            std::env::temp_dir().join(format!("airlock-beneath-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("root")).unwrap();
        let root = File::open(base.join("root")).unwrap();
        (base, OwnedFd::from(root))
    }

    #[test]
    fn test_component_dot_dot_and_slash_refused() {
        for bad in ["", ".", "..", "a/b", "/a"] {
            assert!(component(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        assert!(component(OsStr::new("...")).is_ok());
    }

    #[test]
    fn test_open_dir_in_root_symlink_escape_stays_inside() {
        let (base, root) = scratch("inroot");
        std::fs::create_dir(base.join("outside")).unwrap();
        std::os::unix::fs::symlink("../../outside", base.join("root/up")).unwrap();
        std::os::unix::fs::symlink("/", base.join("root/abs")).unwrap();
        std::fs::create_dir(base.join("root/sub")).unwrap();
        std::os::unix::fs::symlink("../../..", base.join("root/sub/esc")).unwrap();
        // `..` above the root and an absolute link both land on the root itself.
        for path in ["sub/esc", "abs", "../..", "/", ""] {
            let dir = open_dir_in_root(root.as_fd(), Path::new(path)).unwrap();
            let inode = File::from(dir).metadata().unwrap().ino();
            assert_eq!(
                inode,
                std::fs::metadata(base.join("root")).unwrap().ino(),
                "{path}"
            );
        }
        // `up` points to `/outside` inside the root, which does not exist.
        assert!(open_dir_in_root(root.as_fd(), Path::new("up")).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn test_create_file_over_symlink_refused() {
        let (base, root) = scratch("excl");
        std::os::unix::fs::symlink(base.join("target"), base.join("root/link")).unwrap();
        assert!(create_file(root.as_fd(), OsStr::new("link"), 0o644).is_err());
        assert!(open_dir(root.as_fd(), OsStr::new("link")).is_err());
        assert!(!base.join("target").exists());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn test_whiteout_is_char_device_zero() {
        let (base, root) = scratch("whiteout");
        whiteout(root.as_fd(), OsStr::new("gone")).unwrap();
        let meta = std::fs::symlink_metadata(base.join("root/gone")).unwrap();
        assert_eq!(meta.mode() & libc::S_IFMT, libc::S_IFCHR);
        assert_eq!(meta.rdev(), 0);
        let _ = std::fs::remove_dir_all(&base);
    }
}
