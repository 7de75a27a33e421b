//! The microvm tier's disks (root: the store keeps image owners and merges layers with an
//! overlay): the layered busybox test image becomes an ext4 root disk whose files are the
//! merged image's (whiteouts and opaque directories applied, hard links kept), read back
//! with e2fsprogs' `debugfs`, never mounted; it is cached per digest and removed by prune;
//! a sandbox's overlay disk is sparse and holds `upper/` and `work/`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use airlock_image::{ImageStore, ImportOptions};
use common::{Scratch, images};

fn is_root() -> bool {
    airlock_jail::host::effective_uid() == 0
}

/// `debugfs -R COMMAND DISK` (read-only), its standard output.
fn debugfs(disk: &Path, command: &str) -> String {
    let output = Command::new("debugfs")
        .arg("-R")
        .arg(command)
        .arg(disk)
        .output()
        .unwrap();
    assert!(output.status.success(), "debugfs {command}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The names `debugfs ls -l` lists in `dir`.
fn names(disk: &Path, dir: &str) -> Vec<String> {
    let mut names: Vec<String> = debugfs(disk, &format!("ls -l {dir}"))
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    names
}

fn layered_digest(store: &ImageStore) -> String {
    let report = store
        .import(
            &images().join("layouts/busybox"),
            &ImportOptions { tag: None },
            None,
        )
        .unwrap();
    report
        .images
        .iter()
        .find(|i| i.layers.len() == 2)
        .expect("the layered test image")
        .digest
        .clone()
}

#[test]
fn test_root_disk_holds_the_merged_image_and_is_cached_per_digest() {
    if !is_root() {
        eprintln!("SKIPPED: root disks need root (the layers are merged by an overlay)");
        return;
    }
    let scratch = Scratch::new("disk-root");
    let store = scratch.store();
    let digest = layered_digest(&store);
    let disk = store.root_disk(&digest).unwrap();
    assert!(disk.built);
    assert_eq!(disk.digest, digest);
    assert!(disk.path.starts_with(store.root().join("disks/sha256")));

    // Layer one's busybox, byte for byte.
    let busybox = debugfs(&disk.path, "stat /bin/busybox");
    let host_size = std::fs::metadata("/bin/busybox").unwrap().len();
    assert!(busybox.contains(&format!("Size: {host_size}")), "{busybox}");
    assert!(busybox.contains("Mode:  0755"), "{busybox}");
    let dumped = scratch.0.join("busybox");
    debugfs(
        &disk.path,
        &format!("dump /bin/busybox {}", dumped.display()),
    );
    assert_eq!(
        std::fs::read(&dumped).unwrap(),
        std::fs::read("/bin/busybox").unwrap()
    );
    assert!(debugfs(&disk.path, "stat /bin/sh").contains("Fast link dest: \"busybox\""));
    assert!(debugfs(&disk.path, "cat /etc/passwd").starts_with("root:x:0:0:"));
    assert!(debugfs(&disk.path, "stat /tmp").contains("Mode:  01777"));
    // Layer two: /etc/motd whited out, /opt/keep opaque (one and two gone), a hard link and
    // an absolute symlink; no overlay artefact (whiteout device, xattr) is copied.
    assert!(!names(&disk.path, "/etc").contains(&"motd".to_owned()));
    assert!(names(&disk.path, "/etc").contains(&"passwd".to_owned()));
    assert_eq!(names(&disk.path, "/opt/keep"), ["new", "new-link"]);
    assert_eq!(
        debugfs(&disk.path, "cat /opt/keep/new-link"),
        "new in layer two\n"
    );
    assert!(debugfs(&disk.path, "stat /opt/keep/new").contains("Links: 2"));
    assert!(debugfs(&disk.path, "stat /opt/passwd-link").contains("\"/etc/passwd\""));
    assert!(!debugfs(&disk.path, "ea_list /opt/keep").contains("overlay"));

    // Cached: the same file, not rebuilt.
    let inode = std::fs::metadata(&disk.path).unwrap().ino();
    let again = store.root_disk(&digest).unwrap();
    assert!(!again.built);
    assert_eq!(again.path, disk.path);
    assert_eq!(std::fs::metadata(&again.path).unwrap().ino(), inode);
    // Nothing is left in the store's tmp/, and no mount of the build stays behind.
    assert_eq!(
        std::fs::read_dir(store.root().join("tmp")).unwrap().count(),
        0
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&store.root().display().to_string()));

    // Prune removes the disk with its image.
    store.remove(&digest).unwrap();
    store.prune().unwrap();
    assert!(!disk.path.exists());
}

#[test]
fn test_root_disk_of_a_missing_image_is_refused_by_name() {
    let scratch = Scratch::new("disk-missing");
    let store = scratch.store();
    let err = store.root_disk("airlock/none:latest").unwrap_err();
    assert!(
        airlock_jail::error_chain(&err).contains("no image `airlock/none:latest`"),
        "{}",
        airlock_jail::error_chain(&err)
    );
}

#[test]
fn test_overlay_disk_is_sparse_and_holds_upper_and_work() {
    let scratch = Scratch::new("disk-overlay");
    let path = scratch.0.join("overlay.ext4");
    airlock_image::disk::overlay_disk(&path, 256 << 20).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 256 << 20);
    assert!(
        meta.blocks() * 512 < meta.len() / 8,
        "{} bytes allocated",
        meta.blocks() * 512
    );
    assert_eq!(names(&path, "/"), ["lost+found", "upper", "work"]);
    assert!(debugfs(&path, "stat /upper").contains("Mode:  0755"));
    assert!(debugfs(&path, "stat /work").contains("Mode:  0700"));
    assert!(debugfs(&path, "stat /upper").contains("User:     0   Group:     0"));
    let err = airlock_image::disk::overlay_disk(&path, 1 << 20).unwrap_err();
    assert!(err.to_string().contains("smaller than"), "{err}");
}

