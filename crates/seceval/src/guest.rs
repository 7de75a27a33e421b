//! A small blocking client of a sandbox's agent (envd) on its Unix socket, for the microvm
//! column: upload a file, run a command to its end. One request per connection, its answer
//! read by its framing.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine as _;

/// A guard against a guest that stops answering (emulated guests are slow), not a bound on
/// how long a case may take.
const ANSWER_LIMIT: Duration = Duration::from_secs(300);

/// What a command printed and how it ended.
#[derive(Debug, Default)]
pub struct Finished {
    pub stdout: String,
    pub exit_code: Option<i32>,
    /// The signal that ended it (the agent's `status` says so; its `exitCode` is then -1).
    pub signal: Option<i32>,
}

/// One HTTP/1.1 request on a fresh connection: the status and the (de-chunked) body. The
/// answer is read by its own framing (length or chunks), then this side closes: the agent's
/// close is never waited for.
fn request(socket: &Path, head: &str, body: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to the agent at {}", socket.display()))?;
    stream.set_read_timeout(Some(ANSWER_LIMIT))?;
    let mut bytes = format!(
        "{head}Host: localhost\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    stream
        .write_all(&bytes)
        .context("sending the request to the agent")?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 64 << 10];
    loop {
        if let Some(done) = airlock_runtime::microvm::answer::complete(&answer)? {
            return Ok(done);
        }
        let n = stream
            .read(&mut buffer)
            .context("reading the agent's answer")?;
        if n == 0 {
            bail!("the agent closed the connection before its answer was complete");
        }
        answer.extend_from_slice(&buffer[..n]);
    }
}

/// Writes `data` to `path` in the sandbox (envd's `POST /files`).
pub fn upload(socket: &Path, path: &str, data: &[u8]) -> anyhow::Result<()> {
    let boundary = "airlock-seceval-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let head = format!(
        "POST /files?path={path} HTTP/1.1\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
    );
    let (status, answer) = request(socket, &head, &body)?;
    if status != 200 {
        bail!(
            "uploading {path} answered {status}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    Ok(())
}

/// Runs `cmd args` in the sandbox to its end (envd's `process.Process/Start`).
pub fn run(socket: &Path, cmd: &str, args: &[String]) -> anyhow::Result<Finished> {
    let message = serde_json::json!({"process": {"cmd": cmd, "args": args}, "stdin": false});
    let json = message.to_string();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(json.len())?.to_be_bytes());
    frame.extend_from_slice(json.as_bytes());
    let head = "POST /process.Process/Start HTTP/1.1\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n";
    let (status, body) = request(socket, head, &frame)?;
    if status != 200 {
        bail!(
            "starting {cmd} answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let mut finished = Finished::default();
    let mut stdout = Vec::new();
    let mut rest = body.as_slice();
    while rest.len() >= 5 {
        let length = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let payload = rest.get(5..5 + length).context("an envelope cut short")?;
        let message: serde_json::Value = serde_json::from_slice(payload)?;
        let event = &message["event"];
        if let Some(data) = event["data"]["stdout"].as_str() {
            stdout.extend(base64::engine::general_purpose::STANDARD.decode(data)?);
        }
        if let Some(code) = event["end"]["exitCode"].as_i64() {
            finished.exit_code = i32::try_from(code).ok();
        }
        if let Some(status) = event["end"]["status"].as_str() {
            finished.signal = airlock_server::judge0::status::signal_from_status(status);
        }
        rest = &rest[5 + length..];
    }
    finished.stdout = String::from_utf8_lossy(&stdout).into_owned();
    Ok(finished)
}
