//! Language servers for agents (`POST /v1/sandboxes/{id}/lsp`, then a WebSocket on
//! `GET /v1/sandboxes/{id}/lsp/{lsp}`): the server is a process in the sandbox, started by
//! its agent with a stdin pipe (envd's `Start`, so it is confined like any command), and this
//! module bridges its stdio to the WebSocket: each text (or binary) message from the client is
//! one JSON-RPC message, written to the server's stdin with LSP's `Content-Length` framing;
//! each framed message on its stdout goes to the client as one text message.
//!
//! A started server waits for one client; it is killed when that client's WebSocket closes,
//! when its stdout ends, or when no client came within [`ATTACH_WITHIN`]. Servers are not kept
//! across a daemon restart (a client reconnects and starts a new one).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_api::v1::{ErrorCode, LspRequest, LspServer};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

use crate::agent::{Agent, Envelope, EnvelopeReader};
use crate::error::ApiError;
use crate::websocket::{self, Incoming};

/// How long a started server waits for its WebSocket.
pub const ATTACH_WITHIN: Duration = Duration::from_secs(60);
/// The most bytes of one message a server may write before its framing completes.
const MAX_SERVER_MESSAGE: usize = 64 << 20;

/// The language servers known by language.
pub const LANGUAGES: &[(&str, &[&str])] = &[
    ("python", &["pylsp"]),
    ("rust", &["rust-analyzer"]),
    ("typescript", &["typescript-language-server", "--stdio"]),
    ("javascript", &["typescript-language-server", "--stdio"]),
    ("go", &["gopls"]),
];

/// A started server that no client has yet.
#[derive(Debug)]
pub struct Waiting {
    agent: Agent,
    pid: u32,
    reader: EnvelopeReader,
}

/// The servers waiting for their client, by `<sandbox>/<lsp id>`.
#[derive(Debug, Default)]
pub struct LspSessions {
    waiting: Mutex<HashMap<String, Waiting>>,
}

fn key(sandbox: &str, lsp: &str) -> String {
    format!("{sandbox}/{lsp}")
}

/// The command line a request asks for.
pub fn command(request: &LspRequest) -> Result<Vec<String>, ApiError> {
    match (&request.language, &request.argv) {
        (Some(language), None) => LANGUAGES
            .iter()
            .find(|(name, _)| name == language)
            .map(|(_, argv)| argv.iter().map(|a| (*a).to_owned()).collect())
            .ok_or_else(|| {
                let known: Vec<&str> = LANGUAGES.iter().map(|(name, _)| *name).collect();
                ApiError::unprocessable(format!(
                    "no language server known for {language:?} (known: {}); give `argv`",
                    known.join(", ")
                ))
            }),
        (None, Some(argv))
            if (1..=64).contains(&argv.len())
                && argv.iter().all(|a| !a.is_empty() && !a.contains('\0')) =>
        {
            Ok(argv.clone())
        }
        _ => Err(ApiError::invalid(
            "give exactly one of `language` and `argv` (1 to 64 non-empty arguments without NUL)",
        )),
    }
}

async fn kill(agent: &Agent, pid: u32) {
    let message = json!({ "process": { "pid": pid }, "signal": "SIGNAL_SIGKILL" });
    let _ = agent
        .unary::<Value>("process.Process/SendSignal", &message)
        .await;
}

impl LspSessions {
    /// Starts `argv` in `root` of the sandbox behind `agent`, with `env`, and keeps it for its
    /// client. 404 when the sandbox has no such program.
    pub async fn start(
        self: &Arc<Self>,
        sandbox: &str,
        agent: Agent,
        argv: Vec<String>,
        root: String,
        env: BTreeMap<String, String>,
    ) -> Result<LspServer, ApiError> {
        let (cmd, args) = argv
            .split_first()
            .ok_or_else(|| ApiError::invalid("an empty command"))?;
        let process = json!({ "cmd": cmd, "args": args, "envs": env, "cwd": root });
        let mut reader = agent
            .start_process(&json!({ "process": process, "stdin": true }), None, None)
            .await?;
        let pid = loop {
            match reader.next().await? {
                Some(Envelope::Message(value)) => {
                    let event = value.get("event").unwrap_or(&Value::Null);
                    if let Some(start) = event.get("start") {
                        let pid = start.get("pid").and_then(Value::as_u64).unwrap_or(0);
                        break u32::try_from(pid).unwrap_or(0);
                    }
                }
                Some(Envelope::End(Some(err))) => {
                    // A path that names nothing (ENOENT, ENOTDIR at exec) is missing too.
                    let missing = [
                        "not found in PATH",
                        "does not exist",
                        "(os error 2)",
                        "(os error 20)",
                    ];
                    return Err(if missing.iter().any(|m| err.message.contains(m)) {
                        ApiError::new(
                            ErrorCode::NotFound,
                            format!(
                                "the sandbox has no language server {cmd:?} (or no {root}): {}",
                                err.message
                            ),
                        )
                    } else {
                        err
                    });
                }
                Some(Envelope::End(None)) | None => {
                    return Err(ApiError::new(
                        ErrorCode::AgentError,
                        "the agent ended the stream before the server started",
                    ));
                }
            }
        };
        let lsp = crate::auth::new_sandbox_id()
            .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?;
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(sandbox, &lsp), Waiting { agent, pid, reader });
        let sessions = self.clone();
        let slot = key(sandbox, &lsp);
        tokio::spawn(async move {
            tokio::time::sleep(ATTACH_WITHIN).await;
            let left = sessions
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&slot);
            if let Some(waiting) = left {
                kill(&waiting.agent, waiting.pid).await;
            }
        });
        Ok(LspServer {
            websocket_path: format!("/v1/sandboxes/{sandbox}/lsp/{lsp}"),
            id: lsp,
            argv,
            root,
            pid,
        })
    }

    /// Whether server `lsp` of `sandbox` waits for its client.
    pub fn waits(&self, sandbox: &str, lsp: &str) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&key(sandbox, lsp))
    }

    /// The server `lsp` of `sandbox`, for its one client.
    pub fn take(&self, sandbox: &str, lsp: &str) -> Option<Waiting> {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(sandbox, lsp))
    }
}

