//! Warm pools through the API: members start in the background, a create claims one and gets
//! its own env, metadata, timeout and token, the pool refills, creates it cannot serve go cold,
//! members hold places under --max-sandboxes but yield them to cold creates, sizes persist,
//! and no member outlives its daemon. Needs root and the sandbox binaries.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_api::v1::{CreateSandboxRequest, ErrorCode, ExecRequest, PoolStatus};
use airlock_server::client::Client;
use common::TestDaemon;
use hyper::{Method, StatusCode};

const FILL_LIMIT: Duration = Duration::from_secs(60);

async fn wait_ready(client: &Client, template: &str, ready: u32) -> PoolStatus {
    let filled = common::eventually(FILL_LIMIT, || async {
        client.pool(template).await.unwrap().ready == ready
    })
    .await;
    let status = client.pool(template).await.unwrap();
    assert!(filled, "the pool never reached {ready} ready: {status:?}");
    status
}

async fn members(client: &Client) -> Vec<String> {
    client
        .list_including(&[], &BTreeMap::new(), true)
        .await
        .unwrap()
        .into_iter()
        .filter(|sandbox| sandbox.pool)
        .map(|sandbox| sandbox.id)
        .collect()
}

async fn shell(client: &Client, id: &str, script: &str) -> String {
    let request = ExecRequest {
        argv: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    };
    let out = client.exec_collect(id, &request).await.unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pool_claim_applies_the_create_and_the_pool_refills() {
    common::require_binaries();
    let mut daemon = TestDaemon::start("pool-claim", &["--warm-pool", "base=2"]);
    let client = daemon.client();
    let status = wait_ready(&client, "base", 2).await;
    assert_eq!((status.size, status.claims_total), (2, 0));
    assert!(
        client.list(&[], &BTreeMap::new()).await.unwrap().is_empty(),
        "members are not listed"
    );
    let pooled = members(&client).await;
    assert_eq!(pooled.len(), 2, "?include=pool lists the members");
    let (_, _, metrics) = client.raw(Method::GET, "/metrics", &[], "").await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    assert!(
        metrics.contains("airlock_pool_ready{template=\"base\"} 2"),
        "{metrics}"
    );

    let request = CreateSandboxRequest {
        env: [("GREETING".to_owned(), "from the claim".to_owned())].into(),
        metadata: [("owner".to_owned(), "pool-test".to_owned())].into(),
        timeout_ms: Some(90_000),
        ..CreateSandboxRequest::default()
    };
    let before_ms = airlock_server::store::now_ms();
    let created = client.create(&request).await.unwrap();
    let id = created.sandbox.id.clone();
    assert!(pooled.contains(&id), "the create was served by a member");
    assert!(!created.sandbox.pool);
    assert_eq!(created.sandbox.metadata, request.metadata);
    assert!(
        created.sandbox.created_at_ms >= before_ms,
        "created at the claim"
    );
    let expires = created.sandbox.expires_at_ms - created.sandbox.created_at_ms;
    assert_eq!(expires, 90_000, "the create's timeout");
    // The claimed environment reaches new processes, from inside the sandbox.
    assert_eq!(
        shell(&client, &id, "echo \"$GREETING\"").await,
        "from the claim\n"
    );
    // The token is the create's: it opens the sandbox's envd pass-through, a wrong one not.
    let envd = format!("/v1/sandboxes/{id}/envd/health");
    let with_token = client.with_access_token(Some(created.access_token.clone()));
    let (ok, _, _) = with_token.raw(Method::GET, &envd, &[], "").await.unwrap();
    assert_eq!(ok, StatusCode::NO_CONTENT);
    // The agent's claim endpoint is the daemon's alone: not through the pass-through.
    let (refused, _, _) = with_token
        .raw(
            Method::POST,
            &format!("/v1/sandboxes/{id}/envd/airlock/claim"),
            &[],
            "{\"env\":{}}",
        )
        .await
        .unwrap();
    assert!(refused.is_client_error(), "{refused}");
    let logs = client.logs(&id).await.unwrap();
    let kinds: Vec<&str> = logs.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["create", "ready"], "{:?}", logs.events);
    assert!(
        logs.events[0].message.contains("warm pool"),
        "{:?}",
        logs.events
    );
    assert_eq!(
        client.list(&[], &BTreeMap::new()).await.unwrap().len(),
        1,
        "the claimed sandbox is listed like any"
    );

    // The pool refills with a new member.
    let status = wait_ready(&client, "base", 2).await;
    assert_eq!(status.claims_total, 1);
    let refilled = members(&client).await;
    assert!(!refilled.contains(&id));

    // A create that asks for other resources goes cold and leaves the pool alone.
    let mut other = CreateSandboxRequest::default();
    other.resources.memory_bytes = Some(300 << 20);
    let cold = client.create(&other).await.unwrap();
    assert!(!refilled.contains(&cold.sandbox.id));
    let logs = client.logs(&cold.sandbox.id).await.unwrap();
    assert!(
        !logs.events[0].message.contains("warm pool"),
        "{:?}",
        logs.events
    );
    assert_eq!(client.pool("base").await.unwrap().claims_total, 1);

    // Size 0 destroys the members and everything they had.
    let status = client.set_pool("base", 0).await.unwrap();
    assert_eq!((status.size, status.ready), (0, 0));
    assert!(members(&client).await.is_empty());
    for member in &refilled {
        common::assert_sandbox_gone(&daemon.state_dir, member, None);
    }
    client.delete(&id).await.unwrap();
    client.delete(&cold.sandbox.id).await.unwrap();
    assert!(daemon.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pool_bad_requests_are_refused_with_their_reason() {
    common::require_binaries();
    let mut daemon = TestDaemon::start("pool-bad", &["--max-sandboxes", "4"]);
    let client = daemon.client();
    let put = |body: &'static str, template: &'static str| {
        let client = client.clone();
        async move {
            let path = format!("/v1/templates/{template}/pool");
            let headers = [("content-type", "application/json")];
            let (status, _, body) = client
                .raw(Method::PUT, &path, &headers, body)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, body) = put("{\"size\": 1}", "nosuch").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("nosuch"), "{body}");
    let (status, body) = put("{\"size\": -1}", "base").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = put("{\"size\": 1, \"extra\": 1}", "base").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("extra"), "{body}");
    let (status, body) = put("{\"size\": 5}", "base").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.contains("--max-sandboxes"), "{body}");
    let err = client.pool("nosuch").await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    let (status, _, body) = client
        .raw(Method::GET, "/v1/sandboxes?include=everything", &[], "")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("everything"));
    assert_eq!(
        client.pool("base").await.unwrap().size,
        0,
        "nothing was set"
    );
    assert!(daemon.terminate());
}

