//! End-to-end properties of `airlock run`, each proven from inside the sandbox with
//! `airlock-probe`, and each paired with a control showing the same action works outside.
//! Every `airlock` invocation is followed by a check that it left no cgroup or mount behind.
//!
//! These tests need root (as CI has) for cgroups, idmapped mounts and the unprivileged-caller
//! test, which drops to `nobody` itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;

use common::*;

#[test]
fn test_run_masked_home_secret_is_unreadable_inside_readable_outside() {
    let scratch = Scratch::new();
    let home = format!("/home/airlock-test-{}", std::process::id());
    fs::create_dir_all(format!("{home}/.ssh")).unwrap();
    fs::create_dir_all(format!("{home}/.aws")).unwrap();
    let key = format!("{home}/.ssh/id_ed25519");
    let creds = format!("{home}/.aws/credentials");
    fs::write(&key, "PRIVATE KEY").unwrap();
    fs::write(&creds, "[default]").unwrap();

    let inside_key = inside(&scratch, &[], &["read", &key]);
    let inside_creds = inside(&scratch, &[], &["read", &creds]);
    let control = outside(&scratch, &["read", &key]);
    fs::remove_dir_all(&home).unwrap();

    assert_eq!(inside_key.verdict(), "errno 13 EACCES", "{inside_key:?}");
    assert_eq!(inside_creds.verdict(), "errno 13 EACCES");
    assert_eq!(control, "ok 11");
}

#[test]
fn test_run_host_secret_files_are_masked() {
    let scratch = Scratch::new();
    for path in ["/etc/shadow", "/etc/gshadow"] {
        if !std::path::Path::new(path).exists() {
            continue;
        }
        assert_eq!(
            inside(&scratch, &[], &["read", path]).verdict(),
            "errno 13 EACCES",
            "{path}"
        );
        assert!(
            outside(&scratch, &["read", path]).starts_with("ok"),
            "control: root reads {path}"
        );
    }
    // /run holds host daemons' sockets: inside it is an empty directory.
    let listing = airlock(&["run", "--", "ls", "-A", "/run"]);
    assert_eq!(listing.code, 0, "{listing:?}");
    assert_eq!(listing.stdout, "");
    assert!(
        fs::read_dir("/run").unwrap().next().is_some(),
        "control: the host /run is not empty"
    );
}

#[test]
fn test_run_writes_outside_workspace_and_tmp_fail() {
    let scratch = Scratch::new();
    let target = scratch.dir.join("written-from-inside");
    let target = target.to_str().unwrap();
    for path in [
        "/etc/airlock-probe",
        "/usr/airlock-probe",
        target,
        "/dev/airlock-probe",
    ] {
        let run = inside(&scratch, &[], &["write", path]);
        assert_eq!(run.verdict(), "errno 30 EROFS", "{path}: {run:?}");
    }
    assert!(!std::path::Path::new(target).exists());
    assert_eq!(
        outside(&scratch, &["write", target]),
        "ok",
        "control: the host can write there"
    );
    for path in ["/workspace/file", "/tmp/file", "/dev/shm/file", "/dev/null"] {
        assert_eq!(
            inside(&scratch, &[], &["write", path]).verdict(),
            "ok",
            "{path}"
        );
    }
}

#[test]
fn test_run_landlock_denies_writes_the_mounts_allow() {
    let scratch = Scratch::new();
    // /proc is mounted read-write and a process owns its own comm file, so only Landlock
    // stands between the workload and this write.
    let run = inside(&scratch, &[], &["write", "/proc/self/comm"]);
    assert_eq!(run.verdict(), "errno 13 EACCES", "{run:?}");
    assert_eq!(outside(&scratch, &["write", "/proc/self/comm"]), "ok");
}

#[test]
fn test_run_host_pids_are_invisible() {
    let scratch = Scratch::new();
    let me = std::process::id().to_string();
    let run = inside(&scratch, &[], &["pid-visible", &me]);
    assert_eq!(run.verdict(), "errno 3 ESRCH", "{run:?}");
    assert_eq!(outside(&scratch, &["pid-visible", &me]), "ok proc=true");
    let ps = airlock(&["run", "--", "sh", "-c", "ls /proc | grep -c '^[0-9]'"]);
    let count: u32 = ps.stdout.trim().parse().unwrap();
    assert!(
        count <= 4,
        "only the sandbox's own processes are listed, saw {count}"
    );
}

