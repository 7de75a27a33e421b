//! API keys, sandbox access tokens and random identifiers.
//!
//! Keys and tokens are 32 random bytes from the kernel, shown once, and stored only as their
//! SHA-256. They are high-entropy, so a fast hash is enough: nobody can guess a preimage.
//! The key management functions work on the store directly, so `airlock keys ...` needs no
//! running daemon; a daemon that is running sees the change on its next request.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use airlock_api::v1::ErrorCode;
use hyper::HeaderMap;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::store::{KeyRow, Store, StoreError};

pub const API_KEY_HEADER: &str = "x-api-key";
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// Prefix of API keys, so that a leaked one is recognisable in logs and scanners.
const API_KEY_PREFIX: &str = "ak_";
const ACCESS_TOKEN_PREFIX: &str = "at_";
/// The E2B SDKs accept only keys of the form `e2b_<hex>`: the same secret, E2B's prefix.
pub const E2B_KEY_PREFIX: &str = "e2b_";

/// A presented API key as it is stored (hashed): `e2b_<hex>` is another spelling of
/// `ak_<hex>`, so one key works with the native API and with the E2B SDKs.
pub fn canonical_key(key: &str) -> Cow<'_, str> {
    match key.strip_prefix(E2B_KEY_PREFIX) {
        Some(hex) => Cow::Owned(format!("{API_KEY_PREFIX}{hex}")),
        None => Cow::Borrowed(key),
    }
}

/// The E2B spelling (`e2b_<hex>`) of a native key (`ak_<hex>`); other text is kept.
pub fn e2b_key(key: &str) -> String {
    match key.strip_prefix(API_KEY_PREFIX) {
        Some(hex) => format!("{E2B_KEY_PREFIX}{hex}"),
        None => key.to_owned(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read random bytes from /dev/urandom")]
    Random(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("a key name must be 1 to 64 printable characters, got {0:?}")]
    BadName(String),
    #[error("no active key has the id or name {0:?}")]
    NoSuchKey(String),
}

/// A key just created: `key` is shown to the user once and never stored.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub id: String,
    pub name: String,
    pub key: String,
}

pub fn random_bytes<const N: usize>() -> Result<[u8; N], AuthError> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(AuthError::Random)?;
    Ok(bytes)
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    out
}

/// Lowercase hex SHA-256 of a secret.
pub fn hash_secret(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

/// Compares two equal-length strings without an early exit.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub fn new_access_token() -> Result<String, AuthError> {
    Ok(format!(
        "{ACCESS_TOKEN_PREFIX}{}",
        hex(&random_bytes::<32>()?)
    ))
}

/// A sandbox id: 20 characters of `[a-z0-9]` (about 103 bits).
pub fn new_sandbox_id() -> Result<String, AuthError> {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut id = String::with_capacity(20);
    // Rejection sampling keeps every character uniform: 252 = 7 * 36.
    while id.len() < 20 {
        for byte in random_bytes::<32>()? {
            if byte < 252 && id.len() < 20 {
                id.push(char::from(ALPHABET[usize::from(byte % 36)]));
            }
        }
    }
    Ok(id)
}

/// Whether text can be a sandbox id at all: what [`new_sandbox_id`] issues is lower-case letters
/// and digits. Checked before any lookup, so that a path or a host name never reaches the store
/// or the file system with anything else.
pub fn plausible_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Creates an API key named `name` in the store.
pub fn create_key(store: &Store, name: &str) -> Result<NewKey, AuthError> {
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(AuthError::BadName(name.to_owned()));
    }
    let key = format!("{API_KEY_PREFIX}{}", hex(&random_bytes::<32>()?));
    let hash = hash_secret(&key);
    let id = hash[..12].to_owned();
    store.insert_key(&id, name, &hash)?;
    let _ = store.record_event(None, "key_created", &format!("key {id} ({name})"));
    Ok(NewKey {
        id,
        name: name.to_owned(),
        key,
    })
}

pub fn list_keys(store: &Store) -> Result<Vec<KeyRow>, AuthError> {
    Ok(store.list_keys()?)
}

