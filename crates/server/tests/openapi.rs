//! `api/openapi.json` is generated from the route table and the wire types; this test fails
//! when the committed file differs. Regenerate with `AIRLOCK_UPDATE_OPENAPI=1 cargo test -p
//! airlock-server --test openapi` or `airlockd openapi > api/openapi.json`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::path::PathBuf;

#[test]
fn test_committed_openapi_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../api/openapi.json");
    let generated = airlock_server::openapi::document_json();
    if std::env::var_os("AIRLOCK_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: regenerate it with AIRLOCK_UPDATE_OPENAPI=1 cargo test -p airlock-server --test openapi",
        path.display()
    );
}

#[test]
fn test_document_covers_every_route_and_error_schema() {
    let doc = airlock_server::openapi::document();
    let paths = doc["paths"].as_object().unwrap();
    for (path, methods) in [
        ("/v1/health", &["get"][..]),
        ("/v1/templates", &["get"]),
        ("/v1/sandboxes", &["get", "post"]),
        ("/v1/sandboxes/{id}", &["get", "delete"]),
        ("/v1/sandboxes/{id}/timeout", &["post"]),
        ("/v1/sandboxes/{id}/logs", &["get"]),
        ("/v1/sandboxes/{id}/events", &["get"]),
        ("/v1/sandboxes/{id}/policy", &["put"]),
        ("/v1/approvals", &["get"]),
        ("/v1/approvals/{id}", &["post"]),
        ("/v1/sandboxes/{id}/exec", &["post"]),
        ("/v1/sandboxes/{id}/files", &["get", "put", "delete"]),
        ("/v1/sandboxes/{id}/files/list", &["get"]),
        ("/v1/sandboxes/{id}/files/stat", &["get"]),
        ("/v1/sandboxes/{id}/files/mkdir", &["post"]),
        ("/v1/sandboxes/{id}/files/move", &["post"]),
        ("/v1/sandboxes/{id}/envd/{rest}", &["get", "post"]),
    ] {
        for method in methods {
            assert!(
                paths[path][method].is_object(),
                "{method} {path} undocumented"
            );
        }
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "ErrorBody",
        "ErrorCode",
        "CreateSandboxRequest",
        "Sandbox",
        "ExecEvent",
        "FileEntry",
        "PolicyDocument",
        "PolicyApplied",
        "Approval",
        "AuditRecord",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    let create = &paths["/v1/sandboxes"]["post"]["responses"];
    for status in ["201", "400", "401", "413", "422", "503"] {
        assert!(create[status].is_object(), "create lacks {status}");
    }
}
