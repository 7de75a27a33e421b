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
        if let Some(done) = complete(&answer)? {
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

/// The status and body of `answer` once it holds a whole response.
fn complete(answer: &[u8]) -> anyhow::Result<Option<(u16, Vec<u8>)>> {
    let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("the agent's answer has no status: {head}"))?;
    let body = &answer[split + 4..];
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return Ok(dechunk(body).map(|body| (status, body)));
    }
    let length: usize = match header("content-length") {
        Some(text) => text
            .parse()
            .with_context(|| format!("a bad Content-Length `{text}`"))?,
        None if status == 204 || status == 304 => 0,
        None => bail!("the agent's answer has neither a length nor chunks: {head}"),
    };
    Ok((body.len() >= length).then(|| (status, body[..length].to_vec())))
}

/// The body of a chunked answer, `None` while it is not all there yet.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]).into_owned();
        // A size line that is not hex never completes: the caller's read ends it.
        let size = usize::from_str_radix(size_text.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

/// Writes `data` to `path` in the sandbox (envd's `POST /files`). A connection reset before
/// any answer is retried once, and said on stderr.
pub fn upload(socket: &Path, path: &str, data: &[u8]) -> anyhow::Result<()> {
    match upload_once(socket, path, data) {
        Err(err) if is_reset(&err) => {
            eprintln!("airlock seceval: uploading {path} was reset ({err:#}); once more");
            upload_once(socket, path, data)
        }
        other => other,
    }
}

fn is_reset(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        })
    })
}

fn upload_once(socket: &Path, path: &str, data: &[u8]) -> anyhow::Result<()> {
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
        rest = &rest[5 + length..];
    }
    finished.stdout = String::from_utf8_lossy(&stdout).into_owned();
    Ok(finished)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_complete_waits_for_the_whole_answer_by_its_framing() {
        let chunked: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(complete(chunked).unwrap(), Some((200, b"abcde".to_vec())));
        assert_eq!(complete(&chunked[..chunked.len() - 7]).unwrap(), None);
        let sized: &[u8] = b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\nnope";
        assert_eq!(complete(sized).unwrap(), Some((404, b"nope".to_vec())));
        assert_eq!(complete(&sized[..sized.len() - 1]).unwrap(), None);
        assert_eq!(
            complete(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap(),
            Some((204, Vec::new()))
        );
        assert!(complete(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }
}
