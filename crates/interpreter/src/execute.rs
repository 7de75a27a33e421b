//! One execution: the kernel's messages for it, mapped to the NDJSON lines of E2B's
//! protocol, until the kernel is idle and has replied.
//!
//! The lines go to the HTTP answer through a channel. When the client goes away the channel
//! closes; the kernel is interrupted (E2B's timeout is the client's deadline, nothing else)
//! and the rest of the execution is read and dropped, so that the context's next execution
//! starts on an idle kernel. A quiet execution sends a `keepalive` line every few seconds.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::context::{Context, Turn};
use crate::kernel::{Kernel, KillReason, Message, Received};
use crate::languages::EnvSnippets;
use crate::wire::{OutputLine, ResultLine};

/// The quiet spell after which a `keepalive` line goes out (E2B's server: 5 s).
pub const KEEPALIVE: Duration = Duration::from_secs(5);

/// The client's end of an execution's lines.
struct Lines {
    sender: mpsc::Sender<Bytes>,
    gone: bool,
}

impl Lines {
    async fn send(&mut self, line: &OutputLine) {
        if !self.gone && self.sender.send(Bytes::from(line.encode())).await.is_err() {
            self.gone = true;
        }
    }
}

/// What an execution was asked to run.
#[derive(Debug)]
pub struct Job {
    pub code: String,
    pub env: Option<EnvSnippets>,
}

