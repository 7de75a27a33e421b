use super::*;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;

/// Waits for `pid` only: `reap_any` would steal the children of tests running in parallel
/// (it is tested in its own process, in tests/child_reap.rs).
fn wait_for(pid: u32) -> ExitStatus {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer; the pid is a child of this process.
    let ret = unsafe { libc::waitpid(pid.cast_signed(), &mut status, 0) };
    assert_eq!(
        ret,
        pid.cast_signed(),
        "waitpid: {}",
        io::Error::last_os_error()
    );
    ExitStatus::from_raw(status)
}

fn read_all_nonblocking(mut file: &File) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            // A pty master reports EIO once the slave side is closed.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn os(items: &[&str]) -> Vec<OsString> {
    items.iter().map(OsString::from).collect()
}

#[test]
fn pipes_carry_output_and_the_exit_status() {
    let argv = os(&["sh", "-c", "echo out; echo err >&2; cat; exit 3"]);
    let env = os(&["PATH=/usr/bin:/bin"]);
    let child = spawn(&ChildSpec {
        program: Path::new("/bin/sh"),
        argv: &argv,
        env: &env,
        cwd: Path::new("/"),
        switch_ids: None,
        stdio: Stdio::Pipes { stdin: true },
        cgroup_procs: None,
    })
    .unwrap();
    let ChildIo::Pipes {
        stdin: Some(mut stdin),
        stdout,
        stderr,
    } = child.io
    else {
        panic!("expected pipes with stdin");
    };
    stdin.write_all(b"from stdin\n").unwrap();
    drop(stdin);
    assert_eq!(read_all_nonblocking(&stdout), b"out\nfrom stdin\n");
    assert_eq!(read_all_nonblocking(&stderr), b"err\n");
    assert_eq!(wait_for(child.pid).code(), Some(3));
}

