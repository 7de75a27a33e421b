//! Block disks for the microvm tier, made with e2fsprogs' `mke2fs -d` (Debian's e2fsprogs,
//! priority required): an image's root filesystem as one ext4 image, built once per image
//! digest under the store (`<root>/disks/sha256/<manifest hex>.ext4`), and a sandbox's own
//! empty, writable overlay disk.
//!
//! Copy-on-write without qcow: the guest mounts the image's disk read-only (every sandbox of
//! the image shares the one file and the host's page cache of it) and puts an overlayfs over
//! it whose upper and work directories are on the sandbox's overlay disk, so the sandbox's
//! writes land in its own sparse file and nowhere else. A snapshot of the sandbox is its
//! memory plus a copy of that file.
//!
//! Here, not in the VMM: the store owns the layers, the digests, the locks and prune, which
//! removes a disk with its image; the VMM only opens paths. The layers are merged by a
//! read-only overlay that is attached nowhere ([`airlock_jail::mountfs::merged_layers`]),
//! so whiteouts and opaque directories mean what they mean to the container tier and no
//! mount outlives the build. Needs root, like the store's unpacking.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::digest::Digest;
use crate::store::{ImageStore, StoreError};

/// ext4's block size here.
const BLOCK_BYTES: u64 = 4096;
/// Room for the superblock, group descriptors, bitmaps and directories beyond the estimate.
const SLACK_BYTES: u64 = 16 << 20;
const MIN_DISK_BYTES: u64 = 32 << 20;
const INODE_BYTES: u64 = 256;

/// Why a disk could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("resolving the image")]
    Store(#[from] StoreError),
    #[error("merging the layers of image {digest} read-only")]
    Merge {
        digest: String,
        #[source]
        source: airlock_jail::mountfs::MountFsError,
    },
    #[error("cannot {action} `{path}`")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("running mke2fs (e2fsprogs) failed")]
    Spawn(#[source] io::Error),
    #[error("mke2fs could not make `{path}` ({status}): {stderr}")]
    Mkfs {
        path: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("an overlay disk of {size_bytes} bytes is smaller than the {MIN_DISK_BYTES} minimum")]
    TooSmall { size_bytes: u64 },
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DiskError + 'a {
    move |source| DiskError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// An image's root filesystem disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootDisk {
    /// The image's manifest digest, whose disk this is.
    pub digest: String,
    pub path: PathBuf,
    /// The file's length (sparse: its blocks on the host are about the image's files).
    pub size_bytes: u64,
    /// Whether this call built it (`false`: it was cached).
    pub built: bool,
}

/// What the merged tree holds, for sizing the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub data_blocks: u64,
    pub inodes: u64,
}

impl Usage {
    /// A disk this tree fits in with room to spare (read-only, so no free space beyond).
    pub fn disk_bytes(&self) -> u64 {
        let bytes = self.data_blocks * BLOCK_BYTES * 11 / 10 + self.inodes * INODE_BYTES;
        (bytes + SLACK_BYTES).max(MIN_DISK_BYTES).div_ceil(1 << 20) * (1 << 20)
    }

    /// Inodes to make: every entry, some to spare.
    pub fn inode_count(&self) -> u64 {
        self.inodes + self.inodes / 10 + 64
    }
}

/// Counts blocks and inodes under `root` without following symlinks; hard links once.
pub fn measure(root: &Path) -> Result<Usage, DiskError> {
    let mut usage = Usage {
        data_blocks: 1,
        inodes: 1,
    };
    let mut seen = HashSet::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(io_error("list", &dir))?;
        for entry in entries {
            let entry = entry.map_err(io_error("list", &dir))?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).map_err(io_error("inspect", &path))?;
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            usage.inodes += 1;
            usage.data_blocks += meta.len().div_ceil(BLOCK_BYTES).max(1);
            if meta.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok(usage)
}

