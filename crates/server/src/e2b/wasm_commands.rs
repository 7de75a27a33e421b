//! `commands.run` on the wasm tier: envd's `process.Process/Start` for a `wasm-js` or
//! `wasm-python` sandbox is answered by the daemon, not the agent. `python -c CODE`,
//! `python FILE.py`, `node -e CODE` and `node FILE.js` (as the SDK sends them, under
//! `/bin/bash -l -c`) run in the sandbox's engine; anything else ends at once with exit code
//! 127 and a stderr saying it is not available on the wasm tier. The answer is envd's own
//! stream: `start`, `data`, `end`, then the end-of-stream frame.

use std::sync::Arc;

use airlock_api::v1::{
    DEFAULT_EVAL_TIMEOUT_MS, EvalErrorKind, EvalLanguage, EvalRequest, EvalResponse,
    MAX_EVAL_TIMEOUT_MS,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::E2bError;
use crate::agent::{Agent, envelope};
use crate::http::{Body, full, with_type};
use crate::lifecycle::Daemon;

/// The most of a start request read.
const MAX_START_BYTES: usize = 4 << 20;
/// The most of a script file read for `node FILE`.
const MAX_SCRIPT_BYTES: usize = 4 << 20;
/// The exit code of a command the tier does not have (a shell's "command not found").
const NOT_AVAILABLE: i64 = 127;

/// Answers one `process.Process/Start` of wasm sandbox `id`.
pub async fn start(
    daemon: &Arc<Daemon>,
    agent: &Agent,
    id: &str,
    parts: &Parts,
    body: Incoming,
) -> Response<Body> {
    let Ok(collected) = http_body_util::Limited::new(body, MAX_START_BYTES)
        .collect()
        .await
    else {
        return E2bError::new(StatusCode::BAD_REQUEST, "cannot read the start request").response();
    };
    let bytes = collected.to_bytes();
    let enveloped = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/connect"));
    let json = if enveloped && bytes.len() >= 5 {
        bytes.slice(5..)
    } else {
        bytes
    };
    let Ok(start) = serde_json::from_slice::<Value>(&json) else {
        return E2bError::new(StatusCode::BAD_REQUEST, "the start request is not JSON").response();
    };
    let process = &start["process"];
    let cmd = process["cmd"].as_str().unwrap_or_default();
    let args: Vec<String> = process["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let cwd = process["cwd"].as_str().unwrap_or("/workspace");
    let timeout_ms = parts
        .headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .unwrap_or(DEFAULT_EVAL_TIMEOUT_MS)
        .min(MAX_EVAL_TIMEOUT_MS);
    let answer = match plan(cmd, &args, cwd) {
        Ok(Planned::Code(language, code)) => evaluate(daemon, id, language, code, timeout_ms).await,
        Ok(Planned::NodeFile(path)) => match read_script(agent, &path).await {
            Ok(code) => evaluate(daemon, id, EvalLanguage::Javascript, code, timeout_ms).await,
            Err(message) => Finished::failed(1, message),
        },
        Err(message) => Finished::failed(NOT_AVAILABLE, message),
    };
    stream(&answer)
}

/// What a command line maps to.
enum Planned {
    Code(EvalLanguage, String),
    /// A script the daemon reads from the sandbox (QuickJS has no filesystem).
    NodeFile(String),
}

/// How the command ended, as envd reports it.
struct Finished {
    stdout: String,
    stderr: String,
    exit_code: i64,
}

impl Finished {
    fn failed(exit_code: i64, message: String) -> Finished {
        Finished {
            stdout: String::new(),
            stderr: format!("{message}\n"),
            exit_code,
        }
    }
}

fn not_available(line: &str) -> String {
    format!(
        "{line:?}: not available on the wasm tier (it runs `python -c CODE`, `python FILE.py`, `node -e CODE` and `node FILE.js` in an isolate; use the process tier for anything else)"
    )
}

/// Maps envd's `cmd` and `args` (the SDK's `/bin/bash -l -c LINE`, or a direct program).
fn plan(cmd: &str, args: &[String], cwd: &str) -> Result<Planned, String> {
    let shell = matches!(cmd, "/bin/bash" | "bash" | "/bin/sh" | "sh");
    let words = if shell {
        let Some(at) = args.iter().position(|a| a == "-c") else {
            return Err(not_available(cmd));
        };
        let line = args.get(at + 1).cloned().unwrap_or_default();
        split_words(&line).ok_or_else(|| not_available(&line))?
    } else {
        std::iter::once(cmd.to_owned())
            .chain(args.iter().cloned())
            .collect()
    };
    let line = words.join(" ");
    let program = words
        .first()
        .map(|w| w.rsplit('/').next().unwrap_or(w))
        .unwrap_or("");
    let absolute = |path: &str| {
        if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("{}/{path}", cwd.trim_end_matches('/'))
        }
    };
    match (program, &words[1.min(words.len())..]) {
        ("python" | "python3" | "python3.12", [flag, code]) if flag == "-c" => {
            Ok(Planned::Code(EvalLanguage::Python, code.clone()))
        }
        ("python" | "python3" | "python3.12", [file]) if file.ends_with(".py") => {
            let path = absolute(file);
            let path = serde_json::to_string(&path).unwrap_or_default();
            Ok(Planned::Code(
                EvalLanguage::Python,
                format!("import runpy\nrunpy.run_path({path}, run_name='__main__')\nNone"),
            ))
        }
        ("node", [flag, code]) if flag == "-e" || flag == "--eval" => {
            Ok(Planned::Code(EvalLanguage::Javascript, code.clone()))
        }
        ("node", [file]) if file.ends_with(".js") || file.ends_with(".mjs") => {
            Ok(Planned::NodeFile(absolute(file)))
        }
        _ => Err(not_available(&line)),
    }
}

/// Splits a command line by the shell's quoting rules; `None` when it needs more of a shell
/// than words (pipes, redirections, substitutions, variables, globs, separators).
fn split_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        other => word.push(other),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            escaped @ ('"' | '\\' | '$' | '`') => word.push(escaped),
                            '\n' => {}
                            other => {
                                word.push('\\');
                                word.push(other);
                            }
                        },
                        '$' | '`' => return None,
                        other => word.push(other),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next()?);
            }
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '|' | '&' | ';' | '<' | '>' | '(' | ')' | '$' | '`' | '*' | '?' | '[' | '~' | '#' => {
                return None;
            }
            other => {
                in_word = true;
                word.push(other);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

async fn evaluate(
    daemon: &Arc<Daemon>,
    id: &str,
    language: EvalLanguage,
    code: String,
    timeout_ms: u64,
) -> Finished {
    let request = EvalRequest {
        language,
        code,
        timeout_ms: Some(timeout_ms),
        context_id: None,
    };
    match daemon.eval(id, &request).await {
        Ok(answer) => {
            daemon.audit_eval(id, &request, &answer);
            finished(answer)
        }
        Err(err) => Finished::failed(1, err.message),
    }
}

fn finished(answer: EvalResponse) -> Finished {
    let mut stderr = answer.stderr;
    let exit_code = match &answer.error {
        None => 0,
        Some(error) => {
            // A traceback is already on stderr; other failures say what happened.
            if error.kind != EvalErrorKind::Exception || stderr.is_empty() {
                stderr.push_str(&error.message);
                stderr.push('\n');
            }
            match error.kind {
                EvalErrorKind::Timeout => 124,
                EvalErrorKind::MemoryLimit => 137,
                EvalErrorKind::Exit => error
                    .message
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1),
                _ => 1,
            }
        }
    };
    Finished {
        stdout: answer.stdout,
        stderr,
        exit_code,
    }
}

