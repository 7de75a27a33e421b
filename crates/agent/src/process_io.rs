//! The running side of a process: reading its output, broadcasting it to every attached
//! stream with backpressure, and turning a subscription into Connect stream frames (`start`,
//! `data`, `keepalive`, `end`, end-of-stream).

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::json;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use crate::connect::{self, Code, RpcError, encode_bytes};
use crate::process::{Proc, ProcessTable, StreamOptions};

/// Output is read in chunks of at most this size.
const READ_CHUNK_BYTES: usize = 32 * 1024;
/// After the process exits, at most this much more output is read from its pipes (output of
/// background grandchildren that still hold them).
const DRAIN_AFTER_EXIT_BYTES: usize = 1024 * 1024;

const SIGKILL: i32 = 9;

/// What a process produced, as sent to each attached stream.
#[derive(Debug, Clone)]
pub enum Event {
    Stdout(Bytes),
    Stderr(Bytes),
    Pty(Bytes),
    End(Ending),
}

/// How a process ended.
#[derive(Debug, Clone, Copy)]
pub struct Ending {
    pub status: ExitStatus,
    /// The kernel's OOM killer ended a workload process (this one or one of its children:
    /// the sandbox's memory limit was reached) while this one ran.
    pub oom_killed: bool,
}

pub(crate) type Subscriber = mpsc::Sender<Event>;

/// Go's description of a signal, as envd reports it in `status`.
pub(crate) fn signal_description(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        24 => "CPU time limit exceeded",
        25 => "file size limit exceeded",
        31 => "bad system call",
        other => return format!("signal {other}"),
    };
    name.to_string()
}

/// What an OOM-killed process's `end` event says in `error`.
pub const OOM_KILLED: &str = "out of memory: the kernel's OOM killer ended a process of this command at the sandbox's memory limit";

/// The `end` event JSON for an exit status (envd/Go conventions); an OOM kill also sets
/// `error`, as envd does for a process that could not finish.
pub(crate) fn end_json(ending: Ending) -> serde_json::Value {
    let mut end = status_json(ending.status);
    if ending.oom_killed
        && let Some(fields) = end.as_object_mut()
    {
        fields.insert("error".to_owned(), OOM_KILLED.into());
    }
    end
}

fn status_json(status: ExitStatus) -> serde_json::Value {
    match (status.code(), status.signal()) {
        (Some(code), _) => {
            json!({"exitCode": code, "exited": true, "status": format!("exit status {code}")})
        }
        (None, Some(signal)) => {
            let mut text = format!("signal: {}", signal_description(signal));
            if status.core_dumped() {
                text.push_str(" (core dumped)");
            }
            json!({"exitCode": -1, "exited": false, "status": text})
        }
        (None, None) => json!({"exitCode": -1, "exited": false, "status": "unknown"}),
    }
}

pub(crate) fn event_envelope(event: serde_json::Value) -> Bytes {
    connect::envelope(0, json!({ "event": event }).to_string().as_bytes())
}

/// A data event, built by hand: it is the hot path of large outputs.
pub(crate) fn data_envelope(kind: &str, data: &[u8]) -> Bytes {
    let text = format!(
        "{{\"event\":{{\"data\":{{\"{kind}\":\"{}\"}}}}}}",
        encode_bytes(data)
    );
    connect::envelope(0, text.as_bytes())
}

/// Reads one chunk; `None` at end of file (a pty master's EIO after the child hung up too).
pub(crate) async fn read_chunk(rx: &pipe::Receiver) -> io::Result<Option<Bytes>> {
    loop {
        rx.readable().await?;
        let mut buf = BytesMut::zeroed(READ_CHUNK_BYTES);
        match rx.try_read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf.freeze()));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.raw_os_error() == Some(5) => return Ok(None), // EIO
            Err(e) => return Err(e),
        }
    }
}