#[test]
fn test_run_ptrace_mount_and_nested_userns_are_denied() {
    let scratch = Scratch::new();
    for action in ["ptrace", "mount", "userns"] {
        let run = inside(&scratch, &[], &[action]);
        assert_eq!(run.verdict(), "errno 1 EPERM", "{action}: {run:?}");
        assert_eq!(
            outside(&scratch, &[action]),
            "ok",
            "control: {action} works outside"
        );
    }
}

#[test]
fn test_run_dangerous_socket_families_are_denied() {
    let scratch = Scratch::new();
    let packet = ["socket", "17", "2", "0"];
    let netlink_diag = ["socket", "16", "2", "4"];
    let raw_inet = ["socket", "2", "3", "1"];
    for attempt in [&packet, &netlink_diag, &raw_inet] {
        assert_eq!(
            inside(&scratch, &[], attempt).verdict(),
            "errno 1 EPERM",
            "{attempt:?}"
        );
        assert_eq!(outside(&scratch, attempt), "ok", "control {attempt:?}");
    }
    // The audit netlink is closed too, answered as by a kernel without audit (shadow's tools
    // carry on only then).
    let netlink_audit = ["socket", "16", "2", "9"];
    assert_eq!(
        inside(&scratch, &[], &netlink_audit).verdict(),
        "errno 93 EPROTONOSUPPORT"
    );
    assert_eq!(outside(&scratch, &netlink_audit), "ok", "control");
    assert_eq!(
        inside(&scratch, &[], &["socket", "16", "2", "0"]).verdict(),
        "ok",
        "NETLINK_ROUTE stays"
    );
}

#[test]
fn test_run_privileges_are_gone() {
    let status = airlock(&[
        "run",
        "--",
        "grep",
        "-E",
        "^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):",
        "/proc/self/status",
    ]);
    assert_eq!(status.code, 0, "{status:?}");
    let expected = "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
                    CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
    assert_eq!(status.stdout, expected);
    let uid_map = airlock(&["run", "--", "cat", "/proc/self/uid_map"]);
    let fields: Vec<&str> = uid_map.stdout.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"0"));
    assert_ne!(
        fields.get(1),
        Some(&"0"),
        "uid 0 inside must not be root outside: {fields:?}"
    );
    let setuid = {
        let scratch = Scratch::new();
        inside(&scratch, &[], &["chmod-setuid", "/workspace/tool"])
            .verdict()
            .to_owned()
    };
    assert_eq!(setuid, "errno 1 EPERM");
}

#[test]
fn test_run_only_stdio_crosses_into_the_sandbox_and_init_is_out_of_reach() {
    let scratch = Scratch::new();
    // The caller leaks two descriptors without close-on-exec; neither may reach the workload.
    let script = format!(
        "exec 7</etc/hostname 8>/dev/null; exec {} run -- {} fds",
        airlock_bin().display(),
        scratch.probe()
    );
    let run = run_from(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap(),
    );
    assert_eq!(run.verdict(), "ok 0,1,2", "{run:?}");
    // Init holds the channel to the helper; the workload shares its uid but not its /proc.
    let forge = inside(&scratch, &[], &["write", "/proc/1/fd/3"]);
    assert_eq!(forge.verdict(), "errno 13 EACCES", "{forge:?}");
}

#[test]
fn test_run_host_loopback_is_unreachable_but_sandbox_loopback_works() {
    let scratch = Scratch::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let run = inside(&scratch, &[], &["connect", &address]);
    assert_eq!(run.verdict(), "errno 111 ECONNREFUSED", "{run:?}");
    assert_eq!(outside(&scratch, &["connect", &address]), "ok");
    assert_eq!(inside(&scratch, &[], &["loopback"]).verdict(), "ok ping");
    assert_eq!(
        inside(&scratch, &[], &["connect", "169.254.169.254:80"]).verdict(),
        "errno 101 ENETUNREACH",
        "no route off the box"
    );
}

