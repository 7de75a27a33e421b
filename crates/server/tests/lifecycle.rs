//! Lifetimes: timeouts, sandboxes that die by themselves, and a daemon restart that re-adopts
//! live sandboxes and destroys the rest. Needs root and the sandbox binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use airlock_api::v1::{CreateSandboxRequest, ErrorCode, ExecRequest, SandboxState};
use airlock_server::client::Client;
use airlock_server::store::now_ms;
use common::TestDaemon;

const LIMIT: Duration = Duration::from_secs(60);

fn helper_of(daemon: &TestDaemon, id: &str) -> (i32, u64) {
    common::stored_helpers(&daemon.state_dir)
        .into_iter()
        .find(|(row, _)| row == id)
        .and_then(|(_, helper)| helper)
        .unwrap_or_else(|| panic!("no stored helper for {id}"))
}

/// Whether a list (which waits for the teardowns of deletes before it) and a get no longer
/// show the sandbox.
async fn is_gone(client: &Client, id: &str) -> bool {
    let listed = client.list(&[], &BTreeMap::new()).await;
    if listed.is_ok_and(|listed| listed.iter().any(|sandbox| sandbox.id == id)) {
        return false;
    }
    client.get(id).await.err().and_then(|e| e.code()) == Some(ErrorCode::NotFound)
}

async fn has_event(client: &Client, id: &str, kind: &str) -> bool {
    client
        .logs(id)
        .await
        .map(|logs| logs.events.iter().any(|e| e.kind == kind))
        .unwrap_or(false)
}

