//! The `airlock-vmm` binary as its own process: a template snapshotted by one process and
//! forked by others, each fork counting from the snapshot by its own identity under the VMM's
//! seccomp allow-list, which kills the process when it tries anything off the list.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

fn vmm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_airlock-vmm"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn test_vmm_process_forks_count_under_the_allow_list_and_off_list_calls_die() {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm does not exist on this host");
        return;
    }
    let dir = std::env::temp_dir().join(format!("airlock-vmm-process-{}", std::process::id()));
    let snap = dir.to_str().unwrap();
    let out = vmm(&["template", "--snapshot", snap, "--steps", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = vmm(&[
        "fork",
        "--snapshot",
        snap,
        "--identity",
        "10",
        "--steps",
        "2",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("printed: 15 25\ncounter: 25\n"), "{stdout}");

    let out = vmm(&[
        "fork",
        "--snapshot",
        snap,
        "--identity",
        "1",
        "--steps",
        "1",
        "--then-open",
        "/etc/hostname",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("counter: 6\n"), "{stdout}");
    assert!(
        !stdout.contains("opened"),
        "the open went through: {stdout}"
    );
    assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{:?}", out.status);
    std::fs::remove_dir_all(&dir).unwrap();
}