/// `GET /files` of the sandbox's agent: the script of `node FILE`.
async fn read_script(agent: &Agent, path: &str) -> Result<String, String> {
    if !path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
    {
        return Err(format!(
            "{path:?}: only plain paths can be run by node on the wasm tier"
        ));
    }
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("/files?path={path}"))
        .body(full(Bytes::new()))
        .map_err(|e| format!("cannot build the file request: {e}"))?;
    let response = agent.send(request).await.map_err(|e| e.message)?;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_SCRIPT_BYTES)
        .collect()
        .await
        .map_err(|e| format!("cannot read {path}: {e}"))?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!(
            "node: cannot open {path}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    String::from_utf8(body.to_vec()).map_err(|_| format!("{path} is not UTF-8"))
}

/// envd's stream for a command that ran: start, its output, its end, end of stream.
fn stream(finished: &Finished) -> Response<Body> {
    let mut out = BytesMut::new();
    out.extend_from_slice(&envelope(&json!({"event": {"start": {"pid": 1}}})));
    for (name, text) in [("stdout", &finished.stdout), ("stderr", &finished.stderr)] {
        if !text.is_empty() {
            let data = BASE64.encode(text.as_bytes());
            out.extend_from_slice(&envelope(&json!({"event": {"data": {name: data}}})));
        }
    }
    out.extend_from_slice(&envelope(&json!({"event": {"end": {
        "exitCode": finished.exit_code,
        "exited": true,
        "status": format!("exit status {}", finished.exit_code),
    }}})));
    let mut end = envelope(&json!({})).to_vec();
    end[0] = 0x02;
    out.extend_from_slice(&end);
    with_type(
        StatusCode::OK,
        "application/connect+json",
        full(out.freeze()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_split_words_quotes_and_refuses_shell_syntax() {
        assert_eq!(
            split_words(r#"python -c 'print("a b")'"#),
            Some(vec!["python".into(), "-c".into(), "print(\"a b\")".into()])
        );
        assert_eq!(
            split_words(r#"node -e "console.log(\"x\")""#),
            Some(vec![
                "node".into(),
                "-e".into(),
                "console.log(\"x\")".into()
            ])
        );
        for line in [
            "ls | wc",
            "echo $HOME",
            "python a.py > out",
            "true; python -c 1",
            "echo `id`",
        ] {
            assert_eq!(split_words(line), None, "{line}");
        }
    }

    #[test]
    fn test_plan_maps_python_and_node_and_refuses_the_rest() {
        let sh = |line: &str| {
            plan(
                "/bin/bash",
                &["-l".into(), "-c".into(), line.into()],
                "/workspace",
            )
        };
        assert!(
            matches!(sh("python3 -c 'print(1)'"), Ok(Planned::Code(EvalLanguage::Python, c)) if c == "print(1)")
        );
        assert!(
            matches!(sh("node -e '1+1'"), Ok(Planned::Code(EvalLanguage::Javascript, c)) if c == "1+1")
        );
        assert!(matches!(sh("node app.js"), Ok(Planned::NodeFile(p)) if p == "/workspace/app.js"));
        assert!(
            matches!(sh("python run.py"), Ok(Planned::Code(EvalLanguage::Python, c)) if c.contains("\"/workspace/run.py\""))
        );
        for line in [
            "ls -la",
            "pip install requests",
            "bash -c id",
            "python",
            "git status",
        ] {
            let err = sh(line).err().unwrap_or_default();
            assert!(
                err.contains("not available on the wasm tier"),
                "{line}: {err}"
            );
        }
    }
}
