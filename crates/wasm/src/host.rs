//! Tool calls: what the guest asks of the host during one evaluation, beyond `fetch`.
//!
//! The worker knows only the tools' names (`--tool NAME`); a call goes to whoever asked for
//! the evaluation (the daemon, on the evaluation's connection), which performs, approves and
//! audits it. Both engines suspend the guest while a call is out, and the time it waits is
//! not charged to the evaluation's timeout.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Mutex;

use airlock_api::v1::{ToolCall, ToolCallLine, ToolResult, ToolResultLine};
use serde_json::Value;

/// The most of one tool answer read.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Performs the guest's tool calls.
pub trait Host: Send + Sync {
    /// The value of tool `name` called with `args`, or the message the guest's error carries.
    fn call_tool(&self, name: &str, args: Value) -> Result<Value, String>;
}

/// No one to call: the command-line `eval`.
#[derive(Debug)]
pub struct NoHost;

impl Host for NoHost {
    fn call_tool(&self, name: &str, _args: Value) -> Result<Value, String> {
        Err(format!(
            "tool {name:?}: nothing performs tool calls for this evaluation"
        ))
    }
}

/// The evaluation's connection: a call line out, a result line back.
#[derive(Debug)]
pub struct ConnectionHost {
    stream: Mutex<BufReader<TcpStream>>,
}

impl ConnectionHost {
    pub fn new(reader: BufReader<TcpStream>) -> ConnectionHost {
        ConnectionHost {
            stream: Mutex::new(reader),
        }
    }
}

impl Host for ConnectionHost {
    fn call_tool(&self, name: &str, args: Value) -> Result<Value, String> {
        let mut reader = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let mut line = serde_json::to_vec(&ToolCallLine {
            tool_call: ToolCall {
                name: name.to_owned(),
                args,
            },
        })
        .map_err(|e| format!("tool {name:?}: cannot encode the call: {e}"))?;
        line.push(b'\n');
        reader
            .get_mut()
            .write_all(&line)
            .map_err(|e| format!("tool {name:?}: cannot send the call: {e}"))?;
        let mut answer = Vec::new();
        let read = std::io::Read::take(&mut *reader, MAX_ANSWER_BYTES as u64)
            .read_until(b'\n', &mut answer)
            .map_err(|e| format!("tool {name:?}: no answer: {e}"))?;
        if read == 0 {
            return Err(format!("tool {name:?}: the caller went away"));
        }
        match serde_json::from_slice::<ToolResultLine>(&answer) {
            Ok(ToolResultLine {
                tool_result: ToolResult::Ok { value },
            }) => Ok(value),
            Ok(ToolResultLine {
                tool_result: ToolResult::Error { message },
            }) => Err(message),
            Err(err) => Err(format!("tool {name:?}: a bad answer: {err}")),
        }
    }
}

/// Whether `name` is one of `tools`, or the guest's error saying which there are.
pub fn check_tool(tools: &[String], name: &str) -> Result<(), String> {
    if tools.iter().any(|t| t == name) {
        return Ok(());
    }
    let known = if tools.is_empty() {
        "none".to_owned()
    } else {
        tools.join(", ")
    };
    Err(format!(
        "no tool {name:?} in this sandbox (its tools: {known})"
    ))
}
