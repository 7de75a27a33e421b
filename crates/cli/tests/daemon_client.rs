//! `airlock serve`, `airlock keys` and the daemon's client commands (`airlock sandbox ...`,
//! `airlock exec`), end to end through the real binaries. Needs root and a prior
//! `cargo build --workspace`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A daemon started as `airlock serve`, with one API key.
struct Daemon {
    child: Child,
    url: String,
    key: String,
    state: PathBuf,
}

impl Daemon {
    fn start() -> Daemon {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // One per daemon: the tests of this file run in parallel, in one process.
        let state = PathBuf::from(format!(
            "/var/tmp/airlock-cli-daemon-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&state);
        let keys = Command::new(common::airlock_bin())
            .args(["keys", "--state-dir"])
            .arg(&state)
            .args(["create", "cli-test"])
            .output()
            .unwrap();
        assert!(keys.status.success(), "{keys:?}");
        let key = String::from_utf8(keys.stdout).unwrap().trim().to_owned();
        let mut child = Command::new(common::airlock_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&state)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // The daemon prints its address once it listens.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Daemon {
            child,
            url: format!("http://{addr}"),
            key,
            state,
        }
    }

    fn airlock(&self, args: &[&str], key: Option<&str>) -> Output {
        let mut command = Command::new(common::airlock_bin());
        command.args(args).env("AIRLOCK_URL", &self.url);
        match key {
            Some(key) => command.env("AIRLOCK_API_KEY", key),
            None => command.env_remove("AIRLOCK_API_KEY"),
        };
        command.stdin(Stdio::null()).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.airlock(args, Some(&self.key));
        assert!(
            output.status.success(),
            "airlock {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Sandboxes outlive a stopped daemon by design: remove them first, even after a failure.
        let listed = self.airlock(&["sandbox", "ls", "--json"], Some(&self.key));
        let sandboxes: Vec<serde_json::Value> =
            serde_json::from_slice(&listed.stdout).unwrap_or_default();
        for sandbox in sandboxes {
            if let Some(id) = sandbox["id"].as_str() {
                let _ = self.airlock(&["sandbox", "rm", id], Some(&self.key));
            }
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

#[test]
fn test_sandbox_commands_drive_a_daemon() {
    let daemon = Daemon::start();
    let refused = daemon.airlock(&["sandbox", "ls"], None);
    assert_eq!(refused.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("unauthenticated"), "{stderr}");

    let id = daemon
        .ok(&[
            "sandbox",
            "create",
            "--meta",
            "team=cli",
            "--timeout",
            "10m",
        ])
        .trim()
        .to_owned();
    assert!(
        daemon
            .ok(&["sandbox", "ls", "--meta", "team=cli"])
            .contains(&id)
    );
    assert!(
        !daemon
            .ok(&["sandbox", "ls", "--meta", "team=other"])
            .contains(&id)
    );
    let got: serde_json::Value =
        serde_json::from_str(&daemon.ok(&["sandbox", "get", &id])).unwrap();
    assert_eq!(got["metadata"]["team"], "cli");

    // exec streams output and exits with the command's own code.
    let output = daemon.airlock(
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ],
        Some(&daemon.key),
    );
    assert_eq!(output.status.code(), Some(7));
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    let killed = daemon.airlock(
        &["sandbox", "exec", &id, "--", "sh", "-c", "kill -9 $$"],
        Some(&daemon.key),
    );
    assert_eq!(killed.status.code(), Some(137));

    // cp both ways: bytes survive, and a failed download leaves no partial file behind.
    let scratch = common::Scratch::new();
    let local = scratch.dir.join("payload.bin");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &payload).unwrap();
    let remote = format!("{id}:/workspace/payload.bin");
    daemon.ok(&["sandbox", "cp", local.to_str().unwrap(), &remote]);
    let back = scratch.dir.join("back.bin");
    daemon.ok(&["sandbox", "cp", &remote, back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), payload);
    let missing = scratch.dir.join("missing.bin");
    let failed = daemon.airlock(
        &[
            "sandbox",
            "cp",
            &format!("{id}:/workspace/nope"),
            missing.to_str().unwrap(),
        ],
        Some(&daemon.key),
    );
    assert_eq!(failed.status.code(), Some(125));
    assert!(
        !missing.exists() && !Path::new(&format!("{}.airlock-partial", missing.display())).exists()
    );

    let logs = daemon.ok(&["sandbox", "logs", &id]);
    assert!(logs.contains("create") && logs.contains("ready"), "{logs}");
    daemon.ok(&["sandbox", "rm", &id]);
    let gone = daemon.airlock(&["sandbox", "get", &id], Some(&daemon.key));
    assert_eq!(gone.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("not_found"));

    // A warm pool: set, shown, removed; a name that is no template fails naming it.
    let set: serde_json::Value =
        serde_json::from_str(&daemon.ok(&["sandbox", "pool", "base", "--size", "1"])).unwrap();
    assert_eq!(
        (set["template"].as_str(), set["size"].as_u64()),
        (Some("base"), Some(1))
    );
    let shown: serde_json::Value =
        serde_json::from_str(&daemon.ok(&["sandbox", "pool", "base"])).unwrap();
    assert_eq!(shown["size"], 1);
    daemon.ok(&["sandbox", "pool", "base", "--size", "0"]);
    let missing = daemon.airlock(&["sandbox", "pool", "nosuch"], Some(&daemon.key));
    assert_eq!(missing.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nosuch"));
}

#[test]
fn test_client_errors_are_one_line() {
    let bad = Command::new(common::airlock_bin())
        .args(["sandbox", "ls", "--url", "ftp://nowhere"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("unsupported base URL"), "{stderr}");
    let down = Command::new(common::airlock_bin())
        .args(["sandbox", "ls", "--url", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot connect to airlockd"));
}

#[test]
fn test_policy_apply_and_approvals_from_the_cli() {
    let daemon = Daemon::start();
    let dir = PathBuf::from(format!(
        "/var/tmp/airlock-cli-policy-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = RemoveOnDrop(dir.clone());
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let ask = write(
        "ask.yaml",
        "version: 1\nnetwork: {mode: proxy}\napprovals: {unmatched: ask, timeout: 60s}\n",
    );
    let secret = write("secret", "s3cret\n");
    // A credential usable at a new host: a finding that needs review.
    let wider = write(
        "wider.yaml",
        &format!(
            "version: 1\nnetwork:\n  mode: proxy\n  egress: [{{name: api, host: api.example.org, ports: [443]}}]\ncredentials:\n  - {{name: tok, source: {{file: {secret}}}, env: TOKEN, inject: bearer, endpoints: [{{host: api.example.org}}]}}\napprovals: {{unmatched: ask, timeout: 60s}}\n"
        ),
    );
    let id = daemon
        .ok(&["sandbox", "create", "--policy", &ask])
        .trim()
        .to_owned();

    // A widening needs review: refused without --approve, applied with it.
    let refused = daemon.airlock(&["policy", "apply", &id, &wider], Some(&daemon.key));
    assert_ne!(refused.status.code(), Some(0), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("conflict") || stderr.contains("review"),
        "{stderr}"
    );
    daemon.ok(&["policy", "apply", &id, &wider, "--approve"]);

    // An unmatched request is held, listed, and denied from the CLI.
    let held = Command::new(common::airlock_bin())
        .args([
            "exec",
            &id,
            "--",
            "curl",
            "-sS",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "http://held.test/",
        ])
        .env("AIRLOCK_URL", &daemon.url)
        .env("AIRLOCK_API_KEY", &daemon.key)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut approval = None;
    assert!(common::eventually(|| {
        let listed = daemon.ok(&["approvals", "ls", "--json"]);
        let pending: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap_or_default();
        approval = pending
            .iter()
            .find(|p| p.to_string().contains("held.test"))
            .and_then(|p| p["id"].as_str().map(str::to_owned));
        approval.is_some()
    }));
    daemon.ok(&["approvals", "deny", approval.as_deref().unwrap()]);
    let output = held.wait_with_output().unwrap();
    let headers = String::from_utf8_lossy(&output.stdout).to_lowercase();
    assert!(
        headers.contains("x-airlock-error: approval_denied"),
        "{headers}"
    );
    assert!(daemon.ok(&["approvals", "ls", "--json"]).trim() == "[]");

    daemon.ok(&["sandbox", "rm", &id]);
}

/// Removes a scratch directory however the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
