//! A microvm sandbox's disks: the image's root filesystem and the sandbox's own overlay.
//!
//! The root disk is an image's ext4 disk as the image store builds it
//! (`ImageStore::root_disk`, `airlock image disk REF`), shared by every sandbox of the image
//! and shown to the VMM read-only: the guest's `/dev/vda` (serial [`ROOT_SERIAL`]), which the
//! VMM refuses to write and the guest mounts read-only. The overlay disk is the sandbox's own
//! sparse file in its directory, shown read-write: `/dev/vdb` (serial [`OVERLAY_SERIAL`]),
//! holding the `upper/` and `work/` of the guest's overlayfs over the root, so every write of
//! the sandbox lands there. A booted guest starts from a fresh overlay disk; a fork of a
//! snapshot from a copy of the snapshot's (`disk-1.img`: the VMM copies each writable disk
//! into the snapshot, numbered by its place, and the root is disk 0).
//!
//! The guest's init finds the two by their serials, mounts them, switches its root to the
//! overlay and runs the agent from there (scripts/microvm-nested.sh has one such init).

use std::path::{Path, PathBuf};

use airlock_jail::spec::{VMM_FILES_DIR, VmmSpec};
use airlock_policy::IdentityPlan;

use super::guest::GuestSource;

/// The image's root disk (an ext4 image made by `ImageStore::root_disk`). Unset: the guest's
/// root is its initramfs (or whatever its snapshot had).
pub const ENV_ROOT_DISK: &str = "AIRLOCK_MICROVM_ROOT_DISK";
/// The guest finds its disks by these serials (`/sys/block/vdX/serial`).
pub const ROOT_SERIAL: &str = "airlock-root";
pub const OVERLAY_SERIAL: &str = "airlock-overlay";
/// Their names in the VMM's view, under `VMM_FILES_DIR`, and the overlay's in the sandbox's
/// directory.
pub const ROOT_FILE: &str = "root.ext4";
pub const OVERLAY_FILE: &str = "overlay.img";
/// A fresh overlay disk's size (sparse: the host holds only what the guest writes).
pub const OVERLAY_BYTES: u64 = 1 << 30;
/// The snapshot's copy of the overlay disk, disk 1 of the boot that made it.
pub const SNAPSHOT_OVERLAY: &str = "disk-1.img";

/// Why a sandbox's disks could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("the image's root disk `{0}` is not a file")]
    NoRootDisk(PathBuf),
    #[error("the snapshot has no overlay disk `{0}` (it was booted without a root disk?)")]
    NoSnapshotOverlay(PathBuf),
    #[error("the paused VM's overlay disk `{0}` is missing")]
    NoKeptOverlay(PathBuf),
    #[error("making the sandbox's overlay disk `{path}`")]
    Fresh {
        path: PathBuf,
        #[source]
        source: airlock_image::disk::DiskError,
    },
    #[error("copying the snapshot's overlay disk to `{path}`")]
    Copy {
        path: PathBuf,
        #[source]
        source: airlock_vmm::snapshot::SnapshotError,
    },
    #[error("handing the overlay disk `{path}` to the VMM's user")]
    Own {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the sandbox's overlay disk starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverlayStart {
    /// An empty ext4 disk of this size with `upper/` and `work/`.
    Fresh { size_bytes: u64 },
    /// A copy of a snapshot's overlay disk (the guest's memory expects its contents).
    Copy { from: PathBuf },
    /// The sandbox's own, already there: a VM paused to disk, or a fork's copy
    /// ([`super::persist`]).
    Keep,
}

/// A sandbox's two disks, host paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskPlan {
    pub root: PathBuf,
    /// In the sandbox's directory, removed with it.
    pub overlay: PathBuf,
    pub start: OverlayStart,
}

impl DiskPlan {
    /// The disks of a sandbox whose guest comes from `source`, with `root_disk` (the operator's
    /// [`ENV_ROOT_DISK`]) and its directory `sandbox_dir`; `None` without a root disk.
    pub fn new(
        source: &GuestSource,
        root_disk: Option<PathBuf>,
        sandbox_dir: &Path,
    ) -> Option<Self> {
        let start = match source {
            GuestSource::Boot { .. } => OverlayStart::Fresh {
                size_bytes: OVERLAY_BYTES,
            },
            GuestSource::Snapshot { dir } => OverlayStart::Copy {
                from: dir.join(SNAPSHOT_OVERLAY),
            },
        };
        root_disk.map(|root| DiskPlan {
            root,
            overlay: sandbox_dir.join(OVERLAY_FILE),
            start,
        })
    }

