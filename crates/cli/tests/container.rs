//! The container tier through `airlock run --image`, proven from inside with `airlock-probe`
//! (which the test images carry at /usr/bin/airlock-probe), each denial beside a control that
//! shows the same action working outside or on the process tier. Every `airlock` invocation
//! is followed by a check that it left no cgroup or mount behind.
//!
//! Needs root and a prior `cargo build --workspace`, and Debian's busybox-static.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::image::{PROBE, TestImage, config};
use common::*;

/// Runs the image's probe inside a container-tier sandbox of `image` (a description path).
fn in_image(image: &str, sandbox_args: &[&str], probe_args: &[&str]) -> Run {
    let mut args = vec!["run", "--image", image];
    args.extend_from_slice(sandbox_args);
    args.push("--");
    args.push(PROBE);
    args.extend_from_slice(probe_args);
    airlock(&args)
}

/// A shell command in a container-tier sandbox of `image`.
fn sh(image: &str, sandbox_args: &[&str], script: &str) -> Run {
    let mut args = vec!["run", "--image", image];
    args.extend_from_slice(sandbox_args);
    args.extend(["--", "/bin/sh", "-c", script]);
    airlock(&args)
}

#[test]
fn test_container_host_is_invisible_and_the_image_is_present() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img").plain();
    let marker = scratch.dir.join("host-marker");
    fs::write(&marker, "on the host").unwrap();
    let marker = marker.to_str().unwrap();

    let hidden = in_image(&image, &[], &["stat", marker]);
    assert_eq!(hidden.verdict(), "errno 2 ENOENT", "{hidden:?}");
    assert!(
        outside(&scratch, &["stat", marker]).starts_with("ok"),
        "control"
    );
    let on_process_tier = inside(&scratch, &[], &["stat", marker]);
    assert!(
        on_process_tier.verdict().starts_with("ok"),
        "control: the process tier shows the host: {on_process_tier:?}"
    );

    let motd = in_image(&image, &[], &["read", "/etc/motd"]);
    assert_eq!(motd.verdict(), "ok 15", "the image's own file: {motd:?}");
    for host_only in [
        "/etc/hostname",
        "/usr/lib",
        "/var/lib/airlock",
        "/home/alice/.ssh",
    ] {
        let run = in_image(&image, &[], &["stat", host_only]);
        assert_eq!(run.verdict(), "errno 2 ENOENT", "{host_only}: {run:?}");
    }
    let listing = sh(&image, &[], "ls / | tr '\\n' ' '");
    assert_eq!(
        listing.stdout.trim(),
        "bin dev etc home proc root sys tmp usr var workspace",
        "the image's top level plus Airlock's mount points: {listing:?}"
    );
    let mounts = sh(&image, &[], "cat /proc/self/mountinfo");
    assert!(
        !mounts.stdout.contains(scratch.dir.to_str().unwrap()),
        "no host path of the layers shows in the mount table: {}",
        mounts.stdout
    );
}

#[test]
fn test_container_layers_stack_with_whiteouts_and_opaque_directories() {
    let scratch = Scratch::new();
    let mut image = TestImage::busybox(&scratch, "img");
    fs::create_dir_all(image.top().join("opt/old")).unwrap();
    fs::write(image.top().join("opt/old/hidden"), "lower").unwrap();
    fs::write(image.top().join("etc/removed"), "lower").unwrap();
    let top = image.add_layer();
    fs::create_dir_all(top.join("etc")).unwrap();
    fs::write(top.join("etc/motd"), "from the top layer\n").unwrap();
    image.whiteout("etc/removed");
    fs::create_dir_all(top.join("opt/old")).unwrap();
    fs::write(top.join("opt/old/new"), "top").unwrap();
    let marked = std::process::Command::new("python3")
        .args([
            "-c",
            "import os,sys; os.setxattr(sys.argv[1], 'trusted.overlay.opaque', b'y')",
            top.join("opt/old").to_str().unwrap(),
        ])
        .status()
        .is_ok_and(|s| s.success());
    let run = sh(
        &image.plain(),
        &[],
        "cat /etc/motd; test -e /etc/removed && echo present || echo gone; ls /opt/old | tr '\\n' ' '",
    );
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0], "from the top layer",
        "the upper layer wins: {run:?}"
    );
    assert_eq!(lines[1], "gone", "a whiteout deletes the lower file");
    assert!(marked, "python3 set the opaque xattr (test equipment)");
    assert_eq!(
        lines[2].trim(),
        "new",
        "an opaque directory hides the lower one"
    );
}

