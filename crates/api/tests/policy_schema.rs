//! `api/policy.schema.json` is generated from the policy document's types; this test fails
//! when the committed file differs. Regenerate with `AIRLOCK_UPDATE_POLICY_SCHEMA=1 cargo test
//! -p airlock-api --test policy_schema` or `airlock policy schema > api/policy.schema.json`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::path::PathBuf;

fn generated() -> String {
    let mut text = serde_json::to_string_pretty(&airlock_api::policy::schema()).unwrap();
    text.push('\n');
    text
}

#[test]
fn test_committed_policy_schema_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../api/policy.schema.json");
    let generated = generated();
    if std::env::var_os("AIRLOCK_UPDATE_POLICY_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: regenerate it with AIRLOCK_UPDATE_POLICY_SCHEMA=1 cargo test -p airlock-api --test policy_schema",
        path.display()
    );
}

#[test]
fn test_schema_is_strict_and_names_every_section() {
    let schema: serde_json::Value = serde_json::from_str(&generated()).unwrap();
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["required"], serde_json::json!(["version"]));
    for section in [
        "version",
        "extends",
        "tier",
        "filesystem",
        "process",
        "resources",
        "network",
        "credentials",
        "approvals",
        "audit",
    ] {
        assert!(
            schema["properties"][section].is_object(),
            "{section} missing"
        );
    }
}
