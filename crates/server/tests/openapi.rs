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
    for status in ["201", "400", "401", "403", "404", "413", "422", "503"] {
        assert!(create[status].is_object(), "create lacks {status}");
    }
    // What the server enforces is in the document.
    assert_eq!(
        create["503"]["headers"]["Retry-After"]["required"], true,
        "a capped create says when to retry"
    );
    assert_eq!(
        paths["/v1/sandboxes"]["post"]["requestBody"]["required"], false,
        "an empty create body is {{}}"
    );
    let upload = &paths["/v1/sandboxes/{id}/files"]["put"]["responses"];
    for status in ["403", "409", "413", "507"] {
        assert!(upload[status].is_object(), "upload lacks {status}");
    }
    for (path, method) in [
        ("/v1/sandboxes/{id}", "delete"),
        ("/v1/sandboxes/{id}/exec", "post"),
    ] {
        let responses = &paths[path][method]["responses"];
        assert!(responses["409"].is_object(), "{method} {path} lacks 409");
        assert!(responses["503"].is_null(), "{method} {path} documents 503");
    }
    assert!(schemas.contains_key("ConnectError"));
    let resources = &schemas["Resources"]["properties"];
    assert_eq!(resources["memory_bytes"]["minimum"], 16 << 20);
    assert_eq!(resources["pids_max"]["maximum"], 4_194_303);
    let codes = serde_json::to_string(&schemas["ErrorCode"]).unwrap();
    for code in [
        "read_only",
        "sandbox_stopping",
        "file_too_large",
        "insufficient_storage",
    ] {
        assert!(codes.contains(code), "ErrorCode lacks {code}");
    }
    assert!(
        !codes.contains("\"unavailable\""),
        "no route answers `unavailable`"
    );
}
