//! `process.Process`: the process table, the per-process task that broadcasts output to every
//! attached stream, and the RPC handlers (Start, Connect, List, SendSignal, SendInput,
//! CloseStdin, Update, StreamInput).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_jail::child::{self, ChildIo, ChildSpec, Stdio};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use crate::connect::{self, Code, EnumValue, RpcError, RpcResult};
use crate::process_io::{Outputs, Subscriber, pump_stream, run_process, write_all};
use crate::user::User;
use crate::wire::{Lenient, non_empty};
use crate::workload::WorkloadCgroup;

/// Events buffered per attached stream before the process is slowed down.
const SUBSCRIBER_CAPACITY: usize = 8;

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// The input side of a process.
#[derive(Debug)]
enum Input {
    /// A stdin pipe (None once closed or when the process has none).
    Stdin(Option<Arc<pipe::Sender>>),
    /// The terminal's master side: written to for input, `control` for resizing.
    Pty {
        writer: Arc<pipe::Sender>,
        control: File,
    },
}

/// One running process in the table.
#[derive(Debug)]
pub struct Proc {
    pub pid: u32,
    pub tag: Option<String>,
    config: serde_json::Value,
    input: tokio::sync::Mutex<Input>,
    attach: mpsc::UnboundedSender<Subscriber>,
    exit: Mutex<Option<oneshot::Sender<ExitStatus>>>,
    exited: AtomicBool,
    /// The workload cgroup's OOM kill count when the process started: a SIGKILL with a
    /// higher count at its end was the OOM killer's.
    pub(crate) oom_kills_at_start: u64,
}

/// Every process started by the agent and not yet ended, by pid.
#[derive(Debug, Default)]
pub struct ProcessTable {
    procs: Mutex<HashMap<u32, Arc<Proc>>>,
    workload: Option<WorkloadCgroup>,
}

impl ProcessTable {
    pub fn new(workload: Option<WorkloadCgroup>) -> ProcessTable {
        ProcessTable {
            procs: Mutex::default(),
            workload,
        }
    }

    /// The workload cgroup's OOM kill count, 0 without one.
    pub(crate) fn oom_kills(&self) -> u64 {
        self.workload.as_ref().map_or(0, WorkloadCgroup::oom_kills)
    }

    fn insert(&self, proc: Arc<Proc>) {
        if let Ok(mut procs) = self.procs.lock() {
            procs.insert(proc.pid, proc);
        }
    }

    pub(crate) fn remove(&self, pid: u32) {
        if let Ok(mut procs) = self.procs.lock() {
            procs.remove(&pid);
        }
    }