/// LSP's base protocol on a byte stream: `Content-Length: N` headers, a blank line, N bytes.
#[derive(Debug, Default)]
pub struct Deframer {
    buffer: Vec<u8>,
}

impl Deframer {
    /// Adds `bytes`; returns the messages now complete. An error means the stream is not LSP.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, &'static str> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                if self.buffer.len() > 8192 {
                    return Err("a header block longer than 8 KiB");
                }
                return Ok(out);
            };
            let head = std::str::from_utf8(&self.buffer[..end])
                .map_err(|_| "a header that is not text")?;
            let length = head
                .split("\r\n")
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())
                        .flatten()
                })
                .ok_or("a message without Content-Length")?;
            if length > MAX_SERVER_MESSAGE {
                return Err("a message longer than 64 MiB");
            }
            let start = end + 4;
            if self.buffer.len() < start + length {
                return Ok(out);
            }
            out.push(self.buffer[start..start + length].to_vec());
            self.buffer.drain(..start + length);
        }
    }
}

/// LSP's framing of one message.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = format!("Content-Length: {}\r\n\r\n", message.len()).into_bytes();
    out.extend_from_slice(message);
    out
}

/// Ends a server whose client never arrived.
pub async fn abandon(waiting: Waiting) {
    kill(&waiting.agent, waiting.pid).await;
}

/// Serves one client on `upgraded` until either side ends; then the server is killed.
pub async fn bridge(upgraded: Upgraded, waiting: Waiting) {
    let Waiting {
        agent,
        pid,
        mut reader,
    } = waiting;
    let (mut from_client, mut to_client) = tokio::io::split(TokioIo::new(upgraded));
    let (frames, mut outgoing) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            let close = frame.first() == Some(&(0x80 | websocket::CLOSE));
            if to_client.write_all(&frame).await.is_err() || close {
                break;
            }
        }
        let _ = to_client.shutdown().await;
    });
    let to_server = {
        let (agent, frames) = (agent.clone(), frames.clone());
        async move {
            let mut messages = websocket::MessageReader::default();
            loop {
                match messages.next(&mut from_client).await {
                    Ok(Incoming::Message(message)) => {
                        let input = json!({ "process": { "pid": pid }, "input": { "stdin": BASE64.encode(frame(&message)) } });
                        if agent
                            .unary::<Value>("process.Process/SendInput", &input)
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Ok(Incoming::Ping(payload)) => {
                        let _ = frames
                            .send(websocket::encode(websocket::PONG, &payload))
                            .await;
                    }
                    Ok(Incoming::Close) | Err(_) => return,
                }
            }
        }
    };
    let from_server = {
        let frames = frames.clone();
        async move {
            let mut deframer = Deframer::default();
            loop {
                let Ok(Some(Envelope::Message(value))) = reader.next().await else {
                    return;
                };
                let Some(data) = value.get("event").and_then(|e| e.get("data")) else {
                    if value.get("event").and_then(|e| e.get("end")).is_some() {
                        return;
                    }
                    continue;
                };
                let Some(chunk) = data.get("stdout").and_then(Value::as_str) else {
                    continue;
                };
                let Ok(messages) = deframer.push(&BASE64.decode(chunk).unwrap_or_default()) else {
                    return;
                };
                for message in messages {
                    if frames
                        .send(websocket::encode(websocket::TEXT, &message))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = to_server => {}
        () = from_server => {}
    }
    kill(&agent, pid).await;
    // 1000: a normal closure.
    let _ = frames
        .send(websocket::encode(websocket::CLOSE, &1000u16.to_be_bytes()))
        .await;
    drop(frames);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_deframer_splits_messages_across_chunks() {
        let mut deframer = Deframer::default();
        let wire = [frame(br#"{"id":1}"#), frame(br#"{"id":2,"x":"\u00e9"}"#)].concat();
        let mut got = Vec::new();
        for chunk in wire.chunks(5) {
            got.extend(deframer.push(chunk).unwrap());
        }
        assert_eq!(
            got,
            [
                br#"{"id":1}"#.to_vec(),
                br#"{"id":2,"x":"\u00e9"}"#.to_vec()
            ]
        );
        let mut headers = Deframer::default();
        let typed = b"Content-Type: application/vscode-jsonrpc\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(headers.push(typed).unwrap(), [b"{}".to_vec()]);
        assert!(Deframer::default().push(b"Nope: 1\r\n\r\n{}").is_err());
    }

    #[test]
    fn test_command_by_language_or_argv() {
        let python = LspRequest {
            language: Some("python".into()),
            ..LspRequest::default()
        };
        assert_eq!(command(&python).unwrap(), ["pylsp"]);
        let custom = LspRequest {
            argv: Some(vec!["my-ls".into(), "--stdio".into()]),
            ..LspRequest::default()
        };
        assert_eq!(command(&custom).unwrap(), ["my-ls", "--stdio"]);
        let unknown = LspRequest {
            language: Some("cobol".into()),
            ..LspRequest::default()
        };
        assert!(command(&unknown).unwrap_err().message.contains("python"));
        assert!(command(&LspRequest::default()).is_err());
    }
}
