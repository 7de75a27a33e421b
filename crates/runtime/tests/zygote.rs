//! The helper zygote (`Runtime::start_zygote`): forked helpers run sandboxes exactly as exec'd
//! ones, they are the runtime's own children, concurrent requests get their own helpers, a dead
//! zygote costs only speed, and the zygote ends with the runtime. Needs root and the binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_api::SandboxConfig;
use airlock_runtime::Runtime;

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The tests count this process's helper children, so they take turns.
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
    let copy = runtime.clone();
    drop(runtime);
    assert!(stat(zygote).is_some(), "a clone still holds the zygote");
    drop(copy);
    assert!(
        stat(zygote).is_none() && !Path::new(&format!("/proc/{zygote}")).exists(),
        "the last clone's drop ends and reaps the zygote"
    );
}
