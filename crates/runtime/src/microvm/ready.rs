//! The guest agent's side of a microvm sandbox's start: wait until it answers through the
//! VMM's socket, then hand it the sandbox's environment with fresh entropy
//! (`POST /airlock/resume`): a guest restored from a snapshot is one fork of many and must
//! not keep its siblings' randomness or identity, and a booted one gets its environment the
//! same way (its init's environment is the initramfs's).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;

/// Why the guest's agent did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    #[error(
        "the VMM ended before the guest's agent answered (its console is in the sandbox's agent log)"
    )]
    VmmEnded,
    #[error("the guest's agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("reading entropy for the guest failed")]
    Entropy(#[source] std::io::Error),
    #[error("the guest's agent refused the resume: {0}")]
    Resume(String),
}

/// The sandbox's id, in the environment the agent is given at each resume (a fork's own).
pub const ENV_SANDBOX_ID: &str = "AIRLOCK_SANDBOX_ID";

/// Per-attempt socket timeout: a guest under emulation answers slowly.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Bytes of host entropy sent (the agent takes 32 to 512).
const ENTROPY_BYTES: usize = 64;

/// The most an answer of the agent here may be.
const ANSWER_LIMIT_BYTES: usize = 64 << 10;

/// One HTTP/1.1 exchange on a fresh connection, read by the answer's framing
/// ([`super::answer`]); answers the status code and the text.
fn exchange(socket: &Path, request: &[u8]) -> std::io::Result<(u16, String)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(ATTEMPT_TIMEOUT))?;
    stream.set_write_timeout(Some(ATTEMPT_TIMEOUT))?;
    stream.write_all(request)?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match super::answer::complete(&answer) {
            Ok(Some((code, body))) => {
                return Ok((code, String::from_utf8_lossy(&body).into_owned()));
            }
            Ok(None) if answer.len() < ANSWER_LIMIT_BYTES => {}
            Ok(None) | Err(_) => return Err(std::io::ErrorKind::InvalidData.into()),
        }
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        answer.extend_from_slice(&buffer[..n]);
    }
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X'))
    })
}

/// Waits until the agent behind `socket` answers `GET /health` with a success; `helper_pid`
/// is the sandbox's helper, which exits when the VMM does. `limit` guards against a hang.
pub fn wait_for_agent(socket: &Path, helper_pid: i32, limit: Duration) -> Result<(), ReadyError> {
    let deadline = Instant::now() + limit;
    let request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    loop {
        if let Ok((code, _)) = exchange(socket, request)
            && (200..300).contains(&code)
        {
            return Ok(());
        }
        if !runs(helper_pid) {
            return Err(ReadyError::VmmEnded);
        }
        if Instant::now() >= deadline {
            return Err(ReadyError::Timeout(limit));
        }
        std::thread::sleep(RETRY_PAUSE);
    }
}

/// The body of `POST /airlock/resume`; `egress` is a `proxy`-mode sandbox's
/// ([`super::egress::EgressPlan::resume_value`]).
pub fn resume_body(
    entropy: &[u8],
    env: &[(String, String)],
    egress: Option<&serde_json::Value>,
) -> String {
    let env: serde_json::Map<String, serde_json::Value> = env
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let mut body = serde_json::json!({
        "entropy_b64": base64::engine::general_purpose::STANDARD.encode(entropy),
        "env": env,
    });
    if let (Some(egress), Some(object)) = (egress, body.as_object_mut()) {
        object.insert("egress".to_owned(), egress.clone());
    }
    body.to_string()
}

/// Sends the guest's agent fresh host entropy, the sandbox's environment and its egress.
pub fn resume(
    socket: &Path,
    env: &[(String, String)],
    egress: Option<&serde_json::Value>,
) -> Result<(), ReadyError> {
    let mut entropy = [0u8; ENTROPY_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut entropy))
        .map_err(ReadyError::Entropy)?;
    let body = resume_body(&entropy, env, egress);
    let request = format!(
        "POST /airlock/resume HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    match exchange(socket, request.as_bytes()) {
        Ok((204, _)) => Ok(()),
        Ok((_, text)) => Err(ReadyError::Resume(
            text.lines().last().unwrap_or_default().to_owned(),
        )),
        Err(e) => Err(ReadyError::Resume(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_resume_body_carries_the_entropy_and_every_variable() {
        let body = resume_body(
            &[1, 2, 3],
            &[
                ("AIRLOCK_SANDBOX_ID".into(), "abc".into()),
                ("QUOTE".into(), "a \"b\"".into()),
            ],
            None,
        );
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["entropy_b64"], "AQID");
        assert_eq!(value["env"]["AIRLOCK_SANDBOX_ID"], "abc");
        assert_eq!(value["env"]["QUOTE"], "a \"b\"");
        assert!(value.get("egress").is_none());
        let egress = serde_json::json!({"relay_port": 3128});
        let body = resume_body(&[1, 2, 3], &[], Some(&egress));
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["egress"], egress);
    }

    #[test]
    fn test_runs_tells_a_live_process_from_a_gone_one() {
        assert!(runs(i32::try_from(std::process::id()).unwrap()));
        // Above the kernel's largest pid (PID_MAX_LIMIT).
        assert!(!runs(4_194_305));
    }

    #[test]
    fn test_wait_for_agent_ends_when_the_vmm_is_gone() {
        let dir = std::env::temp_dir().join(format!("airlock-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = wait_for_agent(&dir.join("none.sock"), 4_194_305, Duration::from_secs(600))
            .unwrap_err();
        assert!(matches!(err, ReadyError::VmmEnded), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
