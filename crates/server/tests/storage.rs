//! A full disk is a full disk and an OOM kill ends only a workload process: the sandbox, its
//! agent and its files survive both, on disk scratch (the default here) and on memory scratch.
//! Proven from inside, the way a workload would meet them, and through the files API.
//! Needs root, btrfs-progs, and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use airlock_api::v1::{CreateSandboxRequest, ExecRequest, Resources, SandboxState};
use airlock_server::client::{Client, ClientError};
use common::TestDaemon;

const MIB: u64 = 1 << 20;

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

async fn create(client: &Client, memory_bytes: u64, disk_bytes: u64) -> String {
    let request = CreateSandboxRequest {
        resources: Resources {
            memory_bytes: Some(memory_bytes),
            disk_bytes: Some(disk_bytes),
            ..Resources::default()
        },
        ..CreateSandboxRequest::default()
    };
    client.create(&request).await.unwrap().sandbox.id
}

async fn run(client: &Client, id: &str, command: &str) -> (i32, String, String, bool) {
    let out = client.exec_collect(id, &shell(command)).await.unwrap();
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.oom_killed,
    )
}

/// Fills `/tmp` and then `/workspace` past the sandbox's scratch budget (`budget_mib`) from
/// inside; each write fails with `full_error`, and afterwards the sandbox still runs commands
/// and still has a file written before.
async fn fill_the_disk_from_inside(client: &Client, id: &str, budget_mib: u64, full_error: &str) {
    let (code, _, err, _) = run(client, id, "echo kept > /workspace/before").await;
    assert_eq!(code, 0, "{err}");
    for dir in ["/tmp", "/workspace"] {
        // More than the budget: dd must stop with the disk's error, not be killed.
        let (code, _, err, oom) = run(
            client,
            id,
            &format!(
                "dd if=/dev/zero of={dir}/fill bs=1M count={}",
                budget_mib * 3 / 2
            ),
        )
        .await;
        assert_eq!(code, 1, "dd into {dir} should fail, not be killed: {err}");
        assert!(err.contains(full_error), "{dir}: {err}");
        assert!(!oom, "a full disk is not an OOM");
    }
    // Both share the one budget: the sum of what landed is at most the limit.
    let (code, out, err, _) = run(
        client,
        id,
        "cat /workspace/before; du -sk /tmp/fill /workspace/fill | awk '{s+=$1} END {print s}'",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("kept"),
        "the earlier file is gone: {out}"
    );
    let used_kib: u64 = lines.next().unwrap().trim().parse().unwrap();
    assert!(
        used_kib <= budget_mib * 1024 + 1024,
        "{used_kib} KiB landed in a {budget_mib} MiB budget"
    );
    // Freeing space makes room again: it is a disk, not a broken sandbox.
    let (code, _, err, _) = run(
        client,
        id,
        "rm -f /tmp/fill /workspace/fill && sync && dd if=/dev/zero of=/workspace/again bs=1M count=8 2>&1",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        client.get(id).await.unwrap().state,
        SandboxState::Running,
        "the sandbox must survive a full disk"
    );
}

#[tokio::test]
async fn test_disk_scratch_full_disk_fails_writes_and_keeps_the_sandbox() {
    common::require_binaries();
    let daemon = TestDaemon::start("diskfull", &["--scratch", "disk"]);
    let client = daemon.client();
    let id = create(&client, 256 * MIB, 64 * MIB).await;
    fill_the_disk_from_inside(&client, &id, 64, "Disk quota exceeded").await;
}

#[tokio::test]
async fn test_memory_scratch_full_disk_fails_writes_and_keeps_the_sandbox() {
    common::require_binaries();
    let daemon = TestDaemon::start("memfull", &["--scratch", "memory"]);
    let client = daemon.client();
    // The tmpfs's pages count as memory, so it is at most half the memory limit: 64 MiB of
    // disk in 96 MiB of memory is a 48 MiB tmpfs, and a full one leaves the workload room.
    let id = create(&client, 96 * MIB, 64 * MIB).await;
    fill_the_disk_from_inside(&client, &id, 48, "No space left on device").await;
}

#[tokio::test]
async fn test_upload_past_the_disk_limit_is_refused_and_keeps_earlier_files() {
    common::require_binaries();
    let daemon = TestDaemon::start("uploadfull", &["--scratch", "disk"]);
    let client = daemon.client();
    let id = create(&client, 256 * MIB, 32 * MIB).await;
    client
        .write_file(&id, "/workspace/first", b"first file".to_vec())
        .await
        .unwrap();
    let big = vec![7u8; usize::try_from(48 * MIB).unwrap()];
    for path in ["/workspace/big", "/tmp/big"] {
        match client.write_file(&id, path, big.clone()).await {
            Err(ClientError::Api { status, code, .. }) => {
                assert_eq!(
                    (status, code.as_str()),
                    (507, "insufficient_storage"),
                    "{path}: a full disk is the caller's limit, not an agent failure"
                );
            }
            other => panic!("{path}: an upload past the disk limit succeeded: {other:?}"),
        }
    }
    assert_eq!(
        client.read_file(&id, "/workspace/first").await.unwrap(),
        b"first file"
    );
    let (code, _, err, _) = run(&client, &id, "true").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(client.get(&id).await.unwrap().state, SandboxState::Running);
}

#[tokio::test]
async fn test_oom_kill_ends_only_the_workload_and_is_reported() {
    common::require_binaries();
    let daemon = TestDaemon::start("oom", &[]);
    let client = daemon.client();
    let id = create(&client, 96 * MIB, 64 * MIB).await;
    let (_, agent_before, _, _) = run(&client, &id, "cat /proc/1/stat | cut -d' ' -f1-2").await;
    // 300 MiB touched in a 96 MiB sandbox: the kernel must kill the allocator, not the agent.
    let (code, _, err, oom) = run(
        &client,
        &id,
        "python3 -c 'b = bytearray(300 << 20); print(len(b))'",
    )
    .await;
    assert!(
        oom,
        "the exit event must say the OOM killer acted: {code} {err}"
    );
    assert_ne!(code, 0);
    // The sandbox, its agent (same pid 1, same start) and its files are still there.
    let (code, agent_after, err, oom) =
        run(&client, &id, "cat /proc/1/stat | cut -d' ' -f1-2").await;
    assert_eq!(code, 0, "{err}");
    assert!(!oom, "a later command is not blamed for the earlier kill");
    assert_eq!(agent_after, agent_before, "the agent was replaced");
    assert_eq!(client.get(&id).await.unwrap().state, SandboxState::Running);
    // The daemon recorded the kill as an event, with the cgroup's count.
    let mut found = None;
    for _ in 0..100 {
        let events = client.events(&id, None, None).await.unwrap();
        found = events.events.into_iter().find(|e| e.outcome == "oom_kill");
        if found.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let event = found.expect("no oom_kill event was recorded");
    assert!(
        event.detail.as_deref().unwrap_or("").contains("1 so far"),
        "{event:?}"
    );
}
