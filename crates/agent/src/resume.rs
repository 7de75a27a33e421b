//! `POST /airlock/resume {"entropy_b64": "...", "env": {...}}`: a microVM guest resumed from
//! a snapshot, one of possibly many forks of it, must not share secrets with its siblings: it
//! takes entropy from the host (the kernel's CRNG reseeded from it at once, see
//! `airlock_jail::entropy`) and its own identity and access token as environment variables of
//! every process started from then on. Unlike a claim, every resume may send new values.
//! Only the host sends it, on the agent's vsock port; the data plane refuses `/airlock/` paths.
//!
//! A `proxy`-mode sandbox's resume also carries `egress`: the guest has no network device, so
//! the agent brings loopback up, writes the proxy's trust bundles where the environment's
//! `SSL_CERT_FILE` and friends point (`EGRESS_DIR`), and relays `127.0.0.1:<relay_port>` (what
//! `HTTP_PROXY` names) to the host's vsock port `vsock_port`, which the VMM forwards to the
//! sandbox's egress proxy. The relay starts once; a later resume (after a pause) must name
//! the same ports.

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
    #[serde(default)]
    egress: Option<ResumeEgress>,
}

/// The guest's way to the egress proxy (see the module docs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeEgress {
    relay_port: u16,
    vsock_port: u32,
    /// File name in `EGRESS_DIR` (the CA and the trust bundle only) → its PEM text.
    #[serde(default)]
    files: BTreeMap<String, String>,
}

/// The relay a resume started: (loopback port, host vsock port).
pub type EgressRelay = (u16, u32);

/// The files a resume may write in `EGRESS_DIR`.
const EGRESS_FILES: [&str; 2] = [
    airlock_policy::EGRESS_CA,
    airlock_policy::EGRESS_TRUST_BUNDLE,
];
/// The most a trust file may be (a host's whole trust store fits).
const MAX_EGRESS_FILE_BYTES: usize = 4 << 20;

/// Sets up the guest's egress (see the module docs); the error is the client's or the guest's.
fn apply_egress(agent: &Agent, egress: &ResumeEgress) -> Result<(), (StatusCode, String)> {
    let bad = |message: String| {
        (
            StatusCode::BAD_REQUEST,
            format!("invalid resume: {message}"),
        )
    };
    if egress.relay_port == 0 || egress.vsock_port == 0 {
        return Err(bad(
            "egress.relay_port and egress.vsock_port must not be 0".to_owned()
        ));
    }
    for (name, text) in &egress.files {
        if !EGRESS_FILES.contains(&name.as_str()) {
            return Err(bad(format!(
                "egress.files may name {} only, not `{name}`",
                EGRESS_FILES.join(" and ")
            )));
        }
        if text.len() > MAX_EGRESS_FILE_BYTES {
            return Err(bad(format!(
                "egress.files.{name} is over {MAX_EGRESS_FILE_BYTES} bytes"
            )));
        }
    }
    let mut relay = agent.egress_relay.lock().unwrap_or_else(|e| e.into_inner());
    let wanted = (egress.relay_port, egress.vsock_port);
    match *relay {
        Some(running) if running == wanted => {}
        Some((port, vsock)) => {
            return Err(bad(format!(
                "the egress relay already runs from port {port} to vsock port {vsock}"
            )));
        }
        None => {
            let failed = |what: &str, e: std::io::Error| {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{what} failed: {e}"),
                )
            };
            airlock_jail::loopback_up().map_err(|e| failed("bringing loopback up", e))?;
            let listener = std::net::TcpListener::bind(("127.0.0.1", egress.relay_port))
                .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|e| {
                    failed(
                        &format!("binding the egress relay on port {}", egress.relay_port),
                        e,
                    )
                })?;
            let upstream = crate::relay::Upstream::Vsock {
                port: egress.vsock_port,
            };
            tokio::spawn(async move {
                if let Err(err) = crate::relay::relay(listener, upstream).await {
                    crate::log_line!("airlock-agent: the egress relay stopped: {err}");
                }
            });
            *relay = Some(wanted);
        }
    }
    write_egress_files(&egress.files).map_err(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("writing the egress trust files failed: {e}"),
        )
    })
}

/// Writes the trust files in `EGRESS_DIR` (readable by every user of the guest).
fn write_egress_files(files: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if files.is_empty() {
        return Ok(());
    }
    let dir = std::path::Path::new(airlock_policy::EGRESS_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
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
    if let Some(egress) = &resume.egress
        && let Err((status, message)) = apply_egress(agent, egress)
    {
        return http_error(status, message);
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
