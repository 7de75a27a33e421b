//! Credentials on the E2B surface: API keys (`X-API-Key` or a bearer token, either spelling),
//! the per-sandbox record that keeps an E2B sandbox's access token (`e2b.json`), and E2B's
//! `/files` URL signatures.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use hyper::header::AUTHORIZATION;
use hyper::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::E2bError;
use crate::auth::{API_KEY_HEADER, canonical_key, constant_time_eq, hash_secret};
use crate::lifecycle::Daemon;
use crate::store::Store;

/// File name of the record in a sandbox's private directory.
pub const RECORD_FILE: &str = "e2b.json";

/// What the E2B surface remembers about a sandbox it created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxRecord {
    /// The data plane needs the access token (v2 always; v1 with `secure: true`).
    pub secure: bool,
    /// The sandbox's access token, returned again by connect and used to check signatures.
    pub access_token: String,
}

fn record_path(daemon: &Daemon, id: &str) -> PathBuf {
    daemon.config.sandboxes_dir().join(id).join(RECORD_FILE)
}

/// Writes the record of a sandbox just created (mode 0600, never replacing one).
pub fn write_record(daemon: &Daemon, id: &str, record: &SandboxRecord) -> std::io::Result<()> {
    let path = record_path(daemon, id);
    let json = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(&json)
}

/// The record of a sandbox, if the E2B surface created it.
pub fn read_record(daemon: &Daemon, id: &str) -> Option<SandboxRecord> {
    if !crate::auth::plausible_sandbox_id(id) {
        return None;
    }
    read_record_at(&record_path(daemon, id))
}

fn read_record_at(path: &Path) -> Option<SandboxRecord> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The API key a request presents: `X-API-Key`, else `Authorization: Bearer <key>`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(key) = headers.get(API_KEY_HEADER) {
        return Some(key.to_str().unwrap_or_default());
    }
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Checks the presented key against the store (`no_auth` is `--insecure-no-auth`).
pub fn check_key(store: &Store, headers: &HeaderMap, no_auth: bool) -> Result<(), E2bError> {
    if no_auth {
        return Ok(());
    }
    let Some(key) = presented_key(headers) else {
        return Err(E2bError::new(
            StatusCode::UNAUTHORIZED,
            "missing API key: send it as X-API-Key (E2B_API_KEY)",
        ));
    };
    let active = store
        .key_hash_is_active(&hash_secret(&canonical_key(key)))
        .map_err(|e| E2bError::from(crate::error::ApiError::from(e)))?;
    if active {
        Ok(())
    } else {
        Err(E2bError::new(
            StatusCode::UNAUTHORIZED,
            "Invalid API key: it is unknown or revoked",
        ))
    }
}

/// Whether the request carries the sandbox's access token (`X-Access-Token`).
pub fn has_valid_token(headers: &HeaderMap, token_hash: Option<&str>) -> bool {
    match (headers.get(crate::auth::ACCESS_TOKEN_HEADER), token_hash) {
        (Some(token), Some(expected)) => {
            constant_time_eq(&hash_secret(token.to_str().unwrap_or_default()), expected)
        }
        _ => false,
    }
}

/// E2B's `/files` signature: `v1_` + unpadded base64 of
/// sha256(`<path>:<read|write>:<user>:<token>[:<expiration>]`).
pub fn file_signature(
    path: &str,
    write: bool,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let operation = if write { "write" } else { "read" };
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(expiration) = expiration {
        raw.push(':');
        raw.push_str(expiration);
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Checks a signed `/files` URL (its decoded query) against the sandbox's token at `now_s`
/// (Unix seconds). The error says what is wrong.
pub fn check_file_signature(
    query: &[(String, String)],
    write: bool,
    token: &str,
    now_s: u64,
) -> Result<(), String> {
    let param = |name: &str| {
        query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let Some(signature) = param("signature") else {
        return Err("missing X-Access-Token header or signature".to_owned());
    };
    let expiration = param("signature_expiration").filter(|e| !e.is_empty());
    if let Some(expiration) = expiration {
        match expiration.parse::<u64>() {
            Ok(at) if at >= now_s => {}
            Ok(_) => return Err("the signature has expired".to_owned()),
            Err(_) => return Err(format!("bad signature_expiration {expiration:?}")),
        }
    }
    let expected = file_signature(
        param("path").unwrap_or_default(),
        write,
        param("username").unwrap_or_default(),
        token,
        expiration,
    );
    if constant_time_eq(signature, &expected) {
        Ok(())
    } else {
        Err("the signature does not match this path, operation and user".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn test_signature_matches_the_sdks_algorithm() {
        // Python: base64.b64encode(hashlib.sha256(b"/tmp/a b.txt:read::at_tok").digest())
        //         .rstrip(b"=") → IK9o1rlb7ozpLtbo+Pn8ap7ca02OEGplsmWvePa3WhE
        assert_eq!(
            file_signature("/tmp/a b.txt", false, "", "at_tok", None),
            "v1_IK9o1rlb7ozpLtbo+Pn8ap7ca02OEGplsmWvePa3WhE"
        );
        let with_expiry = file_signature("/f", true, "root", "at_tok", Some("1800000000"));
        assert_ne!(
            with_expiry,
            file_signature("/f", true, "root", "at_tok", None)
        );
        assert_ne!(
            with_expiry,
            file_signature("/f", false, "root", "at_tok", Some("1800000000"))
        );
    }

    #[test]
    fn test_signed_urls_are_checked_for_path_operation_user_and_expiry() {
        let token = "at_secret";
        let good = file_signature("/tmp/x", false, "", token, None);
        let query = pairs(&[("path", "/tmp/x"), ("signature", &good)]);
        assert_eq!(check_file_signature(&query, false, token, 0), Ok(()));
        assert!(
            check_file_signature(&query, true, token, 0).is_err(),
            "read is not write"
        );
        assert!(check_file_signature(&query, false, "at_other", 0).is_err());
        let moved = pairs(&[("path", "/etc/x"), ("signature", &good)]);
        assert!(check_file_signature(&moved, false, token, 0).is_err());
        let as_root = pairs(&[
            ("path", "/tmp/x"),
            ("username", "root"),
            ("signature", &good),
        ]);
        assert!(check_file_signature(&as_root, false, token, 0).is_err());

        let expiring = file_signature("/tmp/x", true, "user", token, Some("1000"));
        let query = pairs(&[
            ("path", "/tmp/x"),
            ("username", "user"),
            ("signature", &expiring),
            ("signature_expiration", "1000"),
        ]);
        assert_eq!(check_file_signature(&query, true, token, 999), Ok(()));
        let late = check_file_signature(&query, true, token, 1001).unwrap_err();
        assert!(late.contains("expired"), "{late}");
        let missing = check_file_signature(&pairs(&[("path", "/x")]), false, token, 0);
        assert!(missing.unwrap_err().contains("X-Access-Token"));
    }

    #[test]
    fn test_keys_come_from_x_api_key_or_a_bearer_token() {
        let mut headers = HeaderMap::new();
        assert_eq!(presented_key(&headers), None);
        headers.insert(AUTHORIZATION, "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(presented_key(&headers), None, "Basic is envd's user");
        headers.insert(AUTHORIZATION, "Bearer e2b_00ff".parse().unwrap());
        assert_eq!(presented_key(&headers), Some("e2b_00ff"));
        headers.insert(API_KEY_HEADER, "ak_11".parse().unwrap());
        assert_eq!(presented_key(&headers), Some("ak_11"));
    }
}
