//! Policies end to end: `airlock policy check|explain|diff`, and `airlock run --policy` with
//! each property proven from inside the sandbox with `airlock-probe`, beside a control.
//!
//! These tests need root (as CI has) and a prior `cargo build --workspace`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;

fn write_policy(scratch: &Scratch, name: &str, text: &str) -> PathBuf {
    let path = scratch.dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

fn with_policy(scratch: &Scratch, policy: &Path, extra: &[&str], probe: &[&str]) -> Run {
    let mut args = vec!["--policy", policy.to_str().unwrap()];
    args.extend_from_slice(extra);
    inside(scratch, &args, probe)
}

#[test]
fn test_policy_deny_hides_a_host_path_and_leaves_its_neighbours() {
    let scratch = Scratch::new();
    let secret_dir = scratch.workspace("secret");
    let secret = secret_dir.join("key");
    fs::write(&secret, "PRIVATE").unwrap();
    let neighbour = scratch.dir.join("public");
    fs::write(&neighbour, "public").unwrap();
    let policy = write_policy(
        &scratch,
        "deny.yaml",
        &format!(
            "version: 1\nfilesystem:\n  rules:\n    {}: deny\n",
            secret_dir.display()
        ),
    );
    let secret = secret.to_str().unwrap();
    let hidden = with_policy(&scratch, &policy, &[], &["read", secret]);
    let listing = with_policy(&scratch, &policy, &[], &["stat", secret]);
    let visible = with_policy(
        &scratch,
        &policy,
        &[],
        &["read", neighbour.to_str().unwrap()],
    );
    let without = inside(&scratch, &[], &["read", secret]);
    assert_eq!(hidden.verdict(), "errno 13 EACCES", "{hidden:?}");
    assert!(!listing.verdict().starts_with("ok"), "{listing:?}");
    assert_eq!(visible.verdict(), "ok 6", "{visible:?}");
    assert_eq!(
        without.verdict(),
        "ok 7",
        "control: readable without the policy"
    );
    assert_eq!(outside(&scratch, &["read", secret]), "ok 7");
}

#[test]
fn test_git_metadata_is_read_only_in_a_host_workspace_and_the_rest_writable() {
    let scratch = Scratch::new();
    let ws = scratch.workspace("repo");
    fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    fs::write(ws.join(".git/hooks/pre-commit"), "#!/bin/sh\n").unwrap();
    fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let policy = write_policy(&scratch, "ws.yaml", "version: 1\nextends: [workspace]\n");
    let ws_arg = ["--workspace", ws.to_str().unwrap()];
    let run = |probe: &[&str]| with_policy(&scratch, &policy, &ws_arg, probe);

    for path in [
        "/workspace/.git/hooks/pre-commit",
        "/workspace/.git/hooks/post-checkout",
        "/workspace/.git/config",
    ] {
        assert_eq!(run(&["write", path]).verdict(), "errno 30 EROFS", "{path}");
    }
    // The directories holding them are pinned: they cannot be renamed away and replaced.
    let moved = run(&["rename", "/workspace/.git", "/workspace/.git-old"]);
    assert_eq!(moved.verdict(), "errno 16 EBUSY", "{moved:?}");
    let moved = run(&[
        "rename",
        "/workspace/.git/hooks",
        "/workspace/.git/hooks-old",
    ]);
    assert_eq!(moved.verdict(), "errno 16 EBUSY", "{moved:?}");
    assert!(
        run(&["write", "/workspace/.git/HEAD"])
            .verdict()
            .starts_with("ok")
    );
    assert!(
        run(&["write", "/workspace/notes.txt"])
            .verdict()
            .starts_with("ok")
    );
    assert_eq!(fs::read_to_string(ws.join("notes.txt")).unwrap(), "probe");
    assert_eq!(
        fs::read_to_string(ws.join(".git/hooks/pre-commit")).unwrap(),
        "#!/bin/sh\n"
    );
    assert!(ws.join(".git").is_dir() && !ws.join(".git-old").exists());

    // Control: without the policy the hook is writable.
    let control = inside(
        &scratch,
        &ws_arg,
        &["write", "/workspace/.git/hooks/pre-commit"],
    );
    assert!(control.verdict().starts_with("ok"), "{control:?}");
}

#[test]
fn test_read_only_profile_keeps_the_workspace_read_only_and_tmp_writable() {
    let scratch = Scratch::new();
    let policy = write_policy(&scratch, "ro.yaml", "version: 1\nextends: [read-only]\n");
    let ws = with_policy(&scratch, &policy, &[], &["write", "/workspace/file"]);
    let tmp = with_policy(&scratch, &policy, &[], &["write", "/tmp/file"]);
    assert_eq!(ws.verdict(), "errno 30 EROFS", "{ws:?}");
    assert!(tmp.verdict().starts_with("ok"), "{tmp:?}");
    assert!(
        inside(&scratch, &[], &["write", "/workspace/file"])
            .verdict()
            .starts_with("ok")
    );
}

#[test]
fn test_deny_extra_denies_a_syscall_inside() {
    let scratch = Scratch::new();
    let policy = write_policy(
        &scratch,
        "sys.yaml",
        "version: 1\nprocess:\n  syscalls:\n    deny_extra: [uname]\n",
    );
    let denied = airlock(&["run", "--policy", policy.to_str().unwrap(), "--", "uname"]);
    let control = airlock(&["run", "--", "uname"]);
    assert_ne!(denied.code, 0, "{denied:?}");
    assert!(denied.stderr.contains("not permitted"), "{denied:?}");
    assert_eq!(control.code, 0, "{control:?}");
    assert_eq!(control.stdout.trim(), "Linux");
}

#[test]
fn test_run_refuses_what_the_policy_forbids_or_cannot_enforce() {
    let scratch = Scratch::new();
    let microvm = write_policy(&scratch, "vm.yaml", "version: 1\ntier: microvm\n");
    let weaker = airlock(&[
        "run",
        "--policy",
        microvm.to_str().unwrap(),
        "--tier",
        "process",
        "--",
        "true",
    ]);
    assert_eq!(weaker.code, 125, "{weaker:?}");
    assert!(
        weaker
            .stderr
            .contains("--tier process is weaker than the policy's minimum tier, microvm")
    );
    let full = write_policy(
        &scratch,
        "full.yaml",
        "version: 1\nnetwork:\n  mode: full\n",
    );
    let refused = airlock(&["run", "--policy", full.to_str().unwrap(), "--", "true"]);
    assert_eq!(refused.code, 125, "{refused:?}");
    assert!(refused.stderr.contains("not supported yet"), "{refused:?}");
    assert_eq!(refused.stderr.lines().count(), 1, "one line: {refused:?}");
    let bad = write_policy(
        &scratch,
        "bad.yaml",
        "version: 1\nresources:\n  memory: lots\n",
    );
    let invalid = airlock(&["run", "--policy", bad.to_str().unwrap(), "--", "true"]);
    assert_eq!(invalid.code, 125);
    assert!(
        invalid.stderr.contains("bad.yaml:3:11: resources.memory"),
        "{invalid:?}"
    );
}

#[test]
fn test_policy_check_prints_file_line_column_for_every_problem() {
    let scratch = Scratch::new();
    let bad = write_policy(
        &scratch,
        "bad.yaml",
        "version: 1\nnetwork:\n  mode: proxy\n  egress:\n    - host: \"*\"\n      ports: [0]\nprocess:\n  syscalls:\n    deny_extra: [frobnicate]\n",
    );
    let good = write_policy(
        &scratch,
        "good.yaml",
        "version: 1\nextends: [networked-dev]\n",
    );
    let run = airlock(&[
        "policy",
        "check",
        good.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 1, "{run:?}");
    let bad = bad.display().to_string();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], format!("{}: ok", good.display()));
    assert!(
        lines[1].starts_with(&format!("{bad}:5:13: network.egress[0].host: ")),
        "{run:?}"
    );
    assert!(lines[2].starts_with(&format!("{bad}:6:15: network.egress[0].ports[0]: port 0")));
    assert!(lines[3].starts_with(&format!(
        "{bad}:9:18: process.syscalls.deny_extra[0]: unknown syscall"
    )));
    assert_eq!(lines.len(), 4);
    let syntax = write_policy(
        &scratch,
        "syntax.yaml",
        "version: 1\nfilesystem:\n  rulez: {}\n",
    );
    let run = airlock(&["policy", "check", syntax.to_str().unwrap()]);
    assert_eq!(run.code, 1);
    assert!(
        run.stdout
            .starts_with(&format!("{}:3:3: unknown field `rulez`", syntax.display())),
        "{run:?}"
    );
    let missing = airlock(&["policy", "check", "/no/such/policy.yaml"]);
    assert_eq!(missing.code, 125);
    assert_eq!(missing.stderr.lines().count(), 1);
}

