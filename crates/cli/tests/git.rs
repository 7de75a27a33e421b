//! `airlock run --git`: the command runs in a clone on its own branch, fetched through an
//! egress proxy with a placeholder credential; it may push that branch and no other; a kept
//! `--workspace` stays, a temporary one goes. Against `git http-backend` on loopback
//! (`airlock_server::testing::GitServer`) that wants a token. Needs root and
//! `cargo build --workspace`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::path::Path;
use std::process::Command;

use airlock_server::testing::{FakeForge, GitServer};

const TOKEN: &str = "run-token-0c4b7e2a91";

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=u",
            "-c",
            "user.email=u@test",
            "-c",
            "init.defaultBranch=main",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn test_run_git_works_on_its_branch_and_pushes_only_it() {
    let scratch = common::Scratch::new();
    let work = scratch.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("README"), "from upstream\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "first"]);
    git(&work, &["branch", "develop"]);
    let root = scratch.dir.join("root");
    std::fs::create_dir_all(root.join("acme")).unwrap();
    git(
        &scratch.dir,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            root.join("acme/app.git").to_str().unwrap(),
        ],
    );
    let bare = root.join("acme/app.git");
    let token_file = scratch.dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = runtime
        .block_on(GitServer::start(&root, Some(TOKEN.to_owned()), None))
        .unwrap();
    let kept = scratch.dir.join("kept");
    let audit = scratch.dir.join("audit.jsonl");
    let cache = scratch.dir.join("cache");
    let script = "git branch --show-current; cat README; echo more >> README; \
        git -c user.name=a -c user.email=a@test commit -qam change; git push -q; echo push=$?; \
        git push -q origin HEAD:refs/heads/main 2>/dev/null; echo other=$?; \
        env | grep -c run-token || true";
    let output = Command::new(common::airlock_bin())
        .env(
            "AIRLOCK_TEST_EGRESS_RESOLVE",
            format!("git.test={}", server.address),
        )
        .args([
            "run",
            "--git",
            "http://git.test/acme/app.git@develop",
            "--branch",
            "agent-1",
        ])
        .arg("--git-token-file")
        .arg(&token_file)
        .arg("--git-cache")
        .arg(&cache)
        .arg("--workspace")
        .arg(&kept)
        .arg("--audit-log")
        .arg(&audit)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        ["agent-1", "from upstream", "push=0", "other=1", "0"],
        "{stdout}"
    );
    // The refused push is audited, naming the ref; the audit log never holds the token.
    let lines = std::fs::read_to_string(&audit).unwrap();
    let denied: Vec<serde_json::Value> = lines
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &serde_json::Value| line["code"] == "git_push_denied")
        .collect();
    assert_eq!(denied.len(), 1, "{lines}");
    assert!(denied[0].to_string().contains("refs/heads/main"), "{lines}");
    assert!(!lines.contains(TOKEN), "{lines}");
    let pushed = git(&bare, &["rev-parse", "refs/heads/agent-1"]);
    assert_eq!(
        git(&kept, &["rev-parse", "HEAD"]),
        pushed,
        "the kept workspace has the commit"
    );
    assert_eq!(
        git(&bare, &["rev-parse", "main"]),
        git(&bare, &["rev-parse", "develop"])
    );
    let expected = {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"))
        )
    };
    assert!(
        server
            .seen()
            .iter()
            .all(|s| s.authorization.as_deref() == Some(expected.as_str()))
    );

    // Without --workspace the clone is a temporary directory, gone after the run.
    let before: Vec<_> = temporary_workspaces();
    let output = Command::new(common::airlock_bin())
        .env(
            "AIRLOCK_TEST_EGRESS_RESOLVE",
            format!("git.test={}", server.address),
        )
        .args([
            "run",
            "--git",
            "http://git.test/acme/app.git",
            "--branch",
            "agent-2",
        ])
        .arg("--git-token-file")
        .arg(&token_file)
        .arg("--git-cache")
        .arg(&cache)
        .args(["--", "git", "log", "-1", "--format=%s"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "first",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(temporary_workspaces(), before);
}

fn temporary_workspaces() -> Vec<String> {
    let prefix = format!("airlock-git-{}", std::process::id());
    let mut found: Vec<String> = std::fs::read_dir("/var/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("airlock-git-") && !n.starts_with(&prefix))
        .collect();
    found.sort();
    found
}

/// `airlock serve` with a forge (the fake one, over `GitServer`'s repositories), no auth.
struct ForgeDaemon {
    child: std::process::Child,
    url: String,
    state: std::path::PathBuf,
}

impl ForgeDaemon {
    fn start(state: std::path::PathBuf, flags: &[String]) -> ForgeDaemon {
        use std::io::BufRead as _;
        let mut child = Command::new(common::airlock_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--insecure-no-auth",
                "--state-dir",
            ])
            .arg(&state)
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        ForgeDaemon {
            child,
            url: format!("http://{addr}"),
            state,
        }
    }

    fn airlock(&self, args: &[&str]) -> std::process::Output {
        Command::new(common::airlock_bin())
            .args(args)
            .env("AIRLOCK_URL", &self.url)
            .env_remove("AIRLOCK_API_KEY")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.airlock(args);
        assert!(
            output.status.success(),
            "airlock {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for ForgeDaemon {
    fn drop(&mut self) {
        // Sandboxes outlive a stopped daemon by design: remove them first, even after a failure.
        let listed = self.airlock(&["sandbox", "ls", "--json"]);
        let sandboxes: Vec<serde_json::Value> =
            serde_json::from_slice(&listed.stdout).unwrap_or_default();
        for sandbox in sandboxes {
            if let Some(id) = sandbox["id"].as_str() {
                let _ = self.airlock(&["sandbox", "rm", id]);
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
fn test_sandbox_git_commands_push_the_branch_and_open_a_pull_request() {
    let scratch = common::Scratch::new();
    let work = scratch.dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("README"), "from upstream\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "first"]);
    git(&work, &["branch", "develop"]);
    let root = scratch.dir.join("root");
    std::fs::create_dir_all(root.join("acme")).unwrap();
    let bare = root.join("acme/app.git");
    git(
        &scratch.dir,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let token_file = scratch.dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, forge) = runtime.block_on(async {
        let server = GitServer::start(&root, Some(TOKEN.to_owned()), None)
            .await
            .unwrap();
        let forge = FakeForge::start(TOKEN.to_owned(), &root).await.unwrap();
        (server, forge)
    });
    let flags = [
        "--test-egress-resolve".to_owned(),
        format!("git.test={}", server.address),
        "--forge-api".to_owned(),
        forge.url(),
        "--forge-git-host".to_owned(),
        "git.test".to_owned(),
        "--forge-token-file".to_owned(),
        token_file.display().to_string(),
    ];
    let daemon = ForgeDaemon::start(scratch.dir.join("state"), &flags);
    let url = "http://git.test/acme/app.git";

    // Two agents on one repository, each on its own branch from develop.
    let first = daemon.ok(&[
        "sandbox",
        "create",
        "--git",
        &format!("{url}@develop"),
        "--branch",
        "agent-a",
    ]);
    let second = daemon.ok(&["sandbox", "create", "--git", url, "--branch", "agent-b"]);
    let listed = daemon.ok(&["sandbox", "ls", "--meta", &format!("airlock.git.url={url}")]);
    assert!(
        listed.contains(&first) && listed.contains(&second),
        "{listed}"
    );
    let on_a = daemon.ok(&["sandbox", "ls", "--meta", "airlock.git.branch=agent-a"]);
    assert!(on_a.contains(&first) && !on_a.contains(&second), "{on_a}");

    let script = "cd /workspace && git branch --show-current && echo more >> README && \
        git -c user.name=a -c user.email=a@test commit -qam change && \
        (git config --list; env; cat /proc/self/environ) | grep -c run-token || true";
    let inside = daemon.ok(&["sandbox", "exec", &first, "--", "sh", "-c", script]);
    assert_eq!(
        inside.lines().collect::<Vec<_>>(),
        ["agent-a", "0"],
        "{inside}"
    );
    let head = daemon.ok(&[
        "sandbox",
        "exec",
        &first,
        "--",
        "git",
        "-C",
        "/workspace",
        "rev-parse",
        "HEAD",
    ]);

    // push: the upstream's agent-a is the sandbox's commit; main and develop are unchanged.
    let pushed = daemon.ok(&["sandbox", "push", &first]);
    assert_eq!(pushed, format!("agent-a {head} -> {url}"));
    assert_eq!(git(&bare, &["rev-parse", "agent-a"]), head);
    assert_eq!(
        git(&bare, &["rev-parse", "main"]),
        git(&bare, &["rev-parse", "develop"])
    );

    // pr: the forge gets head agent-a and base develop (where the sandbox started), with the
    // host's token; the CLI prints the forge's URL.
    let pull = daemon.ok(&[
        "sandbox",
        "pr",
        &first,
        "--title",
        "Agent work",
        "--body",
        "by a",
    ]);
    assert_eq!(pull, "https://forge.test/acme/app/pull/1");
    let calls = forge.seen();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    let body: serde_json::Value = serde_json::from_str(&calls[0].body).unwrap();
    assert_eq!(
        (body["head"].as_str(), body["base"].as_str()),
        (Some("agent-a"), Some("develop"))
    );
    assert_eq!(body["title"], "Agent work");

    // A rewritten branch: push refuses to replace the remote's, push --force replaces it.
    let amend = "cd /workspace && git -c user.name=a -c user.email=a@test commit -q --amend -m rewritten && git rev-parse HEAD";
    let rewritten = daemon.ok(&["sandbox", "exec", &first, "--", "sh", "-c", amend]);
    let refused = daemon.airlock(&["sandbox", "push", &first]);
    assert!(
        !refused.status.success(),
        "a non-fast-forward push went through"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("git push of agent-a"), "{stderr}");
    assert_eq!(git(&bare, &["rev-parse", "agent-a"]), head);
    let forced = daemon.ok(&["sandbox", "push", &first, "--force"]);
    assert_eq!(forced, format!("agent-a {rewritten} -> {url}"));
    assert_eq!(git(&bare, &["rev-parse", "agent-a"]), rewritten);

    // A sandbox without a repository: push is refused with a clear error.
    let plain = daemon.ok(&["sandbox", "create"]);
    let refused = daemon.airlock(&["sandbox", "push", &plain]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("repository"), "{stderr}");

    // lsp: a language server the image has, at a WebSocket path under the sandbox.
    let lsp: serde_json::Value = serde_json::from_str(&daemon.ok(&[
        "sandbox",
        "lsp",
        &second,
        "--language",
        "python",
        "--json",
    ]))
    .unwrap();
    let path = lsp["websocket_path"].as_str().unwrap();
    assert!(
        path.starts_with(&format!("/v1/sandboxes/{second}/lsp/")),
        "{lsp}"
    );
    assert_eq!(lsp["root"], "/workspace");
}
