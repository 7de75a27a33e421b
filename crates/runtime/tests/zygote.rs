//! The helper zygote (`Runtime::start_zygote`): forked helpers run sandboxes exactly as exec'd
//! ones, they are the runtime's own children, concurrent requests get their own helpers, a dead
//! zygote costs only speed, and the zygote ends with the runtime. And its sandboxes' view
//! template (`airlock_jail::view_template`): they clone one read-only root instead of staging
//! their own. Seen from inside, the clone hides what a staged view hides, is read-only and
//! propagates no mount; a host change (a new secret, a new mount) gets the next sandbox a
//! rebuilt template. And its pooled network namespaces (`airlock_jail`'s `network_pool`): each
//! sandbox gets a fresh one of its own that it cannot reconfigure, and none outlives its
//! sandbox or the runtime. Needs root and the binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_api::SandboxConfig;
use airlock_runtime::{LiveSpec, Runtime};

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The tests count this process's helper children and template builds, so they take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn runtime_with_zygote() -> Runtime {
    let mut runtime = Runtime::with_helper(bin_dir().join("airlock-jail"));
    runtime.start_zygote().unwrap();
    runtime
}

fn shell(script: &str) -> SandboxConfig {
    SandboxConfig::new(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

/// (ppid, comm) of a live, unreaped process.
fn stat(pid: i32) -> Option<(i32, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_owned();
    let mut rest = text[close + 2..].split(' ');
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    (state != "Z").then_some((ppid, comm))
}

/// Our children named `airlock-jail`, the zygote aside.
fn helpers(zygote: i32) -> Vec<i32> {
    let me = std::process::id().cast_signed();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != zygote)
        .filter(|&pid| stat(pid).is_some_and(|(ppid, comm)| ppid == me && comm == "airlock-jail"))
        .collect()
}

/// A process's children (its main thread's, which is where a fork's child is counted).
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .collect()
}

/// The inode of the network namespace `pid` is in.
fn netns(pid: i32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let link = link.to_str()?;
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn test_zygote_helpers_run_sandboxes_as_children_of_the_runtime() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    let zygote = runtime.zygote_pid().unwrap();
    let me = std::process::id().cast_signed();
    assert_eq!(
        stat(zygote).map(|(ppid, _)| ppid),
        Some(me),
        "the zygote is our child"
    );
    let outcome = runtime
        .run(&shell("test \"$(id -u)\" = 0 && exit 7"), None, |_| {})
        .unwrap();
    assert_eq!(
        outcome.exit_code(),
        7,
        "a forked helper confines and reports: {outcome:?}"
    );
    assert_eq!(
        runtime.zygote_forks(),
        Some(1),
        "the zygote forked that helper"
    );

    let (sandbox, _) = runtime.start(&shell("sleep 30")).unwrap();
    wait_until("the forked helper", || !helpers(zygote).is_empty());
    let forked = helpers(zygote);
    assert_eq!(forked.len(), 1, "one helper, ours: {forked:?}");
    assert_eq!(runtime.zygote_forks(), Some(2));
    // The helper blanks `--zygote` just after the fork: until then ps shows the zygote's argv.
    let shown = || {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", forked[0])).unwrap_or_default();
        cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
    };
    wait_until("ps to show a plain helper, not --zygote", || {
        shown().len() == 1
    });
    assert!(
        shown()[0].ends_with("airlock-jail"),
        "ps shows the helper: {:?}",
        shown()
    );
    drop(sandbox);
    wait_until("the helper to be reaped", || helpers(zygote).is_empty());
    assert!(stat(forked[0]).is_none(), "no zombie is left");
}

#[test]
fn test_zygote_serves_concurrent_starts_each_with_its_own_helper() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..12)
            .map(|n| {
                let runtime = &runtime;
                scope.spawn(move || {
                    let outcome = runtime
                        .run(&shell(&format!("exit {n}")), None, |_| {})
                        .unwrap();
                    (n, outcome.exit_code())
                })
            })
            .collect();
        for run in runs {
            let (n, code) = run.join().unwrap();
            assert_eq!(code, n, "each start got its own helper and its own report");
        }
    });
    assert_eq!(runtime.zygote_forks(), Some(12));
}

