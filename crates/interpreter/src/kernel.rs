//! One Jupyter kernel: its process (in a process group of its own, so that an interrupt or a
//! kill reaches what it started too), its connection file, and its shell, iopub and control
//! channels over ZeroMQ on loopback.
//!
//! Readers of the three channels route every message by its parent's `msg_id` to whoever
//! sent that request ([`Kernel::request`]); messages nobody waits for are dropped. A task
//! waits for the process and publishes its end, so that a waiting request learns at once that
//! the kernel died.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use jupyter_protocol::connection_info::Transport;
use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, InterruptRequest, JupyterMessage, JupyterMessageContent,
    KernelInfoRequest,
};
use jupyter_zmq_client::{Connection, DealerSendConnection, RawMessage, RuntimeError};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use zeromq::SocketRecv;

use crate::languages::KernelSpec;

/// The longest a kernel may take to answer its first `kernel_info_request` (a loaded
/// 2-core machine measured 7 s for ipykernel).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long to wait for iopub to carry the handshake's status before asking again (a SUB
/// socket misses what was published before its subscription arrived).
const IOPUB_SETTLE: Duration = Duration::from_millis(500);
/// How long output of a kernel other than ipykernel still counts after it said idle: Deno's
/// kernel publishes a first cell's output after its idle status.
const LATE_OUTPUT: Duration = Duration::from_millis(50);
/// The most of a kernel's own stdout and stderr kept, for the error of a failed start.
const TAIL_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("cannot reserve ports for the {0} kernel")]
    Ports(String, #[source] RuntimeError),
    #[error("cannot write the {0} kernel's connection file")]
    ConnectionFile(String, #[source] std::io::Error),
    #[error("the {0} kernel's command line is empty")]
    EmptyArgv(String),
    #[error("cannot start the {name} kernel ({program:?})")]
    Spawn {
        name: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to the {0} kernel")]
    Connect(String, #[source] RuntimeError),
    #[error(
        "the {name} kernel {exit} before it was ready{}",
        output_suffix(output)
    )]
    DiedAtStart {
        name: String,
        exit: String,
        output: String,
    },
    #[error("the {0} kernel did not answer within {1} s of its start")]
    StartTimeout(String, u64),
    #[error("cannot send to the {0} kernel")]
    Send(String, #[source] RuntimeError),
    #[error("the {0} kernel {1}")]
    Died(String, String),
}

fn output_suffix(output: &str) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!("; its output ended with: {output}")
    }
}

/// Why Airlock ended a kernel itself, so that the execution it cut short can say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    Restart,
    Remove,
    Shutdown,
}

/// The last [`TAIL_BYTES`] of the kernel's own output.
#[derive(Debug, Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > TAIL_BYTES {
            self.0.drain(..self.0.len() - TAIL_BYTES);
        }
    }
}

/// A message from the kernel, read leniently: kernels other than ipykernel leave out or
/// misspell fields of the typed protocol (`language_info.version`, `status: "abort"`), and
/// one odd field must not lose a whole reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub msg_type: String,
    pub parent_id: Option<String>,
    /// The header's `date` as the kernel wrote it.
    pub date: String,
    pub content: Value,
}

impl Message {
    fn parse(parts: &[Bytes]) -> Option<Message> {
        let [header, parent, _metadata, content, ..] = parts else {
            return None;
        };
        let header: Value = serde_json::from_slice(header).ok()?;
        let parent: Value = serde_json::from_slice(parent).unwrap_or(Value::Null);
        let text =
            |value: &Value, key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Some(Message {
            msg_type: text(&header, "msg_type")?,
            parent_id: text(&parent, "msg_id"),
            date: text(&header, "date").unwrap_or_default(),
            content: serde_json::from_slice(content).unwrap_or(Value::Null),
        })
    }

    /// A string field of the content.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.content.get(key).and_then(Value::as_str)
    }
}

type Routes = Mutex<HashMap<String, mpsc::UnboundedSender<Message>>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The kernel's process and what watches it. Dropping it kills the process group.
struct Process {
    pid: u32,
    exit: watch::Receiver<Option<String>>,
    output: Arc<Mutex<Tail>>,
    tasks: Vec<JoinHandle<()>>,
    connection_file: PathBuf,
}