#[test]
fn test_container_deep_image_of_200_layers_mounts() {
    let scratch = Scratch::new();
    let mut image = TestImage::busybox(&scratch, "img");
    for i in 1..200 {
        let layer = image.add_layer();
        fs::create_dir_all(layer.join("layers")).unwrap();
        fs::write(layer.join(format!("layers/{i}")), "").unwrap();
        fs::write(layer.join("layers/top"), i.to_string()).unwrap();
    }
    assert_eq!(image.layers.len(), 200);
    let run = sh(&image.plain(), &[], "ls /layers | wc -l; cat /layers/top");
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "200\n199", "{run:?}");
}

#[test]
fn test_container_writes_land_in_the_upper_directory_and_vanish() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img");
    let description = image.plain();
    let layer_motd = image.layers[0].join("etc/motd");
    let before = fs::read(&layer_motd).unwrap();

    let write = sh(
        &description,
        &[],
        "echo changed > /etc/motd && mkdir /app && echo made > /app/file && cat /etc/motd /app/file && rm /bin/vi && ls /bin/vi 2>&1 | wc -l",
    );
    assert_eq!(write.code, 0, "the root is writable: {write:?}");
    assert_eq!(write.stdout, "changed\nmade\n1\n");
    assert_eq!(
        fs::read(&layer_motd).unwrap(),
        before,
        "the layer is untouched"
    );
    assert!(
        image.layers[0].join("bin/vi").exists(),
        "nor is a deleted file gone from it"
    );

    let again = sh(&description, &[], "cat /etc/motd; ls /app 2>&1 | wc -l");
    assert_eq!(
        again.stdout, "from the image\n1\n",
        "the next sandbox starts from the image again"
    );

    // The upper directory shares the scratch space with /tmp: it counts against --disk.
    let budget = sh(
        &description,
        &["--disk", "16MiB"],
        "dd if=/dev/zero of=/root/a bs=1M count=10 2>/dev/null && echo first; \
         dd if=/dev/zero of=/tmp/b bs=1M count=10 2>&1 | grep -c 'No space left'",
    );
    assert_eq!(budget.stdout, "first\n1\n", "{budget:?}");
}

#[test]
fn test_container_env_workdir_user_and_entrypoint_apply() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img");
    let described = image.describe(
        "configured",
        config(
            &["PATH=/bin:/usr/bin", "GREETING=from-image", "ONLY_IMAGE=1"],
            Some("/home/alice"),
            Some("alice"),
            &["/bin/echo", "entry"],
            &["default-cmd"],
        ),
    );
    let default = airlock(&["run", "--image", &described]);
    assert_eq!(default.code, 0, "{default:?}");
    assert_eq!(default.stdout, "entry default-cmd\n", "entrypoint + cmd");
    let replaced = airlock(&["run", "--image", &described, "--", "given"]);
    assert_eq!(
        replaced.stdout, "entry given\n",
        "CMD replaces cmd, keeps the entrypoint"
    );

    let shell = image.describe(
        "shell",
        config(
            &["PATH=/bin:/usr/bin", "GREETING=from-image", "ONLY_IMAGE=1"],
            Some("/home/alice"),
            Some("alice"),
            &[],
            &[],
        ),
    );
    let who = sh(
        &shell,
        &["--env", "GREETING=from-caller"],
        "id; pwd; echo $HOME $GREETING $ONLY_IMAGE $PATH",
    );
    assert_eq!(who.code, 0, "{who:?}");
    assert_eq!(
        who.stdout,
        "uid=1000(alice) gid=1000(alice) groups=50(staff)\n/home/alice\n/home/alice from-caller 1 /bin:/usr/bin\n",
        "the image's user with its groups and home, its workdir, its env under the caller's"
    );
    let probe_who = in_image(&shell, &[], &["whoami"]);
    assert_eq!(probe_who.verdict(), "ok uid=1000 gid=1000 euid=1000");

    let overridden = sh(
        &shell,
        &["--user", "1001:50", "--cwd", "/tmp"],
        "id; pwd; echo $HOME",
    );
    assert_eq!(
        overridden.stdout, "uid=1001(bob) gid=50(staff)\n/tmp\n/home/bob\n",
        "--user and --cwd win over the image: {overridden:?}"
    );
    let fresh = sh(
        &shell,
        &[],
        "ls -ld /workspace | awk '{print $3}'; touch /workspace/x && echo ok",
    );
    assert_eq!(
        fresh.stdout, "alice\nok\n",
        "the fresh workspace is the user's"
    );

    let unknown = image.describe(
        "unknown",
        config(&[], None, Some("mallory"), &[], &["true"]),
    );
    let run = airlock(&["run", "--image", &unknown]);
    assert_eq!(run.code, 125, "{run:?}");
    assert!(
        run.stderr
            .contains("user `mallory` is not in the image's /etc/passwd"),
        "{}",
        run.stderr
    );
}