#[test]
fn test_run_memory_bomb_is_oom_killed_inside_the_cgroup() {
    let scratch = Scratch::new();
    let run = inside(&scratch, &["--memory", "64MiB"], &["alloc", "512"]);
    assert_eq!(run.code, 137, "{run:?}");
    assert!(run.stderr.contains("memory limit"), "{}", run.stderr);
    // The host and the next sandbox are fine.
    assert_eq!(inside(&scratch, &[], &["alloc", "100"]).verdict(), "ok 100");
}

#[test]
fn test_run_fork_bomb_stops_at_the_pids_limit() {
    let scratch = Scratch::new();
    let run = inside(&scratch, &["--pids", "32"], &["forkbomb", "10000"]);
    let words: Vec<&str> = run.verdict().split_whitespace().collect();
    assert_eq!(words[..2], ["ok", "forked"], "{run:?}");
    let forked: u32 = words[2].parse().unwrap();
    assert!(forked < 32, "forked {forked} with a limit of 32");
    assert_eq!(words[3..], ["errno", "11"], "fork fails with EAGAIN");
    assert_eq!(
        outside(&scratch, &["forkbomb", "40"]),
        "ok forked 40",
        "control"
    );
}

#[test]
fn test_run_setsid_double_fork_daemon_is_gone_after_the_run() {
    let scratch = Scratch::new();
    let marker = unique_marker("daemon");
    let run = inside(&scratch, &[], &["daemon", &marker]);
    assert_eq!(run.verdict(), "ok");
    assert!(
        eventually(|| processes_with(&marker).is_empty()),
        "the daemon outlived its sandbox"
    );

    // Control: the same daemon outside survives its parent.
    assert_eq!(outside(&scratch, &["daemon", &marker]), "ok");
    let survivors = processes_with(&marker);
    for pid in &survivors {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    assert!(
        !survivors.is_empty(),
        "control: a daemon outside a sandbox survives"
    );
}

#[test]
fn test_run_exit_codes_and_signals_propagate() {
    let scratch = Scratch::new();
    assert_eq!(inside(&scratch, &[], &["exit", "42"]).code, 42);
    assert_eq!(inside(&scratch, &[], &["exit", "0"]).code, 0);
    assert_eq!(inside(&scratch, &[], &["kill-self", "15"]).code, 143);
    assert_eq!(inside(&scratch, &[], &["kill-self", "9"]).code, 137);
    assert_eq!(
        inside(&scratch, &[], &["kill-self", "11"]).code,
        139,
        "a crash of CMD"
    );
}

#[test]
fn test_run_large_stdout_arrives_intact() {
    let scratch = Scratch::new();
    let bytes = 50_000_000usize;
    let run = inside(&scratch, &[], &["spew", &bytes.to_string()]);
    assert_eq!(run.code, 0);
    assert_eq!(run.stdout_bytes.len(), bytes);
    let corrupt = run
        .stdout_bytes
        .iter()
        .enumerate()
        .position(|(i, &b)| b != (i % 251) as u8);
    assert_eq!(corrupt, None, "stdout differs from the pattern");
}

#[test]
fn test_run_stdout_and_stderr_stay_separate_and_stdin_round_trips() {
    let scratch = Scratch::new();
    let input: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let probe = scratch.probe();
    let run = airlock_with_input(&["run", "--", &probe, "cat"], Some(&input));
    assert_eq!(run.code, 0);
    assert_eq!(run.stdout_bytes, input);
    let split = airlock(&["run", "--", "sh", "-c", "echo out; echo err >&2"]);
    assert_eq!(split.stdout, "out\n");
    assert_eq!(split.stderr, "err\n");
}

#[test]
fn test_run_as_non_root_user_inside() {
    let scratch = Scratch::new();
    let run = inside(&scratch, &["--user", "1000:1000"], &["whoami"]);
    assert_eq!(run.verdict(), "ok uid=1000 gid=1000 euid=1000", "{run:?}");
    let write = inside(&scratch, &["--user", "1000"], &["write", "/workspace/mine"]);
    assert_eq!(
        write.verdict(),
        "ok",
        "the fresh workspace belongs to the workload's user"
    );
}

#[test]
fn test_run_host_workspace_keeps_host_ownership() {
    let scratch = Scratch::new();
    let workspace = scratch.workspace("ws");
    fs::write(workspace.join("input.txt"), "from the host").unwrap();
    let ws = workspace.to_str().unwrap();
    let run = airlock(&[
        "run",
        "--workspace",
        ws,
        "--",
        "sh",
        "-c",
        "cat input.txt && echo made > output.txt",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "from the host");
    let meta = fs::metadata(workspace.join("output.txt")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (0, 0),
        "a file written by root inside belongs to the workspace's owner"
    );
    assert_eq!(
        fs::read_to_string(workspace.join("output.txt")).unwrap(),
        "made\n"
    );
}

#[test]
fn test_run_environment_is_not_inherited() {
    // SAFETY of the test: only this test reads this variable.
    let run = std::process::Command::new(airlock_bin())
        .args([
            "run",
            "--env",
            "GIVEN=yes",
            "--",
            "sh",
            "-c",
            "echo ${HOST_SECRET:-absent} $GIVEN",
        ])
        .env("HOST_SECRET", "hunter2")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&run.stdout), "absent yes\n");
}

