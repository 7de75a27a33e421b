//! Pause and resume, snapshots and forks through the native API, and their durability: the
//! operator's timers, and a `kill -9` of the daemon while pauses, resumes and snapshots run.
//! Needs root, btrfs-progs, and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::time::Duration;

use airlock_api::v1::{
    CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest, PauseMode, SandboxState,
};
use airlock_server::client::{Client, ClientError};
use common::{CleanupOnPanic, TestDaemon};

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

async fn run(client: &Client, id: &str, command: &str) -> String {
    let out = client.exec_collect(id, &shell(command)).await.unwrap();
    assert_eq!(
        out.exit_code,
        0,
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn create(client: &Client) -> String {
    client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id
}

/// Polls `check` (no timing is asserted: the deadline only stops a hang).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gave up waiting for {what}");
}

/// The v1 freezer state of a sandbox's cgroup (this host has the v1 freezer).
fn freezer_state(id: &str) -> Option<String> {
    common::sandbox_cgroups(id)
        .into_iter()
        .find_map(|dir| std::fs::read_to_string(dir.join("freezer.state")).ok())
        .map(|s| s.trim().to_owned())
}

#[tokio::test]
async fn test_pause_refuses_the_data_plane_until_resume_and_keeps_files() {
    common::require_binaries();
    let daemon = TestDaemon::start("pause-native", &[]);
    let client = daemon.client();
    let id = create(&client).await;
    run(&client, &id, "echo kept > /workspace/f").await;
    let paused = client.pause(&id, PauseMode::Frozen).await.unwrap();
    assert_eq!(paused.state, SandboxState::Paused);
    assert_eq!(paused.pause_mode, Some(PauseMode::Frozen));
    assert_eq!(freezer_state(&id).as_deref(), Some("FROZEN"));
    match client.exec_collect(&id, &shell("true")).await {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code), (409, ErrorCode::SandboxPaused));
        }
        other => panic!("exec on a paused sandbox: {other:?}"),
    }
    match client.pause(&id, PauseMode::Frozen).await {
        Err(ClientError::Api { code, .. }) => assert_eq!(code, ErrorCode::SandboxPaused),
        other => panic!("a second pause: {other:?}"),
    }
    let listed = client
        .list(&[SandboxState::Paused], &Default::default())
        .await
        .unwrap();
    assert!(listed.iter().any(|s| s.id == id));
    let resumed = client.resume(&id, None).await.unwrap();
    assert_eq!(
        (resumed.state, resumed.pause_mode),
        (SandboxState::Running, None)
    );
    assert_eq!(freezer_state(&id).as_deref(), Some("THAWED"));
    assert_eq!(run(&client, &id, "cat /workspace/f").await, "kept\n");
}

#[tokio::test]
async fn test_pause_to_disk_after_frees_a_frozen_sandbox_and_keeps_its_files() {
    common::require_binaries();
    let daemon = TestDaemon::start("pause-to-disk", &["--pause-to-disk-after", "1s"]);
    let client = daemon.client();
    let id = create(&client).await;
    run(&client, &id, "echo kept > /workspace/f; sleep 1000 &").await;
    client.pause(&id, PauseMode::Frozen).await.unwrap();
    // The row says so first (a crash midway leaves the intent), the event once it is done.
    eventually("the frozen pause to go to disk", || async {
        let events = client.events(&id, None, None).await.unwrap().events;
        events.iter().any(|e| e.outcome == "pause_to_disk")
    })
    .await;
    assert_eq!(
        client.get(&id).await.unwrap().pause_mode,
        Some(PauseMode::Filesystem)
    );
    assert!(
        common::sandbox_cgroups(&id).is_empty(),
        "its processes and cgroups are gone: the memory is free"
    );
    client.resume(&id, None).await.unwrap();
    assert_eq!(run(&client, &id, "cat /workspace/f").await, "kept\n");
    assert_eq!(
        run(&client, &id, "pgrep -c sleep || true").await.trim(),
        "0"
    );
    // Started again (perhaps in another host id range), it still owns its files.
    run(&client, &id, "echo again >> /workspace/f").await;
}

#[tokio::test]
async fn test_paused_retention_deletes_a_sandbox_paused_too_long() {
    common::require_binaries();
    let daemon = TestDaemon::start("pause-retention", &["--paused-retention", "1s"]);
    let client = daemon.client();
    let id = create(&client).await;
    client.pause(&id, PauseMode::Filesystem).await.unwrap();
    eventually("the paused sandbox to be deleted", || async {
        matches!(
            client.get(&id).await,
            Err(ClientError::Api { status: 404, .. })
        )
    })
    .await;
    // A list waits for the removal's teardown.
    client.list(&[], &Default::default()).await.unwrap();
    assert!(common::sandbox_cgroups(&id).is_empty());
    assert!(!daemon.state_dir.join("sandboxes").join(&id).exists());
    assert!(!daemon.state_dir.join("storage/volumes").join(&id).exists());
}

