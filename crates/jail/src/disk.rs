//! The kernel interface of on-disk scratch storage: a loop device over an image file, and the
//! btrfs ioctls that make one subvolume per sandbox with a quota (and, later, snapshots of it).
//! The policy of what goes where lives in `airlock-runtime`'s `storage`; this module only wraps
//! the calls, each checked.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::sys;

const LOOP_CTL_GET_FREE: u32 = 0x4C82;
const LOOP_CONFIGURE: u32 = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
/// Attempts before giving up on finding a free loop device (another process may take the one
/// `LOOP_CTL_GET_FREE` named before we configure it).
const LOOP_ATTEMPTS: usize = 16;

/// `struct loop_info64` from `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` from `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device attached to an image. It detaches itself once nothing holds it open: keep
/// this until the device is mounted (the mount then holds it).
#[derive(Debug)]
pub struct LoopDevice {
    pub path: PathBuf,
    _device: File,
}

/// Attaches `image` to a free loop device that detaches itself when its last user (the mount
/// made on it) goes away.
pub fn loop_attach(image: &Path) -> io::Result<LoopDevice> {
    let backing = File::options().read(true).write(true).open(image)?;
    let control = File::options()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last = io::Error::from_raw_os_error(libc::EBUSY);
    for _ in 0..LOOP_ATTEMPTS {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let number =
            unsafe { libc::ioctl(control.as_raw_fd(), sys::ioctl_request(LOOP_CTL_GET_FREE)) };
        if number < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = File::options().read(true).write(true).open(&path)?;
        // SAFETY: a zeroed loop_info64 is the kernel's "no options" value.
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        let config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info,
            reserved: [0; 8],
        };
        // SAFETY: `config` is a valid loop_config naming a live descriptor; the kernel only
        // reads it during the call.
        let ret = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                sys::ioctl_request(LOOP_CONFIGURE),
                &config,
            )
        };
        if ret == 0 {
            return Ok(LoopDevice {
                path,
                _device: device,
            });
        }
        last = io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
    }
    Err(last)
}

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
const BTRFS_INO_LOOKUP_PATH_MAX: usize = 4080;
const BTRFS_SUBVOL_NAME_MAX: usize = 4039;
const BTRFS_QUOTA_CTL_ENABLE: u64 = 1;
/// Simple quotas (Linux 6.7): usage is charged to the subvolume that wrote an extent, with no
/// backreference walks at each transaction.
const BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA: u64 = 4;
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;

const fn iow<T>(nr: u32) -> u32 {
    (1 << 30) | ((std::mem::size_of::<T>() as u32) << 16) | ((BTRFS_IOCTL_MAGIC as u32) << 8) | nr
}
const fn ior<T>(nr: u32) -> u32 {
    (2 << 30) | ((std::mem::size_of::<T>() as u32) << 16) | ((BTRFS_IOCTL_MAGIC as u32) << 8) | nr
}
const fn iowr<T>(nr: u32) -> u32 {
    (3 << 30) | ((std::mem::size_of::<T>() as u32) << 16) | ((BTRFS_IOCTL_MAGIC as u32) << 8) | nr
}

/// `struct btrfs_ioctl_vol_args_v2`, with the name member of its union.
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; BTRFS_SUBVOL_NAME_MAX + 1],
}

#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; BTRFS_INO_LOOKUP_PATH_MAX],
}

const BTRFS_IOC_SNAP_CREATE_V2: u32 = iow::<VolArgsV2>(23);
const BTRFS_IOC_SUBVOL_CREATE_V2: u32 = iow::<VolArgsV2>(24);
const BTRFS_IOC_SNAP_DESTROY_V2: u32 = iow::<VolArgsV2>(63);
const BTRFS_IOC_INO_LOOKUP: u32 = iowr::<InoLookupArgs>(18);
const BTRFS_IOC_QUOTA_CTL: u32 = iowr::<QuotaCtlArgs>(40);
const BTRFS_IOC_QGROUP_CREATE: u32 = iow::<QgroupCreateArgs>(42);
const BTRFS_IOC_QGROUP_LIMIT: u32 = ior::<QgroupLimitArgs>(43);

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = sys::cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated path; the descriptor returned is ours.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn vol_args(name: &str) -> io::Result<Box<VolArgsV2>> {
    let bytes = CString::new(name)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?
        .into_bytes();
    if bytes.is_empty() || bytes.len() > BTRFS_SUBVOL_NAME_MAX || bytes.contains(&b'/') {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut args = Box::new(VolArgsV2 {
        fd: 0,
        transid: 0,
        flags: 0,
        unused: [0; 4],
        name: [0; BTRFS_SUBVOL_NAME_MAX + 1],
    });
    args.name[..bytes.len()].copy_from_slice(&bytes);
    Ok(args)
}

fn ioctl<T>(fd: &OwnedFd, request: u32, arg: &mut T) -> io::Result<()> {
    // SAFETY: every request used here takes a pointer to exactly the struct `T` that its
    // number encodes; the struct outlives the call, and the kernel writes only within it.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            sys::ioctl_request(request),
            std::ptr::from_mut(arg),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Turns on quotas for the btrfs filesystem mounted at `mount`: simple quotas where the kernel
/// has them, full qgroup accounting otherwise. Returns whether they are simple.
pub fn btrfs_enable_quota(mount: &Path) -> io::Result<bool> {
    let dir = open_dir(mount)?;
    let mut args = QuotaCtlArgs {
        cmd: BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA,
        status: 0,
    };
    match ioctl(&dir, BTRFS_IOC_QUOTA_CTL, &mut args) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
            let mut args = QuotaCtlArgs {
                cmd: BTRFS_QUOTA_CTL_ENABLE,
                status: 0,
            };
            ioctl(&dir, BTRFS_IOC_QUOTA_CTL, &mut args).map(|()| false)
        }
        Err(e) => Err(e),
    }
}