    fn all(&self) -> Vec<Arc<Proc>> {
        self.procs
            .lock()
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Finds a process by pid or tag.
    fn select(&self, selector: Option<&Selector>) -> RpcResult<Arc<Proc>> {
        let selector = selector.ok_or_else(|| {
            RpcError::new(Code::InvalidArgument, "a process selector is required")
        })?;
        let procs = self
            .procs
            .lock()
            .map_err(|_| RpcError::new(Code::Internal, "process table poisoned"))?;
        if let Some(pid) = selector.pid.as_ref().map(Lenient::get) {
            let pid = u32::try_from(pid)
                .map_err(|_| RpcError::new(Code::InvalidArgument, "pid out of range"))?;
            return procs.get(&pid).cloned().ok_or_else(|| {
                RpcError::new(Code::NotFound, format!("process with pid {pid} not found"))
            });
        }
        if let Some(tag) = non_empty(&selector.tag) {
            return procs
                .values()
                .find(|p| p.tag.as_deref() == Some(tag))
                .cloned()
                .ok_or_else(|| {
                    RpcError::new(
                        Code::NotFound,
                        format!("process with tag '{tag}' not found"),
                    )
                });
        }
        Err(RpcError::new(
            Code::InvalidArgument,
            "the process selector needs a pid or a tag",
        ))
    }

    /// Hands an exit status reaped by the SIGCHLD handler to its process. Returns false for
    /// pids that are not ours (orphans re-parented to PID 1).
    pub fn route_exit(&self, pid: u32, status: ExitStatus) -> bool {
        let proc = self.procs.lock().ok().and_then(|p| p.get(&pid).cloned());
        let Some(proc) = proc else {
            return false;
        };
        proc.exited.store(true, Ordering::SeqCst);
        if let Some(tx) = proc.exit.lock().ok().and_then(|mut e| e.take()) {
            let _ = tx.send(status);
        }
        true
    }
}

// Request messages. Proto3 JSON semantics: unknown fields are ignored (no
// deny_unknown_fields here, unlike our own wire types), both camelCase and snake_case are
// accepted, null means "not set".

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    #[serde(default)]
    cmd: Option<String>,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    envs: Option<HashMap<String, String>>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Size {
    #[serde(default)]
    cols: Option<Lenient>,
    #[serde(default)]
    rows: Option<Lenient>,
}

#[derive(Debug, Deserialize)]
struct PtyConfig {
    #[serde(default)]
    size: Option<Size>,
}

#[derive(Debug, Deserialize)]
pub struct StartRequest {
    #[serde(default)]
    process: Option<ProcessConfig>,
    #[serde(default)]
    pty: Option<PtyConfig>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Selector {
    #[serde(default)]
    pid: Option<Lenient>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct SelectRequest {
    #[serde(default)]
    process: Option<Selector>,
}

#[derive(Debug, Deserialize)]
struct ProcessInput {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct SendInputRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    input: Option<ProcessInput>,
}

#[derive(Debug, Deserialize)]
pub struct SendSignalRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    signal: Option<EnumValue>,
}

#[derive(Debug, Deserialize)]
pub struct UpdateRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    pty: Option<PtyConfig>,
}

/// One message of a StreamInput request stream.
#[derive(Debug, Deserialize)]
pub struct StreamInputRequest {
    #[serde(default)]
    start: Option<SelectRequest>,
    #[serde(default)]
    data: Option<StreamInputData>,
}

#[derive(Debug, Deserialize)]
struct StreamInputData {
    #[serde(default)]
    input: Option<ProcessInput>,
}

/// How a started process runs, from headers: `Connect-Timeout-Ms` and
/// `Keepalive-Ping-Interval`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamOptions {
    pub timeout: Option<Duration>,
    pub keepalive: Option<Duration>,
}

/// Finds `cmd` on `path_var` when it has no slash.
fn find_program(cmd: &str, path_var: Option<&OsString>) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path_var = path_var
        .cloned()
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path_var)
        .map(|dir| dir.join(cmd))
        .find(|p| p.is_file())
}

/// Everything a Start needs, resolved from the request.
struct Launch {
    program: PathBuf,
    argv: Vec<OsString>,
    env: Vec<OsString>,
    cwd: PathBuf,
    stdio: Stdio,
    config: serde_json::Value,
}

