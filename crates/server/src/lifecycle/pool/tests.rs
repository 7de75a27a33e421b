//! The pool key: what a claim may differ in.

use super::*;

#[test]
fn test_pool_key_ignores_what_a_claim_applies_only() {
    let bare = bare_request("base");
    let mut claimed = bare.clone();
    claimed.env.insert("A".into(), "1".into());
    claimed.metadata.insert("k".into(), "v".into());
    claimed.timeout_ms = Some(1234);
    assert_eq!(pool_key(&bare), pool_key(&claimed));
    let mut bigger = bare.clone();
    bigger.resources.memory_bytes = Some(1 << 30);
    assert_ne!(pool_key(&bare), pool_key(&bigger));
    assert_ne!(pool_key(&bare), pool_key(&bare_request("other")));
}

#[test]
fn test_pool_key_of_a_desktop_carries_its_resolution() {
    let bare = bare_request(super::super::DESKTOP_TEMPLATE);
    let mut same = bare.clone();
    same.metadata.insert("resolution".into(), "1024X768".into());
    assert_eq!(pool_key(&bare), pool_key(&same));
    let mut other = bare.clone();
    other
        .metadata
        .insert("resolution".into(), "1280x720".into());
    assert_ne!(pool_key(&bare), pool_key(&other));
}
