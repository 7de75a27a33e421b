//! The create call's `policy`: its settings fill what the request leaves out, its rules confine
//! the sandbox, and an invalid policy is refused with 422 naming the field. Needs root and
//! `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{CreateSandboxRequest, ErrorCode, ExecRequest, Resources};
use common::TestDaemon;

fn policy(json: serde_json::Value) -> Option<Box<PolicyDocument>> {
    Some(Box::new(serde_json::from_value(json).unwrap()))
}

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

#[tokio::test]
async fn test_create_applies_a_policy_and_refuses_an_invalid_one() {
    common::require_binaries();
    let secret_dir = common::scratch_dir("policy-secret");
    std::fs::write(secret_dir.join("key"), "PRIVATE").unwrap();
    let secret = secret_dir.join("key").display().to_string();
    let daemon = TestDaemon::start("policy", &[]);
    let client = daemon.client();
    let confined = policy(serde_json::json!({
        "version": 1,
        "extends": ["workspace"],
        "resources": {"memory": "256MiB"},
        "filesystem": {"rules": {secret_dir.display().to_string(): "deny"}},
        "process": {"syscalls": {"deny_extra": ["uname"]}},
    }));
    let created = client
        .create(&CreateSandboxRequest {
            policy: confined.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = created.sandbox.id;
    assert_eq!(created.sandbox.resources.memory_bytes, Some(256 << 20));
    let read = client
        .exec_collect(&id, &shell(&format!("cat {secret}")))
        .await
        .unwrap();
    assert_ne!(read.exit_code, 0, "the denied file was read");
    assert!(String::from_utf8_lossy(&read.stderr).contains("Permission denied"));
    let uname = client.exec_collect(&id, &shell("uname")).await.unwrap();
    assert_ne!(uname.exit_code, 0, "uname is denied by the policy");

    // The request's own values win over the policy's.
    let explicit = client
        .create(&CreateSandboxRequest {
            policy: confined,
            resources: Resources {
                memory_bytes: Some(128 << 20),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(explicit.sandbox.resources.memory_bytes, Some(128 << 20));

    // Control: without the policy the file and uname are there.
    let plain = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap();
    let read = client
        .exec_collect(&plain.sandbox.id, &shell(&format!("cat {secret}; uname")))
        .await
        .unwrap();
    assert_eq!(read.exit_code, 0, "{read:?}");
    assert_eq!(String::from_utf8_lossy(&read.stdout), "PRIVATELinux\n");

    for (bad, says) in [
        (
            serde_json::json!({"version": 1, "process": {"syscalls": {"allow_extra": ["mount"]}}}),
            "process.syscalls.allow_extra[0]: `mount` cannot be allowed",
        ),
        (
            serde_json::json!({"version": 1, "resources": {"memory": "max"}}),
            "does not lift limits",
        ),
        (
            serde_json::json!({"version": 1, "network": {"mode": "full"}}),
            "not supported yet",
        ),
    ] {
        let err = client
            .create(&CreateSandboxRequest {
                policy: policy(bad),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::Unprocessable), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
    drop(daemon);
    std::fs::remove_dir_all(&secret_dir).unwrap();
}
