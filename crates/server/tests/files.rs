//! The files API reaches only the sandbox's own view, and big files stream intact.
//! Needs root and `scripts/sandbox-binaries.sh`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use airlock_api::v1::{CreateSandboxRequest, ErrorCode, ExecRequest};
use airlock_server::client::ClientError;
use common::TestDaemon;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

fn shell(command: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(command.to_owned()),
        ..ExecRequest::default()
    }
}

#[tokio::test]
async fn test_path_traversal_stays_in_the_sandbox_view() {
    common::require_binaries();
    let daemon = TestDaemon::start("traversal", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let host_marker = format!("/var/tmp/airlock-traversal-{id}");

    // Control: the host's shadow file is readable by the test (root).
    let host_shadow = std::fs::read("/etc/shadow").unwrap();
    assert!(!host_shadow.is_empty());
    for path in [
        "../../etc/shadow",
        "/workspace/../../../etc/shadow",
        "/etc/shadow",
    ] {
        match client.read_file(&id, path).await {
            Ok(bytes) => assert_ne!(bytes, host_shadow, "{path} returned the host's shadow file"),
            Err(ClientError::Api { .. }) => {}
            Err(other) => panic!("{path}: {other}"),
        }
    }
    // The daemon's own state directory is masked from the sandbox.
    let db = daemon.state_dir.join("airlock.db");
    let host_db = std::fs::read(&db).unwrap();
    match client.read_file(&id, db.to_str().unwrap()).await {
        Ok(bytes) => assert_ne!(bytes, host_db, "the store is visible inside"),
        Err(ClientError::Api { .. }) => {}
        Err(other) => panic!("{other}"),
    }

    // Writes outside /workspace and /tmp fail, and nothing appears on the host.
    for path in [
        host_marker.as_str(),
        "/workspace/../../var/tmp/airlock-escape",
        "/etc/airlock-escape",
        "/../../../usr/airlock-escape",
    ] {
        let result = client.write_file(&id, path, &b"x"[..]).await;
        assert!(result.is_err(), "{path} was writable");
    }
    assert!(!std::path::Path::new(&host_marker).exists());
    assert!(!std::path::Path::new("/var/tmp/airlock-escape").exists());
    assert!(!std::path::Path::new("/etc/airlock-escape").exists());

    // /tmp inside is the sandbox's own: a write lands there, not in the host's /tmp.
    let name = format!("/tmp/airlock-private-{id}");
    client
        .write_file(&id, &format!("/workspace/../{name}"), &b"inside"[..])
        .await
        .unwrap();
    assert_eq!(client.read_file(&id, &name).await.unwrap(), b"inside");
    assert!(
        !std::path::Path::new(&name).exists(),
        "the sandbox's /tmp is the host's"
    );

    // A symlink planted inside cannot open a way out.
    let out = client
        .exec_collect(
            &id,
            &shell("ln -s /etc/shadow /workspace/s && ln -s / /workspace/root"),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    match client.read_file(&id, "/workspace/s").await {
        Ok(bytes) => assert_ne!(bytes, host_shadow),
        Err(ClientError::Api { .. }) => {}
        Err(other) => panic!("{other}"),
    }
    let result = client
        .write_file(&id, "/workspace/root/etc/airlock-escape", &b"x"[..])
        .await;
    assert!(result.is_err(), "wrote through a symlink to /");
    assert!(!std::path::Path::new("/etc/airlock-escape").exists());
    // Inside /workspace everything works, parents included.
    client
        .write_file(&id, "/workspace/a/../b/c.txt", &b"ok"[..])
        .await
        .unwrap();
    assert_eq!(
        client.read_file(&id, "/workspace/b/c.txt").await.unwrap(),
        b"ok"
    );
    let err = client
        .read_file(&id, "/workspace/missing")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
}

#[tokio::test]
async fn test_200_mb_round_trip_keeps_the_checksum() {
    common::require_binaries();
    let daemon = TestDaemon::start("bigfile", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;

    // 200 MB of deterministic, incompressible-looking bytes, written to a host file.
    const SIZE: u64 = 200 * 1000 * 1000;
    let source = common::scratch_dir("bigfile-src").join("payload");
    let mut hasher = Sha256::new();
    {
        let mut file = tokio::fs::File::create(&source).await.unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut written = 0u64;
        let mut chunk = vec![0u8; 1 << 20];
        while written < SIZE {
            for word in chunk.chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
            }
            let take = usize::try_from((SIZE - written).min(chunk.len() as u64)).unwrap();
            file.write_all(&chunk[..take]).await.unwrap();
            hasher.update(&chunk[..take]);
            written += take as u64;
        }
        file.flush().await.unwrap();
    }
    let expected = hasher.finalize();

    let file = tokio::fs::File::open(&source).await.unwrap();
    let entry = client
        .upload(&id, "/workspace/payload", file, Some(SIZE))
        .await
        .unwrap();
    assert_eq!(entry.size_bytes, SIZE);

    let mut download = client.download(&id, "/workspace/payload").await.unwrap();
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    while let Some(chunk) = download.chunk().await.unwrap() {
        hasher.update(&chunk);
        total += chunk.len() as u64;
    }
    assert_eq!(total, SIZE);
    assert_eq!(
        hasher.finalize(),
        expected,
        "the download differs from the upload"
    );
    // The sandbox agrees on the content too.
    let out = client
        .exec_collect(&id, &shell("sha256sum /workspace/payload"))
        .await
        .unwrap();
    let inside = String::from_utf8_lossy(&out.stdout).into_owned();
    let hex: String = expected.iter().map(|b| format!("{b:02x}")).collect();
    assert!(inside.starts_with(&hex), "{inside}");
    let _ = std::fs::remove_dir_all(source.parent().unwrap());
}

/// The agent is the sandbox's pid 1 and shares the workload's uid: the workload must still not
/// reach its memory, environment or descriptors (the agent's listening socket among them).
#[tokio::test]
async fn test_workload_cannot_reach_into_the_agent() {
    let daemon = TestDaemon::start("agentpeek", &[]);
    let client = daemon.client();
    let id = client
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .sandbox
        .id;
    let output = client
        .exec_collect(
            &id,
            &shell(
                "for f in /proc/1/environ /proc/1/mem /proc/1/fd/3; do \
                   if head -c1 $f >/dev/null 2>&1; then echo open:$f; else echo denied:$f; fi; \
                 done; readlink /proc/1/fd/3 >/dev/null 2>&1 && echo linked || echo unlinked",
            ),
        )
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        text,
        "denied:/proc/1/environ\ndenied:/proc/1/mem\ndenied:/proc/1/fd/3\nunlinked\n",
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The control: the workload's own process is open to itself.
    let own = client
        .exec_collect(
            &id,
            &shell("head -c1 /proc/self/environ >/dev/null && readlink /proc/self/fd/0 >/dev/null && echo ok"),
        )
        .await
        .unwrap();
    assert_eq!(own.stdout, b"ok\n");
    client.delete(&id).await.unwrap();
}