/// Runs mke2fs on a new sparse file `path` of `size_bytes` with the tree at `source`.
fn mkfs(path: &Path, size_bytes: u64, source: &Path, options: &[String]) -> Result<(), DiskError> {
    let file = File::create(path).map_err(io_error("create", path))?;
    file.set_len(size_bytes).map_err(io_error("size", path))?;
    drop(file);
    let output = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0"])
        .args(options)
        .arg("-d")
        .arg(source)
        .arg(path)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .map_err(DiskError::Spawn)?;
    if output.status.success() {
        return Ok(());
    }
    let _ = fs::remove_file(path);
    Err(DiskError::Mkfs {
        path: path.to_path_buf(),
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// A UUID-shaped string from a digest's first 16 bytes: the same image gives the same
/// filesystem UUID (and directory hash seed).
fn uuid_of(digest: &Digest) -> String {
    let hex = digest.hex();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl ImageStore {
    /// Where the root filesystem disk of the image with manifest `digest` is kept.
    pub fn disk_path(&self, digest: &Digest) -> PathBuf {
        self.root()
            .join("disks/sha256")
            .join(format!("{}.ext4", digest.hex()))
    }

    /// The image's root filesystem as an ext4 disk, built from its layers on first use and
    /// cached per image digest. The guest mounts it read-only; see [`overlay_disk`] for
    /// where its writes go.
    pub fn root_disk(&self, reference: &str) -> Result<RootDisk, DiskError> {
        let rootfs = self.resolve(reference)?;
        let digest = Digest::parse(&rootfs.digest).map_err(|_| {
            StoreError::NotFound(format!("{reference} (its digest {})", rootfs.digest))
        })?;
        let path = self.disk_path(&digest);
        let found = |built| -> Result<RootDisk, DiskError> {
            let size_bytes = fs::metadata(&path)
                .map_err(io_error("inspect", &path))?
                .len();
            Ok(RootDisk {
                digest: rootfs.digest.clone(),
                path: path.clone(),
                size_bytes,
                built,
            })
        };
        if path.is_file() {
            return found(false);
        }
        // Shared: no prune meanwhile; the disk's own lock: one build per image at a time.
        let _store = self.store_lock(false)?;
        let lock_path = self
            .root()
            .join(format!("locks/disk-{}.lock", digest.hex()));
        let lock = File::create(&lock_path).map_err(io_error("create", &lock_path))?;
        lock.lock().map_err(io_error("lock", &lock_path))?;
        if path.is_file() {
            return found(false);
        }
        let work =
            self.root()
                .join("tmp")
                .join(format!("disk-{}-{}", digest.hex(), std::process::id()));
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(work.join("empty")).map_err(io_error("create", &work))?;
        let placed = build(&rootfs.layers, &work, &digest).and_then(|partial| {
            let parent = path.parent().unwrap_or(Path::new("."));
            fs::create_dir_all(parent).map_err(io_error("create", parent))?;
            fs::rename(&partial, &path).map_err(io_error("rename into", &path))
        });
        let _ = fs::remove_dir_all(&work);
        placed?;
        found(true)
    }
}

/// Builds the disk in `work` (which holds an empty `empty/`); returns the finished file,
/// which the caller renames into place.
fn build(layers: &[PathBuf], work: &Path, digest: &Digest) -> Result<PathBuf, DiskError> {
    let merged =
        airlock_jail::mountfs::merged_layers(layers, &work.join("empty")).map_err(|source| {
            DiskError::Merge {
                digest: digest.to_string(),
                source,
            }
        })?;
    // mke2fs (a child) reaches the detached overlay through this process's descriptor.
    let view = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        merged.as_raw_fd()
    ));
    let usage = measure(&view)?;
    let uuid = uuid_of(digest);
    let options = [
        // Read-only in the guest: no journal to replay, no free space reserved.
        "-O".to_owned(),
        "^has_journal".to_owned(),
        "-N".to_owned(),
        usage.inode_count().to_string(),
        "-L".to_owned(),
        "airlock-root".to_owned(),
        "-U".to_owned(),
        uuid.clone(),
        "-E".to_owned(),
        format!("hash_seed={uuid}"),
    ];
    let out = work.join("disk.ext4");
    let size = usage.disk_bytes();
    // An estimate that falls short (many small directories) gets one more try, twice the size.
    if mkfs(&out, size, &view, &options).is_err() {
        mkfs(&out, size * 2, &view, &options)?;
    }
    drop(merged);
    Ok(out)
}

/// Makes a sandbox's writable overlay disk at `path`: a sparse ext4 file of `size_bytes`
/// holding `upper/` (0755, root's, which becomes the guest's `/` attributes) and `work/`
/// (0700), the directories the guest's overlayfs needs over the image's read-only disk. No
/// journal: a sandbox's disk does not outlive a host crash.
pub fn overlay_disk(path: &Path, size_bytes: u64) -> Result<(), DiskError> {
    if size_bytes < MIN_DISK_BYTES {
        return Err(DiskError::TooSmall { size_bytes });
    }
    let staging = PathBuf::from(format!("{}.staging", path.display()));
    let _ = fs::remove_dir_all(&staging);
    let make = || -> Result<(), DiskError> {
        for (name, mode) in [("upper", 0o755), ("work", 0o700)] {
            let dir = staging.join(name);
            fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
            fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(io_error("set permissions of", &dir))?;
        }
        let options = [
            "-O".to_owned(),
            "^has_journal".to_owned(),
            "-L".to_owned(),
            "airlock-overlay".to_owned(),
            "-E".to_owned(),
            "root_owner=0:0".to_owned(),
        ];
        mkfs(path, size_bytes, &staging, &options)
    };
    let result = make();
    let _ = fs::remove_dir_all(&staging);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_usage_disk_bytes_has_a_floor_and_rounds_to_mebibytes() {
        assert_eq!(Usage::default().disk_bytes(), MIN_DISK_BYTES);
        let usage = Usage {
            data_blocks: 100_000,
            inodes: 20_000,
        };
        let bytes = usage.disk_bytes();
        assert_eq!(bytes % (1 << 20), 0);
        assert!(bytes >= 100_000 * BLOCK_BYTES + 20_000 * INODE_BYTES + SLACK_BYTES);
        assert!(usage.inode_count() > 20_000);
    }

    #[test]
    fn test_uuid_of_digest_is_uuid_shaped() {
        let digest = Digest::parse(&format!("sha256:{}", "0123456789abcdef".repeat(4)))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(uuid_of(&digest), "01234567-89ab-cdef-0123-456789abcdef");
    }
}
