//! Test harness: starts the real `airlock-agent` binary on a temporary Unix socket and speaks
//! raw HTTP/1.1 bytes to it (no HTTP client library, so framing is checked byte for byte).
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

/// The agent under test: `$AIRLOCK_AGENT_BIN`, else the one `scripts/sandbox-binaries.sh` put
/// beside the workspace's binaries (a test executable sits in `deps/` below them).
pub fn agent_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("AIRLOCK_AGENT_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("airlock-agent");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/sandbox-binaries.sh first",
        path.display()
    );
    path
}

/// A running agent and its scratch directory (used as its `$HOME`).
pub struct TestAgent {
    child: Child,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

impl TestAgent {
    pub fn start(name: &str) -> TestAgent {
        let dir =
            std::env::temp_dir().join(format!("airlock-agent-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("home")).unwrap();
        let socket = dir.join("agent.sock");
        let child = Command::new(agent_bin())
            .arg("--listen")
            .arg(&socket)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", dir.join("home"))
            .env("LANG", "C.UTF-8")
            .env("AIRLOCK_TEST_BASE", "base-value")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let agent = TestAgent { child, socket, dir };
        // Wait until the socket accepts connections (bounded, generous: not a timing assertion).
        for _ in 0..3000 {
            if UnixStream::connect(&agent.socket).is_ok() {
                return agent;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "the agent never started listening on {}",
            agent.socket.display()
        );
    }

    pub fn home(&self) -> PathBuf {
        self.dir.join("home")
    }

    pub fn connect(&self) -> Conn {
        let stream = UnixStream::connect(&self.socket).unwrap();
        // A safety net against hangs, not an assertion about speed.
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        Conn {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How a request body is sent.
pub enum Body<'a> {
    None,
    Fixed(&'a [u8]),
    /// `Transfer-Encoding: chunked`, one chunk per slice.
    Chunked(Vec<&'a [u8]>),
}

#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    }
}

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    /// A connection over a stream already connected to an agent (e.g. through a VMM's vsock
    /// socket after its `CONNECT` handshake); `reader` holds any bytes read past it.
    pub fn from_stream(reader: BufReader<UnixStream>) -> Conn {
        let writer = reader.get_ref().try_clone().unwrap();
        Conn { reader, writer }
    }
}

/// Reads a response body incrementally (chunked or by length).
pub struct BodyReader<'a> {
    conn: &'a mut Conn,
    chunked: bool,
    left_in_chunk: usize,
    done: bool,
}

impl Read for BodyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left_in_chunk == 0 {
            if !self.chunked {
                self.done = true;
                return Ok(0);
            }
            let line = self.conn.line();
            let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size line {line:?}"));
            if size == 0 {
                // Trailers, then the empty line.
                while !self.conn.line().is_empty() {}
                self.done = true;
                return Ok(0);
            }
            self.left_in_chunk = size;
        }
        let want = buf.len().min(self.left_in_chunk);
        let n = self.conn.reader.read(&mut buf[..want])?;
        assert!(n > 0, "connection closed inside a response body");
        self.left_in_chunk -= n;
        if self.left_in_chunk == 0 && self.chunked {
            let mut crlf = [0u8; 2];
            self.conn.reader.read_exact(&mut crlf)?;
            assert_eq!(&crlf, b"\r\n", "chunk not followed by CRLF");
        }
        Ok(n)
    }
}

impl BodyReader<'_> {
    /// The next Connect envelope `(flags, json)`, or `None` at the end of the body.
    pub fn envelope(&mut self) -> Option<(u8, Value)> {
        let mut header = [0u8; 5];
        let mut got = 0;
        while got < 5 {
            let n = self.read(&mut header[got..]).unwrap();
            if n == 0 {
                assert_eq!(got, 0, "body ended inside an envelope header");
                return None;
            }
            got += n;
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut payload = vec![0u8; len];
        self.read_exact(&mut payload).unwrap();
        let json = serde_json::from_slice(&payload).unwrap_or_else(|e| {
            panic!(
                "envelope is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&payload)
            )
        });
        Some((header[0], json))
    }

    /// The next data envelope's message (panics on the end frame).
    pub fn message(&mut self) -> Value {
        let (flags, json) = self.envelope().expect("stream ended early");
        assert_eq!(
            flags, 0,
            "expected a data envelope, got flags {flags} with {json}"
        );
        json
    }

    /// Reads until the end frame; returns it and asserts the body then ends.
    pub fn end_frame(&mut self) -> Value {
        loop {
            let (flags, json) = self.envelope().expect("stream ended without an end frame");
            if flags == 2 {
                assert!(self.envelope().is_none(), "data after the end frame");
                return json;
            }
        }
    }
}

impl Conn {
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(line.ends_with("\r\n"), "line without CRLF: {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: Body<'_>) {
        self.try_send(method, path, headers, body).unwrap();
    }

    /// Like `send`, but a server that answers early and closes may cut the body off (EPIPE).
    pub fn send_cut_off(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) {
        let _ = self.try_send(method, path, headers, body);
    }

    fn try_send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) -> std::io::Result<()> {
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        for (k, v) in headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        let mut bytes = Vec::new();
        match body {
            Body::None => request.push_str("\r\n"),
            Body::Fixed(data) => {
                request.push_str(&format!("Content-Length: {}\r\n\r\n", data.len()));
                bytes.extend_from_slice(data);
            }
            Body::Chunked(chunks) => {
                request.push_str("Transfer-Encoding: chunked\r\n\r\n");
                for chunk in chunks.iter().filter(|c| !c.is_empty()) {
                    bytes.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    bytes.extend_from_slice(chunk);
                    bytes.extend_from_slice(b"\r\n");
                }
                bytes.extend_from_slice(b"0\r\n\r\n");
            }
        }
        self.writer.write_all(request.as_bytes())?;
        self.writer.write_all(&bytes)
    }

    pub fn head(&mut self) -> Head {
        let status_line = self.line();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let line = self.line();
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        Head { status, headers }
    }

    pub fn body<'a>(&'a mut self, head: &Head) -> BodyReader<'a> {
        let chunked = head.is_chunked();
        let length = if chunked || head.status == 204 {
            0
        } else {
            head.header("content-length")
                .map(|v| v.parse().unwrap())
                .expect("response without Content-Length or chunked encoding")
        };
        BodyReader {
            conn: self,
            chunked,
            left_in_chunk: length,
            done: !chunked && length == 0,
        }
    }