fn error_line(content: &Value, default_name: &str) -> OutputLine {
    let field = |key: &str| content.get(key).and_then(Value::as_str).unwrap_or("");
    let traceback = match content.get("traceback") {
        Some(Value::Array(lines)) => lines
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    let name = if field("ename").is_empty() {
        default_name
    } else {
        field("ename")
    };
    OutputLine::Error {
        name: name.to_owned(),
        value: field("evalue").to_owned(),
        traceback,
    }
}

fn result_line(content: &Value, is_main_result: bool) -> OutputLine {
    let bundle = match content.get("data") {
        Some(Value::Object(data)) => data.clone(),
        _ => Map::new(),
    };
    OutputLine::Result(Box::new(ResultLine::from_bundle(bundle, is_main_result)))
}

/// The error line for a kernel that ended under an execution.
fn death_line(context: &Context, kernel: &Kernel, how: &str) -> OutputLine {
    match kernel.killed_for() {
        Some(KillReason::Restart) => {
            OutputLine::error("ContextRestarting", "Context was restarted")
        }
        Some(KillReason::Remove) => OutputLine::error("ContextRemoved", "Context was removed"),
        Some(KillReason::Shutdown) => {
            OutputLine::error("ServiceStopped", "the code interpreter stopped")
        }
        None => OutputLine::error(
            "DeadKernelError",
            format!(
                "the {} kernel {how}; the next execution starts a new one (the state of this context is lost)",
                context.language()
            ),
        ),
    }
}

/// Maps one message; returns whether the request is done with (reply seen and idle).
#[derive(Debug, Default)]
struct Progress {
    idle: bool,
    replied: bool,
    error_sent: bool,
}

fn map(message: &Message, progress: &mut Progress) -> Option<OutputLine> {
    let content = &message.content;
    match message.msg_type.as_str() {
        "execute_input" => Some(OutputLine::NumberOfExecutions {
            execution_count: content
                .get("execution_count")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        }),
        "stream" => {
            let text = message.text("text").unwrap_or("").to_owned();
            let timestamp = message.date.clone();
            Some(match message.text("name") {
                Some("stderr") => OutputLine::Stderr { text, timestamp },
                _ => OutputLine::Stdout { text, timestamp },
            })
        }
        "execute_result" => Some(result_line(content, true)),
        "display_data" => Some(result_line(content, false)),
        "error" if !progress.error_sent => {
            progress.error_sent = true;
            Some(error_line(content, "Error"))
        }
        "execute_reply" => {
            progress.replied = true;
            match message.text("status") {
                Some("error") if !progress.error_sent => {
                    progress.error_sent = true;
                    Some(error_line(content, "Error"))
                }
                // ipykernel says `aborted`, older kernels `abort`.
                Some("abort" | "aborted") if !progress.error_sent => {
                    progress.error_sent = true;
                    Some(OutputLine::error(
                        "ExecutionAborted",
                        "Execution was aborted",
                    ))
                }
                _ => None,
            }
        }
        "status" => {
            if message.text("execution_state") == Some("idle") {
                progress.idle = true;
            }
            None
        }
        _ => None,
    }
}

/// Runs a silent snippet (an execution's variables); the error's text when it failed.
async fn silent(kernel: &Kernel, code: &str) -> Result<(), String> {
    let mut request = kernel
        .execute(code, true)
        .await
        .map_err(|e| e.to_string())?;
    let mut progress = Progress::default();
    let mut failed = None;
    while !(progress.idle && progress.replied) {
        match kernel.next(&mut request).await {
            Received::Message(message) => {
                if let Some(OutputLine::Error { name, value, .. }) = map(&message, &mut progress) {
                    failed = Some(format!("{name}: {value}"));
                }
            }
            Received::Died(how) => return Err(format!("the kernel {how}")),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Runs `job` in its turn and streams its lines into `sender`; ends with
/// `end_of_execution`, then restores the variables before it gives up the turn.
pub async fn run(context: Arc<Context>, turn: Turn, job: Job, sender: mpsc::Sender<Bytes>) {
    let Turn {
        kernel,
        guard,
        restarted_after,
    } = turn;
    let mut lines = Lines {
        sender,
        gone: false,
    };
    if let Some(note) = restarted_after {
        let line = OutputLine::Stderr {
            text: format!("[airlock] {note}\n"),
            timestamp: String::new(),
        };
        lines.send(&line).await;
    }
    let mut env_set = false;
    if let Some(env) = &job.env {
        match silent(&kernel, &env.set).await {
            Ok(()) => env_set = true,
            Err(err) => {
                let line = OutputLine::error("EnvVarsError", format!("env_vars: {err}"));
                lines.send(&line).await;
                lines.send(&OutputLine::EndOfExecution).await;
                return;
            }
        }
    }
    stream(&context, &kernel, &job.code, &mut lines).await;
    lines.send(&OutputLine::EndOfExecution).await;
    if env_set
        && let Some(env) = &job.env
        && kernel.exited().is_none()
    {
        // An execution that ended in an error can make ipykernel abort the request that
        // comes right after it; one retry covers that.
        if silent(&kernel, &env.restore).await.is_err() && kernel.exited().is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = silent(&kernel, &env.restore).await;
        }
    }
    drop(guard);
}

async fn stream(context: &Context, kernel: &Arc<Kernel>, code: &str, lines: &mut Lines) {
    let mut request = match kernel.execute(code, false).await {
        Ok(request) => request,
        Err(err) => {
            let line = OutputLine::error("KernelError", crate::context::error_chain(&err));
            lines.send(&line).await;
            return;
        }
    };
    let mut progress = Progress::default();
    let mut interrupted = false;
    let mut quiet_until = tokio::time::Instant::now() + KEEPALIVE;
    while !(progress.idle && progress.replied) {
        if lines.gone && !interrupted {
            interrupted = true;
            kernel.interrupt().await;
        }
        let closed = lines.sender.clone();
        tokio::select! {
            received = kernel.next(&mut request) => match received {
                Received::Message(message) => {
                    if let Some(line) = map(&message, &mut progress) {
                        lines.send(&line).await;
                        quiet_until = tokio::time::Instant::now() + KEEPALIVE;
                    }
                }
                Received::Died(how) => {
                    context.forget(kernel);
                    lines.send(&death_line(context, kernel, &how)).await;
                    return;
                }
            },
            () = tokio::time::sleep_until(quiet_until), if !lines.gone => {
                lines.send(&OutputLine::Keepalive).await;
                quiet_until = tokio::time::Instant::now() + KEEPALIVE;
            }
            () = closed.closed(), if !lines.gone => lines.gone = true,
        }
    }
    let settle = kernel.late_output();
    if settle.is_zero() {
        return;
    }
    let until = tokio::time::Instant::now() + settle;
    while let Ok(Received::Message(message)) =
        tokio::time::timeout_at(until, kernel.next(&mut request)).await
    {
        if let Some(line) = map(&message, &mut progress) {
            lines.send(&line).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(msg_type: &str, content: Value) -> Message {
        Message {
            msg_type: msg_type.to_owned(),
            parent_id: Some("p".to_owned()),
            date: "2026-12-01T00:00:00.000001Z".to_owned(),
            content,
        }
    }

    #[test]
    fn test_map_first_error_only_and_reply_error_when_none_came() {
        let mut progress = Progress::default();
        let error = json!({
            "ename": "ZeroDivisionError",
            "evalue": "division by zero",
            "traceback": ["line 1", "line 2"],
        });
        let first = map(&message("error", error.clone()), &mut progress);
        assert_eq!(
            first,
            Some(OutputLine::Error {
                name: "ZeroDivisionError".to_owned(),
                value: "division by zero".to_owned(),
                traceback: "line 1\nline 2".to_owned(),
            })
        );
        assert_eq!(map(&message("error", error), &mut progress), None);
        let aborted = json!({"status": "abort"});
        assert_eq!(
            map(&message("execute_reply", aborted.clone()), &mut progress),
            None
        );
        assert!(progress.replied);

        let mut fresh = Progress::default();
        assert_eq!(
            map(&message("execute_reply", aborted), &mut fresh),
            Some(OutputLine::error(
                "ExecutionAborted",
                "Execution was aborted"
            ))
        );
    }

    #[test]
    fn test_map_stream_result_and_idle() {
        let mut progress = Progress::default();
        let line = map(
            &message("stream", json!({"name": "stderr", "text": "warn\n"})),
            &mut progress,
        );
        assert_eq!(
            line,
            Some(OutputLine::Stderr {
                text: "warn\n".to_owned(),
                timestamp: "2026-12-01T00:00:00.000001Z".to_owned(),
            })
        );
        let result = map(
            &message(
                "display_data",
                json!({"data": {"text/plain": "x"}, "metadata": {}}),
            ),
            &mut progress,
        );
        assert!(
            matches!(result, Some(OutputLine::Result(r)) if !r.is_main_result && r.text.as_deref() == Some("x"))
        );
        let idle = json!({"execution_state": "idle"});
        assert_eq!(map(&message("status", idle), &mut progress), None);
        assert!(progress.idle && !progress.replied);
    }
}