fn prepare_launch(
    request: &StartRequest,
    user: &User,
    base_env: &[(OsString, OsString)],
) -> RpcResult<Launch> {
    let process = request
        .process
        .as_ref()
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process.cmd is required"))?;
    let cmd = non_empty(&process.cmd)
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process.cmd is required"))?;
    let args = process.args.clone().unwrap_or_default();
    let envs = process.envs.clone().unwrap_or_default();

    let cwd = match non_empty(&process.cwd) {
        Some(cwd) => {
            let resolved = user.resolve(cwd);
            if !resolved.is_dir() {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!(
                        "cwd '{}' does not exist or is not a directory",
                        resolved.display()
                    ),
                ));
            }
            resolved
        }
        None if user.home.is_dir() => user.home.clone(),
        None => PathBuf::from("/"),
    };

    let mut env: Vec<(OsString, OsString)> = base_env.to_vec();
    let mut set = |key: &str, value: OsString| {
        env.retain(|(k, _)| k != key);
        env.push((key.into(), value));
    };
    if !user.is_current() || !base_env.iter().any(|(k, _)| k == "HOME") {
        set("HOME", user.home.clone().into_os_string());
    }
    set("USER", user.name.clone().into());
    for (key, value) in &envs {
        if key.is_empty() || key.contains('=') {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("invalid environment variable name '{key}'"),
            ));
        }
        set(key, value.into());
    }
    let path_var = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v);
    let mut program = find_program(cmd, path_var).ok_or_else(|| {
        RpcError::new(
            Code::InvalidArgument,
            format!("command '{cmd}' not found in PATH"),
        )
    })?;
    if program == Path::new("/bin/bash") && !program.exists() {
        program = PathBuf::from("/bin/sh"); // minimal images: the SDK always asks for bash
    }
    let mut argv = vec![OsString::from(cmd)];
    argv.extend(args.iter().map(OsString::from));
    let env = env
        .into_iter()
        .map(|(k, v)| {
            let mut entry = k;
            entry.push("=");
            entry.push(v);
            entry
        })
        .collect();

    let stdio = match &request.pty {
        Some(pty) => {
            let size = pty.size.as_ref();
            let dim = |v: Option<&Lenient>, default: u16| {
                v.map(Lenient::get)
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .unwrap_or(default)
            };
            Stdio::Pty {
                cols: dim(size.and_then(|s| s.cols.as_ref()), 80),
                rows: dim(size.and_then(|s| s.rows.as_ref()), 24),
            }
        }
        None => Stdio::Pipes {
            stdin: request.stdin == Some(true),
        },
    };
    let mut config = json!({"cmd": cmd, "args": args, "envs": envs});
    if let Some(cwd) = non_empty(&process.cwd) {
        config["cwd"] = json!(cwd);
    }
    Ok(Launch {
        program,
        argv,
        env,
        cwd,
        stdio,
        config,
    })
}

fn spawn_error(err: child::ChildError, user: &User, program: &Path) -> RpcError {
    match err {
        child::ChildError::Setup { stage, source } if stage.is_identity_switch() => RpcError::new(
            Code::PermissionDenied,
            format!(
                "cannot run as user '{}': {stage} failed: {source}",
                user.name
            ),
        ),
        child::ChildError::Setup {
            stage: child::Stage::Exec,
            source,
        } => RpcError::new(
            Code::InvalidArgument,
            format!("cannot execute '{}': {source}", program.display()),
        ),
        other => RpcError::new(Code::Internal, airlock_jail::error_chain(&other)),
    }
}

