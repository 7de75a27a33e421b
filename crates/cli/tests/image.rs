//! `airlock image ...` end to end, as root, against Debian's docker-registry on loopback: a pull
//! killed with SIGKILL midway recovers on the next pull, two concurrent pull processes download
//! and unpack each layer once, credentials come from a Docker config.json, and ls / inspect /
//! rm / prune behave. The registry rig and the test images are the image crate's
//! (crates/image/tests/common, scripts/test-images.sh).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

#[path = "../../image/tests/common/mod.rs"]
mod rig;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rig::{Front, Gate, Registry, Scratch, images};

fn airlock(store: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_airlock"));
    command.arg("image").arg("--store").arg(store);
    command
}

fn run(mut command: Command) -> Output {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The single `*.partial` download in the store's tmp/, with its size.
fn partial(store: &Path) -> Option<(PathBuf, u64)> {
    std::fs::read_dir(store.join("tmp"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "partial"))
        .and_then(|p| std::fs::metadata(&p).ok().map(|m| (p, m.len())))
}

/// Starts `airlock image pull` and SIGKILLs it once its partial download holds `at_least`
/// bytes. Returns the partial's size at the kill.
fn pull_killed_at(store: &Path, reference: &str, at_least: u64) -> u64 {
    let mut child = airlock(store)
        .args(["pull", reference])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some((_, size)) = partial(store)
            && size >= at_least
        {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pull ended before it could be killed"
        );
        assert!(
            Instant::now() < deadline,
            "the partial download never reached {at_least} bytes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    partial(store).unwrap().1
}

#[test]
fn test_image_pull_killed_midway_recovers() {
    let registry = Registry::start();
    registry.push("python", "gzip", "airlock/python:gzip");
    // A throttled front (20 MB/s) so that the 70+ MB layer is still arriving when killed.
    let slow = Front::start(
        registry.port,
        Gate::Throttle {
            bytes_per_second: 20_000_000,
        },
    );
    let scratch = Scratch::new("cli-kill");
    let store = scratch.0.join("store");
    let slow_ref = format!("127.0.0.1:{}/airlock/python:gzip", slow.port);
    let first = pull_killed_at(&store, &slow_ref, 16 << 20);
    // Killed: nothing is recorded or published, the partial blob stays for the next pull.
    let listed = run({
        let mut c = airlock(&store);
        c.arg("ls");
        c
    });
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).lines().count(),
        1,
        "only the header"
    );
    assert_eq!(
        std::fs::read_dir(store.join("layers/sha256"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(store.join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
    // Killed again, later in the same download: the resumed bytes are kept too.
    let second = pull_killed_at(&store, &slow_ref, first + (16 << 20));
    assert!(second > first);
    // The next pull finishes the job, fetching only what is missing.
    let direct = format!("{}/airlock/python:gzip", registry.host());
    let report = json(&run({
        let mut c = airlock(&store);
        c.args(["pull", "--json", &direct]);
        c
    }));
    let layer = &report["layers"][0];
    let size = std::fs::metadata(
        images().join("layouts/python/blobs/sha256").join(
            layer["blob"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:"),
        ),
    )
    .unwrap()
    .len();
    let downloaded = layer["downloaded_bytes"].as_u64().unwrap();
    assert_eq!(downloaded, size - second, "resumed from the partial file");
    assert_eq!(layer["unpacked"], true);
    let details = json(&run({
        let mut c = airlock(&store);
        c.args(["inspect", &direct]);
        c
    }));
    let dir = PathBuf::from(details["layers"][0]["directory"].as_str().unwrap());
    assert!(dir.join("usr/bin/python3").exists() || dir.join("usr/bin/python3.11").exists());
    assert!(dir.join("usr/lib/python3.11/os.py").is_file());
    let leftovers: Vec<_> = std::fs::read_dir(store.join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn test_image_two_pull_processes_share_layers() {
    let registry = Registry::start();
    registry.push("busybox", "layered", "airlock/busybox:layered");
    // Throttled so that the two processes overlap for sure.
    let slow = Front::start(
        registry.port,
        Gate::Throttle {
            bytes_per_second: 1_000_000,
        },
    );
    let scratch = Scratch::new("cli-concurrent");
    let store = scratch.0.join("store");
    let reference = format!("127.0.0.1:{}/airlock/busybox:layered", slow.port);
    let children: Vec<_> = (0..2)
        .map(|_| {
            airlock(&store)
                .args(["pull", "--json", &reference])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let reports: Vec<serde_json::Value> = children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            json(&output)
        })
        .collect();
    for position in 0..2 {
        let unpacked = reports
            .iter()
            .filter(|r| r["layers"][position]["unpacked"] == true)
            .count();
        let downloaded = reports
            .iter()
            .filter(|r| r["layers"][position]["downloaded_bytes"].as_u64() > Some(0))
            .count();
        assert_eq!(
            (unpacked, downloaded),
            (1, 1),
            "layer {position}: {reports:?}"
        );
    }
    assert_eq!(reports[0]["digest"], reports[1]["digest"]);
    assert_eq!(
        std::fs::read_dir(store.join("layers/sha256"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().is_dir())
            .count(),
        2
    );
}

#[test]
fn test_image_pull_credentials_from_docker_config() {
    let registry = Registry::start();
    registry.push("busybox", "gzip", "airlock/busybox:gzip");
    let gate = Front::start(
        registry.port,
        Gate::Token {
            user: "bob".into(),
            password: "hunter2".into(),
            token: "abc.def".into(),
        },
    );
    let scratch = Scratch::new("cli-auth");
    let store = scratch.0.join("store");
    let reference = format!("127.0.0.1:{}/airlock/busybox:gzip", gate.port);
    let config = scratch.0.join("docker");
    std::fs::create_dir_all(&config).unwrap();
    let denied = airlock(&store)
        .args(["pull", &reference])
        .env("DOCKER_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(denied.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("HTTP 401") && stderr.contains("token"),
        "{stderr}"
    );
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("bob:hunter2");
    std::fs::write(
        config.join("config.json"),
        format!(
            r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"{auth}"}}}}}}"#,
            gate.port
        ),
    )
    .unwrap();
    let output = run({
        let mut c = airlock(&store);
        c.args(["pull", &reference]).env("DOCKER_CONFIG", &config);
        c
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Digest: sha256:"), "{stdout}");
    assert!(gate.tokens.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[test]
fn test_image_import_ls_inspect_rm_prune() {
    let scratch = Scratch::new("cli-manage");
    let store = scratch.0.join("store");
    let tarball = images().join("busybox.tar");
    let imported = run({
        let mut c = airlock(&store);
        c.args(["import", "--tag", "airlock/local:1"]).arg(&tarball);
        c
    });
    let digest = String::from_utf8_lossy(&imported.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert!(digest.starts_with("sha256:"));
    let listed = String::from_utf8_lossy(
        &run({
            let mut c = airlock(&store);
            c.arg("ls");
            c
        })
        .stdout,
    )
    .into_owned();
    assert!(
        listed.contains("docker.io/airlock/local:1") && listed.contains(&digest[7..19]),
        "{listed}"
    );
    let details = json(&run({
        let mut c = airlock(&store);
        c.args(["inspect", "airlock/local:1"]);
        c
    }));
    assert_eq!(details["digest"], digest.as_str());
    assert_eq!(details["layers"][0]["present"], true);
    let missing = airlock(&store)
        .args(["inspect", "airlock/other:1"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no image `airlock/other:1`"));
    let removed = run({
        let mut c = airlock(&store);
        c.args(["rm", "airlock/local:1"]);
        c
    });
    assert!(String::from_utf8_lossy(&removed.stdout).contains("removed docker.io/airlock/local:1"));
    let pruned = String::from_utf8_lossy(
        &run({
            let mut c = airlock(&store);
            c.arg("prune");
            c
        })
        .stdout,
    )
    .into_owned();
    assert!(
        pruned.starts_with("removed 1 images, 1 layers, 1 blobs"),
        "{pruned}"
    );
    assert_eq!(
        std::fs::read_dir(store.join("layers/sha256"))
            .unwrap()
            .count(),
        0
    );
}

/// `debugfs -R COMMAND DISK` (read-only): its standard output.
fn debugfs(disk: &Path, command: &str) -> String {
    let output = run({
        let mut c = Command::new("debugfs");
        c.arg("-R").arg(command).arg(disk);
        c
    });
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn test_image_disk_prints_the_cached_root_disk_and_overlay_disk_makes_upper_and_work() {
    let scratch = Scratch::new("cli-disk");
    let store = scratch.0.join("store");
    run({
        let mut c = airlock(&store);
        c.args(["import", "--tag", "airlock/disk:1"])
            .arg(images().join("busybox.tar"));
        c
    });
    let disk = || {
        let output = run({
            let mut c = airlock(&store);
            c.args(["disk", "airlock/disk:1"]);
            c
        });
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    };
    let first = disk();
    assert!(first.starts_with(store.join("disks/sha256")), "{first:?}");
    assert_eq!(
        debugfs(&first, "cat /etc/motd"),
        "Welcome to the Airlock test image\n"
    );
    // Cached: the same file, not rebuilt.
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&first).unwrap());
    assert_eq!(disk(), first);
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&first).unwrap()),
        inode
    );
    let missing = airlock(&store)
        .args(["disk", "airlock/none:1"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(125));

    let overlay = scratch.0.join("overlay.img");
    let mut make = Command::new(env!("CARGO_BIN_EXE_airlock"));
    make.args(["image", "overlay-disk", "--size-mib", "64"])
        .arg(&overlay);
    run(make);
    assert_eq!(std::fs::metadata(&overlay).unwrap().len(), 64 << 20);
    let listing = debugfs(&overlay, "ls /");
    assert!(
        listing.contains("upper") && listing.contains("work"),
        "{listing}"
    );
    let small = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["image", "overlay-disk", "--size-mib", "1"])
        .arg(scratch.0.join("small.img"))
        .output()
        .unwrap();
    assert_eq!(small.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&small.stderr).contains("smaller than"));
}
