//! Long-lived sandboxes through the runtime API: the agent serves on the host socket from
//! inside the sandbox, a sandbox not committed ends with its handle, and `destroy` leaves
//! nothing behind. Needs root (cgroups) and the workspace's binaries built.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use airlock_api::SandboxConfig;
use airlock_runtime::{LiveSandbox, LiveSpec, Runtime};

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn runtime() -> Runtime {
    let mut runtime = Runtime::with_helper(bin_dir().join("airlock-jail"));
    runtime.set_owner("livetest").unwrap();
    runtime
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-live-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(id: &str, dir: &Path) -> LiveSpec {
    LiveSpec {
        id: id.into(),
        dir: dir.to_path_buf(),
        config: SandboxConfig::new(Vec::new()),
        volume: Default::default(),
        vm_shell: false,
    }
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

/// One request to the agent's HTTP API; the whole answer, headers included.
fn agent_request(socket: &Path, method: &str, target: &str, body: &str) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    write!(
        stream,
        "{method} {target} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

fn cgroup_exists(record: &LiveSandbox) -> bool {
    record.cgroup_dirs.iter().any(|dir| dir.exists())
}

#[test]
fn test_committed_sandbox_serves_until_destroyed() {
    let runtime = runtime();
    let dir = scratch("commit");
    let pending = runtime.create_live(&spec("livecommit1", &dir)).unwrap();
    let record = pending.commit().unwrap();
    assert!(
        health(&record.socket).starts_with("HTTP/1.1 204"),
        "the agent answers from inside"
    );
    runtime.adopt(&record).unwrap();
    assert_eq!(
        record.cgroup_dirs.len(),
        3,
        "memory, pids and freezer: {record:?}"
    );
    assert!(cgroup_exists(&record));
    runtime.destroy(&record);
    assert!(!alive(record.helper_pid), "helper gone");
    assert!(!cgroup_exists(&record), "cgroup removed");
    assert!(!dir.exists(), "directory removed");
    assert!(
        runtime.adopt(&record).is_err(),
        "a destroyed sandbox cannot be adopted"
    );
    runtime.destroy(&record);
}

#[test]
fn test_uncommitted_sandbox_ends_with_its_handle() {
    let runtime = runtime();
    let dir = scratch("drop");
    let pending = runtime.create_live(&spec("livedrop1", &dir)).unwrap();
    let record = pending.record().clone();
    assert!(health(&record.socket).starts_with("HTTP/1.1 204"));
    drop(pending);
    assert!(!alive(record.helper_pid), "helper gone with the handle");
    assert!(!cgroup_exists(&record));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_sweep_removes_cgroups_of_unknown_sandboxes() {
    let runtime = runtime();
    let dir = scratch("sweep");
    let record = runtime
        .create_live(&spec("livesweep1", &dir))
        .unwrap()
        .commit()
        .unwrap();
    // The other tests' sandboxes run concurrently: they are known, not orphans.
    let others = ["livecommit1", "livedrop1", "livefreeze1"].map(String::from);
    let mut keep: std::collections::HashSet<String> = others.clone().into();
    keep.insert("livesweep1".into());
    assert!(
        !runtime
            .sweep_orphans(&keep)
            .contains(&"livesweep1".to_string())
    );
    assert!(alive(record.helper_pid));
    let swept = runtime.sweep_orphans(&others.into());
    assert!(swept.contains(&"livesweep1".to_string()), "{swept:?}");
    assert!(!cgroup_exists(&record));
    runtime.destroy(&record);
    assert!(!alive(record.helper_pid));
}

#[test]
fn test_frozen_sandbox_thaws_and_a_frozen_one_is_destroyed_whole() {
    let runtime = runtime();
    let dir = scratch("freeze");
    let record = runtime
        .create_live(&spec("livefreeze1", &dir))
        .unwrap()
        .commit()
        .unwrap();
    record.freeze().unwrap();
    assert!(record.is_frozen());
    // A frozen agent accepts connections (the kernel does) but answers nothing.
    let mut stream = UnixStream::connect(&record.socket).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        std::io::Read::read(&mut stream, &mut byte).is_err(),
        "a frozen agent answered"
    );
    record.thaw().unwrap();
    assert!(!record.is_frozen());
    let mut answer = String::new();
    stream.set_read_timeout(None).unwrap();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    // Destroying a frozen sandbox (v1: its tasks take no signal until thawed) leaves nothing.
    record.freeze().unwrap();
    runtime.destroy(&record);
    assert!(!alive(record.helper_pid), "helper gone");
    assert!(!cgroup_exists(&record), "cgroup removed");
    assert!(!dir.exists(), "directory removed");
}

#[test]
fn test_bad_ids_are_refused() {
    let runtime = runtime();
    let dir = scratch("badid");
    for id in ["", "UPPER", "a/b", "../x", &"x".repeat(33)] {
        let err = runtime.create_live(&spec(id, &dir)).unwrap_err();
        assert!(err.to_string().contains("is not a sandbox id"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_a_view_of_binds_shows_the_agent_nothing_of_the_host_but_them() {
    let runtime = runtime();
    let dir = scratch("binds");
    // Under /tmp on purpose: the view is staged there, over whatever the host has.
    let data = scratch("binds-data");
    std::fs::write(data.join("hello.txt"), "bound").unwrap();
    let mut spec = spec("livebinds1", &dir);
    spec.config.root_binds = Some(vec![airlock_api::ViewBind {
        host: data.clone(),
        guest: "/opt/data".into(),
    }]);
    let record = runtime.create_live(&spec).unwrap().commit().unwrap();
    // Destroyed even when an assertion fails, so that a rerun finds no leftovers.
    struct Destroy<'a>(&'a Runtime, LiveSandbox);
    impl Drop for Destroy<'_> {
        fn drop(&mut self) {
            self.0.destroy(&self.1);
        }
    }
    let _destroy = Destroy(&runtime, record.clone());
    let socket = &record.socket;
    let listed = agent_request(
        socket,
        "POST",
        "/filesystem.Filesystem/ListDir",
        r#"{"path": "/", "depth": 1}"#,
    );
    let shown = |path: &str| listed.contains(&format!("\"path\":\"{path}\""));
    for path in [
        "/dev",
        "/opt",
        "/proc",
        "/run",
        "/sys",
        "/tmp",
        "/workspace",
    ] {
        assert!(shown(path), "{path} is missing: {listed}");
    }
    for path in ["/usr", "/etc", "/home", "/bin", "/var", "/root", "/lib"] {
        assert!(!shown(path), "the host's {path} is in the view: {listed}");
    }
    let file = agent_request(socket, "GET", "/files?path=/opt/data/hello.txt", "");
    assert!(
        file.starts_with("HTTP/1.1 200") && file.contains("bound"),
        "{file}"
    );
    for path in [
        "/etc/passwd",
        "/usr/bin/env",
        "/bin/sh",
        dir.to_str().unwrap(),
    ] {
        let stat = agent_request(
            socket,
            "POST",
            "/filesystem.Filesystem/Stat",
            &format!(r#"{{"path": "{path}"}}"#),
        );
        assert!(stat.contains("not_found"), "{path}: {stat}");
    }
    // The bind is read-only like the rest of the view; the sandbox's /tmp is its own.
    let make_dir = |path: &str| {
        agent_request(
            socket,
            "POST",
            "/filesystem.Filesystem/MakeDir",
            &format!(r#"{{"path": "{path}"}}"#),
        )
    };
    let control = make_dir("/tmp/made");
    assert!(control.starts_with("HTTP/1.1 200"), "{control}");
    let planted = make_dir("/opt/data/planted");
    assert!(!planted.starts_with("HTTP/1.1 200"), "{planted}");
    assert!(!data.join("planted").exists());
    std::fs::remove_dir_all(&data).unwrap();
}

/// Started by hand (no spec on descriptor 3, no report channel on 4), the helper says what it
/// needs and exits with the setup failure's code, instead of aborting on descriptors that are
/// not there.
#[test]
fn test_the_helper_started_without_its_descriptors_says_so() {
    let output = std::process::Command::new(bin_dir().join("airlock-jail"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no spec on descriptor 3 or no report channel on descriptor 4"),
        "{stderr}"
    );
}
