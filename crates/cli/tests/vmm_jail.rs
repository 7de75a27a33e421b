//! The VMM confined by the process tier's jail (root; needs /dev/kvm): `airlock run --rootfs`
//! with a view that holds only the `airlock-vmm` binary, `/dev/kvm` handed in as the VMM's
//! standard input (the view has no device node, and the sandbox's user could not open it), a
//! workspace for the snapshot, and a memory limit. A template snapshotted in one sandbox is
//! forked in others; the VMM's own seccomp allow-list stacks on the jail's filter; without
//! the handed descriptor there is no KVM at all; the memory cgroup bounds the VMM and its
//! guest's RAM.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Dirs {
    rootfs: PathBuf,
    workspace: PathBuf,
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.rootfs);
        let _ = fs::remove_dir_all(&self.workspace);
    }
}

fn dirs() -> Dirs {
    let airlock = PathBuf::from(env!("CARGO_BIN_EXE_airlock"));
    let vmm = airlock.with_file_name("airlock-vmm");
    assert!(
        vmm.is_file(),
        "{} is missing: run `cargo build --workspace` first",
        vmm.display()
    );
    let base = format!("/var/tmp/airlock-vmm-jail-{}", std::process::id());
    let dirs = Dirs {
        rootfs: PathBuf::from(format!("{base}-root")),
        workspace: PathBuf::from(format!("{base}-ws")),
    };
    fs::create_dir_all(dirs.rootfs.join("bin")).unwrap();
    fs::create_dir_all(&dirs.workspace).unwrap();
    fs::copy(&vmm, dirs.rootfs.join("bin/airlock-vmm")).unwrap();
    // The binary must need nothing else from the view (the workspace builds it static).
    let ldd = Command::new("ldd").arg(&vmm).output().unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    assert!(
        ldd.contains("statically linked") || ldd.contains("not a dynamic"),
        "{ldd}"
    );
    dirs
}

fn jailed(dirs: &Dirs, memory: &str, kvm: bool, vmm_args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_airlock"));
    command.arg("run").arg("--rootfs").arg(&dirs.rootfs);
    command.arg("--workspace").arg(&dirs.workspace);
    command.args(["--memory", memory, "--pids", "8", "--"]);
    command.arg("/bin/airlock-vmm").args(vmm_args);
    if kvm {
        let device = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .unwrap();
        command.stdin(Stdio::from(device)).args(["--kvm-fd", "0"]);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn test_vmm_in_process_tier_jail_forks_and_stays_confined() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm does not exist on this host");
        return;
    }
    let dirs = dirs();
    let template = ["template", "--snapshot", "/workspace/snap", "--steps", "5"];
    let out = jailed(&dirs, "64MiB", true, &template);
    assert!(out.status.success(), "{}", text(&out));
    assert!(dirs.workspace.join("snap/state.json").is_file());

    let fork = [
        "fork",
        "--snapshot",
        "/workspace/snap",
        "--identity",
        "7",
        "--steps",
        "3",
    ];
    let out = jailed(&dirs, "64MiB", true, &fork);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("printed: 12 19 26\ncounter: 26\n"),
        "{}",
        text(&out)
    );

    // The VMM's allow-list is in force inside the jail: an open after set-up kills it.
    let out = jailed(
        &dirs,
        "64MiB",
        true,
        &[&fork[..], &["--then-open", "/bin/airlock-vmm"]].concat(),
    );
    assert_eq!(
        out.status.code(),
        Some(128 + 31), // SIGSYS
        "{}",
        text(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("opened"),
        "{}",
        text(&out)
    );

    // Without the handed descriptor the view has no /dev/kvm.
    let out = jailed(&dirs, "64MiB", false, &fork);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("opening /dev/kvm failed: No such file"),
        "{}",
        text(&out)
    );

    // The sandbox's memory cgroup holds the VMM (and the guest RAM it touches).
    let out = jailed(
        &dirs,
        "1MiB",
        true,
        &["template", "--snapshot", "/workspace/small", "--steps", "5"],
    );
    assert_eq!(out.status.code(), Some(137), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory limit"),
        "{}",
        text(&out)
    );
}