#[tokio::test]
async fn test_fork_and_snapshot_through_the_native_api() {
    common::require_binaries();
    let daemon = TestDaemon::start("fork-native", &[]);
    let client = daemon.client();
    let id = create(&client).await;
    run(&client, &id, "echo parent > /workspace/f").await;
    let snapshot = client
        .snapshot(&id, Some("base-copy".into()))
        .await
        .unwrap();
    // Its clone is made ahead, off the path of the create that takes it.
    let spares = daemon.state_dir.join("storage/spares");
    assert!(
        spares.join(&snapshot.id).is_dir(),
        "no spare clone was made"
    );
    let forks = client
        .fork(
            &id,
            &ForkRequest {
                count: 3,
                timeout_ms: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(forks.len(), 3);
    for (i, fork) in forks.iter().enumerate() {
        let fork = fork.sandbox.as_ref().expect("each fork succeeds here");
        assert_eq!(run(&client, &fork.id, "cat /workspace/f").await, "parent\n");
        run(&client, &fork.id, &format!("echo {i} > /workspace/mine")).await;
        // Each fork runs in a host id range of its own, and still owns the copied files.
        assert_eq!(
            run(
                &client,
                &fork.id,
                "echo more >> /workspace/f && stat -c %u:%g /workspace/f"
            )
            .await,
            "0:0\n"
        );
    }
    assert_eq!(
        run(&client, &id, "cat /workspace/mine 2>/dev/null || echo none").await,
        "none\n"
    );
    let child = client
        .create(&CreateSandboxRequest {
            template: Some("base-copy".into()),
            ..CreateSandboxRequest::default()
        })
        .await
        .unwrap()
        .sandbox
        .id;
    assert_eq!(run(&client, &child, "cat /workspace/f").await, "parent\n");
    client.delete_snapshot(&snapshot.id).await.unwrap();
    assert_eq!(run(&client, &child, "cat /workspace/f").await, "parent\n");
    assert!(client.snapshots().await.unwrap().is_empty());
    // No clone outlives its snapshot, not even one a background refill was making.
    let spares_gone = common::eventually(Duration::from_secs(30), || async {
        std::fs::read_dir(&spares).map_or(true, |mut entries| entries.next().is_none())
    })
    .await;
    assert!(spares_gone, "a spare clone outlived its snapshot");
    assert!(
        matches!(
            client
                .fork(
                    &id,
                    &ForkRequest {
                        count: 21,
                        timeout_ms: None
                    }
                )
                .await,
            Err(ClientError::Api { status: 400, .. })
        ),
        "at most 20 forks"
    );
}

#[tokio::test]
async fn test_kill_9_during_pauses_and_snapshots_leaves_each_sandbox_whole() {
    common::require_binaries();
    let mut first = TestDaemon::start("pause-crash", &[]);
    first.keep_state = true;
    let _cleanup = CleanupOnPanic {
        state_dir: first.state_dir.clone(),
    };
    let client = first.client();
    let mut ids = Vec::new();
    for _ in 0..6 {
        let id = create(&client).await;
        run(&client, &id, "echo before > /workspace/f").await;
        ids.push(id);
    }
    // Pauses, resumes and snapshots in flight when the daemon dies.
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let client = client.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0.. {
                let mode = if (i + round) % 2 == 0 {
                    PauseMode::Frozen
                } else {
                    PauseMode::Filesystem
                };
                let _ = client.pause(&id, mode).await;
                let _ = client.snapshot(&id, None).await;
                let _ = client.resume(&id, None).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    first.kill9();
    for task in tasks {
        task.abort();
    }
    let second = TestDaemon::start_in(&first.state_dir, &first.key, &[]);
    let client = second.client();
    for id in &ids {
        let sandbox = match client.get(id).await {
            Ok(sandbox) => sandbox,
            Err(err) => {
                let events = client.logs(id).await.map(|l| l.events).unwrap_or_default();
                let last: Vec<String> = events
                    .iter()
                    .rev()
                    .take(4)
                    .map(|e| format!("{}: {}", e.kind, e.message))
                    .collect();
                panic!("{id} is gone after the restart ({err}); its last events: {last:?}");
            }
        };
        match (sandbox.state, sandbox.pause_mode) {
            (SandboxState::Running, None) => {
                assert_ne!(
                    freezer_state(id).as_deref(),
                    Some("FROZEN"),
                    "{id} runs frozen"
                );
                assert_eq!(run(&client, id, "cat /workspace/f").await, "before\n");
            }
            (SandboxState::Paused, Some(PauseMode::Frozen)) => {
                assert_eq!(freezer_state(id).as_deref(), Some("FROZEN"), "{id}");
            }
            (SandboxState::Paused, Some(PauseMode::Filesystem)) => {
                assert!(
                    common::sandbox_cgroups(id).is_empty(),
                    "{id} kept processes"
                );
            }
            other => panic!("{id} is half-way: {other:?}"),
        }
        // Whatever state it is in, it resumes whole.
        client.resume(id, None).await.unwrap();
        assert_eq!(run(&client, id, "cat /workspace/f").await, "before\n");
    }
    // Only complete snapshots are listed, and each starts a sandbox with the files.
    for snapshot in client.snapshots().await.unwrap().into_iter().take(2) {
        let child = client
            .create(&CreateSandboxRequest {
                template: Some(snapshot.id.clone()),
                ..CreateSandboxRequest::default()
            })
            .await
            .unwrap()
            .sandbox
            .id;
        assert_eq!(run(&client, &child, "cat /workspace/f").await, "before\n");
    }
    let listed: std::collections::HashSet<String> = client
        .snapshots()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    let on_disk: std::collections::HashSet<String> =
        std::fs::read_dir(second.state_dir.join("storage/snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    assert_eq!(listed, on_disk, "snapshot volumes and rows agree");
    for snapshot in listed {
        client.delete_snapshot(&snapshot).await.unwrap();
    }
}