/// Revokes the active key(s) with this id or name.
pub fn revoke_key(store: &Store, id_or_name: &str) -> Result<usize, AuthError> {
    let count = store.revoke_key(id_or_name)?;
    if count == 0 {
        return Err(AuthError::NoSuchKey(id_or_name.to_owned()));
    }
    let _ = store.record_event(None, "key_revoked", &format!("key {id_or_name}"));
    Ok(count)
}

/// Opens the store of a state directory, creating both if needed (for `airlock keys`).
pub fn open_state_store(state_dir: &Path) -> Result<Store, crate::config::ConfigError> {
    crate::config::prepare_state_dir(state_dir)?;
    Store::open(&state_dir.join(crate::config::STORE_FILE))
        .map_err(crate::config::ConfigError::from)
}

/// How a request proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// An active API key (or auth is disabled): may do anything.
    Operator,
    /// The access token of the sandbox named in the path: its data plane only.
    SandboxToken,
}

/// Checks the `X-API-Key` header against the store. `no_auth` is `--insecure-no-auth`.
pub fn check_api_key(
    store: &Store,
    headers: &HeaderMap,
    no_auth: bool,
) -> Result<Caller, ApiError> {
    if no_auth {
        return Ok(Caller::Operator);
    }
    let Some(key) = headers.get(API_KEY_HEADER) else {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "missing X-API-Key header",
        ));
    };
    let key = key.to_str().unwrap_or_default();
    if store.key_hash_is_active(&hash_secret(&canonical_key(key)))? {
        Ok(Caller::Operator)
    } else {
        Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "the API key is unknown or revoked",
        ))
    }
}

/// [`check_api_key`], where the key may also come as `Authorization: Bearer KEY`: what a
/// Prometheus scrape config's `authorization` sends (`GET /metrics`).
pub fn check_api_key_or_bearer(
    store: &Store,
    headers: &HeaderMap,
    no_auth: bool,
) -> Result<Caller, ApiError> {
    let bearer = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match bearer {
        Some(token) if !no_auth && headers.get(API_KEY_HEADER).is_none() => {
            let mut with_key = HeaderMap::new();
            let value = hyper::header::HeaderValue::from_str(token).map_err(|_| {
                ApiError::new(ErrorCode::Unauthenticated, "the bearer token is malformed")
            })?;
            with_key.insert(API_KEY_HEADER, value);
            check_api_key(store, &with_key, no_auth)
        }
        _ => check_api_key(store, headers, no_auth),
    }
}

/// For data-plane routes: an API key, or the sandbox's own access token.
pub fn check_sandbox_access(
    store: &Store,
    headers: &HeaderMap,
    no_auth: bool,
    token_hash: Option<&str>,
) -> Result<Caller, ApiError> {
    if let (Some(token), Some(expected)) = (headers.get(ACCESS_TOKEN_HEADER), token_hash) {
        if constant_time_eq(&hash_secret(token.to_str().unwrap_or_default()), expected) {
            return Ok(Caller::SandboxToken);
        }
        if headers.get(API_KEY_HEADER).is_none() && !no_auth {
            return Err(ApiError::new(
                ErrorCode::Unauthenticated,
                "the access token does not belong to this sandbox",
            ));
        }
    }
    if !no_auth && headers.get(API_KEY_HEADER).is_none() {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "missing X-API-Key or X-Access-Token header",
        ));
    }
    check_api_key(store, headers, no_auth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ids_and_secrets_have_their_shape() {
        let id = new_sandbox_id().unwrap();
        assert_eq!(id.len(), 20);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_ne!(id, new_sandbox_id().unwrap());
        let token = new_access_token().unwrap();
        assert!(token.starts_with("at_") && token.len() == 3 + 64);
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "ab"));
    }

    #[test]
    fn test_e2b_spelling_maps_to_the_native_key() {
        assert_eq!(canonical_key("e2b_00ff"), "ak_00ff");
        assert_eq!(canonical_key("ak_00ff"), "ak_00ff");
        assert_eq!(canonical_key("at_00ff"), "at_00ff");
        assert_eq!(canonical_key("e2b"), "e2b");
        assert_eq!(e2b_key("ak_00ff"), "e2b_00ff");
        assert_eq!(canonical_key(&e2b_key("ak_1234")), "ak_1234");
        assert_eq!(e2b_key("other"), "other");
    }
}