impl Process {
    fn exited(&self) -> Option<String> {
        self.exit.borrow().clone()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.pid != 0 && self.exited().is_none() {
            let _ = airlock_jail::child::signal_group(self.pid, libc::SIGKILL);
        }
        for task in &self.tasks {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.connection_file);
    }
}

/// A running kernel. Dropping it kills the kernel's process group.
pub struct Kernel {
    name: String,
    interrupt_by_message: bool,
    shell: tokio::sync::Mutex<DealerSendConnection>,
    control: tokio::sync::Mutex<DealerSendConnection>,
    routes: Arc<Routes>,
    killed: Mutex<Option<KillReason>>,
    /// Zero for ipykernel, [`LATE_OUTPUT`] for others.
    late_output: Duration,
    process: Process,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("pid", &self.process.pid)
            .finish_non_exhaustive()
    }
}

/// A request in flight: its replies and iopub messages arrive here until it is dropped.
pub struct Request {
    pub msg_id: String,
    messages: mpsc::UnboundedReceiver<Message>,
    routes: Arc<Routes>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("msg_id", &self.msg_id)
            .finish_non_exhaustive()
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        lock(&self.routes).remove(&self.msg_id);
    }
}

/// What waiting on a request gave.
pub enum Received {
    Message(Box<Message>),
    /// The kernel's process ended (how, in words).
    Died(String),
}

impl fmt::Debug for Received {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Received::Message(message) => write!(f, "Message({})", message.msg_type),
            Received::Died(how) => write!(f, "Died({how})"),
        }
    }
}

/// How a process ended, in words.
fn describe_exit(status: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (_, Some(libc::SIGKILL)) => {
                "was killed by SIGKILL (the sandbox's memory limit, or a kill)".to_owned()
            }
            (_, Some(signal)) => format!("was killed by signal {signal}"),
            _ => "ended".to_owned(),
        },
        Err(err) => format!("could not be waited for ({err})"),
    }
}

async fn keep_tail(mut pipe: impl AsyncRead + Unpin, tail: Arc<Mutex<Tail>>) {
    let mut buffer = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        lock(&tail).push(&buffer[..n]);
    }
}

fn route(routes: &Routes, message: Message) {
    let Some(parent) = &message.parent_id else {
        return;
    };
    if let Some(sender) = lock(routes).get(parent) {
        let _ = sender.send(message);
    }
}

/// Reads a channel until its socket fails, verifying each message's signature.
async fn read_channel<S: SocketRecv>(mut channel: Connection<S>, routes: Arc<Routes>) {
    loop {
        let Ok(multipart) = channel.socket.recv().await else {
            return;
        };
        match RawMessage::from_multipart(multipart, &channel.mac) {
            Ok(raw) => match Message::parse(&raw.jparts) {
                Some(message) => route(&routes, message),
                None => eprintln!("airlock-interpreter: dropped a malformed kernel message"),
            },
            Err(err) => eprintln!("airlock-interpreter: dropped a kernel message: {err}"),
        }
    }
}

/// Everything a kernel is started with besides its spec.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub cwd: &'a Path,
    /// Added to the service's own environment (after the kernelspec's `env`).
    pub env: &'a [(String, String)],
    /// Where the connection file goes (private to the sandbox).
    pub runtime_dir: &'a Path,
}