#[test]
fn test_policy_explain_and_diff() {
    let scratch = Scratch::new();
    let old = write_policy(&scratch, "old.yaml", "version: 1\nextends: [workspace]\n");
    let new = write_policy(
        &scratch,
        "new.yaml",
        "version: 1\nextends: [workspace]\nfilesystem:\n  protect_git: false\nresources:\n  memory: 4GiB\n",
    );
    let explained = airlock(&["policy", "explain", old.to_str().unwrap()]);
    assert_eq!(explained.code, 0, "{explained:?}");
    assert!(
        explained
            .stdout
            .contains("a path created later is not protected")
    );
    let vm = airlock(&[
        "policy",
        "explain",
        "--tier",
        "microvm",
        old.to_str().unwrap(),
    ]);
    // The guest applies none of the workspace profile's path rules yet: each says so.
    assert_eq!(vm.code, 0, "{vm:?}");
    assert!(
        vm.stdout
            .contains("NOT ENFORCED: the guest applies no path rules yet"),
        "{vm:?}"
    );
    let diff = airlock(&[
        "policy",
        "diff",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert_eq!(diff.code, 1, "{diff:?}");
    assert!(
        diff.stdout
            .contains("[writable-path, review] /workspace/.git/hooks is no longer protected")
    );
    assert!(diff.stdout.contains("[limit] memory (bytes) rises"));
    let back = airlock(&[
        "policy",
        "diff",
        new.to_str().unwrap(),
        old.to_str().unwrap(),
    ]);
    assert_eq!(back.code, 0, "narrowing needs no review: {back:?}");
    let outside = airlock(&[
        "policy",
        "diff",
        "--boundary",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert_eq!(outside.code, 1);
    assert!(
        outside.stdout.contains("outside the ceiling"),
        "{outside:?}"
    );
    let schema = airlock(&["policy", "schema"]);
    let committed = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../api/policy.schema.json"
    ))
    .unwrap();
    assert_eq!(schema.stdout, committed);
}