#[test]
fn test_run_timeout_kills_the_whole_sandbox() {
    let scratch = Scratch::new();
    let marker = unique_marker("timeout");
    let probe = scratch.probe();
    let script = format!("{probe} daemon {marker}; exec sleep 60");
    let uid = 3101;
    let user = uid.to_string();
    let run = airlock(&[
        "run",
        "--timeout",
        "1s",
        "--user",
        &user,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(run.code, 124, "{run:?}");
    assert_eq!(
        orphaned_inits(uid),
        Vec::<u32>::new(),
        "init was reaped, not orphaned"
    );
    assert!(run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(
        eventually(|| processes_with(&marker).is_empty()),
        "a process outlived the timeout"
    );
}

fn signal_tears_down(signal: &str, expected: i32, uid: u32) {
    let scratch = Scratch::new();
    let marker = unique_marker(signal);
    let probe = scratch.probe();
    let user = uid.to_string();
    let child = spawn_airlock(&[
        "run",
        "--user",
        &user,
        "--",
        &probe,
        "sleep-marker",
        &marker,
    ]);
    let pid = child.id();
    assert!(
        eventually(|| !processes_with(&marker).is_empty()),
        "the sandbox never started"
    );
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let run = run_from(child.wait_with_output().unwrap());
    assert_no_leftovers(pid);
    assert_eq!(run.code, expected, "{run:?}");
    assert_eq!(
        orphaned_inits(uid),
        Vec::<u32>::new(),
        "init was reaped, not orphaned"
    );
    assert!(
        eventually(|| processes_with(&marker).is_empty()),
        "the workload outlived airlock"
    );
}

#[test]
fn test_run_sigterm_tears_down_and_exits_143() {
    signal_tears_down("-TERM", 143, 3102);
}

#[test]
fn test_run_sigint_tears_down_and_exits_130() {
    signal_tears_down("-INT", 130, 3103);
}

#[test]
fn test_run_bad_input_gets_one_line_errors_and_code_125() {
    let cases: [&[&str]; 6] = [
        &["run", "--workspace", "/no/such/dir", "--", "true"],
        &["run", "--memory", "12parsecs", "--", "true"],
        &["run", "--timeout", "soon", "--", "true"],
        &["run", "--frobnicate", "--", "true"],
        &["run", "--user", "alice", "--", "true"],
        &["run", "--cwd", "/no/such/dir", "--", "true"],
    ];
    for args in cases {
        let run = airlock(args);
        assert_eq!(run.code, 125, "{args:?}: {run:?}");
        assert_eq!(
            run.stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line, got {:?}",
            run.stderr
        );
        assert!(run.stderr.starts_with("airlock: "), "{:?}", run.stderr);
    }
    let missing = airlock(&["run", "--", "no-such-command-anywhere"]);
    assert_eq!(missing.code, 127);
    assert_eq!(
        missing.stderr,
        "airlock: no-such-command-anywhere: command not found\n"
    );
    assert!(
        airlock(&["run", "--workspace", "/no/such/dir", "--", "true"])
            .stderr
            .contains("/no/such/dir")
    );
    assert!(
        airlock(&["run", "--memory", "12parsecs", "--", "true"])
            .stderr
            .contains("parsecs")
    );
}

#[test]
fn test_run_unprivileged_caller_works_and_strict_names_the_missing_layer() {
    let scratch = Scratch::new();
    let airlock = scratch.airlock();
    let probe = scratch.probe();
    let as_nobody = |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&airlock)
            .args(args)
            .env("HOME", "/nonexistent")
            .output()
            .unwrap()
    };
    let best_effort = run_from(as_nobody(&[
        "run",
        "--compat",
        "best-effort",
        "--",
        &probe,
        "whoami",
    ]));
    assert_eq!(best_effort.code, 0, "{best_effort:?}");
    assert_eq!(best_effort.verdict(), "ok uid=0 gid=0 euid=0");
    assert!(
        best_effort.stderr.contains("not enforced: cgroup limits"),
        "{}",
        best_effort.stderr
    );

    let confined = run_from(as_nobody(&[
        "run",
        "--compat",
        "best-effort",
        "--",
        &probe,
        "mount",
    ]));
    assert_eq!(
        confined.verdict(),
        "errno 1 EPERM",
        "the other layers still hold"
    );
    // Init shares the workload's host uid here; its descriptors must still be out of reach.
    for fd in ["3", "4"] {
        let path = format!("/proc/1/fd/{fd}");
        let args = [
            "run",
            "--compat",
            "best-effort",
            "--",
            &probe,
            "write",
            &path,
        ];
        let forge = run_from(as_nobody(&args));
        assert_eq!(
            forge.verdict(),
            "errno 13 EACCES",
            "init's descriptor {fd}: {forge:?}"
        );
    }

    let strict = run_from(as_nobody(&["run", "--", &probe, "whoami"]));
    assert_eq!(strict.code, 125);
    assert!(strict.stderr.contains("cgroup"), "{}", strict.stderr);
    assert_eq!(strict.stdout, "", "nothing ran");
}

#[test]
fn test_run_cgroup_limits_are_applied_on_this_hosts_hierarchy() {
    let scratch = Scratch::new();
    let marker = unique_marker("limits");
    let probe = scratch.probe();
    let child = spawn_airlock(&[
        "run",
        "--memory",
        "96MiB",
        "--pids",
        "40",
        "--cpus",
        "1.5",
        "--",
        &probe,
        "sleep-marker",
        &marker,
    ]);
    let pid = child.id();
    assert!(
        eventually(|| !processes_with(&marker).is_empty()),
        "the sandbox never started"
    );
    let dirs = cgroups_of(pid);
    let read = |file: &str| -> Option<String> {
        dirs.iter()
            .find_map(|dir| fs::read_to_string(dir.join(file)).ok())
            .map(|s| s.trim().to_owned())
    };
    let (memory, pids, cpu) = if read("memory.max").is_some() {
        (read("memory.max"), read("pids.max"), read("cpu.max"))
    } else {
        (
            read("memory.limit_in_bytes"),
            read("pids.max"),
            read("cpu.cfs_quota_us"),
        )
    };
    let swap = read("memory.memsw.limit_in_bytes").or_else(|| read("memory.swap.max"));
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let run = run_from(child.wait_with_output().unwrap());
    assert_no_leftovers(pid);
    assert_eq!(run.code, 143);
    assert_eq!(
        memory.as_deref(),
        Some("100663296"),
        "memory limit in {dirs:?}"
    );
    assert_eq!(
        pids.as_deref(),
        Some("41"),
        "40 for the workload, 1 for init"
    );
    assert!(
        matches!(cpu.as_deref(), Some("150000") | Some("150000 100000")),
        "cpu: {cpu:?}"
    );
    assert!(
        matches!(swap.as_deref(), Some("100663296") | Some("0") | None),
        "no swap on top: {swap:?}"
    );
}

#[test]
fn test_run_rlimits_follow_the_disk_quota() {
    let run = airlock(&["run", "--disk", "10MiB", "--", "cat", "/proc/self/limits"]);
    assert_eq!(run.code, 0, "{run:?}");
    let limit = |name: &str| -> Vec<String> {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default();
        line[name.len()..]
            .split_whitespace()
            .take(2)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(limit("Max core file size"), ["0", "0"]);
    assert_eq!(limit("Max file size"), ["10485760", "10485760"]);
    // 65536 open files, unless the host's own hard limit is lower: it is never raised.
    let host = fs::read_to_string("/proc/self/limits").unwrap();
    let host_hard: u64 = host
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
        .unwrap();
    let expected = host_hard.min(65536).to_string();
    assert_eq!(limit("Max open files"), [expected.clone(), expected]);
}

#[test]
fn test_run_custom_rootfs_replaces_the_host_view() {
    let scratch = Scratch::new();
    let rootfs = scratch.rootfs("rootfs");
    fs::create_dir_all(rootfs.join("etc")).unwrap();
    fs::write(rootfs.join("etc/marker"), "inside the custom rootfs").unwrap();
    let root = rootfs.to_str().unwrap();
    let run = airlock(&[
        "run",
        "--rootfs",
        root,
        "--",
        "/bin/probe",
        "read",
        "/etc/marker",
    ]);
    assert_eq!(run.verdict(), "ok 24", "{run:?}");
    let host = airlock(&[
        "run",
        "--rootfs",
        root,
        "--",
        "/bin/probe",
        "read",
        "/etc/hostname",
    ]);
    assert_eq!(
        host.verdict(),
        "errno 2 ENOENT",
        "the host's files are not there"
    );
    let write = airlock(&[
        "run",
        "--rootfs",
        root,
        "--",
        "/bin/probe",
        "write",
        "/etc/marker",
    ]);
    assert_eq!(write.verdict(), "errno 30 EROFS");
    assert_eq!(
        fs::read_to_string(rootfs.join("etc/marker")).unwrap(),
        "inside the custom rootfs"
    );
}

#[test]
fn test_run_cwd_and_hostname() {
    let run = airlock(&["run", "--cwd", "/tmp", "--", "sh", "-c", "pwd; hostname"]);
    assert_eq!(run.stdout, "/tmp\nairlock\n", "{run:?}");
}

#[test]
fn test_run_foreign_syscall_abis_kill_the_process() {
    let scratch = Scratch::new();
    // i386 through int 0x80, and x32: the filter kills with SIGSYS (128 + 31).
    assert_eq!(inside(&scratch, &[], &["int80"]).code, 159);
    assert_eq!(inside(&scratch, &[], &["x32"]).code, 159);
    assert_eq!(
        outside(&scratch, &["int80"]),
        "ok",
        "control: this kernel runs i386 syscalls"
    );
    let x32 = outside(&scratch, &["x32"]);
    assert!(
        x32 == "ok" || x32 == "errno 38 ENOSYS",
        "control: the kernel itself answers: {x32}"
    );
}

#[test]
fn test_run_sigkill_of_airlock_takes_the_sandbox_along() {
    let scratch = Scratch::new();
    let marker = unique_marker("sigkill");
    let probe = scratch.probe();
    let mut child = spawn_airlock(&["run", "--", &probe, "sleep-marker", &marker]);
    let pid = child.id();
    assert!(
        eventually(|| !processes_with(&marker).is_empty()),
        "the sandbox never started"
    );
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    // Only wait: a surviving sandbox would hold the output pipes open forever.
    let _ = child.wait().unwrap();
    assert!(
        eventually(|| processes_with(&marker).is_empty()),
        "the workload outlived airlock"
    );
    // The dead supervisor could not remove its cgroup; the next airlock process sweeps it.
    assert!(eventually(|| cgroups_of(pid).iter().all(|dir| {
        fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .is_empty()
    })));
    let next = airlock(&["run", "--", "true"]);
    assert_eq!(next.code, 0);
    assert_eq!(
        cgroups_of(pid),
        Vec::<std::path::PathBuf>::new(),
        "the stale cgroup was swept"
    );
}
