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

/// The counter guest's template in `dir`, counted to 5.
fn make_template(dir: &std::path::Path) {
    let out = vmm(&[
        "template",
        "--snapshot",
        dir.to_str().unwrap(),
        "--steps",
        "5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first byte the guest writes to its console (the VMM's standard output).
fn first_console_byte(child: &mut std::process::Child) -> u8 {
    use std::io::Read;
    let mut first = [0u8; 1];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    first[0]
}

/// Whether this host has no `/dev/kvm` (the test is skipped, saying so).
fn kvm_missing() -> bool {
    let missing = !std::path::Path::new("/dev/kvm").exists();
    if missing {
        eprintln!("SKIPPED: /dev/kvm does not exist on this host");
    }
    missing
}

#[test]
fn test_vmm_process_forks_count_under_the_allow_list_and_off_list_calls_die() {
    if kvm_missing() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("airlock-vmm-process-{}", std::process::id()));
    let snap = dir.to_str().unwrap();
    make_template(&dir);

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
    use std::os::unix::fs::MetadataExt;
    if kvm_missing() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("airlock-vmm-save-{}", std::process::id()));
    let (template, paused) = (dir.join("template"), dir.join("paused"));
    std::fs::create_dir_all(&paused).unwrap();
    make_template(&template);
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
    first_console_byte(&mut child);
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

/// A pre-created shell: the VMM makes its VM and opens the snapshot, then waits for its
/// owner's `restore` on the socket; only then does the guest run, counting on from the
/// snapshot. A request other than `restore` ends the shell with nothing restored.
#[test]
fn test_vmm_shell_waits_for_its_owner_then_restores_the_snapshot_and_counts_on() {
    use std::io::{BufRead, Read, Write};
    if kvm_missing() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("airlock-vmm-shell-{}", std::process::id()));
    let template = dir.join("template");
    make_template(&template);
    let shell = |socket: &std::path::Path| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-vmm"))
            .args([
                "restore",
                "--shell",
                "--snapshot",
                template.to_str().unwrap(),
            ])
            .args(["--vsock-socket", socket.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line says the shell is made; the socket is bound before it.
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        assert!(line.starts_with("airlock-vmm: shell ready"), "{line}");
        (child, stderr)
    };

    let socket = dir.join("good.sock");
    let (mut child, mut stderr) = shell(&socket);
    let mut control = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let took = airlock_vmm::shell_control::request_restore(&mut control).unwrap();
    assert!(took > std::time::Duration::ZERO);
    // Restored: the guest counts (and prints) on from the template's 5.
    assert_eq!(first_console_byte(&mut child), 6);
    child.kill().unwrap();
    child.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("restored"), "{rest}");

    let socket = dir.join("bad.sock");
    let (child, mut stderr) = shell(&socket);
    let mut control = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    control.write_all(b"boot\n").unwrap();
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "the guest ran: {:?}", out.stdout);
    assert!(err.contains("asked \"boot\", not `restore`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