#[test]
fn test_container_keeps_every_denial_of_the_process_tier() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img").plain();
    // Landlock: no device node anywhere, though the root is writable.
    let mknod = in_image(&image, &[], &["mknod-char", "/tmp/null"]);
    assert_eq!(mknod.verdict(), "errno 13 EACCES", "{mknod:?}");
    // /proc, /sys and /dev are read-only on this tier.
    for path in ["/proc/self/comm", "/dev/airlock", "/sys/kernel/airlock"] {
        let run = in_image(&image, &[], &["write", path]);
        assert_eq!(run.verdict(), "errno 30 EROFS", "{path}: {run:?}");
    }
    assert_eq!(outside(&scratch, &["write", "/proc/self/comm"]), "ok");
    for path in [
        "/dev/null",
        "/dev/shm/x",
        "/tmp/x",
        "/workspace/x",
        "/etc/x",
    ] {
        let run = in_image(&image, &[], &["write", path]);
        assert_eq!(run.verdict(), "ok", "{path}: {run:?}");
    }
    // seccomp.
    for (action, expect) in [
        ("ptrace", "errno 1 EPERM"),
        ("mount", "errno 1 EPERM"),
        ("userns", "errno 1 EPERM"),
    ] {
        let run = in_image(&image, &[], &[action]);
        assert_eq!(run.verdict(), expect, "{action}: {run:?}");
    }
    // No privileges but root's own file capabilities (test_container_root_keeps_only_...).
    let status = in_image(&image, &["--user", "1000"], &["status"]);
    assert_eq!(
        status.verdict(),
        "ok CapEff=0 CapPrm=0 CapBnd=0 CapAmb=0 NoNewPrivs=1 Seccomp=2",
        "{status:?}"
    );
    // Namespaces: host processes and the host's loopback are out of reach.
    let me = std::process::id().to_string();
    assert_eq!(
        in_image(&image, &[], &["pid-visible", &me]).verdict(),
        "errno 3 ESRCH"
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    assert_eq!(
        in_image(&image, &[], &["connect", &address]).verdict(),
        "errno 111 ECONNREFUSED"
    );
    // cgroups.
    let bomb = in_image(&image, &["--pids", "32"], &["forkbomb", "200"]);
    assert!(bomb.verdict().contains("errno 11"), "{bomb:?}");
    let memory = in_image(&image, &["--memory", "64MiB"], &["alloc", "256"]);
    assert_eq!(memory.code, 137, "{memory:?}");
    // init and its descriptors are out of reach; only stdio crosses in.
    assert_eq!(
        in_image(&image, &[], &["open-write", "/proc/1/exe"]).verdict(),
        "errno 13 EACCES",
        "init (a host binary) cannot be rewritten through /proc (CVE-2019-5736)"
    );
    assert_eq!(in_image(&image, &[], &["fds"]).verdict(), "ok 0,1,2");
}

