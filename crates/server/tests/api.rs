//! The /v1 API end to end, through real HTTP against a real airlockd: every endpoint and every
//! error code. Needs root and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use airlock_api::Tier;
use airlock_api::v1::{
    CreateSandboxRequest, ErrorBody, ErrorCode, ExecRequest, FileKind, Resources, SandboxState,
    Workspace,
};
use airlock_server::client::{Client, ClientError};
use common::TestDaemon;
use hyper::{Method, StatusCode};

/// Sends a raw request and checks the status and the error code of the body.
async fn expect_error(
    client: &Client,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    status: StatusCode,
    code: ErrorCode,
) -> String {
    let (got, _, bytes) = client
        .raw(method.clone(), path, headers, body.to_owned())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(got, status, "{method} {path}: {text}");
    let error: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(error.code, code, "{method} {path}: {text}");
    assert!(!error.message.is_empty());
    error.message
}

fn code_of<T: std::fmt::Debug>(result: Result<T, ClientError>) -> ErrorCode {
    match result {
        Err(ClientError::Api { code, .. }) => code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

#[tokio::test]
async fn test_auth_routing_validation_and_body_limits() {
    let daemon = TestDaemon::start("auth", &["--max-body-bytes", "1KiB"]);
    let client = daemon.client();
    let anonymous = daemon.anonymous();

    assert_eq!(anonymous.health().await.unwrap().status, "ok");
    assert_eq!(client.templates().await.unwrap().templates[0].name, "base");

    // 401: no key, a wrong key, a revoked key; a valid one works.
    expect_error(
        &anonymous,
        Method::GET,
        "/v1/sandboxes",
        &[],
        "",
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthenticated,
    )
    .await;
    expect_error(
        &anonymous,
        Method::GET,
        "/v1/sandboxes",
        &[("x-api-key", "ak_wrong")],
        "",
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthenticated,
    )
    .await;
    assert!(client.list(&[], &BTreeMap::new()).await.unwrap().is_empty());
    let second = common::create_key(&daemon.state_dir, "second");
    let second_client = Client::new(&daemon.url(), Some(second)).unwrap();
    second_client.templates().await.unwrap();
    let keys = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_airlockd"))
            .arg("keys")
            .arg("--state-dir")
            .arg(&daemon.state_dir)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert!(keys(&["revoke", "second"]).0);
    assert_eq!(
        code_of(second_client.templates().await),
        ErrorCode::Unauthenticated
    );
    assert!(
        !keys(&["revoke", "second"]).0,
        "revoking twice names no active key"
    );
    let (ok, table) = keys(&["ls"]);
    assert!(
        ok && table.contains("second") && table.contains("test"),
        "{table}"
    );
    assert!(!table.contains("ak_"), "ls never prints keys: {table}");
    // An access token is no API key: the control plane refuses it.
    expect_error(
        &anonymous,
        Method::GET,
        "/v1/sandboxes",
        &[("x-access-token", "at_x")],
        "",
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthenticated,
    )
    .await;
    expect_error(
        &anonymous,
        Method::GET,
        "/v1/sandboxes/abc/files/stat?path=/",
        &[("x-access-token", "at_x")],
        "",
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthenticated,
    )
    .await;

    // 404 and 405.
    expect_error(
        &client,
        Method::GET,
        "/v1/nothing",
        &[],
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        "/v1/sandboxes/nosuch",
        &[],
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        "/v1/sandboxes/NOT-AN-ID",
        &[],
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::DELETE,
        "/v1/sandboxes/nosuch",
        &[],
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::POST,
        "/v1/sandboxes/nosuch/timeout",
        &[],
        r#"{"timeout_ms":1000}"#,
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        "/v1/sandboxes/nosuch/logs",
        &[],
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::POST,
        "/v1/sandboxes/nosuch/exec",
        &[],
        r#"{"argv":["true"]}"#,
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        "/v1/sandboxes/nosuch/files?path=/etc/hostname",
        &[],
        "",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    expect_error(
        &client,
        Method::POST,
        "/v1/sandboxes/nosuch/envd/filesystem.Filesystem/Stat",
        &[],
        "{}",
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
    )
    .await;
    let (status, headers, _) = client
        .raw(Method::PATCH, "/v1/sandboxes", &[], "")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "GET, POST");

    // 400: malformed bodies and queries.
    expect_error(
        &client,
        Method::POST,
        "/v1/sandboxes",
        &[],
        "{not json",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;
    let message = expect_error(
        &client,
        Method::POST,
        "/v1/sandboxes",
        &[],
        r#"{"timeout":5}"#,
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;
    assert!(message.contains("unknown field `timeout`"), "{message}");
    expect_error(
        &client,
        Method::GET,
        "/v1/sandboxes?state=frozen",
        &[],
        "",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        "/v1/sandboxes?color=red",
        &[],
        "",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;

    // 413: a JSON body over --max-body-bytes, declared or chunked.
    let big = format!(r#"{{"metadata":{{"k":"{}"}}}}"#, "x".repeat(2000));
    expect_error(
        &client,
        Method::POST,
        "/v1/sandboxes",
        &[],
        &big,
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::PayloadTooLarge,
    )
    .await;
    let (tx, body) = airlock_server::http::ChannelBody::new(4);
    tokio::spawn(async move {
        for _ in 0..4 {
            let _ = tx.send(Ok(bytes::Bytes::from(vec![b' '; 600]))).await;
        }
    });
    let request = hyper::Request::post("/v1/sandboxes")
        .body(http_body_util::BodyExt::boxed_unsync(body))
        .unwrap();
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // The daemon is still fine afterwards.
    assert_eq!(client.health().await.unwrap().status, "ok");

    // 422: well-formed but impossible.
    let create = |request: CreateSandboxRequest| {
        let client = client.clone();
        async move { client.create(&request).await }
    };
    let err = create(CreateSandboxRequest {
        template: Some("nope".into()),
        ..Default::default()
    })
    .await;
    assert_eq!(code_of(err), ErrorCode::NotFound);
    let err = create(CreateSandboxRequest {
        tier: Tier::Microvm,
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unprocessable));
    assert!(
        err.to_string().contains("microvm tier is unavailable"),
        "{err}"
    );
    let err = create(CreateSandboxRequest {
        timeout_ms: Some(0),
        ..Default::default()
    })
    .await;
    assert_eq!(code_of(err), ErrorCode::Unprocessable);
    let err = create(CreateSandboxRequest {
        resources: Resources {
            memory_bytes: Some(1024),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    assert_eq!(code_of(err), ErrorCode::Unprocessable);
    let err = create(CreateSandboxRequest {
        workspace: Workspace::Host {
            path: "relative/dir".into(),
        },
        ..Default::default()
    })
    .await;
    assert_eq!(code_of(err), ErrorCode::Unprocessable);
}

#[test]
fn test_insecure_no_auth_only_on_loopback() {
    let state = common::scratch_dir("noauth");
    let output = Command::new(env!("CARGO_BIN_EXE_airlockd"))
        .args(["--insecure-no-auth", "--listen", "0.0.0.0:0", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--insecure-no-auth is refused on 0.0.0.0:0"),
        "{stderr}"
    );

    let daemon = TestDaemon::start_in(&state, "", &["--insecure-no-auth"]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let templates = runtime.block_on(daemon.anonymous().templates()).unwrap();
    assert_eq!(
        templates.templates.len(),
        5,
        "base, code-interpreter-v1, desktop, wasm-js, wasm-python"
    );
}

#[tokio::test]
async fn test_sandbox_control_plane_and_capacity() {
    common::require_binaries();
    let daemon = TestDaemon::start("control", &["--max-sandboxes", "2"]);
    let client = daemon.client();
    let mut metadata = BTreeMap::new();
    metadata.insert("team".to_owned(), "red".to_owned());
    let created = client
        .create(&CreateSandboxRequest {
            metadata: metadata.clone(),
            timeout_ms: Some(600_000),
            ..Default::default()
        })
        .await
        .unwrap();
    let a = created.sandbox.clone();
    assert_eq!(a.state, SandboxState::Running);
    assert_eq!(a.template, "base");
    assert_eq!(
        a.resources.memory_bytes,
        Some(2 << 30),
        "defaults are filled in"
    );
    assert!(a.expires_at_ms >= a.created_at_ms + 600_000);
    assert!(created.access_token.starts_with("at_"));
    assert_eq!(client.get(&a.id).await.unwrap(), a);

    let b = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox;
    // 503 past --max-sandboxes.
    let err = client.create(&CreateSandboxRequest::default()).await;
    assert_eq!(code_of(err), ErrorCode::Capacity);

    // List and its filters.
    let all = client.list(&[], &BTreeMap::new()).await.unwrap();
    assert_eq!(all.len(), 2);
    let red = client
        .list(&[SandboxState::Running], &metadata)
        .await
        .unwrap();
    assert_eq!(
        red.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        vec![a.id.as_str()]
    );
    let mut blue = BTreeMap::new();
    blue.insert("team".to_owned(), "blue".to_owned());
    assert!(client.list(&[], &blue).await.unwrap().is_empty());
    assert!(
        client
            .list(&[SandboxState::Creating], &BTreeMap::new())
            .await
            .unwrap()
            .is_empty()
    );

    // Timeout.
    let moved = client.set_timeout(&a.id, 3_600_000).await.unwrap();
    assert!(moved.expires_at_ms > a.expires_at_ms);
    assert_eq!(
        code_of(client.set_timeout(&a.id, 0).await),
        ErrorCode::Unprocessable
    );
    assert_eq!(
        code_of(client.set_timeout(&a.id, 1 << 60).await),
        ErrorCode::Unprocessable
    );

    // Logs: the events so far.
    let logs = client.logs(&a.id).await.unwrap();
    let kinds: Vec<&str> = logs.events.iter().map(|e| e.kind.as_str()).collect();
    assert!(
        kinds.contains(&"create") && kinds.contains(&"ready") && kinds.contains(&"timeout_set"),
        "{kinds:?}"
    );

    // Delete: 204, then 404; the events outlive the sandbox.
    assert_eq!(
        common::sandbox_cgroups(&b.id).len(),
        3,
        "a live sandbox has memory, pids and freezer cgroups (so the leftover check can see them)"
    );
    client.delete(&b.id).await.unwrap();
    assert_eq!(code_of(client.get(&b.id).await), ErrorCode::NotFound);
    assert_eq!(code_of(client.delete(&b.id).await), ErrorCode::NotFound);
    let logs = client.logs(&b.id).await.unwrap();
    assert!(logs.events.iter().any(|e| e.kind == "delete"));
    // A list waits for the delete's teardown.
    client.list(&[], &BTreeMap::new()).await.unwrap();
    common::assert_sandbox_gone(&daemon.state_dir, &b.id, None);
    // Room again.
    let c = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox;
    client.delete(&c.id).await.unwrap();
}

#[tokio::test]
async fn test_exec_streams_and_access_tokens() {
    common::require_binaries();
    let daemon = TestDaemon::start("exec", &[]);
    let client = daemon.client();
    let mut env = BTreeMap::new();
    env.insert("FROM_SANDBOX".to_owned(), "sbx".to_owned());
    let created = client
        .create(&CreateSandboxRequest {
            env,
            ..Default::default()
        })
        .await
        .unwrap();
    let id = created.sandbox.id.clone();
    let other = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap();

    let out = client
        .exec_collect(
            &id,
            &ExecRequest {
                argv: Some(vec!["echo".into(), "a b".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (out.stdout.as_slice(), out.exit_code, out.exited),
        (&b"a b\n"[..], 0, true)
    );
    assert!(out.pid > 0);

    let mut request = shell("echo $FROM_SANDBOX $FROM_REQUEST; pwd; echo oops >&2; exit 3");
    request.env.insert("FROM_REQUEST".into(), "req".into());
    request.cwd = Some("/tmp".into());
    let out = client.exec_collect(&id, &request).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sbx req\n/tmp\n");
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!((out.exit_code, out.exited), (3, true));
    assert_eq!(out.status, "exit status 3");

    let mut request = shell("cat; echo done");
    request.stdin_base64 = Some("aGVsbG8K".into());
    let out = client.exec_collect(&id, &request).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\ndone\n");

    let mut request = shell("sleep 60");
    request.timeout_ms = Some(500);
    let out = client.exec_collect(&id, &request).await.unwrap();
    assert!(!out.exited, "killed by its timeout: {out:?}");

    // The agent's own refusal surfaces as an HTTP error: what the sandbox lacks is 404.
    let mut request = shell("true");
    request.cwd = Some("/no/such/dir".into());
    assert_eq!(
        code_of(client.exec(&id, &request).await),
        ErrorCode::NotFound
    );
    let both = ExecRequest {
        argv: Some(vec!["true".into()]),
        shell: Some("true".into()),
        ..Default::default()
    };
    assert_eq!(
        code_of(client.exec(&id, &both).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        code_of(client.exec(&id, &ExecRequest::default()).await),
        ErrorCode::InvalidRequest
    );

    // The access token opens this sandbox's data plane, and nothing else.
    let token = daemon
        .anonymous()
        .with_access_token(Some(created.access_token.clone()));
    let out = token
        .exec_collect(&id, &shell("echo via-token"))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"via-token\n");
    assert_eq!(
        code_of(token.exec(&other.sandbox.id, &shell("true")).await),
        ErrorCode::Unauthenticated
    );
    assert_eq!(code_of(token.get(&id).await), ErrorCode::Unauthenticated);
    assert_eq!(code_of(token.delete(&id).await), ErrorCode::Unauthenticated);

    // The envd pass-through: one Connect unary call and the plain health route.
    let (status, headers, body) = token
        .raw(
            Method::POST,
            &format!("/v1/sandboxes/{id}/envd/filesystem.Filesystem/Stat"),
            &[
                ("content-type", "application/json"),
                ("connect-protocol-version", "1"),
            ],
            r#"{"path":"/workspace"}"#,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["entry"]["type"], "FILE_TYPE_DIRECTORY", "{answer}");
    let (status, _, _) = token
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/envd/health"),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = daemon
        .anonymous()
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/envd/health"),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn test_files_endpoints_and_upload_cap() {
    common::require_binaries();
    let daemon = TestDaemon::start("files", &["--max-upload-bytes", "1MiB"]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;

    let entry = client
        .write_file(&id, "/workspace/d/a.txt", &b"hello"[..])
        .await
        .unwrap();
    assert_eq!(
        (entry.kind, entry.size_bytes, entry.path.as_str()),
        (FileKind::File, 5, "/workspace/d/a.txt")
    );
    assert_eq!(
        client.read_file(&id, "/workspace/d/a.txt").await.unwrap(),
        b"hello"
    );
    let stat = client.stat(&id, "/workspace/d").await.unwrap();
    assert_eq!(stat.kind, FileKind::Directory);
    let list = client.list_dir(&id, "/workspace/d", 1).await.unwrap();
    assert_eq!(
        list.entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>(),
        vec!["a.txt"]
    );

    let made = client.mkdir(&id, "/workspace/e/f").await.unwrap();
    assert_eq!(made.kind, FileKind::Directory);
    assert_eq!(
        code_of(client.mkdir(&id, "/workspace/e/f").await),
        ErrorCode::Conflict
    );
    let moved = client
        .rename(&id, "/workspace/d/a.txt", "/workspace/e/b.txt")
        .await
        .unwrap();
    assert_eq!(moved.path, "/workspace/e/b.txt");
    assert_eq!(
        code_of(client.read_file(&id, "/workspace/d/a.txt").await),
        ErrorCode::NotFound
    );
    assert_eq!(
        code_of(client.stat(&id, "/workspace/nothing").await),
        ErrorCode::NotFound
    );
    client.remove(&id, "/workspace/e").await.unwrap();
    assert_eq!(
        code_of(client.stat(&id, "/workspace/e").await),
        ErrorCode::NotFound
    );

    // The edge rejects what cannot be a path.
    let base = format!("/v1/sandboxes/{id}/files");
    expect_error(
        &client,
        Method::GET,
        &format!("{base}?path="),
        &[],
        "",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        &format!("{base}?path=/workspace/a%00b"),
        &[],
        "",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        &format!("{base}/stat"),
        &[],
        "",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;
    expect_error(
        &client,
        Method::GET,
        &format!("{base}/list?path=/&depth=x"),
        &[],
        "",
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
    )
    .await;

    // 413 past --max-upload-bytes: declared up front, or found while streaming.
    let big = vec![7u8; 2 << 20];
    assert_eq!(
        code_of(client.write_file(&id, "/workspace/big", big.clone()).await),
        ErrorCode::PayloadTooLarge
    );
    let streamed = client
        .upload(&id, "/workspace/big2", std::io::Cursor::new(big), None)
        .await;
    assert_eq!(code_of(streamed), ErrorCode::PayloadTooLarge);
    // Exactly at the cap is fine.
    let entry = client
        .write_file(&id, "/workspace/cap", vec![1u8; 1 << 20])
        .await
        .unwrap();
    assert_eq!(entry.size_bytes, 1 << 20);
    assert_eq!(client.health().await.unwrap().status, "ok");
}

#[tokio::test]
async fn test_host_workspaces_only_beneath_the_workspace_root() {
    let request = |path: &str| CreateSandboxRequest {
        workspace: Workspace::Host { path: path.into() },
        ..Default::default()
    };
    let closed = TestDaemon::start("wsclosed", &[]);
    let err = closed.client().create(&request("/tmp")).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied));
    assert!(err.to_string().contains("--workspace-root"), "{err}");
    drop(closed);

    let root = common::scratch_dir("wsroot");
    let project = root.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
    let root_arg = root.to_string_lossy().into_owned();
    let daemon = TestDaemon::start("wsopen", &["--workspace-root", &root_arg]);
    let client = daemon.client();
    for outside in [
        "/etc",
        &format!("{root_arg}/escape"),
        &format!("{root_arg}/../"),
    ] {
        let err = client.create(&request(outside)).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(ErrorCode::PermissionDenied),
            "{outside}: {err}"
        );
    }
    let created = client
        .create(&request(&project.to_string_lossy()))
        .await
        .unwrap();
    let output = client
        .exec_collect(
            &created.sandbox.id,
            &shell("echo from-inside > /workspace/proof && cat /workspace/proof"),
        )
        .await
        .unwrap();
    assert_eq!(output.stdout, b"from-inside\n");
    assert_eq!(
        std::fs::read_to_string(project.join("proof")).unwrap(),
        "from-inside\n",
        "the host directory is the workspace"
    );
    client.delete(&created.sandbox.id).await.unwrap();
    drop(daemon);
    std::fs::remove_dir_all(&root).unwrap();
}