/// A snapshot has a pool only on the microvm tier, where its members are VM shells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pool_of_a_process_tier_snapshot_is_refused_naming_what_may_have_one() {
    common::require_binaries();
    let mut daemon = TestDaemon::start("pool-snapshot", &["--scratch", "disk"]);
    let client = daemon.client();
    let created = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap();
    client
        .snapshot(&created.sandbox.id, Some("files".into()))
        .await
        .unwrap();
    let (status, _, body) = client
        .raw(
            Method::PUT,
            "/v1/templates/files/pool",
            &[("content-type", "application/json")],
            "{\"size\": 1}",
        )
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("microvm snapshots"), "{body}");
    let (status, _, body) = client
        .raw(Method::GET, "/v1/templates/files/pool", &[], "")
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    client.delete(&created.sandbox.id).await.unwrap();
    assert!(daemon.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pool_members_yield_their_places_to_cold_creates() {
    common::require_binaries();
    let mut daemon = TestDaemon::start("pool-capacity", &["--max-sandboxes", "2"]);
    let client = daemon.client();
    client.set_pool("base", 2).await.unwrap();
    wait_ready(&client, "base", 2).await;
    let mut cold = CreateSandboxRequest::default();
    cold.resources.pids_max = Some(100);
    let first = client.create(&cold).await.unwrap();
    let second = client.create(&cold).await.unwrap();
    let err = client.create(&cold).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Capacity), "{err}");
    assert!(members(&client).await.is_empty(), "both members gave way");
    for id in [&first.sandbox.id, &second.sandbox.id] {
        assert_eq!(shell(&client, id, "echo up").await, "up\n");
        client.delete(id).await.unwrap();
    }
    // With room again, the pool fills back.
    wait_ready(&client, "base", 2).await;
    assert!(daemon.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pool_size_persists_and_members_end_with_their_daemon() {
    common::require_binaries();
    let mut daemon = TestDaemon::start("pool-restart", &[]);
    daemon.keep_state = true;
    let _cleanup = common::CleanupOnPanic {
        state_dir: daemon.state_dir.clone(),
    };
    let client = daemon.client();
    client.set_pool("base", 1).await.unwrap();
    wait_ready(&client, "base", 1).await;
    let killed = members(&client).await;
    assert_eq!(killed.len(), 1);
    daemon.kill9();

    // The next daemon keeps the size, sweeps the dead member and starts a new one.
    let state_dir = daemon.state_dir.clone();
    let key = daemon.key.clone();
    let mut daemon = TestDaemon::start_in(&state_dir, &key, &[]);
    let client = daemon.client();
    assert_eq!(client.pool("base").await.unwrap().size, 1);
    common::assert_sandbox_gone(&state_dir, &killed[0], None);
    wait_ready(&client, "base", 1).await;
    let stopped = members(&client).await;
    assert_eq!(stopped.len(), 1);
    assert_ne!(stopped, killed);

    // A graceful stop destroys the members at once.
    assert!(daemon.terminate());
    common::assert_sandbox_gone(&state_dir, &stopped[0], None);
    daemon.keep_state = false;
}

/// SIGTERM while the fillers are still starting members: the daemon waits for those starts
/// and destroys them too, so no member's cgroup outlives it (the next daemon on this state
/// directory would sweep one, but a deleted state directory has no next daemon).
#[tokio::test]
async fn test_a_daemon_stopped_mid_fill_leaves_no_member_behind() {
    common::require_binaries();
    let mut daemon = TestDaemon::start("pool-stop-mid-fill", &["--pool-fill-concurrency", "2"]);
    let client = daemon.client();
    client.set_pool("base", 8).await.unwrap();
    let mut polls = 0;
    while client.pool("base").await.unwrap().starting == 0 {
        polls += 1;
        assert!(polls < 10_000, "no member ever started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let state_dir = daemon.state_dir.clone();
    assert!(daemon.terminate());
    let left = common::owner_cgroups(&state_dir);
    assert!(
        left.is_empty(),
        "members' cgroups outlived their daemon: {left:?}"
    );
}