/// Creates the subvolume `name` in the directory `parent`.
pub fn btrfs_create_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let dir = open_dir(parent)?;
    let mut args = vol_args(name)?;
    ioctl(&dir, BTRFS_IOC_SUBVOL_CREATE_V2, args.as_mut())
}

/// Makes `name` in `parent` a snapshot of the subvolume at `source`, read-only if asked.
pub fn btrfs_snapshot(source: &Path, parent: &Path, name: &str, read_only: bool) -> io::Result<()> {
    let source = open_dir(source)?;
    let dir = open_dir(parent)?;
    let mut args = vol_args(name)?;
    args.fd = i64::from(source.as_raw_fd());
    if read_only {
        args.flags = BTRFS_SUBVOL_RDONLY;
    }
    ioctl(&dir, BTRFS_IOC_SNAP_CREATE_V2, args.as_mut())
}

/// Deletes the subvolume `name` in `parent`, contents included (the space is freed in the
/// background). A missing subvolume is not an error.
pub fn btrfs_delete_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let dir = open_dir(parent)?;
    let mut args = vol_args(name)?;
    match ioctl(&dir, BTRFS_IOC_SNAP_DESTROY_V2, args.as_mut()) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The id of the subvolume holding `path`.
pub fn btrfs_subvolume_id(path: &Path) -> io::Result<u64> {
    let dir = open_dir(path)?;
    let mut args = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: 256, // BTRFS_FIRST_FREE_OBJECTID: the subvolume's root directory
        name: [0; BTRFS_INO_LOOKUP_PATH_MAX],
    });
    ioctl(&dir, BTRFS_IOC_INO_LOOKUP, args.as_mut())?;
    Ok(args.treeid)
}

/// Limits the data the subvolume at `path` may reference to `max_bytes`: beyond it, writes
/// fail with `EDQUOT`.
pub fn btrfs_limit_subvolume(path: &Path, max_bytes: u64) -> io::Result<()> {
    let dir = open_dir(path)?;
    let mut args = QgroupLimitArgs {
        qgroupid: 0, // the subvolume's own qgroup
        lim: QgroupLimit {
            flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
            max_rfer: max_bytes,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    ioctl(&dir, BTRFS_IOC_QGROUP_LIMIT, &mut args)
}

/// Removes the qgroup `0/<subvolume_id>` of a deleted subvolume. Fails with `EBUSY` while the
/// kernel is still freeing the subvolume's extents.
pub fn btrfs_remove_qgroup(mount: &Path, subvolume_id: u64) -> io::Result<()> {
    let dir = open_dir(mount)?;
    let mut args = QgroupCreateArgs {
        create: 0,
        qgroupid: subvolume_id,
    };
    match ioctl(&dir, BTRFS_IOC_QGROUP_CREATE, &mut args) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The filesystem type's magic of the filesystem holding `path`.
pub fn filesystem_magic(path: &Path) -> io::Result<i64> {
    let c = sys::cpath(path)?;
    // SAFETY: a zeroed statfs is a valid buffer for the kernel to fill.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `buf` a statfs the kernel fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut buf) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(
        clippy::unnecessary_cast,
        clippy::cast_possible_wrap,
        reason = "f_type is a long in glibc and an unsigned long in musl; magics fit in 32 bits"
    )]
    let magic = buf.f_type as i64;
    Ok(magic)
}

/// Reserves `len` bytes of real disk for `file` (unwritten extents: fast, and later writes
/// through the loop device cannot run the host's disk out of space).
pub fn preallocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: fallocate takes a live descriptor and integers; it has no memory effects.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The bytes an unprivileged writer could still use on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let c = sys::cpath(path)?;
    // SAFETY: a zeroed statvfs is a valid buffer for the kernel to fill.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `buf` a statvfs the kernel fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut buf) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf.f_bavail.saturating_mul(buf.f_frsize))
}

/// `BTRFS_SUPER_MAGIC`.
pub const BTRFS_MAGIC: i64 = 0x9123_683E;

/// Mounts the btrfs filesystem on `device` at `target`.
pub fn mount_btrfs(device: &Path, target: &Path) -> io::Result<()> {
    let source = device
        .to_str()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    sys::mount(
        Some(source),
        target,
        Some("btrfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
        Some("discard=async"),
    )
}

/// Detaches the mount at `target` (lazily: sandboxes' binds of it stay valid).
pub fn unmount(target: &Path) -> io::Result<()> {
    sys::umount_detach(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ioctl_numbers_match_the_kernel_headers() {
        // Values from <linux/btrfs.h> as compiled for x86_64.
        assert_eq!(BTRFS_IOC_SUBVOL_CREATE_V2, 0x5000_9418);
        assert_eq!(BTRFS_IOC_SNAP_CREATE_V2, 0x5000_9417);
        assert_eq!(BTRFS_IOC_SNAP_DESTROY_V2, 0x5000_943f);
        assert_eq!(BTRFS_IOC_QUOTA_CTL, 0xc010_9428);
        assert_eq!(BTRFS_IOC_QGROUP_LIMIT, 0x8030_942b);
        assert_eq!(BTRFS_IOC_QGROUP_CREATE, 0x4010_942a);
        assert_eq!(BTRFS_IOC_INO_LOOKUP, 0xd000_9412);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn test_vol_args_refuses_names_that_are_not_one_component() {
        assert!(vol_args("").is_err());
        assert!(vol_args("a/b").is_err());
        assert!(vol_args("a\0b").is_err());
        assert!(vol_args("sbx1").is_ok());
    }
}
