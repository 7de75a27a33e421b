//! `POST /airlock/resume {"entropy_b64": "...", "env": {...}}`: a microVM guest resumed from
//! a snapshot, one of possibly many forks of it, must not share secrets with its siblings: it
//! takes entropy from the host (the kernel's CRNG reseeded from it at once, see
//! `airlock_jail::entropy`) and its own identity and access token as environment variables of
//! every process started from then on. Unlike a claim, every resume may send new values.
//! Only the host sends it, on the agent's vsock port; the data plane refuses `/airlock/` paths.

use std::collections::BTreeMap;

use base64::Engine;
use hyper::StatusCode;
use serde::Deserialize;

use crate::Agent;
use crate::connect::{HttpResponse, no_content};
use crate::files::http_error;

pub const PATH: &str = "/airlock/resume";
/// Less than this is not worth calling fresh entropy.
const MIN_ENTROPY_BYTES: usize = 32;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Resume {
    entropy_b64: String,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

/// Applies a resume from its JSON body.
pub fn apply(agent: &Agent, body: &[u8]) -> HttpResponse {
    let resume: Resume = match serde_json::from_slice(body) {
        Ok(resume) => resume,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("invalid resume: {e}")),
    };
    let entropy = match base64::engine::general_purpose::STANDARD.decode(&resume.entropy_b64) {
        Ok(bytes)
            if (MIN_ENTROPY_BYTES..=airlock_jail::entropy::MAX_ENTROPY_BYTES)
                .contains(&bytes.len()) =>
        {
            bytes
        }
        _ => {
            return http_error(
                StatusCode::BAD_REQUEST,
                format!(
                    "invalid resume: entropy_b64 must be base64 of {MIN_ENTROPY_BYTES} to {} bytes",
                    airlock_jail::entropy::MAX_ENTROPY_BYTES
                ),
            );
        }
    };
    if let Err(e) = crate::claim::check_env(&resume.env) {
        return http_error(StatusCode::BAD_REQUEST, format!("invalid resume: {e}"));
    }
    if let Err(e) = airlock_jail::entropy::add_and_reseed(&entropy) {
        return http_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reseeding the kernel's random pool failed: {e}"),
        );
    }
    let mut env = agent.base_env.write().unwrap_or_else(|e| e.into_inner());
    crate::claim::merge(&mut env, resume.env);
    no_content()
}