    /// A whole response: head and body bytes.
    pub fn response(&mut self) -> (Head, Vec<u8>) {
        let head = self.head();
        let mut body = Vec::new();
        self.body(&head).read_to_end(&mut body).unwrap();
        (head, body)
    }

    /// A unary Connect call: `(status, json)`.
    pub fn unary(&mut self, method: &str, message: &Value) -> (u16, Value) {
        let body = message.to_string();
        self.send(
            "POST",
            &format!("/{method}"),
            &[
                ("Content-Type", "application/json"),
                ("Connect-Protocol-Version", "1"),
            ],
            Body::Fixed(body.as_bytes()),
        );
        let (head, body) = self.response();
        assert_eq!(
            head.header("content-type"),
            Some("application/json"),
            "{method}"
        );
        (head.status, serde_json::from_slice(&body).unwrap())
    }

    /// A unary call that must succeed.
    pub fn ok(&mut self, method: &str, message: &Value) -> Value {
        let (status, json) = self.unary(method, message);
        assert_eq!(status, 200, "{method} failed: {json}");
        json
    }

    /// Opens a server stream; returns after the response head (which must be a 200 stream).
    pub fn open_stream(
        &mut self,
        method: &str,
        message: &Value,
        headers: &[(&str, &str)],
    ) -> BodyReader<'_> {
        let frame = envelope(0, message);
        let mut all = vec![
            ("Content-Type", "application/connect+json"),
            ("Connect-Protocol-Version", "1"),
        ];
        all.extend_from_slice(headers);
        self.send("POST", &format!("/{method}"), &all, Body::Fixed(&frame));
        let head = self.head();
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("content-type"),
            Some("application/connect+json")
        );
        self.body(&head)
    }
}

pub fn envelope(flags: u8, message: &Value) -> Vec<u8> {
    let json = message.to_string();
    let mut out = vec![flags];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json.as_bytes());
    out
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn unb64(text: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text.as_str().expect("bytes field is a string"))
        .unwrap()
}

/// The `Start` message the Python SDK sends for `commands.run(cmd)`.
pub fn bash(cmd: &str) -> Value {
    json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false})
}

/// What a process stream carried: concatenated output and the end event.
#[derive(Debug, Default)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub end: Value,
    pub end_frame: Value,
    pub keepalives: usize,
}

/// Reads a process stream after its start event to the end frame.
pub fn collect(stream: &mut BodyReader<'_>) -> Collected {
    let mut out = Collected::default();
    loop {
        let (flags, message) = stream
            .envelope()
            .expect("stream ended without an end frame");
        if flags == 2 {
            out.end_frame = message;
            assert!(stream.envelope().is_none(), "data after the end frame");
            return out;
        }
        let event = &message["event"];
        if let Some(data) = event.get("data") {
            for (kind, sink) in [
                ("stdout", &mut out.stdout),
                ("stderr", &mut out.stderr),
                ("pty", &mut out.pty),
            ] {
                if let Some(bytes) = data.get(kind) {
                    sink.extend_from_slice(&unb64(bytes));
                }
            }
        } else if let Some(end) = event.get("end") {
            out.end = end.clone();
        } else if event.get("keepalive").is_some() {
            out.keepalives += 1;
        } else {
            panic!("unexpected event {message}");
        }
    }
}

/// Reads the start event of a process stream and returns the pid.
pub fn start_pid(stream: &mut BodyReader<'_>) -> u64 {
    let message = stream.message();
    message["event"]["start"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("first event is not start: {message}"))
}

/// Reads process events until the concatenated stdout or pty output contains `needle`.
pub fn read_until(stream: &mut BodyReader<'_>, needle: &str) -> String {
    let mut seen = Vec::new();
    loop {
        let message = stream.message();
        let data = &message["event"]["data"];
        for kind in ["stdout", "pty"] {
            if let Some(bytes) = data.get(kind) {
                seen.extend_from_slice(&unb64(bytes));
            }
        }
        assert!(
            message["event"].get("end").is_none(),
            "process ended before {needle:?}: {:?}",
            String::from_utf8_lossy(&seen)
        );
        let text = String::from_utf8_lossy(&seen).into_owned();
        if text.contains(needle) {
            return text;
        }
    }
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}