impl Kernel {
    /// Starts the kernel and waits until it answers `kernel_info_request` on shell and its
    /// status reaches iopub.
    pub async fn start(spec: &KernelSpec, launch: &Launch<'_>) -> Result<Kernel, KernelError> {
        let name = spec.name.clone();
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (ports, listeners) = jupyter_zmq_client::peek_ports_with_listeners(loopback, 5)
            .await
            .map_err(|e| KernelError::Ports(name.clone(), e))?;
        let info = ConnectionInfo {
            ip: loopback.to_string(),
            transport: Transport::TCP,
            shell_port: ports[0],
            iopub_port: ports[1],
            stdin_port: ports[2],
            control_port: ports[3],
            hb_port: ports[4],
            key: uuid::Uuid::new_v4().to_string(),
            signature_scheme: "hmac-sha256".to_owned(),
            kernel_name: Some(name.clone()),
        };
        let connection_file = launch
            .runtime_dir
            .join(format!("kernel-{}.json", uuid::Uuid::new_v4()));
        write_private(
            &connection_file,
            &serde_json::to_vec(&info).unwrap_or_default(),
        )
        .map_err(|e| KernelError::ConnectionFile(name.clone(), e))?;

        let (program, args) = spec
            .argv
            .split_first()
            .ok_or_else(|| KernelError::EmptyArgv(name.clone()))?;
        let mut command = Command::new(program);
        for arg in args {
            if arg == "{connection_file}" {
                command.arg(&connection_file);
            } else {
                command.arg(arg);
            }
        }
        command
            .envs(&spec.env)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .current_dir(launch.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let spawned = command.spawn();
        drop(listeners);
        let mut child = spawned.map_err(|source| {
            let _ = std::fs::remove_file(&connection_file);
            KernelError::Spawn {
                name: name.clone(),
                program: program.clone(),
                source,
            }
        })?;
        let pid = child.id().unwrap_or(0);

        let output = Arc::new(Mutex::new(Tail::default()));
        let mut tasks = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            tasks.push(tokio::spawn(keep_tail(stdout, output.clone())));
        }
        if let Some(stderr) = child.stderr.take() {
            tasks.push(tokio::spawn(keep_tail(stderr, output.clone())));
        }
        let (exit_tx, exit) = watch::channel(None);
        tasks.push(tokio::spawn(async move {
            let status = child.wait().await;
            let _ = exit_tx.send(Some(describe_exit(status)));
        }));
        let mut process = Process {
            pid,
            exit,
            output,
            tasks,
            connection_file,
        };

        let session = uuid::Uuid::new_v4().to_string();
        let connect = |e| KernelError::Connect(name.clone(), e);
        let iopub = jupyter_zmq_client::create_client_iopub_connection(&info, "", &session)
            .await
            .map_err(connect)?;
        let identity = jupyter_zmq_client::peer_identity_for_session(&session).map_err(connect)?;
        let shell = jupyter_zmq_client::create_client_shell_connection_with_identity(
            &info, &session, identity,
        )
        .await
        .map_err(connect)?;
        let control = jupyter_zmq_client::create_client_control_connection(&info, &session)
            .await
            .map_err(connect)?;
        let (shell_send, shell_recv) = shell.split();
        let (control_send, control_recv) = control.split();
        let routes: Arc<Routes> = Arc::new(Mutex::new(HashMap::new()));
        for task in [
            tokio::spawn(read_channel(iopub, routes.clone())),
            tokio::spawn(read_channel(shell_recv, routes.clone())),
            tokio::spawn(read_channel(control_recv, routes.clone())),
        ] {
            process.tasks.push(task);
        }
        let kernel = Kernel {
            name,
            interrupt_by_message: spec.interrupt_by_message,
            shell: tokio::sync::Mutex::new(shell_send),
            control: tokio::sync::Mutex::new(control_send),
            routes,
            killed: Mutex::new(None),
            late_output: Duration::ZERO,
            process,
        };
        let mut kernel = kernel;
        let implementation = kernel.handshake().await?;
        if implementation != "ipython" {
            kernel.late_output = LATE_OUTPUT;
        }
        Ok(kernel)
    }

