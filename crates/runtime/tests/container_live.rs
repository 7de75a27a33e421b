//! A long-lived container-tier sandbox on on-disk scratch storage (the daemon's setting): the
//! agent serves from inside the image's root, the overlay's upper directory is in the
//! sandbox's quota-limited volume, the sandbox holds a host id range of its own while it
//! lives, and `destroy` removes all of it. Needs root, loop devices, mkfs.btrfs and the
//! workspace's binaries built.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use airlock_api::{ImageConfig, ImageRootfs, SandboxConfig};
use airlock_runtime::{IdRange, LiveSpec, Runtime, Storage, id_range};

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(format!(
        "/var/tmp/airlock-container-live-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn health(socket: &Path) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn test_container_sandbox_on_disk_scratch_keeps_its_upper_in_the_volume() {
    if airlock_runtime::storage::mkfs_btrfs().is_none() {
        panic!("mkfs.btrfs is missing: apt-get install btrfs-progs");
    }
    let root = scratch("disk");
    let layer = root.join("layers/base");
    std::fs::create_dir_all(layer.join("etc")).unwrap();
    std::fs::write(layer.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    let state = root.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let storage = Storage::open(&state, airlock_runtime::storage::MIN_BYTES).unwrap();
    let mount = storage.mount_point().to_path_buf();
    let _unmount = Unmount(mount.clone());
    let mut runtime = Runtime::with_helper(bin_dir().join("airlock-jail"));
    runtime.set_owner("ctrtest").unwrap();
    runtime.set_storage(storage);

    let image = ImageRootfs {
        digest: "sha256:live".into(),
        layers: vec![layer.clone()],
        config: ImageConfig::default(),
    };
    let dir = root.join("sandbox");
    std::fs::create_dir_all(&dir).unwrap();
    let spec = LiveSpec {
        id: "ctrlive1".into(),
        dir: dir.clone(),
        config: SandboxConfig::for_image(image, &["ignored".into()]),
        volume: Default::default(),
        vm_shell: false,
    };
    let record = runtime.create_live(&spec).unwrap().commit().unwrap();
    let volume = mount.join("volumes/ctrlive1");
    // Checked inside catch_unwind, so that a failed check still destroys the sandbox.
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(
            health(&record.socket).starts_with("HTTP/1.1 204"),
            "the agent answers from inside the image"
        );
        let base = record
            .id_range
            .expect("a root caller's sandbox has a range");
        assert!(
            IdRange::is_held_in(Path::new(id_range::ID_RANGE_DIR), base),
            "the helper holds the range while the sandbox lives"
        );
        // Init made its mount points in the image's root: they are in the volume's upper/.
        let upper = volume.join("upper");
        for made in ["proc", "tmp", "workspace", "run/airlock/agent"] {
            assert!(upper.join(made).exists(), "{made} in {}", upper.display());
        }
        let owner = std::fs::metadata(&upper).unwrap();
        assert_eq!(
            (owner.uid(), owner.gid()),
            (base, base),
            "the upper directory belongs to the sandbox's root"
        );
        assert!(
            !layer.join("proc").exists(),
            "nothing was written into the layer"
        );
        base
    }));
    runtime.destroy(&record);
    let outcome = checked.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    assert!(
        !volume.exists(),
        "the volume and its upper directory are gone"
    );
    assert!(
        !IdRange::is_held_in(Path::new(id_range::ID_RANGE_DIR), outcome),
        "the range is free once the sandbox is gone"
    );
    assert!(
        runtime.adopt(&record).is_err(),
        "a destroyed sandbox cannot be adopted"
    );
    assert!(runtime.storage().unwrap().release(), "no volume is left");
    std::fs::remove_dir_all(&root).unwrap();
}

/// Detaches the test's storage however the test ends (a failed start would leave it mounted).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
}