fn kill9(pid: i32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn test_timeout_and_self_ending_sandboxes_are_swept() {
    common::require_binaries();
    let daemon = TestDaemon::start("timeout", &[]);
    let client = daemon.client();
    let short = client
        .create(&CreateSandboxRequest {
            timeout_ms: Some(1500),
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox;
    let short_helper = helper_of(&daemon, &short.id);
    let doomed = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox;
    let doomed_helper = helper_of(&daemon, &doomed.id);
    assert!(common::process_alive(
        doomed_helper.0,
        Some(doomed_helper.1)
    ));

    // The agent (and so the sandbox) dies on its own: the daemon notices and cleans up.
    kill9(doomed_helper.0);
    assert!(common::eventually(LIMIT, || is_gone(&client, &doomed.id)).await);
    // The event is stored as the sandbox is removed, which `get` may report a moment earlier.
    assert!(common::eventually(LIMIT, || has_event(&client, &doomed.id, "ended")).await);
    common::assert_sandbox_gone(&daemon.state_dir, &doomed.id, Some(doomed_helper));

    assert!(common::eventually(LIMIT, || is_gone(&client, &short.id)).await);
    assert!(
        now_ms() >= short.expires_at_ms,
        "removed before its deadline"
    );
    assert!(common::eventually(LIMIT, || has_event(&client, &short.id, "timeout")).await);
    common::assert_sandbox_gone(&daemon.state_dir, &short.id, Some(short_helper));
}

#[tokio::test]
async fn test_restart_readopts_live_sandboxes_and_destroys_the_rest() {
    common::require_binaries();
    let mut first = TestDaemon::start("restart", &[]);
    first.keep_state = true;
    let _cleanup = common::CleanupOnPanic {
        state_dir: first.state_dir.clone(),
    };
    let client = first.client();
    let kept = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap();
    let kept_id = kept.sandbox.id.clone();
    client
        .write_file(&kept_id, "/workspace/note", &b"survives"[..])
        .await
        .unwrap();
    let expiring = client
        .create(&CreateSandboxRequest {
            timeout_ms: Some(2000),
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox;
    let dying = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox;
    let kept_helper = helper_of(&first, &kept_id);
    let expiring_helper = helper_of(&first, &expiring.id);
    let dying_helper = helper_of(&first, &dying.id);

    // A graceful stop leaves every sandbox running.
    assert!(first.terminate(), "airlockd exits cleanly on SIGTERM");
    for (pid, ticks) in [kept_helper, expiring_helper, dying_helper] {
        assert!(
            common::process_alive(pid, Some(ticks)),
            "sandbox died with the daemon"
        );
    }
    // While the daemon is down: one sandbox dies, one passes its deadline, and a stray
    // directory appears.
    kill9(dying_helper.0);
    let stray = first.state_dir.join("sandboxes").join("strayleftover");
    std::fs::create_dir_all(&stray).unwrap();
    while now_ms() <= expiring.expires_at_ms {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let second = TestDaemon::start_in(&first.state_dir, &first.key, &[]);
    let client = second.client();
    // Re-adopted: listed, and both its token and its files still work.
    let listed = client.get(&kept_id).await.unwrap();
    assert_eq!(listed.state, SandboxState::Running);
    let token = second
        .anonymous()
        .with_access_token(Some(kept.access_token.clone()));
    assert_eq!(
        token.read_file(&kept_id, "/workspace/note").await.unwrap(),
        b"survives"
    );
    let out = token
        .exec_collect(
            &kept_id,
            &ExecRequest {
                argv: Some(vec!["cat".into(), "/workspace/note".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, b"survives");
    assert!(has_event(&client, &kept_id, "adopted").await);

    // The one that died while the daemon was down is destroyed and recorded, before serving.
    assert!(is_gone(&client, &dying.id).await);
    assert!(has_event(&client, &dying.id, "orphan_destroyed").await);
    common::assert_sandbox_gone(&second.state_dir, &dying.id, Some(dying_helper));
    assert!(!stray.exists(), "stray directory kept");
    assert!(has_event(&client, "strayleftover", "orphan_destroyed").await);

    // The expired one ends at once, from its stored deadline.
    assert!(common::eventually(LIMIT, || is_gone(&client, &expiring.id)).await);
    assert!(common::eventually(LIMIT, || has_event(&client, &expiring.id, "timeout")).await);
    common::assert_sandbox_gone(&second.state_dir, &expiring.id, Some(expiring_helper));

    client.delete(&kept_id).await.unwrap();
    assert!(is_gone(&client, &kept_id).await);
    common::assert_sandbox_gone(&second.state_dir, &kept_id, Some(kept_helper));
    drop(first);
}

/// `(state, parent pid, start ticks)` of `/proc/<pid>`, if the entry exists.
fn proc_entry(pid: i32) -> Option<(String, u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    Some((
        fields.first()?.to_string(),
        fields.get(1)?.parse().ok()?,
        fields.get(19)?.parse().ok()?,
    ))
}

/// Every process in the sandbox's cgroups (the agent and what it runs), as `(pid, ticks)`.
fn sandbox_processes(id: &str) -> Vec<(i32, u64)> {
    let mut found = Vec::new();
    for dir in common::sandbox_cgroups(id) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if let Some((_, _, ticks)) = proc_entry(pid)
                && !found.contains(&(pid, ticks))
            {
                found.push((pid, ticks));
            }
        }
    }
    found
}

/// Starts a process in the sandbox that would run for long, and returns the sandbox's
/// processes (at least the agent and that one).
async fn busy_sandbox(client: &Client, id: &str) -> Vec<(i32, u64)> {
    let out = client
        .exec_collect(
            id,
            &ExecRequest {
                shell: Some("sleep 1000 >/dev/null 2>&1 & echo started".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, b"started\n");
    let processes = sandbox_processes(id);
    assert!(processes.len() >= 2, "agent and sleep: {processes:?}");
    processes
}

/// Whether `/proc` still shows this process (same pid and start time), zombie or not.
fn in_proc(pid: i32, ticks: u64) -> bool {
    proc_entry(pid).is_some_and(|(_, _, t)| t == ticks)
}

/// Once a list sent right after a DELETE answers (it waits for the delete's teardown), nothing
/// of the sandbox runs: its cgroup is gone and every process that was in it has exited and
/// been reaped; its helper is reaped by the daemon when the daemon is its parent. A re-adopted sandbox's helper belongs to whoever adopted the old
/// daemon's orphans (init here): the daemon waits, through a pidfd, until it has exited, and
/// no one but that parent can collect its exit status.
#[tokio::test]
async fn test_delete_after_restart_leaves_no_process_of_the_sandbox() {
    common::require_binaries();
    let mut first = TestDaemon::start("reap", &[]);
    first.keep_state = true;
    let _cleanup = common::CleanupOnPanic {
        state_dir: first.state_dir.clone(),
    };
    let client = first.client();
    let adopted = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let adopted_processes = busy_sandbox(&client, &adopted).await;
    let adopted_helper = helper_of(&first, &adopted);
    assert!(first.terminate(), "airlockd exits cleanly on SIGTERM");

    let second = TestDaemon::start_in(&first.state_dir, &first.key, &[]);
    let client = second.client();
    assert_eq!(
        client.get(&adopted).await.unwrap().state,
        SandboxState::Running
    );
    let own = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let own_processes = busy_sandbox(&client, &own).await;
    let own_helper = helper_of(&second, &own);
    for (pid, ticks) in adopted_processes.iter().chain(&own_processes) {
        assert!(
            common::process_alive(*pid, Some(*ticks)),
            "{pid} not running"
        );
    }

    for (id, processes, helper) in [
        (&adopted, &adopted_processes, adopted_helper),
        (&own, &own_processes, own_helper),
    ] {
        client.delete(id).await.unwrap();
        let listed = client.list(&[], &BTreeMap::new()).await.unwrap();
        assert!(listed.iter().all(|sandbox| sandbox.id != *id), "{listed:?}");
        // No polling: all of this holds when the list answers.
        common::assert_sandbox_gone(&second.state_dir, id, Some(helper));
        for &(pid, ticks) in processes {
            assert!(
                !in_proc(pid, ticks),
                "process {pid} of {id} left: {:?}",
                proc_entry(pid)
            );
        }
        let (pid, ticks) = helper;
        if let Some((state, parent, _)) = proc_entry(pid).filter(|(_, _, t)| *t == ticks) {
            assert_eq!(state, "Z", "helper {pid} of {id} still runs");
            assert_ne!(
                parent,
                second.pid(),
                "helper {pid} of {id} is the daemon's child and was not reaped"
            );
            assert_eq!(id, &adopted, "the daemon's own helper {pid} was not reaped");
        }
    }
    drop(first);
}

/// The namespaces (`/proc/PID/ns/NAME` link texts) of `processes`, that the host's pid 1 does
/// not share.
fn own_namespaces(processes: &[(i32, u64)]) -> HashSet<String> {
    let host: HashSet<String> = NAMESPACES
        .iter()
        .filter_map(|ns| std::fs::read_link(format!("/proc/1/ns/{ns}")).ok())
        .map(|link| link.to_string_lossy().into_owned())
        .collect();
    processes
        .iter()
        .flat_map(|(pid, _)| NAMESPACES.iter().map(move |ns| (*pid, ns)))
        .filter_map(|(pid, ns)| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok())
        .map(|link| link.to_string_lossy().into_owned())
        .filter(|link| !host.contains(link))
        .collect()
}

const NAMESPACES: [&str; 6] = ["mnt", "net", "pid", "ipc", "uts", "user"];

/// Processes anywhere on the host that are in one of `namespaces`.
fn processes_in(namespaces: &HashSet<String>) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            NAMESPACES.iter().any(|ns| {
                std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                    .is_ok_and(|link| namespaces.contains(link.to_string_lossy().as_ref()))
            })
        })
        .collect()
}

/// A DELETE answers once every process of the sandbox is killed and its row is gone; the
/// kernel's teardown and the removal of its cgroup, volume and directory may still run. A
/// list sent right after it (or after a create sent right after it) waits for that: when it
/// answers, nothing of the sandbox is left (processes, namespaces, cgroups, mounts,
/// directory, volume, store row).
#[tokio::test]
async fn test_a_list_right_after_a_delete_finds_nothing_of_the_sandbox() {
    common::require_binaries();
    let daemon = TestDaemon::start("deleted", &[]);
    let client = daemon.client();
    let volumes = daemon.state_dir.join("storage/volumes");
    for then_create in [false, true] {
        let id = client
            .create(&CreateSandboxRequest::default())
            .await
            .unwrap()
            .sandbox
            .id;
        let processes = busy_sandbox(&client, &id).await;
        let namespaces = own_namespaces(&processes);
        assert!(namespaces.len() >= 5, "{namespaces:?}");
        let (helper, ticks) = helper_of(&daemon, &id);
        assert!(volumes.join(&id).is_dir(), "the sandbox has a volume");

        // Processes started from now on are not the sandbox's (its namespaces' numbers may be
        // given to a new sandbox's, this test's or another's, once they are freed).
        let mut marker = std::process::Command::new("true").spawn().unwrap();
        let (_, _, since) = proc_entry(i32::try_from(marker.id()).unwrap()).unwrap();
        marker.wait().unwrap();
        client.delete(&id).await.unwrap();
        let next = if then_create {
            let created = client.create(&CreateSandboxRequest::default()).await;
            Some(created.unwrap().sandbox.id)
        } else {
            None
        };
        let listed = client.list(&[], &BTreeMap::new()).await.unwrap();
        assert!(listed.iter().all(|sandbox| sandbox.id != id), "{listed:?}");

        // No polling: all of this holds when the list answers.
        common::assert_sandbox_gone(&daemon.state_dir, &id, None);
        for &(pid, ticks) in &processes {
            assert!(!in_proc(pid, ticks), "process {pid} of {id} left");
        }
        assert!(
            !in_proc(helper, ticks),
            "helper {helper} of {id} left: {:?}",
            proc_entry(helper)
        );
        let left: Vec<i32> = processes_in(&namespaces)
            .into_iter()
            .filter(|&pid| proc_entry(pid).is_some_and(|(_, _, ticks)| ticks <= since))
            .collect();
        assert_eq!(
            left,
            Vec::<i32>::new(),
            "processes in the namespaces of {id}"
        );
        assert!(!volumes.join(&id).exists(), "volume of {id} left");
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mountinfo.contains(&id), "a mount of {id} left");
        assert!(
            common::stored_helpers(&daemon.state_dir)
                .iter()
                .all(|(row, _)| *row != id),
            "the row of {id} left"
        );
        if let Some(next) = next {
            client.delete(&next).await.unwrap();
        }
    }
}