#[test]
fn test_dead_zygote_falls_back_to_exec() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    let zygote = runtime.zygote_pid().unwrap();
    // As an operator (or the OOM killer) would.
    let killed = std::process::Command::new("kill")
        .args(["-9", &zygote.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_until("the zygote to be reaped", || stat(zygote).is_none());
    let outcome = runtime.run(&shell("exit 3"), None, |_| {}).unwrap();
    assert_eq!(outcome.exit_code(), 3, "sandboxes still start: {outcome:?}");
    assert_eq!(runtime.zygote_forks(), Some(0), "by exec");
}

#[test]
fn test_zygote_ends_with_the_runtime() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    let zygote = runtime.zygote_pid().unwrap();
    // The zygote forks its network pooler once it runs.
    wait_until("the zygote's network pooler", || {
        children(zygote).len() == 1
    });
    let pooler = children(zygote);
    let copy = runtime.clone();
    drop(runtime);
    assert!(stat(zygote).is_some(), "a clone still holds the zygote");
    drop(copy);
    assert!(
        stat(zygote).is_none() && !Path::new(&format!("/proc/{zygote}")).exists(),
        "the last clone's drop ends and reaps the zygote"
    );
    assert!(
        !Path::new(&format!("/proc/{}", pooler[0])).exists(),
        "and its pooler"
    );
}

/// Runs `script` in a sandbox of `runtime` and returns its exit code.
fn run(runtime: &Runtime, script: &str) -> i32 {
    runtime
        .run(&shell(script), None, |_| {})
        .unwrap()
        .exit_code()
}

#[test]
fn test_template_view_is_read_only_masked_and_propagates_nothing() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    // Each line exits with its own code, so that a failure names the check.
    let script = r#"
        test -x /bin/sh || exit 10
        touch /airlock-template-probe 2>/dev/null && exit 11
        touch /usr/airlock-template-probe 2>/dev/null && exit 12
        mkdir /run/airlock-template-probe 2>/dev/null && exit 13
        test -s /etc/shadow && exit 14
        cat /etc/shadow >/dev/null 2>&1 && exit 15
        grep -Eq 'shared:|master:' /proc/self/mountinfo && exit 16
        mount -t tmpfs none /usr 2>/dev/null && exit 17
        echo ok > /tmp/written && test "$(cat /tmp/written)" = ok || exit 18
        exit 0
    "#;
    assert_eq!(run(&runtime, script), 0, "the first sandbox's view");
    assert_eq!(
        runtime.view_template_builds(),
        Some(1),
        "the first built it"
    );
    assert_eq!(run(&runtime, script), 0, "the second sandbox's view");
    assert_eq!(
        runtime.view_template_builds(),
        Some(1),
        "the second reused it"
    );
    // What one sandbox wrote in its scratch space is not in the next one's.
    assert_eq!(
        run(&runtime, "test ! -e /tmp/written"),
        0,
        "scratch is per sandbox"
    );
}

#[test]
fn test_long_lived_sandboxes_share_one_template_with_the_agent_mounted_in_each() {
    let _serial = serial();
    let mut runtime = runtime_with_zygote();
    runtime.set_owner("templatetest").unwrap();
    let mut records = Vec::new();
    for n in 0..2 {
        let dir =
            std::env::temp_dir().join(format!("airlock-template-live-{n}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let spec = LiveSpec {
            id: format!("templatelive{n}"),
            dir,
            config: SandboxConfig::new(Vec::new()),
            volume: Default::default(),
            vm_shell: false,
        };
        let record = runtime.create_live(&spec).unwrap().commit().unwrap();
        let mut stream = UnixStream::connect(&record.socket).unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 204"),
            "sandbox {n}'s agent answers from its cloned view: {answer}"
        );
        records.push(record);
    }
    assert_eq!(
        runtime.view_template_builds(),
        Some(1),
        "one template, with the agent's mount point, for both"
    );
    for record in &records {
        runtime.destroy(record);
        assert!(!record.dir.exists(), "{} removed", record.dir.display());
    }
}