/// Reads what is buffered right now, without waiting. Reads the descriptor directly: tokio's
/// `try_read` answers "would block" until the reactor has seen readiness, which it may not
/// have yet for output written just before the exit.
pub(crate) fn read_ready(file: &mut std::fs::File) -> Option<Bytes> {
    use std::io::Read;
    let mut buf = BytesMut::zeroed(READ_CHUNK_BYTES);
    loop {
        match file.read(&mut buf) {
            Ok(n) if n > 0 => {
                buf.truncate(n);
                return Some(buf.freeze());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            _ => return None, // end of file, would block, or EIO from a hung-up terminal
        }
    }
}

/// Writes all of `data`.
pub(crate) async fn write_all(tx: &pipe::Sender, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        tx.writable().await?;
        match tx.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends `event` to every subscriber, waiting for slow ones (backpressure) and dropping the
/// ones whose stream is gone.
pub(crate) async fn broadcast(subscribers: &mut Vec<Subscriber>, event: Event) {
    let mut gone = Vec::new();
    for (i, sub) in subscribers.iter().enumerate() {
        if sub.send(event.clone()).await.is_err() {
            gone.push(i);
        }
    }
    for i in gone.into_iter().rev() {
        subscribers.swap_remove(i);
    }
}

/// The output side of a started process.
pub(crate) struct Outputs {
    pub(crate) stdout: Option<pipe::Receiver>,
    pub(crate) stderr: Option<pipe::Receiver>,
    pub(crate) pty: Option<pipe::Receiver>,
}

async fn read_opt(fd: Option<&pipe::Receiver>) -> io::Result<Option<Bytes>> {
    match fd {
        Some(fd) => read_chunk(fd).await,
        None => std::future::pending().await,
    }
}

/// The life of one process: read its output and broadcast it until it exits, then send the
/// end event and leave the table.
pub(crate) async fn run_process(
    table: Arc<ProcessTable>,
    proc: Arc<Proc>,
    mut outputs: Outputs,
    exit_rx: oneshot::Receiver<ExitStatus>,
    mut attach_rx: mpsc::UnboundedReceiver<Subscriber>,
    mut subscribers: Vec<Subscriber>,
) {
    let mut exit_rx = exit_rx;
    let status = loop {
        tokio::select! {
            biased;
            Some(sub) = attach_rx.recv() => subscribers.push(sub),
            status = &mut exit_rx => break status.unwrap_or_else(|_| ExitStatus::from_raw(SIGKILL)),
            chunk = read_opt(outputs.stdout.as_ref()), if outputs.stdout.is_some() => match chunk {
                Ok(Some(data)) => broadcast(&mut subscribers, Event::Stdout(data)).await,
                _ => outputs.stdout = None,
            },
            chunk = read_opt(outputs.stderr.as_ref()), if outputs.stderr.is_some() => match chunk {
                Ok(Some(data)) => broadcast(&mut subscribers, Event::Stderr(data)).await,
                _ => outputs.stderr = None,
            },
            chunk = read_opt(outputs.pty.as_ref()), if outputs.pty.is_some() => match chunk {
                Ok(Some(data)) => broadcast(&mut subscribers, Event::Pty(data)).await,
                _ => outputs.pty = None,
            },
        }
    };
    // Everything the process wrote before it exited is in the pipe (or terminal) buffers now.
    let mut budget = DRAIN_AFTER_EXIT_BYTES;
    for (rx, make) in [
        (outputs.stdout.take(), Event::Stdout as fn(Bytes) -> Event),
        (outputs.stderr.take(), Event::Stderr),
        (outputs.pty.take(), Event::Pty),
    ] {
        let Some(Ok(fd)) = rx.map(pipe::Receiver::into_nonblocking_fd) else {
            continue;
        };
        let mut file = std::fs::File::from(fd);
        while budget > 0 {
            let Some(data) = read_ready(&mut file) else {
                break;
            };
            budget = budget.saturating_sub(data.len());
            broadcast(&mut subscribers, make(data)).await;
        }
    }
    table.remove(proc.pid);
    attach_rx.close();
    while let Ok(sub) = attach_rx.try_recv() {
        subscribers.push(sub);
    }
    let ending = Ending {
        status,
        // Counted, not guessed from SIGKILL: a shell whose child was killed exits with 137.
        oom_killed: table.oom_kills() > proc.oom_kills_at_start,
    };
    broadcast(&mut subscribers, Event::End(ending)).await;
    crate::log_line!(
        "airlock-agent: process {} ended: {}",
        proc.pid,
        end_json(ending)
    );
}

/// Turns a subscription into the frames of a stream response: `start` first, then the
/// process's events, keepalives when idle, and the end frame.
pub(crate) async fn pump_stream(
    pid: u32,
    mut events: mpsc::Receiver<Event>,
    frames: mpsc::Sender<Bytes>,
    options: StreamOptions,
    stream_deadline: Option<tokio::time::Instant>,
) {
    if frames
        .send(event_envelope(json!({"start": {"pid": pid}})))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let keepalive = async {
            match options.keepalive {
                Some(every) => tokio::time::sleep(every).await,
                None => std::future::pending().await,
            }
        };
        let deadline = async {
            match stream_deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let frame = tokio::select! {
            event = events.recv() => match event {
                Some(Event::Stdout(d)) => data_envelope("stdout", &d),
                Some(Event::Stderr(d)) => data_envelope("stderr", &d),
                Some(Event::Pty(d)) => data_envelope("pty", &d),
                Some(Event::End(ending)) => {
                    if frames.send(event_envelope(json!({"end": end_json(ending)}))).await.is_ok() {
                        let _ = frames.send(connect::end_envelope(None)).await;
                    }
                    return;
                }
                None => {
                    let error = RpcError::new(Code::Internal, "the process stream ended without an end event");
                    let _ = frames.send(connect::end_envelope(Some(&error))).await;
                    return;
                }
            },
            () = keepalive => event_envelope(json!({"keepalive": {}})),
            () = deadline => {
                let error = RpcError::new(Code::DeadlineExceeded, "the stream's Connect-Timeout-Ms elapsed");
                let _ = frames.send(connect::end_envelope(Some(&error))).await;
                return;
            }
        };
        if frames.send(frame).await.is_err() {
            return; // the client is gone: dropping `events` detaches this stream
        }
    }
}
