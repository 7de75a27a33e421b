//! On-disk scratch space for long-lived sandboxes: one btrfs filesystem per state directory,
//! in a preallocated image file on a loop device, with one subvolume per sandbox whose quota
//! is the sandbox's disk limit. `/tmp` and a fresh `/workspace` live there (`tmp/` and
//! `workspace/`), so a full disk answers `EDQUOT` instead of growing memory, and the files
//! survive anything that happens to the sandbox's processes.
//!
//! Why btrfs: a subvolume with a quota costs about 0.03 ms to create (measured here), its
//! deletion is one call, and a snapshot of it is O(1), which pause, snapshots and forks of
//! the workspace build on. Why an image: the host's own filesystem (ext4 here) has no
//! per-directory quota without remounting it, and the image's space is reserved up front, so
//! the sandboxes can never fill the host's disk.
//!
//! The filesystem stays mounted while any volume exists (sandboxes outlive the daemon, and
//! their binds keep the mount's superblock); [`Storage::release`] unmounts it when the last
//! one is gone. A daemon that starts again finds it still mounted and reuses it.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_jail::disk;

/// The image file and the mount point, in the state directory.
const IMAGE: &str = "storage.img";
const MOUNT: &str = "storage";
/// Inside the mount: one subvolume per sandbox, and one read-only subvolume per snapshot.
const VOLUMES: &str = "volumes";
const SNAPSHOTS: &str = "snapshots";
/// Inside the mount: at most one writable clone of each snapshot, made before a create needs
/// it. Making a btrfs snapshot commits a transaction (3 to 11 ms measured here, most of a
/// create from a snapshot); renaming a ready clone into `volumes/` does not.
const SPARES: &str = "spares";
/// The default image size: at most this, and at most half the free space.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;
/// btrfs needs about 110 MiB for itself; below this an image is not worth making.
pub const MIN_BYTES: u64 = 256 << 20;