/// `Start`: spawns the process and returns the stream of its events. Output is subscribed to
/// before the process exists, so none is lost.
pub fn start(
    table: &Arc<ProcessTable>,
    request: StartRequest,
    user: &User,
    base_env: &[(OsString, OsString)],
    options: StreamOptions,
) -> RpcResult<mpsc::Receiver<Bytes>> {
    let launch = prepare_launch(&request, user, base_env)?;
    let (sub_tx, sub_rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
    let oom_kills_at_start = table.oom_kills();
    let spawned = child::spawn(&ChildSpec {
        program: &launch.program,
        argv: &launch.argv,
        env: &launch.env,
        cwd: &launch.cwd,
        switch_ids: (!user.is_current()).then_some((user.uid, user.gid)),
        stdio: launch.stdio,
        cgroup_procs: table.workload.as_ref().map(WorkloadCgroup::procs_fd),
    })
    .map_err(|e| spawn_error(e, user, &launch.program))?;
    let pid = spawned.pid;
    // From here to the table insert there is no await: the SIGCHLD handler cannot run before
    // the process is in the table.
    // The descriptors are non-blocking pipe ends or a terminal master: both poll like pipes.
    let reader = |f: File| pipe::Receiver::from_file_unchecked(f).map_err(|e| internal_io(&e));
    let writer = |f: File| pipe::Sender::from_file_unchecked(f).map_err(|e| internal_io(&e));
    let (input, outputs) = match spawned.io {
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let stdin = stdin.map(writer).transpose()?.map(Arc::new);
            let outputs = Outputs {
                stdout: Some(reader(stdout)?),
                stderr: Some(reader(stderr)?),
                pty: None,
            };
            (Input::Stdin(stdin), outputs)
        }
        ChildIo::Pty { master } => {
            let control = master.try_clone().map_err(|e| internal_io(&e))?;
            let write_end = master.try_clone().map_err(|e| internal_io(&e))?;
            let outputs = Outputs {
                stdout: None,
                stderr: None,
                pty: Some(reader(master)?),
            };
            let input = Input::Pty {
                writer: Arc::new(writer(write_end)?),
                control,
            };
            (input, outputs)
        }
    };
    let (exit_tx, exit_rx) = oneshot::channel();
    let (attach_tx, attach_rx) = mpsc::unbounded_channel();
    let proc = Arc::new(Proc {
        pid,
        tag: request.tag.clone().filter(|t| !t.is_empty()),
        config: launch.config,
        input: tokio::sync::Mutex::new(input),
        attach: attach_tx,
        exit: Mutex::new(Some(exit_tx)),
        exited: AtomicBool::new(false),
        oom_kills_at_start,
    });
    table.insert(proc.clone());
    crate::log_line!(
        "airlock-agent: started pid {pid}: {}",
        launch.program.display()
    );

    if let Some(timeout) = options.timeout {
        // Weak: an ended process's descriptors must not wait for its timer.
        let weak = Arc::downgrade(&proc);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(proc) = weak.upgrade()
                && !proc.exited.load(Ordering::SeqCst)
            {
                crate::log_line!(
                    "airlock-agent: pid {} reached its Connect-Timeout-Ms, killing its group",
                    proc.pid
                );
                let _ = child::signal_group(proc.pid, SIGKILL);
            }
        });
    }
    tokio::spawn(run_process(
        table.clone(),
        proc,
        outputs,
        exit_rx,
        attach_rx,
        vec![sub_tx],
    ));
    let (frames_tx, frames_rx) = mpsc::channel(2);
    tokio::spawn(pump_stream(pid, sub_rx, frames_tx, options, None));
    Ok(frames_rx)
}

fn internal_io(err: &io::Error) -> RpcError {
    RpcError::new(
        Code::Internal,
        format!("cannot register the process's descriptors: {err}"),
    )
}

/// `Connect`: attaches a new stream to a running process (start event, then new output).
pub fn connect(
    table: &ProcessTable,
    request: &SelectRequest,
    options: StreamOptions,
) -> RpcResult<mpsc::Receiver<Bytes>> {
    let proc = table.select(request.process.as_ref())?;
    let (sub_tx, sub_rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
    proc.attach
        .send(sub_tx)
        .map_err(|_| RpcError::new(Code::NotFound, format!("process {} has ended", proc.pid)))?;
    let deadline = options.timeout.map(|t| tokio::time::Instant::now() + t);
    let (frames_tx, frames_rx) = mpsc::channel(2);
    tokio::spawn(pump_stream(proc.pid, sub_rx, frames_tx, options, deadline));
    Ok(frames_rx)
}

/// `List`.
pub fn list(table: &ProcessTable) -> serde_json::Value {
    let mut procs = table.all();
    procs.sort_by_key(|p| p.pid);
    let processes: Vec<serde_json::Value> = procs
        .iter()
        .map(|p| {
            let mut info = json!({"config": p.config, "pid": p.pid});
            if let Some(tag) = &p.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    json!({ "processes": processes })
}

/// `SendSignal`: SIGTERM or SIGKILL to the process's group.
pub fn send_signal(
    table: &ProcessTable,
    request: &SendSignalRequest,
) -> RpcResult<serde_json::Value> {
    let proc = table.select(request.process.as_ref())?;
    let signal = request
        .signal
        .as_ref()
        .and_then(|s| s.resolve("SIGNAL_", &[("SIGNAL_SIGTERM", 15), ("SIGNAL_SIGKILL", 9)]))
        .ok_or_else(|| {
            RpcError::new(
                Code::InvalidArgument,
                "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL",
            )
        })?;
    let signal = if signal == 9 { SIGKILL } else { SIGTERM };
    child::signal_group(proc.pid, signal).map_err(|e| {
        RpcError::new(
            Code::NotFound,
            format!("cannot signal process {}: {e}", proc.pid),
        )
    })?;
    Ok(json!({}))
}

/// Writes input to a process's stdin pipe or terminal.
async fn write_input(proc: &Proc, input: &ProcessInput) -> RpcResult<()> {
    let input_lock = proc.input.lock().await;
    let (data, fd) = match (&*input_lock, &input.stdin, &input.pty) {
        (Input::Stdin(Some(fd)), Some(data), _) => (data, fd.clone()),
        (Input::Pty { writer, .. }, _, Some(data))
        | (Input::Pty { writer, .. }, Some(data), None) => (data, writer.clone()),
        (Input::Stdin(None), Some(_), _) => {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!(
                    "process {} has no open stdin (start it with stdin: true)",
                    proc.pid
                ),
            ));
        }
        (Input::Stdin(_), None, Some(_)) => {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                format!("process {} has no pty", proc.pid),
            ));
        }
        (_, None, None) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "input needs stdin or pty bytes",
            ));
        }
    };
    let bytes = connect::decode_bytes(data)?;
    write_all(&fd, &bytes).await.map_err(|e| {
        RpcError::new(
            Code::FailedPrecondition,
            format!("cannot write to process {}: {e}", proc.pid),
        )
    })
}

