//! `POST /airlock/claim {"env": {...}}`: a warm-pool sandbox handed to its creator takes the
//! creator's environment for every process started from then on, exactly as if it had been
//! started with it. Once per sandbox: a second claim is 409. Only the daemon sends it, on the
//! agent's socket; the data plane refuses `/airlock/` paths.

use std::collections::BTreeMap;
use std::ffi::OsString;

use hyper::StatusCode;
use serde::Deserialize;

use crate::Agent;
use crate::connect::{HttpResponse, no_content};
use crate::files::http_error;

pub const PATH: &str = "/airlock/claim";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Claim {
    env: BTreeMap<String, String>,
}

/// Applies a claim from its JSON body.
pub fn apply(agent: &Agent, body: &[u8]) -> HttpResponse {
    let claim: Claim = match serde_json::from_slice(body) {
        Ok(claim) => claim,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, format!("invalid claim: {e}")),
    };
    if let Err(e) = check_env(&claim.env) {
        return http_error(StatusCode::BAD_REQUEST, format!("invalid claim: {e}"));
    }
    if agent
        .claimed
        .swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        return http_error(StatusCode::CONFLICT, "this sandbox was already claimed");
    }
    let mut env = agent.base_env.write().unwrap_or_else(|e| e.into_inner());
    merge(&mut env, claim.env);
    no_content()
}

/// Refuses names and values no environment can hold.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    match env
        .iter()
        .find(|(name, value)| name.is_empty() || name.contains(['=', '\0']) || value.contains('\0'))
    {
        Some((name, _)) => Err(format!("{name:?} is not a valid environment variable")),
        None => Ok(()),
    }
}

/// `extra` over `base`: a name already present takes the new value in place.
pub(crate) fn merge(base: &mut Vec<(OsString, OsString)>, extra: BTreeMap<String, String>) {
    for (name, value) in extra {
        let (name, value) = (OsString::from(name), OsString::from(value));
        match base.iter_mut().find(|(existing, _)| *existing == name) {
            Some(slot) => slot.1 = value,
            None => base.push((name, value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_merge_overrides_in_place_and_appends() {
        let mut base = vec![("A".into(), "1".into()), ("B".into(), "2".into())];
        merge(
            &mut base,
            [
                ("B".to_owned(), "3".to_owned()),
                ("C".to_owned(), "4".to_owned()),
            ]
            .into(),
        );
        assert_eq!(
            base,
            vec![
                ("A".into(), "1".into()),
                ("B".into(), "3".into()),
                ("C".into(), "4".into())
            ]
        );
    }
}