/// Why the scratch storage cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(
        "the storage image {path} would need {size_bytes} bytes, but only {free_bytes} are free"
    )]
    NoSpace {
        path: PathBuf,
        size_bytes: u64,
        free_bytes: u64,
    },
    #[error("a storage image must be at least {MIN_BYTES} bytes, not {0}")]
    TooSmall(u64),
    #[error("creating the storage image {path}")]
    CreateImage {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("running mkfs.btrfs on {path} (install btrfs-progs, or use memory scratch)")]
    Format {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mkfs.btrfs failed on {path}: {stderr}")]
    FormatFailed { path: PathBuf, stderr: String },
    #[error("attaching {path} to a loop device")]
    Attach {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mounting {device} at {target}")]
    Mount {
        device: PathBuf,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("enabling quotas on {path}")]
    Quota {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is a mount point, but not of a btrfs filesystem")]
    NotBtrfs { path: PathBuf },
    #[error("creating the scratch volume {path}")]
    Volume {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn volume_error(path: &Path) -> impl FnOnce(io::Error) -> StorageError + '_ {
    move |source| StorageError::Volume {
        path: path.to_path_buf(),
        source,
    }
}

/// The scratch storage of one state directory.
#[derive(Debug)]
pub struct Storage {
    mount: PathBuf,
}

/// What a new volume starts with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum VolumeSource {
    /// Empty `tmp/` and `workspace/`.
    #[default]
    Empty,
    /// The volume the same id had before (a sandbox resumed after a filesystem-only pause):
    /// its `workspace/` is kept, its `tmp/` emptied.
    Keep,
    /// A copy-on-write copy of a snapshot (`Storage::snapshot`): the new sandbox sees its
    /// files and shares no writable storage with anything. `tmp/` is emptied.
    Snapshot(String),
}

/// Who owns a volume's directories, as the volume stores them: the sandbox's root owns
/// `tmp/` (and `upper/`), the workload's user `workspace/`. For a root caller these are the
/// sandbox's own ids, shown through idmapped mounts; otherwise the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeOwners {
    pub root: (u32, u32),
    pub workload: (u32, u32),
    /// Also make the container tier's `upper/` and `work/`, `upper/` owned by these host
    /// ids (the sandbox's root in its host range: overlayfs refuses an idmapped upper
    /// directory, so these files carry host ids, shifted when the volume changes range).
    pub upper: Option<(u32, u32)>,
}

impl Storage {
    /// The default image size for a state directory: half of its free space, at most
    /// [`DEFAULT_MAX_BYTES`].
    pub fn default_size(state_dir: &Path) -> io::Result<u64> {
        Ok((disk::free_bytes(state_dir)? / 2).min(DEFAULT_MAX_BYTES))
    }

    /// Mounts the storage of `state_dir`, making its image of `size_bytes` on first use. An
    /// existing image keeps its size (and its volumes).
    pub fn open(state_dir: &Path, size_bytes: u64) -> Result<Storage, StorageError> {
        let mount = state_dir.join(MOUNT);
        let image = state_dir.join(IMAGE);
        if is_mount_point(&mount) {
            if disk::filesystem_magic(&mount).ok() != Some(disk::BTRFS_MAGIC) {
                return Err(StorageError::NotBtrfs { path: mount });
            }
            return Ok(Storage { mount });
        }
        let fresh = !image.exists();
        if fresh {
            make_image(&image, size_bytes)?;
        }
        std::fs::create_dir_all(&mount).map_err(|source| StorageError::CreateImage {
            path: mount.clone(),
            source,
        })?;
        let device = disk::loop_attach(&image).map_err(|source| StorageError::Attach {
            path: image.clone(),
            source,
        })?;
        // The loop device detaches itself when the mount goes (or if it fails).
        disk::mount_btrfs(&device.path, &mount).map_err(|source| StorageError::Mount {
            device: device.path.clone(),
            target: mount.clone(),
            source,
        })?;
        drop(device);
        disk::btrfs_enable_quota(&mount).map_err(|source| {
            let _ = disk::unmount(&mount);
            StorageError::Quota {
                path: mount.clone(),
                source,
            }
        })?;
        let prepared = (|| {
            std::fs::set_permissions(&mount, std::fs::Permissions::from_mode(0o700))?;
            for dir in [VOLUMES, SNAPSHOTS] {
                match std::fs::create_dir(mount.join(dir)) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                    _ => {}
                }
            }
            Ok(())
        })();
        prepared.map_err(|source| StorageError::CreateImage {
            path: mount.clone(),
            source,
        })?;
        Ok(Storage { mount })
    }

    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// The host directory of sandbox `id`'s volume.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.mount.join(VOLUMES).join(id)
    }

    /// The host directory of snapshot `id`.
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.mount.join(SNAPSHOTS).join(id)
    }

    /// Creates sandbox `id`'s volume, limited to `limit_bytes`, from `source`. An empty
    /// volume replaces one an earlier sandbox of the same id left.
    pub fn create_volume(
        &self,
        id: &str,
        limit_bytes: u64,
        owners: VolumeOwners,
        source: &VolumeSource,
    ) -> Result<PathBuf, StorageError> {
        let dir = self.volume_dir(id);
        let volumes = self.mount.join(VOLUMES);
        let created = match source {
            VolumeSource::Empty => {
                if dir.exists() {
                    self.remove_volume(id);
                }
                disk::btrfs_create_subvolume(&volumes, id)
            }
            VolumeSource::Keep if dir.is_dir() => Ok(()),
            VolumeSource::Keep => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the sandbox's volume is gone",
            )),
            VolumeSource::Snapshot(snapshot) => {
                if dir.exists() {
                    self.remove_volume(id);
                }
                // Two creates may race for one spare: the rename's loser makes its own clone.
                if std::fs::rename(self.spare_dir(snapshot), &dir).is_ok() {
                    Ok(())
                } else {
                    disk::btrfs_snapshot(&self.snapshot_dir(snapshot), &volumes, id, false)
                }
            }
        };
        created.map_err(volume_error(&dir))?;
        let made = (|| -> io::Result<()> {
            disk::btrfs_limit_subvolume(&dir, limit_bytes)?;
            let mut dirs = vec![
                (airlock_policy::SCRATCH_TMP, 0o1777, owners.root),
                (airlock_policy::SCRATCH_WORKSPACE, 0o755, owners.workload),
            ];
            if let Some(upper_owner) = owners.upper {
                let upper = dir.join(airlock_policy::SCRATCH_UPPER);
                if let Ok(meta) = std::fs::symlink_metadata(&upper) {
                    // Kept or copied from a sandbox of another host range.
                    shift_owners(&upper, (meta.uid(), meta.gid()), upper_owner)?;
                }
                dirs.push((airlock_policy::SCRATCH_UPPER, 0o755, upper_owner));
                dirs.push((airlock_policy::SCRATCH_WORK, 0o700, (0, 0)));
            }
            for (name, mode, (uid, gid)) in dirs {
                let path = dir.join(name);
                // A kept or copied `/tmp` starts empty, as after a reboot, and so does the
                // overlay's work directory (a volatile overlay leaves a marker there).
                let fresh = [airlock_policy::SCRATCH_TMP, airlock_policy::SCRATCH_WORK];
                if fresh.contains(&name) && path.exists() {
                    std::fs::remove_dir_all(&path)?;
                }
                match std::fs::create_dir(&path) {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    other => other?,
                }
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            }
            Ok(())
        })();
        if let Err(error) = made {
            // A kept volume holds the sandbox's files: only a new one is taken back.
            if *source != VolumeSource::Keep {
                self.remove_volume(id);
            }
            return Err(StorageError::Volume {
                path: dir,
                source: error,
            });
        }
        Ok(dir)
    }

    /// Snapshots sandbox `id`'s volume as snapshot `snapshot`, read-only. The caller freezes
    /// the sandbox around the call, so that no write is half-done in the copy.
    pub fn snapshot(&self, id: &str, snapshot: &str) -> Result<PathBuf, StorageError> {
        let dir = self.snapshot_dir(snapshot);
        disk::btrfs_snapshot(
            &self.volume_dir(id),
            &self.mount.join(SNAPSHOTS),
            snapshot,
            true,
        )
        .map_err(volume_error(&dir))?;
        Ok(dir)
    }

    fn spare_dir(&self, snapshot: &str) -> PathBuf {
        self.mount.join(SPARES).join(snapshot)
    }

    /// Makes the writable clone of snapshot `snapshot` that the next create from it takes,
    /// unless one is ready or the snapshot is gone. Off the create's path: after a snapshot,
    /// and in the background after a create took the spare.
    pub fn prepare_spare(&self, snapshot: &str) -> Result<(), StorageError> {
        let spares = self.mount.join(SPARES);
        let dir = self.spare_dir(snapshot);
        if dir.exists() || !self.snapshot_dir(snapshot).is_dir() {
            return Ok(());
        }
        std::fs::create_dir_all(&spares)
            .and_then(|()| {
                disk::btrfs_snapshot(&self.snapshot_dir(snapshot), &spares, snapshot, false)
            })
            .map_err(volume_error(&dir))?;
        // The snapshot may have been deleted while its clone was made: take the clone back.
        if !self.snapshot_dir(snapshot).is_dir() {
            self.remove_spare(snapshot);
        }
        Ok(())
    }

    /// [`Storage::prepare_spare`] on a thread of its own, for a create that just took one.
    pub fn refill_spare(self: &std::sync::Arc<Self>, snapshot: &str) {
        let storage = self.clone();
        let snapshot = snapshot.to_owned();
        let _ = std::thread::Builder::new()
            .name("airlock-spare".into())
            .spawn(move || {
                let _ = storage.prepare_spare(&snapshot);
            });
    }

    fn remove_spare(&self, snapshot: &str) {
        let subvolume = disk::btrfs_subvolume_id(&self.spare_dir(snapshot)).ok();
        let _ = disk::btrfs_delete_subvolume(&self.mount.join(SPARES), snapshot);
        if let Some(subvolume) = subvolume {
            let _ = disk::btrfs_remove_qgroup(&self.mount, subvolume);
        }
    }

    /// Removes the spares whose snapshot is gone (a crash between the two removals).
    pub fn sweep_spares(&self) {
        for snapshot in list_dirs(&self.mount.join(SPARES)) {
            if !self.snapshot_dir(&snapshot).is_dir() {
                self.remove_spare(&snapshot);
            }
        }
    }

    /// Deletes snapshot `snapshot` and its spare; nothing if there is none. Volumes made from
    /// it keep their files (copy on write).
    pub fn remove_snapshot(&self, snapshot: &str) {
        let dir = self.snapshot_dir(snapshot);
        let subvolume = disk::btrfs_subvolume_id(&dir).ok();
        let _ = disk::btrfs_delete_subvolume(&self.mount.join(SNAPSHOTS), snapshot);
        if let Some(subvolume) = subvolume {
            let _ = disk::btrfs_remove_qgroup(&self.mount, subvolume);
        }
        // After the snapshot: no new clone can be made of it now (see `prepare_spare`).
        self.remove_spare(snapshot);
    }

    /// The ids of the snapshots that exist.
    pub fn snapshots(&self) -> Vec<String> {
        list_dirs(&self.mount.join(SNAPSHOTS))
    }

    /// Deletes sandbox `id`'s volume and its files; nothing if there is none. The quota group
    /// goes too, unless the kernel is still freeing the volume (the next sweep takes it).
    pub fn remove_volume(&self, id: &str) {
        let dir = self.volume_dir(id);
        let subvolume = disk::btrfs_subvolume_id(&dir).ok();
        let _ = disk::btrfs_delete_subvolume(&self.mount.join(VOLUMES), id);
        if let Some(subvolume) = subvolume {
            let _ = disk::btrfs_remove_qgroup(&self.mount, subvolume);
        }
    }

    /// The ids of the volumes that exist.
    pub fn volumes(&self) -> Vec<String> {
        list_dirs(&self.mount.join(VOLUMES))
    }

    /// Unmounts the storage if no volume and no snapshot is left; returns whether it did.
    /// The image stays.
    pub fn release(&self) -> bool {
        self.volumes().is_empty()
            && self.snapshots().is_empty()
            && disk::unmount(&self.mount).is_ok()
    }
}