    /// The overlay disk's path in the VMM's view (Landlock must let the VMM write it).
    pub fn overlay_in_view() -> PathBuf {
        Path::new(VMM_FILES_DIR).join(OVERLAY_FILE)
    }

    /// Adds the disks to the VMM's jail and arguments: the root read-only as disk 0, the
    /// overlay read-write as disk 1 (a restore needs them in the order of the boot).
    pub fn add_to(&self, spec: &mut VmmSpec) {
        spec.files.push((ROOT_FILE.to_owned(), self.root.clone()));
        spec.disks
            .push((OVERLAY_FILE.to_owned(), self.overlay.clone()));
        spec.args.extend([
            "--disk".to_owned(),
            format!("{VMM_FILES_DIR}/{ROOT_FILE}:ro:id={ROOT_SERIAL}"),
            "--disk".to_owned(),
            format!("{VMM_FILES_DIR}/{OVERLAY_FILE}:id={OVERLAY_SERIAL}"),
        ]);
    }

    /// Makes the overlay disk (fresh, or the snapshot's copied with its holes) and gives it to
    /// `owner` (host uid and gid), mode 0600: the VMM runs as the sandbox's user.
    pub fn prepare(&self, owner: (u32, u32)) -> Result<(), DiskError> {
        if !self.root.is_file() {
            return Err(DiskError::NoRootDisk(self.root.clone()));
        }
        let path = &self.overlay;
        match &self.start {
            OverlayStart::Fresh { size_bytes } => {
                airlock_image::disk::overlay_disk(path, *size_bytes).map_err(|source| {
                    DiskError::Fresh {
                        path: path.clone(),
                        source,
                    }
                })?;
            }
            OverlayStart::Copy { from } => {
                if !from.is_file() {
                    return Err(DiskError::NoSnapshotOverlay(from.clone()));
                }
                airlock_vmm::snapshot::copy_disk(from, path).map_err(|source| DiskError::Copy {
                    path: path.clone(),
                    source,
                })?;
            }
            OverlayStart::Keep if !path.is_file() => {
                return Err(DiskError::NoKeptOverlay(path.clone()));
            }
            // Given to this start's user below: a resumed sandbox may have another id range.
            OverlayStart::Keep => {}
        }
        let own = |source| DiskError::Own {
            path: path.clone(),
            source,
        };
        std::os::unix::fs::chown(path, Some(owner.0), Some(owner.1)).map_err(own)?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(own)
    }
}

/// The host ids of the sandbox's user (the VMM's), through the sandbox's id maps: the disk
/// is shown to it without an idmapped mount.
pub fn host_owner(identity: &IdentityPlan) -> (u32, u32) {
    let outside = |maps: &[airlock_policy::IdMap], inside: u32| {
        maps.iter()
            .find(|m| inside >= m.inside && inside - m.inside < m.count)
            .map_or(inside, |m| m.outside + (inside - m.inside))
    };
    (
        outside(&identity.uid_map, identity.uid),
        outside(&identity.gid_map, identity.gid),
    )
}