#[test]
fn test_container_root_keeps_only_its_file_capabilities() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img").plain();
    // CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE: 0x4fb.
    let status = in_image(&image, &["--user", "0"], &["status"]);
    assert_eq!(
        status.verdict(),
        "ok CapEff=4fb CapPrm=4fb CapBnd=4fb CapAmb=0 NoNewPrivs=1 Seccomp=2",
        "{status:?}"
    );
    // What a package manager needs: files owned by the image's users, a set-group-id
    // directory, and another user's private directory entered.
    let packages = sh(
        &image,
        &["--user", "0"],
        "mkdir -p /srv/private && chown 1000:1000 /srv /srv/private && chmod 2775 /srv \
         && chmod 700 /srv/private && touch /srv/private/file && stat -c '%u:%g %a' /srv",
    );
    assert_eq!(packages.stdout.trim(), "1000:1000 2775", "{packages:?}");
    // Still refused to root: set-user-id files, device nodes, init's binary, mounts.
    assert_eq!(
        in_image(&image, &["--user", "0"], &["chmod-setuid", "/bin/busybox"]).verdict(),
        "errno 1 EPERM"
    );
    assert_eq!(
        in_image(&image, &["--user", "0"], &["mknod-char", "/tmp/null"]).verdict(),
        "errno 13 EACCES"
    );
    assert_eq!(
        in_image(&image, &["--user", "0"], &["open-write", "/proc/1/exe"]).verdict(),
        "errno 13 EACCES"
    );
    assert_eq!(
        in_image(&image, &["--user", "0"], &["mount"]).verdict(),
        "errno 1 EPERM"
    );
    // Another user of the image holds nothing, and the process tier's root neither.
    assert_eq!(
        in_image(&image, &["--user", "1000"], &["status"]).verdict(),
        "ok CapEff=0 CapPrm=0 CapBnd=0 CapAmb=0 NoNewPrivs=1 Seccomp=2"
    );
    assert_eq!(
        airlock(&["run", "--user", "0", "--", &scratch.probe(), "status"]).verdict(),
        "ok CapEff=0 CapPrm=0 CapBnd=0 CapAmb=0 NoNewPrivs=1 Seccomp=2"
    );
}

/// Debian's `groupadd` (shadow, built with libaudit) opens the audit netlink before anything
/// else and aborts on EPERM: the filter answers EPROTONOSUPPORT there, as a kernel without audit
/// does, so a package's post-install script that adds its system group works as the image's
/// root, while the socket stays closed.
#[test]
fn test_container_root_adds_a_group_with_debians_groupadd() {
    let scratch = Scratch::new();
    let root = scratch.workspace("debian");
    let images = std::env::var_os("AIRLOCK_TEST_IMAGES").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-images"),
        std::path::PathBuf::from,
    );
    let tarball = images.join("python.tar");
    assert!(
        tarball.is_file(),
        "{} is missing: run scripts/test-images.sh",
        tarball.display()
    );
    let unpacked = std::process::Command::new("tar")
        .args(["-x", "--exclude=./dev/*", "-f"])
        .arg(&tarball)
        .arg("-C")
        .arg(&root)
        .status()
        .unwrap();
    assert!(unpacked.success(), "tar -x of {}", tarball.display());
    let root = root.to_str().unwrap();
    let added = sh(
        root,
        &["--user", "0"],
        "groupadd --system airlock-group && getent group airlock-group",
    );
    assert_eq!(added.code, 0, "{added:?}");
    assert!(added.stdout.starts_with("airlock-group:x:"), "{added:?}");
    let audit = sh(
        root,
        &["--user", "0"],
        "python3 -c 'import socket\ntry:\n    socket.socket(16, 3, 9)\nexcept OSError as e:\n    print(e.errno)'",
    );
    assert_eq!(
        audit.stdout.trim(),
        "93", // EPROTONOSUPPORT
        "the audit socket stays closed: {audit:?}"
    );
}