/// Moves every file of the tree at `root` from the host range whose root is `from` to the one
/// whose root is `to` (ids outside the range are left alone). Never follows a symlink.
fn shift_owners(root: &Path, from: (u32, u32), to: (u32, u32)) -> io::Result<()> {
    if from == to {
        return Ok(());
    }
    let shift = |id: u32, from: u32, to: u32| {
        id.checked_sub(from)
            .filter(|offset| *offset < airlock_policy::SANDBOX_ID_COUNT)
            .map_or(id, |offset| to + offset)
    };
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        std::os::unix::fs::lchown(
            &path,
            Some(shift(meta.uid(), from.0, to.0)),
            Some(shift(meta.gid(), from.1, to.1)),
        )?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
    }
    Ok(())
}

fn list_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect()
}

/// Where `mkfs.btrfs` is: on `PATH`, or in the sbin directories a non-login `PATH` may lack.
pub fn mkfs_btrfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("mkfs.btrfs"))
        .find(|candidate| candidate.is_file())
}

/// Whether `path` is a directory with another filesystem mounted on it.
fn is_mount_point(path: &Path) -> bool {
    let (Ok(here), Some(Ok(parent))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    here.is_dir() && here.dev() != parent.dev()
}

fn make_image(image: &Path, size_bytes: u64) -> Result<(), StorageError> {
    if size_bytes < MIN_BYTES {
        return Err(StorageError::TooSmall(size_bytes));
    }
    let parent = image.parent().unwrap_or(Path::new("/"));
    let free_bytes = disk::free_bytes(parent).unwrap_or(0);
    if free_bytes < size_bytes {
        return Err(StorageError::NoSpace {
            path: image.to_path_buf(),
            size_bytes,
            free_bytes,
        });
    }
    let create_error = |source| StorageError::CreateImage {
        path: image.to_path_buf(),
        source,
    };
    // Made under a temporary name and renamed: a crash never leaves a half-made image behind
    // that a later start would take for a formatted one.
    let partial = image.with_extension("img.partial");
    let file = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&partial)
        .map_err(create_error)?;
    let result = (|| {
        disk::preallocate(&file, size_bytes).map_err(create_error)?;
        drop(file);
        let mkfs = mkfs_btrfs().ok_or_else(|| StorageError::Format {
            path: image.to_path_buf(),
            source: io::ErrorKind::NotFound.into(),
        })?;
        let output = Command::new(mkfs)
            .args(["-q", "-f"])
            .arg(&partial)
            .output()
            .map_err(|source| StorageError::Format {
                path: image.to_path_buf(),
                source,
            })?;
        if !output.status.success() {
            return Err(StorageError::FormatFailed {
                path: image.to_path_buf(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        std::fs::rename(&partial, image).map_err(create_error)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}