#[test]
fn a_missing_program_is_an_exec_error() {
    let argv = os(&["nope"]);
    let err = spawn(&ChildSpec {
        program: Path::new("/nonexistent/program"),
        argv: &argv,
        env: &[],
        cwd: Path::new("/"),
        switch_ids: None,
        stdio: Stdio::Pipes { stdin: false },
        cgroup_procs: None,
    })
    .unwrap_err();
    match err {
        ChildError::Setup { stage, source } => {
            assert_eq!(stage, Stage::Exec);
            assert_eq!(source.kind(), io::ErrorKind::NotFound);
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn a_missing_cwd_is_a_chdir_error() {
    let argv = os(&["true"]);
    let err = spawn(&ChildSpec {
        program: Path::new("/bin/true"),
        argv: &argv,
        env: &[],
        cwd: Path::new("/nonexistent/dir"),
        switch_ids: None,
        stdio: Stdio::Pipes { stdin: false },
        cgroup_procs: None,
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            ChildError::Setup {
                stage: Stage::Chdir,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A signal mask line of `/proc/.../status` (`SigBlk`, `SigIgn`), as bits.
fn signal_bits(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line.trim_start_matches(':').trim(), 16).unwrap()
}

fn run_for_output(program: &str, argv: &[&str], switch_ids: Option<(u32, u32)>) -> String {
    let argv = os(argv);
    let child = spawn(&ChildSpec {
        program: Path::new(program),
        argv: &argv,
        env: &os(&["PATH=/usr/bin:/bin"]),
        cwd: Path::new("/"),
        switch_ids,
        stdio: Stdio::Pipes { stdin: false },
        cgroup_procs: None,
    })
    .unwrap();
    let ChildIo::Pipes { stdout, .. } = child.io else {
        panic!("expected pipes");
    };
    let out = read_all_nonblocking(&stdout);
    assert_eq!(wait_for(child.pid).code(), Some(0));
    String::from_utf8(out).unwrap()
}

#[test]
fn the_workload_starts_with_no_signal_blocked_nor_sigpipe_ignored_and_the_caller_keeps_its_mask() {
    let bit = |signal: libc::c_int| 1u64 << (signal - 1);
    // The caller blocks SIGUSR1 in this thread, and Rust's runtime ignores SIGPIPE.
    // SAFETY: zeroed sigsets are valid; the calls only write them.
    unsafe {
        let mut usr1: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut usr1);
        libc::sigaddset(&mut usr1, libc::SIGUSR1);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &usr1, std::ptr::null_mut()),
            0
        );
    }
    let before = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    assert_ne!(signal_bits(&before, "SigBlk") & bit(libc::SIGUSR1), 0);
    assert_ne!(signal_bits(&before, "SigIgn") & bit(libc::SIGPIPE), 0);

    let status = run_for_output("/bin/cat", &["cat", "/proc/self/status"], None);
    assert_eq!(signal_bits(&status, "SigBlk"), 0, "{status}");
    // SIGPIPE is back to its default; whatever else the caller inherited ignored stays so, as
    // it would through an exec.
    assert_eq!(
        signal_bits(&status, "SigIgn"),
        signal_bits(&before, "SigIgn") & !bit(libc::SIGPIPE),
        "{status}"
    );
    // Every signal was blocked around the clone; the caller's own mask is back.
    let after = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    assert_eq!(
        signal_bits(&after, "SigBlk"),
        signal_bits(&before, "SigBlk")
    );
}

#[test]
fn an_identity_switch_reaches_the_workload_and_leaves_the_caller_alone() {
    if current_ids() != (0, 0) {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let out = run_for_output(
        "/bin/sh",
        &["sh", "-c", "id -u; id -g; id -G"],
        Some((65534, 65534)),
    );
    assert_eq!(out, "65534\n65534\n65534\n");
    // The child changed its own credentials only, although it shared this process's memory.
    assert_eq!(current_ids(), (0, 0));
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(uids.split_whitespace().collect::<Vec<_>>()[1..], ["0"; 4]);
}

#[test]
fn the_child_leads_its_own_group_and_the_group_can_be_killed() {
    let argv = os(&["sh", "-c", "sleep 1000 & sleep 1000"]);
    let child = spawn(&ChildSpec {
        program: Path::new("/bin/sh"),
        argv: &argv,
        env: &[],
        cwd: Path::new("/"),
        switch_ids: None,
        stdio: Stdio::Pipes { stdin: false },
        cgroup_procs: None,
    })
    .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.pid)).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // Fields after the command: state, ppid, pgrp, session.
    assert_eq!(fields[2], child.pid.to_string(), "pgrp");
    assert_eq!(fields[3], child.pid.to_string(), "session");
    signal_group(child.pid, libc::SIGKILL).unwrap();
    assert_eq!(wait_for(child.pid).signal(), Some(libc::SIGKILL));
}

#[test]
fn a_pty_is_the_controlling_terminal_with_the_given_size() {
    let argv = os(&["sh", "-c", "stty size; test -t 0 && echo tty"]);
    let child = spawn(&ChildSpec {
        program: Path::new("/bin/sh"),
        argv: &argv,
        env: &[],
        cwd: Path::new("/"),
        switch_ids: None,
        stdio: Stdio::Pty { cols: 91, rows: 17 },
        cgroup_procs: None,
    })
    .unwrap();
    let ChildIo::Pty { master } = child.io else {
        panic!("expected a pty");
    };
    let status = wait_for(child.pid);
    let out = String::from_utf8(read_all_nonblocking(&master)).unwrap();
    assert!(out.contains("17 91"), "{out:?}");
    assert!(out.contains("tty"), "{out:?}");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn window_size_changes_are_seen_by_the_child() {
    let argv = os(&["sh", "-c", "read line; stty size"]);
    let child = spawn(&ChildSpec {
        program: Path::new("/bin/sh"),
        argv: &argv,
        env: &[],
        cwd: Path::new("/"),
        switch_ids: None,
        stdio: Stdio::Pty { cols: 80, rows: 24 },
        cgroup_procs: None,
    })
    .unwrap();
    let ChildIo::Pty { mut master } = child.io else {
        panic!("expected a pty");
    };
    set_window_size(&master, 120, 40).unwrap();
    master.write_all(b"go\n").unwrap();
    let status = wait_for(child.pid);
    let out = String::from_utf8(read_all_nonblocking(&master)).unwrap();
    assert!(out.contains("40 120"), "{out:?}");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn inherited_listener_rejects_what_is_not_a_listening_unix_socket() {
    let file = File::open("/dev/null").unwrap();
    let err = inherited_listener(file.as_raw_fd()).unwrap_err();
    assert!(err.to_string().contains("not an open socket"), "{err}");
    assert!(inherited_listener(-1).is_err());
}

#[test]
fn inotify_reports_a_created_file() {
    use crate::inotify::{CREATE, Inotify, parse_events};
    let dir = std::env::temp_dir().join(format!("airlock-inotify-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let inotify = Inotify::new().unwrap();
    let wd = Inotify::add_watch(inotify.file(), &dir, CREATE).unwrap();
    std::fs::write(dir.join("new file"), b"x").unwrap();
    let mut buf = vec![0u8; crate::inotify::READ_BUFFER_BYTES];
    let n = inotify.file().read(&mut buf).unwrap();
    let events = parse_events(&buf[..n]);
    assert!(
        events
            .iter()
            .any(|e| e.wd == wd && e.mask & CREATE != 0 && e.name == b"new file"),
        "{events:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
