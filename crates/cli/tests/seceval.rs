//! `airlock seceval` end to end: a few cases through the real binaries, the JSON report, and
//! the evaluation-only knobs, which only the hidden `__seceval-run` accepts. Needs root and a
//! prior `cargo build --workspace`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

mod common;

use common::*;

#[test]
fn test_seceval_proves_the_layers_of_a_few_cases_and_writes_json() {
    let scratch = Scratch::new();
    let out = scratch.dir.join("seceval.json");
    let run = airlock(&[
        "seceval",
        "--only",
        "fs-conf.home-ssh-key",
        "--only",
        "fs-int.proc-self-comm",
        "--only",
        "kern.keyctl",
        "--only",
        "net.metadata",
        "--json",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("result: PASS"), "{}", run.stdout);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let cases = report["tiers"][0]["cases"].as_array().unwrap();
    let by = |id: &str| {
        let case = cases.iter().find(|c| c["id"] == id).unwrap();
        (
            case["airlock"]["verdict"].as_str().unwrap().to_owned(),
            case["airlock"]["by"].clone(),
        )
    };
    assert_eq!(
        by("fs-conf.home-ssh-key"),
        ("blocked".into(), "mount-view+landlock".into())
    );
    assert_eq!(
        by("fs-int.proc-self-comm"),
        ("blocked".into(), "landlock".into())
    );
    assert_eq!(by("kern.keyctl"), ("blocked".into(), "seccomp".into()));
    assert_eq!(by("net.metadata"), ("blocked".into(), "namespace".into()));
}

#[test]
fn test_only_the_hidden_evaluation_command_takes_layers_away() {
    let scratch = Scratch::new();
    let probe = scratch.probe();
    let with = airlock(&[
        "__seceval-run",
        "--ablate",
        "landlock",
        "--",
        &probe,
        "write",
        "/proc/self/comm",
    ]);
    assert_eq!(
        with.verdict(),
        "ok",
        "Landlock is what stopped it: {with:?}"
    );
    let normal = airlock(&["__seceval-run", "--", &probe, "write", "/proc/self/comm"]);
    assert_eq!(normal.verdict(), "errno 13 EACCES", "{normal:?}");
    let tagged = airlock(&[
        "__seceval-run",
        "--ablate",
        "seccomp-tag",
        "--",
        &probe,
        "ptrace",
    ]);
    assert_eq!(
        tagged.verdict(),
        "errno 133 EHWPOISON",
        "the filter's answer is marked: {tagged:?}"
    );
    let refused = airlock(&[
        "run",
        "--ablate",
        "landlock",
        "--",
        &probe,
        "write",
        "/proc/self/comm",
    ]);
    assert_eq!(
        refused.code, 125,
        "`airlock run` has no such flag: {refused:?}"
    );
    assert!(refused.stderr.contains("--ablate"), "{}", refused.stderr);
}
