//! 100 sandboxes created at once are all usable, and all are cleaned up afterwards.
//! Needs root and the sandbox binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use airlock_api::v1::{CreateSandboxRequest, ExecRequest};
use common::TestDaemon;

const COUNT: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_100_concurrent_creates_are_usable_then_cleaned_up() {
    common::require_binaries();
    let daemon = TestDaemon::start("scale", &[]);
    let client = daemon.client();
    let mut tasks = Vec::new();
    for _ in 0..COUNT {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client.create(&CreateSandboxRequest::default()).await
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap().unwrap().sandbox.id);
    }
    assert_eq!(
        client.list(&[], &Default::default()).await.unwrap().len(),
        COUNT
    );
    let helpers = common::stored_helpers(&daemon.state_dir);
    assert_eq!(helpers.len(), COUNT);

    // Every one runs a command of its own, concurrently.
    let mut tasks = Vec::new();
    for id in &ids {
        let client = client.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let request = ExecRequest {
                argv: Some(vec!["echo".into(), id.clone()]),
                ..Default::default()
            };
            let out = client.exec_collect(&id, &request).await.unwrap();
            assert_eq!(out.stdout, format!("{id}\n").into_bytes());
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let mut tasks = Vec::new();
    for id in &ids {
        let client = client.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move { client.delete(&id).await }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert!(
        client
            .list(&[], &Default::default())
            .await
            .unwrap()
            .is_empty()
    );
    for (id, helper) in helpers {
        common::assert_sandbox_gone(&daemon.state_dir, &id, helper);
    }
    let left = std::fs::read_dir(daemon.state_dir.join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "sandbox directories left");
}
