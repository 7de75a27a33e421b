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

use airlock_server::testing::GitServer;

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
