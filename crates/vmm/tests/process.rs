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

/// A VMM under its allow-list (which allows no open) snapshots on SIGUSR1 into the two files
/// it was given, and the snapshot restores where the guest was: still counting.
#[test]
fn test_vmm_under_the_allow_list_snapshots_on_sigusr1_into_given_files_and_counting_goes_on() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm does not exist on this host");
        return;
    }
    let dir = std::env::temp_dir().join(format!("airlock-vmm-save-{}", std::process::id()));
    let (template, paused) = (dir.join("template"), dir.join("paused"));
    std::fs::create_dir_all(&paused).unwrap();
    let out = vmm(&[
        "template",
        "--snapshot",
        template.to_str().unwrap(),
        "--steps",
        "5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (memory, state) = (dir.join("save-memory"), dir.join("save-state"));
    std::fs::write(&memory, b"").unwrap();
    std::fs::write(&state, b"stale").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-vmm"))
        .args(["restore", "--snapshot", template.to_str().unwrap()])
        .args(["--save-memory", memory.to_str().unwrap()])
        .args(["--save-state", state.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The guest prints as it counts: once a byte is out, it runs, filter and handler in place.
    let mut first = [0u8; 1];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    let signalled = Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("snapshot written"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The guest's 2 MiB, of which it touched a few pages: a sparse file.
    let meta = std::fs::metadata(&memory).unwrap();
    assert_eq!(meta.len(), 2 << 20);
    assert!(
        meta.blocks() * 512 < 1 << 20,
        "{} bytes",
        meta.blocks() * 512
    );
    std::fs::rename(&memory, paused.join("memory")).unwrap();
    std::fs::rename(&state, paused.join("state.json")).unwrap();
    let out = vmm(&[
        "fork",
        "--snapshot",
        paused.to_str().unwrap(),
        "--identity",
        "100",
        "--steps",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let counter: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("counter: "))
        .unwrap()
        .parse()
        .unwrap();
    // The template stopped at 5; the restored guest counted on from there before its pause
    // (at least the byte read above), then one step of 100.
    assert!(counter > 105, "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}