/// `SendInput`.
pub async fn send_input(
    table: &ProcessTable,
    request: &SendInputRequest,
) -> RpcResult<serde_json::Value> {
    let proc = table.select(request.process.as_ref())?;
    let input = request
        .input
        .as_ref()
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "input is required"))?;
    write_input(&proc, input).await?;
    Ok(json!({}))
}

/// `CloseStdin`: closes the stdin pipe (the process reads end of file).
pub async fn close_stdin(
    table: &ProcessTable,
    request: &SelectRequest,
) -> RpcResult<serde_json::Value> {
    let proc = table.select(request.process.as_ref())?;
    let mut input = proc.input.lock().await;
    match &mut *input {
        Input::Stdin(stdin) => {
            *stdin = None;
            Ok(json!({}))
        }
        Input::Pty { .. } => Err(RpcError::new(
            Code::FailedPrecondition,
            format!("process {} uses a pty; send EOT (Ctrl-D) instead", proc.pid),
        )),
    }
}

/// `Update`: resizes the process's terminal.
pub async fn update(table: &ProcessTable, request: &UpdateRequest) -> RpcResult<serde_json::Value> {
    let proc = table.select(request.process.as_ref())?;
    let Some(size) = request.pty.as_ref().and_then(|p| p.size.as_ref()) else {
        return Ok(json!({}));
    };
    let input = proc.input.lock().await;
    let Input::Pty { control, .. } = &*input else {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!("process {} has no pty", proc.pid),
        ));
    };
    let dim = |v: Option<&Lenient>| {
        v.map(Lenient::get)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
    };
    let (Some(cols), Some(rows)) = (dim(size.cols.as_ref()), dim(size.rows.as_ref())) else {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "pty.size needs cols and rows between 1 and 65535",
        ));
    };
    child::set_window_size(control, cols, rows)
        .map_err(|e| RpcError::new(Code::Internal, format!("cannot resize the pty: {e}")))?;
    Ok(json!({}))
}

/// The client-streaming `StreamInput`: the first message selects the process, later ones
/// carry input. Returns the process once selected so the caller can feed the rest.
pub async fn stream_input_message(
    table: &ProcessTable,
    selected: &mut Option<Arc<Proc>>,
    message: StreamInputRequest,
) -> RpcResult<()> {
    if let Some(start) = message.start {
        *selected = Some(table.select(start.process.as_ref())?);
        return Ok(());
    }
    if let Some(data) = message.data {
        let proc = selected.as_ref().ok_or_else(|| {
            RpcError::new(Code::FailedPrecondition, "StreamInput data before start")
        })?;
        if let Some(input) = data.input {
            write_input(proc, &input).await?;
        }
    }
    Ok(()) // keepalive
}