/// Mount points unmounted (innermost first) on drop, so a failing test leaves none behind.
struct Mounts(Vec<std::path::PathBuf>);

impl Mounts {
    fn mount(&mut self, args: &[&str], target: &Path) {
        std::fs::create_dir_all(target).unwrap();
        let status = Command::new("mount")
            .args(args)
            .arg(target)
            .status()
            .unwrap();
        assert!(status.success(), "mount {args:?} {}", target.display());
        self.0.push(target.to_path_buf());
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        while let Some(target) = self.0.pop() {
            let _ = Command::new("umount").arg(&target).status();
        }
    }
}

#[test]
fn test_overlay_disk_over_the_root_disk_takes_every_write_as_the_guest_mounts_them() {
    if !is_root() {
        eprintln!("SKIPPED: loop and overlay mounts need root");
        return;
    }
    let scratch = Scratch::new("disk-cow");
    let store = scratch.store();
    let root = store.root_disk(&layered_digest(&store)).unwrap();
    let overlay = scratch.0.join("overlay.ext4");
    airlock_image::disk::overlay_disk(&overlay, 64 << 20).unwrap();
    let root_before = std::fs::read(&root.path).unwrap();

    // What the guest's init does with /dev/vda (the image, read-only) and /dev/vdb (its own).
    let (lower, rw, merged) = (
        scratch.0.join("lower"),
        scratch.0.join("rw"),
        scratch.0.join("merged"),
    );
    let mut mounts = Mounts(Vec::new());
    let root_disk = root.path.display().to_string();
    let overlay_disk = overlay.display().to_string();
    mounts.mount(&["-t", "ext4", "-o", "loop,ro", &root_disk], &lower);
    mounts.mount(&["-t", "ext4", "-o", "loop", &overlay_disk], &rw);
    let options = format!(
        "lowerdir={},upperdir={}/upper,workdir={}/work",
        lower.display(),
        rw.display(),
        rw.display()
    );
    mounts.mount(&["-t", "overlay", "overlay", "-o", &options], &merged);
    assert_eq!(
        std::fs::read_to_string(merged.join("opt/keep/new")).unwrap(),
        "new in layer two\n"
    );
    assert!(!merged.join("etc/motd").exists());
    std::fs::write(merged.join("opt/written"), "by the sandbox\n").unwrap();
    std::fs::write(merged.join("etc/passwd"), "changed\n").unwrap();
    std::fs::remove_file(merged.join("bin/sh")).unwrap();
    drop(mounts);

    // The writes are on the sandbox's disk; the image's disk has not changed by a byte.
    assert_eq!(
        debugfs(&overlay, "cat /upper/opt/written"),
        "by the sandbox\n"
    );
    assert_eq!(debugfs(&overlay, "cat /upper/etc/passwd"), "changed\n");
    assert!(debugfs(&overlay, "stat /upper/bin/sh").contains("Type: character special"));
    assert!(std::fs::read(&root.path).unwrap() == root_before);
    assert!(debugfs(&root.path, "cat /etc/passwd").starts_with("root:x:0:0:"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&scratch.0.display().to_string()));
}