    /// `kernel_info_request` until both its reply (shell) and its idle status (iopub) came;
    /// returns the reply's `implementation`.
    async fn handshake(&self) -> Result<String, KernelError> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let mut request = self.request(KernelInfoRequest {}.into(), false).await?;
            let (mut replied, mut idle) = (None, false);
            let mut settle: Option<tokio::time::Instant> = None;
            while !(replied.is_some() && idle) {
                let until = settle.map_or(deadline, |s| s.min(deadline));
                match tokio::time::timeout_at(until, self.next(&mut request)).await {
                    Ok(Received::Message(message)) => match message.msg_type.as_str() {
                        "kernel_info_reply" => {
                            replied = Some(message.text("implementation").unwrap_or("").to_owned());
                            settle = Some(tokio::time::Instant::now() + IOPUB_SETTLE);
                        }
                        "status" if message.text("execution_state") == Some("idle") => {
                            idle = true;
                        }
                        _ => {}
                    },
                    Ok(Received::Died(exit)) => {
                        return Err(KernelError::DiedAtStart {
                            name: self.name.clone(),
                            exit,
                            output: self.output_tail(),
                        });
                    }
                    Err(_) if tokio::time::Instant::now() >= deadline => {
                        return Err(KernelError::StartTimeout(
                            self.name.clone(),
                            START_TIMEOUT.as_secs(),
                        ));
                    }
                    // Replied, but iopub missed the status: ask again.
                    Err(_) => break,
                }
            }
            if let (Some(implementation), true) = (replied, idle) {
                return Ok(implementation);
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long after idle its output may still arrive.
    pub fn late_output(&self) -> Duration {
        self.late_output
    }

    /// The kernel's own output, lossily decoded and trimmed.
    pub fn output_tail(&self) -> String {
        String::from_utf8_lossy(&lock(&self.process.output).0)
            .trim()
            .to_owned()
    }

    /// How the process ended, once it has.
    pub fn exited(&self) -> Option<String> {
        self.process.exited()
    }

    /// Why Airlock killed it, if Airlock did.
    pub fn killed_for(&self) -> Option<KillReason> {
        *lock(&self.killed)
    }

    /// Sends a request on shell (or control) and returns the handle its messages arrive on.
    pub async fn request(
        &self,
        content: JupyterMessageContent,
        control: bool,
    ) -> Result<Request, KernelError> {
        let message = JupyterMessage::new(content, None);
        let msg_id = message.header.msg_id.clone();
        let (sender, messages) = mpsc::unbounded_channel();
        lock(&self.routes).insert(msg_id.clone(), sender);
        let request = Request {
            msg_id,
            messages,
            routes: self.routes.clone(),
        };
        let sent = if control {
            self.control.lock().await.send(message).await
        } else {
            self.shell.lock().await.send(message).await
        };
        sent.map_err(|e| KernelError::Send(self.name.clone(), e))?;
        Ok(request)
    }

    /// An `execute_request` as E2B's server sends it (history kept unless silent; no stdin,
    /// so `input()` fails rather than hangs).
    pub async fn execute(&self, code: &str, silent: bool) -> Result<Request, KernelError> {
        let content = ExecuteRequest {
            code: code.to_owned(),
            silent,
            store_history: !silent,
            user_expressions: None,
            allow_stdin: false,
            stop_on_error: !silent,
        };
        self.request(content.into(), false).await
    }

    /// The next message of `request`, or the kernel's death.
    pub async fn next(&self, request: &mut Request) -> Received {
        let mut exit = self.process.exit.clone();
        loop {
            if let Some(how) = exit.borrow_and_update().clone() {
                // Messages that arrived before the death still count.
                return match request.messages.try_recv() {
                    Ok(message) => Received::Message(Box::new(message)),
                    Err(_) => Received::Died(how),
                };
            }
            tokio::select! {
                message = request.messages.recv() => match message {
                    Some(message) => return Received::Message(Box::new(message)),
                    None => return Received::Died("stopped answering".to_owned()),
                },
                changed = exit.changed() => {
                    if changed.is_err() {
                        return Received::Died("stopped answering".to_owned());
                    }
                }
            }
        }
    }

    /// Interrupts what the kernel runs: SIGINT to its process group, or an
    /// `interrupt_request` when its kernelspec asks for messages.
    pub async fn interrupt(&self) {
        if self.interrupt_by_message {
            if let Ok(request) = self.request(InterruptRequest {}.into(), true).await {
                drop(request);
            }
        } else if self.process.pid != 0 {
            let _ = airlock_jail::child::signal_group(self.process.pid, libc::SIGINT);
        }
    }

    /// Kills the kernel's process group and waits for the kernel to be gone.
    pub async fn kill(&self, reason: KillReason) {
        lock(&self.killed).get_or_insert(reason);
        if self.process.pid != 0 {
            let _ = airlock_jail::child::signal_group(self.process.pid, libc::SIGKILL);
        }
        let mut exit = self.process.exit.clone();
        let _ = exit.wait_for(Option::is_some).await;
    }
}

/// Writes a file only its owner can read (the connection file holds the signing key).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}
