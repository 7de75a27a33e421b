//! The invariants of the daemon's request handling, for fuzzers: the JSON body of every route
//! (native `/v1` and E2B's), the policy a create request carries, the route table and E2B's
//! routing decision. Shared by the cargo-fuzz target (`crates/server/fuzz`) and the bounded
//! stable run (`crates/server/tests/fuzz_bodies.rs`). Panics on a broken invariant.

use airlock_api::policy::PolicyDocument;
use airlock_api::v1::{
    CreateSandboxRequest, DecideApprovalRequest, ExecRequest, MkdirRequest, MoveRequest,
    SetTimeoutRequest,
};
use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Uri};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::e2b;

/// A body either fails to parse, or parses into a value that serializes and parses back to
/// itself: what the daemon accepted is what it will store and echo.
fn round_trips<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(
    data: &[u8],
) -> Option<T> {
    let value: T = serde_json::from_slice(data).ok()?;
    let bytes =
        serde_json::to_vec(&value).unwrap_or_else(|e| panic!("{value:?} does not serialize: {e}"));
    let again: T = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{value:?} serializes to something it cannot read back: {e}"));
    assert_eq!(
        again, value,
        "a body does not survive its own serialization"
    );
    Some(value)
}

fn parses<T: DeserializeOwned + Serialize>(data: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<T>(data) {
        let bytes = serde_json::to_vec(&value).unwrap_or_default();
        assert!(
            serde_json::from_slice::<T>(&bytes).is_ok(),
            "serializes to something unreadable"
        );
    }
}

/// Every request body, the routes and the routing headers, from the same bytes.
pub fn request_bodies(data: &[u8]) {
    if let Some(create) = round_trips::<CreateSandboxRequest>(data)
        && let Some(document) = &create.policy
    {
        check_policy(document);
    }
    round_trips::<ExecRequest>(data);
    round_trips::<SetTimeoutRequest>(data);
    round_trips::<MkdirRequest>(data);
    round_trips::<MoveRequest>(data);
    round_trips::<DecideApprovalRequest>(data);
    if let Some(document) = round_trips::<PolicyDocument>(data) {
        check_policy(&document);
    }
    parses::<e2b::wire::NewSandbox>(data);
    parses::<e2b::wire::ConnectSandbox>(data);
    parses::<e2b::wire::SetTimeout>(data);
    parses::<e2b::wire::Refresh>(data);
    parses::<e2b::wire::Pause>(data);
    parses::<e2b::wire::Resume>(data);

    let text = String::from_utf8_lossy(data);
    let path = format!("/{}", text.trim_start_matches('/'));
    for method in [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ] {
        if let Some(pattern) = crate::routes::route_pattern(&method, &path) {
            // A matched route names its parameters in the path: `{id}` is one whole segment.
            // Every route is under /v1 but the scrape endpoint.
            assert!(
                pattern.starts_with("/v1/") || pattern == "/metrics",
                "{method} {path} matched {pattern}"
            );
        }
    }
    let _ = e2b::time::parse_ms(&text);
    let _ = e2b::host_target(&text);
    if let Ok(uri) = path.parse::<Uri>() {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.insert(HOST, value.clone());
            headers.insert(HeaderName::from_static("e2b-sandbox-id"), value.clone());
            headers.insert(HeaderName::from_static("e2b-sandbox-port"), value);
        }
        let first = e2b::classify(&uri, &headers);
        assert_eq!(
            format!("{first:?}"),
            format!("{:?}", e2b::classify(&uri, &headers))
        );
    }
}

/// A policy inside a request is either refused with problems or accepted whole.
fn check_policy(document: &PolicyDocument) {
    if let Err(err) = airlock_policy::Policy::from_document(document) {
        assert!(
            !err.problems().is_empty(),
            "a refused policy names no problem"
        );
    }
}
