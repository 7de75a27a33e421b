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
use jupyter_protocol::{ExecutionState, JupyterMessage, JupyterMessageContent, ReplyStatus, Stdio};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::context::{Context, Turn};
use crate::kernel::{Kernel, KillReason, Received};
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

fn timestamp(message: &JupyterMessage) -> String {
    match serde_json::to_value(message.header.date) {
        Ok(Value::String(date)) => date,
        _ => String::new(),
    }
}

fn bundle(media: &impl serde::Serialize) -> Map<String, Value> {
    match serde_json::to_value(media) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
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

fn map(message: &JupyterMessage, progress: &mut Progress) -> Option<OutputLine> {
    match &message.content {
        JupyterMessageContent::ExecuteInput(input) => Some(OutputLine::NumberOfExecutions {
            execution_count: input.execution_count.value() as u64,
        }),
        JupyterMessageContent::StreamContent(stream) => {
            let text = stream.text.clone();
            let timestamp = timestamp(message);
            Some(match stream.name {
                Stdio::Stdout => OutputLine::Stdout { text, timestamp },
                Stdio::Stderr => OutputLine::Stderr { text, timestamp },
            })
        }
        JupyterMessageContent::ExecuteResult(result) => Some(OutputLine::Result(Box::new(
            ResultLine::from_bundle(bundle(&result.data), true),
        ))),
        JupyterMessageContent::DisplayData(display) => Some(OutputLine::Result(Box::new(
            ResultLine::from_bundle(bundle(&display.data), false),
        ))),
        JupyterMessageContent::ErrorOutput(error) if !progress.error_sent => {
            progress.error_sent = true;
            Some(OutputLine::Error {
                name: error.ename.clone(),
                value: error.evalue.clone(),
                traceback: error.traceback.join("\n"),
            })
        }
        JupyterMessageContent::ExecuteReply(reply) => {
            progress.replied = true;
            match (&reply.status, &reply.error) {
                (ReplyStatus::Error, Some(error)) if !progress.error_sent => {
                    progress.error_sent = true;
                    Some(OutputLine::Error {
                        name: error.ename.clone(),
                        value: error.evalue.clone(),
                        traceback: error.traceback.join("\n"),
                    })
                }
                (ReplyStatus::Aborted, _) if !progress.error_sent => {
                    progress.error_sent = true;
                    Some(OutputLine::error(
                        "ExecutionAborted",
                        "Execution was aborted",
                    ))
                }
                _ => None,
            }
        }
        JupyterMessageContent::Status(status) => {
            if status.execution_state == ExecutionState::Idle {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::{ErrorOutput, ExecuteReply, Status, StreamContent};

    fn message(content: impl Into<JupyterMessageContent>) -> JupyterMessage {
        JupyterMessage::new(content.into(), None)
    }

    #[test]
    fn test_map_first_error_only_and_reply_error_when_none_came() {
        let mut progress = Progress::default();
        let error = ErrorOutput {
            ename: "ZeroDivisionError".to_owned(),
            evalue: "division by zero".to_owned(),
            traceback: vec!["line 1".to_owned(), "line 2".to_owned()],
        };
        let first = map(&message(error.clone()), &mut progress);
        assert_eq!(
            first,
            Some(OutputLine::Error {
                name: "ZeroDivisionError".to_owned(),
                value: "division by zero".to_owned(),
                traceback: "line 1\nline 2".to_owned(),
            })
        );
        assert_eq!(map(&message(error), &mut progress), None);
        let reply = ExecuteReply {
            status: ReplyStatus::Aborted,
            ..ExecuteReply::default()
        };
        assert_eq!(map(&message(reply.clone()), &mut progress), None);
        assert!(progress.replied);

        let mut fresh = Progress::default();
        assert_eq!(
            map(&message(reply), &mut fresh),
            Some(OutputLine::error(
                "ExecutionAborted",
                "Execution was aborted"
            ))
        );
    }

    #[test]
    fn test_map_stream_and_idle() {
        let mut progress = Progress::default();
        let line = map(&message(StreamContent::stderr("warn\n")), &mut progress);
        assert!(matches!(line, Some(OutputLine::Stderr { ref text, .. }) if text == "warn\n"));
        let idle = Status {
            execution_state: ExecutionState::Idle,
        };
        assert_eq!(map(&message(idle), &mut progress), None);
        assert!(progress.idle && !progress.replied);
    }
}