#[test]
fn test_a_new_secret_or_mount_on_the_host_rebuilds_the_template() {
    let _serial = serial();
    let home = PathBuf::from(format!("/home/airlock-template-{}", std::process::id()));
    let mount_point = PathBuf::from(format!("/var/tmp/airlock-template-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&mount_point).unwrap();
    let cleanup = Cleanup {
        home: home.clone(),
        mount_point: mount_point.clone(),
    };
    let runtime = runtime_with_zygote();
    let ssh = home.join(".ssh");
    let no_key = format!("test ! -e {}", ssh.display());
    assert_eq!(run(&runtime, &no_key), 0, "no key yet");
    assert_eq!(runtime.view_template_builds(), Some(1));

    // A key appears on the host: the next sandbox must not read it.
    std::fs::create_dir(&ssh).unwrap();
    std::fs::write(ssh.join("id_test"), "airlock-template-secret").unwrap();
    let key_hidden = format!(
        "cat {key} 2>/dev/null && exit 20; ls -A {ssh} 2>/dev/null | grep -q . && exit 21; exit 0",
        key = ssh.join("id_test").display(),
        ssh = ssh.display(),
    );
    assert_eq!(run(&runtime, &key_hidden), 0, "the new key is masked");
    assert_eq!(
        runtime.view_template_builds(),
        Some(2),
        "the new key's directory made the template stale"
    );

    // A filesystem is mounted on the host: the next sandbox sees it, as a staged view would.
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "airlock-template-test"])
        .arg(&mount_point)
        .status()
        .unwrap();
    assert!(status.success(), "mounting a tmpfs on the host");
    std::fs::write(mount_point.join("mounted"), "yes").unwrap();
    let sees_mount = format!("test \"$(cat {}/mounted)\" = yes", mount_point.display());
    assert_eq!(
        run(&runtime, &sees_mount),
        0,
        "the new mount is in the view"
    );
    assert_eq!(
        runtime.view_template_builds(),
        Some(3),
        "the mount made the template stale"
    );
    drop(cleanup);
}

/// Removes the test's host directory and mount, however the test ends.
struct Cleanup {
    home: PathBuf,
    mount_point: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount_point)
            .status();
        let _ = std::fs::remove_dir(&self.mount_point);
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn pooled(runtime: &Runtime) -> u64 {
    runtime.host_networks().map_or(0, |counts| counts.pooled)
}

/// The pool starts with four namespaces and gets a replacement for each only once the sandbox
/// that took it has started or ended: sandboxes one after another must keep finding it full.
#[test]
fn test_the_network_pool_refills_after_each_sandbox_that_took_a_namespace() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    for _ in 0..200 {
        assert_eq!(run(&runtime, "exit 0"), 0);
        if pooled(&runtime) > 6 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let counts = runtime.host_networks().unwrap();
    assert!(
        counts.pooled > 6,
        "more namespaces came from the pool than its first four: {counts:?}"
    );
}

#[test]
fn test_pooled_network_namespaces_are_fresh_private_and_beyond_the_sandboxs_reach() {
    let _serial = serial();
    let runtime = runtime_with_zygote();
    let host = netns(std::process::id().cast_signed()).unwrap();
    // Each line exits with its own code, so that a failure names the check. 0x9 is up and
    // loopback; SIOCSIFFLAGS (0x8914) with no flags would take the loopback down.
    let script = format!(
        r#"
        test "$(readlink /proc/self/ns/net)" != "net:[{host}]" || exit 10
        test "$(ls /sys/class/net)" = lo || exit 11
        test "$(cat /sys/class/net/lo/flags)" = 0x9 || exit 12
        python3 -c 'import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", 0))' 2>/dev/null && exit 13
        test "$(cat /sys/class/net/lo/flags)" = 0x9 || exit 14
        echo 1 2>/dev/null > /proc/sys/net/ipv4/ip_forward && exit 15
        python3 -c 'import socket
s = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(s.getsockname())
s.accept()[0].sendall(b"up")
assert c.recv(2) == b"up"' || exit 16
        exit 0
    "#
    );
    // The pooler fills at the lowest priority, so the first sandboxes may find the pool empty
    // and get a namespace their helper made the same way: every one must pass.
    for _ in 0..50 {
        assert_eq!(run(&runtime, &script), 0, "a sandbox's network namespace");
        if pooled(&runtime) >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let counts = runtime.host_networks().unwrap();
    assert!(
        counts.pooled >= 2,
        "sandboxes got namespaces from the pool: {counts:?}"
    );

    // Two sandboxes at once: each in a namespace of its own, and neither outlives its sandbox.
    let zygote = runtime.zygote_pid().unwrap();
    let first = runtime.start(&shell("sleep 30")).unwrap();
    let second = runtime.start(&shell("sleep 30")).unwrap();
    let inits = || -> Vec<i32> { helpers(zygote).into_iter().flat_map(children).collect() };
    wait_until("both sandboxes' init", || inits().len() == 2);
    let namespaces: Vec<u64> = inits().into_iter().filter_map(netns).collect();
    assert_eq!(namespaces.len(), 2, "{namespaces:?}");
    assert_ne!(namespaces[0], namespaces[1], "never shared");
    assert!(
        !namespaces.contains(&host),
        "not the host's: {namespaces:?}"
    );
    drop((first, second));
    wait_until("both helpers to be reaped", || helpers(zygote).is_empty());
    let holders: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| netns(pid).is_some_and(|ns| namespaces.contains(&ns)))
        .collect();
    assert!(holders.is_empty(), "processes left in them: {holders:?}");
}