/// The operator's root disk setting (`get` reads one environment variable).
pub fn root_disk_from_vars(get: &impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    get(ENV_ROOT_DISK)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// What a sandbox's guest boots from and on which root disk. `sandbox_disk` (the root disk of
/// the image the sandbox asked for) replaces the operator's root disk. A snapshot's guest
/// has the disk it was made on mounted (its page cache and its filesystem's state are that
/// disk's), so only a sandbox of that image forks it; one of another image boots the
/// operator's kernel, and without a kernel is refused. `same_file` says whether two paths
/// are one file.
pub fn choose_guest(
    sandbox_disk: Option<&Path>,
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
    same_file: impl Fn(&Path, &Path) -> bool,
) -> Result<(GuestSource, Option<PathBuf>), String> {
    let operator_disk = root_disk_from_vars(&get);
    let source = GuestSource::from_vars(&get)?;
    let Some(disk) = sandbox_disk else {
        return Ok((source, operator_disk));
    };
    let snapshot_of_this_image = operator_disk
        .as_deref()
        .is_some_and(|operator| same_file(operator, disk));
    match source {
        GuestSource::Snapshot { .. } if !snapshot_of_this_image => {
            let boot = GuestSource::boot_from_vars(&get).map_err(|_| {
                format!(
                    "the operator's guest is a snapshot made on {}, and this sandbox's image is another: a sandbox of another image boots a kernel, and {} is not set",
                    operator_disk.as_deref().map_or_else(
                        || "no root disk (its initramfs)".to_owned(),
                        |d| format!("the root disk {}", d.display())
                    ),
                    super::guest::ENV_KERNEL,
                )
            })?;
            Ok((boot, Some(disk.to_path_buf())))
        }
        source => Ok((source, Some(disk.to_path_buf()))),
    }
}

/// Whether two paths name one file (the same device and inode); false when either is missing.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> VmmSpec {
        VmmSpec {
            mode: "restore".into(),
            files: vec![("snapshot".into(), "/snap".into())],
            disks: Vec::new(),
            args: vec!["--snapshot".into(), "/run/airlock/vm/snapshot".into()],
        }
    }

    #[test]
    fn test_disk_plan_of_a_snapshot_copies_its_overlay_and_restores_root_then_overlay() {
        let source = GuestSource::Snapshot {
            dir: "/snap".into(),
        };
        let plan = DiskPlan::new(
            &source,
            Some("/images/root.ext4".into()),
            Path::new("/sbx/a"),
        )
        .unwrap();
        assert_eq!(
            plan,
            DiskPlan {
                root: "/images/root.ext4".into(),
                overlay: "/sbx/a/overlay.img".into(),
                start: OverlayStart::Copy {
                    from: "/snap/disk-1.img".into()
                },
            }
        );
        let mut vmm = spec();
        plan.add_to(&mut vmm);
        assert_eq!(
            vmm.files,
            [
                ("snapshot".to_owned(), PathBuf::from("/snap")),
                ("root.ext4".to_owned(), PathBuf::from("/images/root.ext4"))
            ]
        );
        assert_eq!(
            vmm.disks,
            [(
                "overlay.img".to_owned(),
                PathBuf::from("/sbx/a/overlay.img")
            )]
        );
        assert_eq!(
            vmm.args[2..],
            [
                "--disk",
                "/run/airlock/vm/root.ext4:ro:id=airlock-root",
                "--disk",
                "/run/airlock/vm/overlay.img:id=airlock-overlay"
            ]
        );
        assert_eq!(
            DiskPlan::overlay_in_view(),
            PathBuf::from("/run/airlock/vm/overlay.img")
        );
    }

    #[test]
    fn test_disk_plan_of_a_boot_starts_a_fresh_overlay_and_none_without_a_root_disk() {
        let source = GuestSource::Boot {
            kernel: "/k".into(),
            initrd: None,
            cmdline: String::new(),
            cmdline_devices: false,
        };
        let plan = DiskPlan::new(&source, Some("/r.ext4".into()), Path::new("/sbx/b")).unwrap();
        assert_eq!(
            plan.start,
            OverlayStart::Fresh {
                size_bytes: OVERLAY_BYTES
            }
        );
        assert_eq!(DiskPlan::new(&source, None, Path::new("/sbx/b")), None);
    }

    fn choose(
        sandbox_disk: Option<&str>,
        vars: &[(&str, &str)],
    ) -> Result<(GuestSource, Option<PathBuf>), String> {
        let vars: std::collections::HashMap<String, std::ffi::OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        // Paths name one file when they are equal (the tests' own notion of a file).
        choose_guest(
            sandbox_disk.map(Path::new),
            |name| vars.get(name).cloned(),
            |a, b| a == b,
        )
    }

    #[test]
    fn test_choose_guest_a_sandbox_image_replaces_the_operator_disk_on_a_boot() {
        let kernel = (super::super::guest::ENV_KERNEL, "/k");
        let operator = (ENV_ROOT_DISK, "/images/plain.ext4");
        let (source, disk) = choose(None, &[kernel, operator]).unwrap();
        assert!(matches!(source, GuestSource::Boot { .. }), "{source:?}");
        assert_eq!(disk, Some(PathBuf::from("/images/plain.ext4")));
        let (_, disk) = choose(Some("/images/layered.ext4"), &[kernel, operator]).unwrap();
        assert_eq!(disk, Some(PathBuf::from("/images/layered.ext4")));
        // Without the operator's disk the initramfs is the root, unless the sandbox names one.
        assert_eq!(choose(None, &[kernel]).unwrap().1, None);
        assert_eq!(
            choose(Some("/images/layered.ext4"), &[kernel]).unwrap().1,
            Some(PathBuf::from("/images/layered.ext4"))
        );
    }

    #[test]
    fn test_choose_guest_forks_the_snapshot_only_for_the_image_it_was_made_on() {
        let snapshot = (super::super::guest::ENV_SNAPSHOT, "/snap");
        let operator = (ENV_ROOT_DISK, "/images/plain.ext4");
        let kernel = (super::super::guest::ENV_KERNEL, "/k");
        let fork = |disk| choose(disk, &[snapshot, operator, kernel]).unwrap();
        for same in [None, Some("/images/plain.ext4")] {
            let (source, disk) = fork(same);
            assert_eq!(
                source,
                GuestSource::Snapshot {
                    dir: "/snap".into()
                }
            );
            assert_eq!(disk, Some(PathBuf::from("/images/plain.ext4")));
        }
        // Another image's guest boots the operator's kernel on that image's disk.
        let (source, disk) = fork(Some("/images/layered.ext4"));
        assert!(
            matches!(&source, GuestSource::Boot { kernel, .. } if kernel == Path::new("/k")),
            "{source:?}"
        );
        assert_eq!(disk, Some(PathBuf::from("/images/layered.ext4")));
        // Without a kernel it is refused, naming the snapshot's disk and the missing setting.
        let err = choose(Some("/images/layered.ext4"), &[snapshot, operator]).unwrap_err();
        assert!(
            err.contains("/images/plain.ext4") && err.contains(super::super::guest::ENV_KERNEL),
            "{err}"
        );
        let err = choose(Some("/images/layered.ext4"), &[snapshot]).unwrap_err();
        assert!(err.contains("initramfs"), "{err}");
    }

    #[test]
    fn test_same_file_is_one_inode_not_one_spelling() {
        let dir = std::env::temp_dir().join(format!("airlock-same-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.ext4");
        std::fs::write(&a, b"disk").unwrap();
        std::fs::hard_link(&a, dir.join("b.ext4")).unwrap();
        std::fs::write(dir.join("copy.ext4"), b"disk").unwrap();
        assert!(same_file(&a, &dir.join("./b.ext4")));
        assert!(!same_file(&a, &dir.join("copy.ext4")));
        assert!(!same_file(&a, &dir.join("missing.ext4")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_disk_plan_prepare_refuses_a_missing_root_disk_or_snapshot_overlay() {
        let dir = std::env::temp_dir().join(format!("airlock-disks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = DiskPlan {
            root: dir.join("none.ext4"),
            overlay: dir.join(OVERLAY_FILE),
            start: OverlayStart::Fresh { size_bytes: 1 },
        };
        let err = missing.prepare((0, 0)).unwrap_err();
        assert!(matches!(err, DiskError::NoRootDisk(_)), "{err}");
        std::fs::write(dir.join("root.ext4"), b"").unwrap();
        let no_copy = DiskPlan {
            root: dir.join("root.ext4"),
            overlay: dir.join(OVERLAY_FILE),
            start: OverlayStart::Copy {
                from: dir.join("snap/disk-1.img"),
            },
        };
        let err = no_copy.prepare((0, 0)).unwrap_err();
        assert!(err.to_string().contains("disk-1.img"), "{err}");
        assert!(!dir.join(OVERLAY_FILE).exists());
        // A paused VM's own overlay disk must still be there.
        let kept = DiskPlan {
            start: OverlayStart::Keep,
            ..no_copy.clone()
        };
        let err = kept.prepare((0, 0)).unwrap_err();
        assert!(matches!(err, DiskError::NoKeptOverlay(_)), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_host_owner_maps_the_sandbox_user_through_the_id_maps() {
        let map = |outside| {
            vec![airlock_policy::IdMap {
                inside: 0,
                outside,
                count: 65536,
            }]
        };
        let identity = IdentityPlan {
            uid_map: map(200_000),
            gid_map: map(300_000),
            uid: 1000,
            gid: 1000,
            privileged_caller: true,
            lookup: None,
            groups: Vec::new(),
            root_file_caps: false,
        };
        assert_eq!(host_owner(&identity), (201_000, 301_000));
        let single = IdentityPlan {
            uid_map: Vec::new(),
            gid_map: Vec::new(),
            ..identity
        };
        assert_eq!(host_owner(&single), (1000, 1000));
    }
}