#[test]
fn test_container_hostile_image_links_cannot_redirect_mounts() {
    let scratch = Scratch::new();
    let mut image = TestImage::busybox(&scratch, "img");
    let top = image.add_layer();
    fs::create_dir_all(top.join("etc")).unwrap();
    for (link, target) in [
        ("proc", "/"),
        ("tmp", "/etc"),
        ("workspace", "/usr"),
        ("dev", "/home"),
        ("sys", "../../.."),
    ] {
        std::os::unix::fs::symlink(target, top.join(link)).unwrap();
    }
    // The user lookup must neither hang on an endless file nor follow a link out.
    std::os::unix::fs::symlink("/dev/zero", top.join("etc/group")).unwrap();
    let description = image.describe("hostile", config(&[], None, Some("alice"), &[], &[]));
    let run = airlock(&[
        "run",
        "--image",
        &description,
        "--",
        "/bin/sh",
        "-c",
        "id -u; stat -c %F /proc /tmp /workspace /dev /sys; ls /proc/self/status; touch /tmp/x /workspace/y && ls /etc/x /usr/y 2>&1 | wc -l",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "1000\ndirectory\ndirectory\ndirectory\ndirectory\ndirectory\n/proc/self/status\n2\n",
        "every mount point became a directory of its own: {run:?}"
    );

    // A FIFO as /etc/passwd would block a reader forever: it is refused, not opened.
    let mut fifo = TestImage::busybox(&scratch, "fifo");
    let layer = fifo.add_layer();
    fs::create_dir_all(layer.join("etc")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(layer.join("etc/passwd"))
        .status()
        .unwrap();
    assert!(made.success());
    let description = fifo.describe("fifo", config(&[], None, Some("alice"), &[], &["true"]));
    let run = airlock(&["run", "--image", &description]);
    assert_eq!(run.code, 125, "{run:?}");
    assert!(run.stderr.contains("/etc/passwd"), "{}", run.stderr);
}

#[test]
fn test_container_bad_images_get_one_line_errors() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img");
    let missing = image.describe(
        "missing",
        serde_json::json!({"env": [], "working_dir": null, "user": null, "entrypoint": [], "cmd": ["true"]}),
    );
    let text = fs::read_to_string(&missing).unwrap();
    let broken = scratch.dir.join("broken.json");
    fs::write(&broken, text.replace("/000", "/nope")).unwrap();
    let run = airlock(&["run", "--image", broken.to_str().unwrap()]);
    assert_eq!(run.code, 125, "{run:?}");
    assert!(
        run.stderr.contains("image layer") && run.stderr.contains("nope"),
        "{}",
        run.stderr
    );

    let layout = scratch.workspace("layout");
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let run = airlock(&["run", "--image", layout.to_str().unwrap(), "--", "true"]);
    assert_eq!(run.code, 125);
    assert!(run.stderr.contains("OCI layout"), "{}", run.stderr);

    let no_cmd = airlock(&["run", "--image", &image.plain()]);
    assert_eq!(no_cmd.code, 125);
    assert!(
        no_cmd.stderr.contains("no entrypoint and no cmd"),
        "{}",
        no_cmd.stderr
    );

    let garbage = scratch.dir.join("garbage.json");
    fs::write(&garbage, "{\"digest\": 1}").unwrap();
    let run = airlock(&["run", "--image", garbage.to_str().unwrap(), "--", "true"]);
    assert_eq!(run.code, 125);
    assert!(
        run.stderr.contains("not an image description"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

/// Host uid of the process running `airlock-probe sleep-marker MARKER`.
fn host_uid_of(marker: &str) -> u32 {
    let pids = processes_with(marker);
    let pid = pids.first().expect("the workload runs");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn test_two_live_sandboxes_never_share_a_host_uid_on_either_tier() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img").plain();
    let probe = scratch.probe();
    let markers = [unique_marker("range-a"), unique_marker("range-b")];
    let children: Vec<_> = [
        vec![
            "run",
            "--image",
            &image,
            "--",
            PROBE,
            "sleep-marker",
            &markers[0],
        ],
        vec!["run", "--", &probe, "sleep-marker", &markers[1]],
    ]
    .iter()
    .map(|args| spawn_airlock(args))
    .collect();
    for marker in &markers {
        assert!(
            eventually(|| !processes_with(marker).is_empty()),
            "the sandbox never started"
        );
    }
    let uids: Vec<u32> = markers.iter().map(|m| host_uid_of(m)).collect();
    for child in children {
        let pid = child.id();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let _ = child.wait_with_output();
        assert_no_leftovers(pid);
    }
    assert_ne!(
        uids[0], uids[1],
        "each sandbox has a host id range of its own"
    );
    for uid in &uids {
        assert!(*uid >= 0x7000_0000, "an unprivileged range: {uid:#x}");
        assert_eq!(
            (uid - 0x7000_0000) % 65_536,
            0,
            "uid 0 inside is its range's base"
        );
    }
}

#[test]
fn test_container_host_workspace_keeps_host_owners_through_the_idmap() {
    let scratch = Scratch::new();
    let image = TestImage::busybox(&scratch, "img").plain();
    let workspace = scratch.workspace("ws");
    fs::write(workspace.join("input"), "from the host").unwrap();
    std::os::unix::fs::chown(workspace.join("input"), Some(1000), Some(1000)).unwrap();
    let ws = workspace.to_str().unwrap();
    let run = sh(
        &image,
        &["--workspace", ws],
        "stat -c %u /workspace/input; cat /workspace/input; echo made > /workspace/output",
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "1000\nfrom the host");
    let meta = fs::metadata(workspace.join("output")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (0, 0),
        "root inside writes as the host's 0"
    );
}
