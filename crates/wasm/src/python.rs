//! Python: CPython 3.12 for WASI on wasmtime 48, one fresh instance per evaluation.
//!
//! CPython's own start (about 100 ms: the embedded stdlib's imports) dominates, not the
//! engine's (tens of µs with `InstancePre`). So the engine keeps one instance started ahead of
//! time: it has run CPython's initialisation and the prelude's imports and blocks reading its
//! stdin. An evaluation hands its code to that instance (which then runs only the snippet),
//! and a replacement starts at once on its own thread. Each instance serves one evaluation:
//! no state passes from one snippet to the next.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::{
    Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap, UpdateDeadline,
};
use wasmtime_wasi::cli::InputFile;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::channel::{CappedPipe, Heard, Tap};
use crate::guests::{GuestError, Guests};
use crate::host::{Host, check_tool};
use crate::wire::{EvalError, EvalErrorKind, EvalOutcome};

/// The engine version a `.cwasm` in the cache was compiled by (part of its file name).
const WASMTIME_VERSION: &str = "48.0.8";
/// One epoch tick; timeouts are rounded up to it.
const TICK: Duration = Duration::from_millis(5);
/// How long a waiting instance may take to initialise before it is abandoned.
const WARM_START_LIMIT: Duration = Duration::from_secs(120);
/// Marks the result line the prelude writes after the snippet's own output.
const RESULT_MARK: char = '\u{1e}';
/// Runs in every instance: imports first (the waiting part), then the snippet from stdin. A
/// trailing expression is the result, as in a notebook cell.
const PRELUDE: &str = include_str!("python_prelude.py");

/// A directory the guest sees (a WASI preopen); nothing else of the host is reachable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preopen {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

impl std::str::FromStr for Preopen {
    type Err = String;

    /// `HOST:GUEST:ro` or `HOST:GUEST:rw`.
    fn from_str(text: &str) -> Result<Preopen, String> {
        let mut parts = text.rsplitn(3, ':');
        let (Some(mode), Some(guest), Some(host)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("preopen {text:?} is not HOST:GUEST:ro|rw"));
        };
        let writable = match mode {
            "ro" => false,
            "rw" => true,
            other => return Err(format!("preopen mode {other:?} is neither ro nor rw")),
        };
        if !guest.starts_with('/') || host.is_empty() {
            return Err(format!(
                "preopen {text:?} needs a host path and an absolute guest path"
            ));
        }
        Ok(Preopen {
            host: host.into(),
            guest: guest.into(),
            writable,
        })
    }
}

/// Why the Python engine cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error(transparent)]
    Guest(#[from] GuestError),
    #[error("cannot {what}: {message}")]
    Engine { what: &'static str, message: String },
}

fn engine_error(what: &'static str) -> impl FnOnce(wasmtime::Error) -> PythonError {
    move |err| PythonError::Engine {
        what,
        message: format!("{err:#}"),
    }
}

struct State {
    wasi: WasiP1Ctx,
    limiter: Limiter,
}

/// Refuses `memory.grow` past the limit (the guest's malloc fails: a MemoryError) and notes it.
struct Limiter {
    memory_bytes: usize,
    refused: Arc<AtomicBool>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = desired <= self.memory_bytes;
        if !allowed {
            self.refused.store(true, Ordering::Relaxed);
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// An instance that has initialised and waits for its snippet.
struct Waiting {
    stdin: std::io::PipeWriter,
    deadline: Arc<Mutex<Option<Instant>>>,
    /// Its host calls, then its end.
    heard: mpsc::Receiver<Heard<Ended>>,
    /// Its output and its limiter's note (a kept instance's are per cell).
    stdout: CappedPipe,
    stderr: CappedPipe,
    refused: Arc<AtomicBool>,
}

/// How handing code to an instance ended.
enum Driven {
    /// A kept instance finished the cell (its exit status and value).
    Done {
        status: i64,
        value: Option<serde_json::Value>,
    },
    /// The instance ended (how the code was handed over, too).
    Ended(Ended, std::io::Result<()>),
    Vanished,
}

/// The most contexts (kept Python instances) one worker keeps.
const MAX_CONTEXTS: usize = 16;
/// How long a kept instance may wait for its next cell before its deadline stops it.
const KEPT_IDLE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// How an instance's run ended.
struct Ended {
    status: Result<(), wasmtime::Error>,
    stdout: CappedPipe,
    stderr: CappedPipe,
    memory_refused: bool,
}

/// Compiles (or loads the cached) CPython module once, and runs snippets in fresh instances.
pub struct PythonEngine {
    engine: Engine,
    pre: InstancePre<State>,
    preopens: Vec<Preopen>,
    memory_bytes: u64,
    output_cap: usize,
    /// The names of `tools`' functions.
    tools: Vec<String>,
    /// The egress proxy for `fetch`; `None`: no network.
    proxy: Option<crate::fetch::Network>,
    waiting: Mutex<Option<Waiting>>,
    /// Kept instances by context id; each serves one evaluation at a time.
    contexts: Mutex<std::collections::HashMap<String, Arc<Mutex<Option<Waiting>>>>>,
}

/// What the Python engine is started with, beside the guests.
#[derive(Debug, Clone, Default)]
pub struct PythonOptions {
    pub preopens: Vec<Preopen>,
    pub memory_bytes: u64,
    pub output_cap: usize,
    pub tools: Vec<String>,
    pub proxy: Option<crate::fetch::Network>,
}

impl std::fmt::Debug for PythonEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonEngine")
            .field("preopens", &self.preopens)
            .field("memory_bytes", &self.memory_bytes)
            .finish_non_exhaustive()
    }
}

fn engine_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config
}

/// The cache file of a module with SHA-256 `hash`.
fn cache_path(dir: &Path, hash: &str) -> PathBuf {
    dir.join(format!(
        "python-{}-wasmtime-{WASMTIME_VERSION}.cwasm",
        &hash[..16]
    ))
}

/// Compiles the CPython module into `cache_dir` (the install step; the worker then only maps it).
pub fn precompile(guests: &Guests, cache_dir: &Path) -> Result<PathBuf, PythonError> {
    let engine = Engine::new(&engine_config()).map_err(engine_error("start wasmtime"))?;
    let (bytes, hash) = guests.python()?;
    let path = cache_path(cache_dir, &hash);
    if load_cached(&engine, &path).is_some() {
        return Ok(path);
    }
    let compiled = engine
        .precompile_module(&bytes)
        .map_err(engine_error("compile the CPython module"))?;
    let partial = path.with_extension("cwasm.partial");
    std::fs::write(&partial, compiled)
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|err| PythonError::Engine {
            what: "write the compiled module",
            message: format!("{}: {err}", path.display()),
        })?;
    Ok(path)
}

impl PythonEngine {
    /// Loads the module from `cache_dir` (compiling it there first if absent and writable) and
    /// starts the epoch ticker and the first waiting instance.
    pub fn new(
        guests: &Guests,
        cache_dir: &Path,
        options: PythonOptions,
    ) -> Result<Arc<PythonEngine>, PythonError> {
        let PythonOptions {
            preopens,
            memory_bytes,
            output_cap,
            tools,
            proxy,
        } = options;
        let engine = Engine::new(&engine_config()).map_err(engine_error("start wasmtime"))?;
        let (bytes, hash) = guests.python()?;
        let cached = cache_path(cache_dir, &hash);
        let module = match load_cached(&engine, &cached) {
            Some(module) => module,
            None => {
                let module = Module::new(&engine, &bytes)
                    .map_err(engine_error("compile the CPython module"))?;
                // A read-only cache (the sandbox's view) only costs the next start the compile.
                if let Ok(compiled) = module.serialize() {
                    let _ = std::fs::write(&cached, compiled);
                }
                module
            }
        };
        drop(bytes);
        let mut linker: Linker<State> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut State| &mut state.wasi)
            .map_err(engine_error("link WASI"))?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(engine_error("pre-link the CPython module"))?;
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .map_err(|err| PythonError::Engine {
                what: "start the epoch ticker",
                message: err.to_string(),
            })?;
        let python = Arc::new(PythonEngine {
            engine,
            pre,
            preopens,
            memory_bytes,
            output_cap,
            tools,
            proxy,
            waiting: Mutex::new(None),
            contexts: Mutex::default(),
        });
        let first = python.start_instance(false)?;
        *python.lock_waiting() = Some(first);
        Ok(python)
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, Option<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `code` in the waiting instance (or a new one) and starts the next; `host`
    /// performs its tool calls.
    pub fn eval(self: &Arc<Self>, code: &str, timeout: Duration, host: &dyn Host) -> EvalOutcome {
        let started = Instant::now();
        let taken = self.lock_waiting().take();
        let instance = match taken {
            Some(waiting) => Ok(waiting),
            None => self.start_instance(false),
        };
        // The next evaluation's instance initialises while this one runs.
        let next = self.clone();
        let _ = std::thread::Builder::new()
            .name("python-warm".into())
            .spawn(move || {
                if let Ok(waiting) = next.start_instance(false) {
                    let mut slot = next.lock_waiting();
                    if slot.is_none() {
                        *slot = Some(waiting);
                    }
                }
            });
        let mut outcome = match instance {
            Ok(waiting) => self.run(waiting, code, started + timeout, host),
            Err(err) => EvalOutcome::failed(EvalErrorKind::Engine, err.to_string()),
        };
        outcome.duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome
    }

    fn run(
        &self,
        mut waiting: Waiting,
        code: &str,
        deadline: Instant,
        host: &dyn Host,
    ) -> EvalOutcome {
        match self.drive(&mut waiting, code, deadline, host) {
            Driven::Ended(ended, fed) => {
                drop(waiting);
                let stdout = String::from_utf8_lossy(&ended.stdout.take()).into_owned();
                let stderr = String::from_utf8_lossy(&ended.stderr.take()).into_owned();
                let (stdout, result) = split_result(stdout);
                let error = match ended.status {
                    Ok(()) => None,
                    Err(err) => Some(self.classify(&err, &stderr, ended.memory_refused)),
                };
                let error = error.or_else(|| {
                    fed.err().map(|err| EvalError {
                        kind: EvalErrorKind::Engine,
                        message: format!("cannot hand the code to the instance: {err}"),
                    })
                });
                self.finish(result, stdout, stderr, error)
            }
            Driven::Done { .. } => EvalOutcome::failed(
                EvalErrorKind::Engine,
                "a fresh instance answered like a kept one",
            ),
            Driven::Vanished => {
                EvalOutcome::failed(EvalErrorKind::Engine, "the Python instance vanished")
            }
        }
    }

    /// The outcome, with a full output buffer named as the cause of a failure.
    fn finish(
        &self,
        result: Option<serde_json::Value>,
        stdout: String,
        stderr: String,
        error: Option<EvalError>,
    ) -> EvalOutcome {
        // A full pipe refuses the write (CPython raises OSError EIO): the cap is the cause.
        let full = stdout.len().max(stderr.len()) >= self.output_cap;
        let error = match error {
            Some(_) if full => Some(EvalError {
                kind: EvalErrorKind::OutputLimit,
                message: format!("output past {} bytes was refused", self.output_cap),
            }),
            other => other,
        };
        EvalOutcome {
            result: if error.is_none() { result } else { None },
            stdout,
            stderr,
            error,
            duration_us: 0,
        }
    }

    /// Hands `code` to the instance and answers its host calls until the cell is done (a kept
    /// instance) or the instance ends.
    fn drive(
        &self,
        waiting: &mut Waiting,
        code: &str,
        deadline: Instant,
        host: &dyn Host,
    ) -> Driven {
        *waiting.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        waiting.refused.store(false, Ordering::Relaxed);
        // The code as one frame (its length, then itself); stdin stays open for answers.
        let fed = waiting
            .stdin
            .write_all(format!("{}\n", code.len()).as_bytes())
            .and_then(|()| waiting.stdin.write_all(code.as_bytes()));
        loop {
            let call = match waiting.heard.recv() {
                Ok(Heard::Call(call)) => call,
                Ok(Heard::Ended(ended)) => return Driven::Ended(ended, fed),
                Err(_) => return Driven::Vanished,
            };
            let done = call
                .as_ref()
                .ok()
                .and_then(|c| serde_json::from_slice::<serde_json::Value>(c).ok())
                .and_then(|c| c.get("done").cloned());
            let answer = match &done {
                Some(_) => serde_json::json!({ "ok": null }),
                None => {
                    let asked = Instant::now();
                    let answer = self.answer(call, host, deadline_of(&waiting.deadline));
                    // The guest waited: that time is not charged to its timeout.
                    if let Some(d) = waiting
                        .deadline
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_mut()
                    {
                        *d += asked.elapsed();
                    }
                    answer
                }
            };
            let mut line = serde_json::to_vec(&answer).unwrap_or_default();
            line.push(b'\n');
            // An instance that stopped reading has ended or will: its end follows.
            let _ = waiting.stdin.write_all(&line);
            if let Some(done) = done {
                // Idle between cells: no deadline but a far one.
                *waiting.deadline.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Instant::now() + KEPT_IDLE_LIMIT);
                let status = done["status"].as_i64().unwrap_or(1);
                return Driven::Done {
                    status,
                    value: done.get("value").cloned(),
                };
            }
        }
    }

    /// Runs `code` in the kept instance of `context` (started by its first evaluation): the
    /// state of the context's earlier evaluations is there. A timeout or a trap ends the
    /// instance, and its state with it.
    pub fn eval_kept(
        self: &Arc<Self>,
        context: &str,
        code: &str,
        timeout: Duration,
        host: &dyn Host,
    ) -> EvalOutcome {
        let started = Instant::now();
        let slot = {
            let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            if !contexts.contains_key(context) && contexts.len() >= MAX_CONTEXTS {
                return EvalOutcome::failed(
                    EvalErrorKind::Invalid,
                    format!("this worker already keeps {MAX_CONTEXTS} Python contexts; remove one"),
                );
            }
            contexts.entry(context.to_owned()).or_default().clone()
        };
        let mut kept = slot.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_none() {
            match self.start_instance(true) {
                Ok(instance) => *kept = Some(instance),
                Err(err) => return EvalOutcome::failed(EvalErrorKind::Engine, err.to_string()),
            }
        }
        let Some(instance) = kept.as_mut() else {
            return EvalOutcome::failed(EvalErrorKind::Engine, "no kept instance");
        };
        // The timeout counts from the request, the kept instance's start included.
        let mut outcome = match self.drive(instance, code, started + timeout, host) {
            Driven::Done { status, value } => {
                let stdout = String::from_utf8_lossy(&instance.stdout.take()).into_owned();
                let stderr = String::from_utf8_lossy(&instance.stderr.take()).into_owned();
                let memory_refused = instance.refused.load(Ordering::Relaxed);
                let error = (status != 0).then(|| {
                    self.classify(
                        &wasmtime::Error::new(I32Exit(i32::try_from(status).unwrap_or(1))),
                        &stderr,
                        memory_refused,
                    )
                });
                self.finish(value, stdout, stderr, error)
            }
            Driven::Ended(ended, _) => {
                *kept = None;
                let stdout = String::from_utf8_lossy(&ended.stdout.take()).into_owned();
                let stderr = String::from_utf8_lossy(&ended.stderr.take()).into_owned();
                let mut error = match ended.status {
                    Ok(()) => EvalError {
                        kind: EvalErrorKind::Exit,
                        message: "the kept instance exited".to_owned(),
                    },
                    Err(err) => self.classify(&err, &stderr, ended.memory_refused),
                };
                error
                    .message
                    .push_str(" (the context's state is lost; its next evaluation starts afresh)");
                self.finish(None, stdout, stderr, Some(error))
            }
            Driven::Vanished => {
                *kept = None;
                EvalOutcome::failed(EvalErrorKind::Engine, "the Python instance vanished")
            }
        };
        outcome.duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome
    }

    /// Forgets a context: its kept instance reads end of file and exits.
    pub fn drop_context(&self, context: &str) -> bool {
        self.contexts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(context)
            .is_some()
    }

    /// The answer line to one host call: `{"ok": value}` or `{"error": message}`.
    fn answer(
        &self,
        call: Result<Vec<u8>, String>,
        host: &dyn Host,
        deadline: Instant,
    ) -> serde_json::Value {
        match self.perform(call, host, deadline) {
            Ok(value) => serde_json::json!({ "ok": value }),
            Err(message) => serde_json::json!({ "error": message }),
        }
    }

    fn perform(
        &self,
        call: Result<Vec<u8>, String>,
        host: &dyn Host,
        deadline: Instant,
    ) -> Result<serde_json::Value, String> {
        let call: serde_json::Value =
            serde_json::from_slice(&call?).map_err(|e| format!("a bad host call: {e}"))?;
        if let Some(name) = call.get("tool").and_then(|n| n.as_str()) {
            check_tool(&self.tools, name)?;
            let args = call.get("args").cloned().unwrap_or_default();
            return host
                .call_tool(name, args)
                .map_err(|message| format!("tool {name}: {message}"));
        }
        let Some(request) = call.get("fetch") else {
            return Err("a host call that is neither a tool nor a fetch".to_owned());
        };
        let Some(proxy) = &self.proxy else {
            return Err("fetch: this sandbox has no network (its policy needs `network: proxy` and egress rules)".to_owned());
        };
        let text = |key: &str| request.get(key).and_then(|v| v.as_str());
        let headers: std::collections::BTreeMap<String, String> = request
            .get("headers")
            .and_then(|h| serde_json::from_value(h.clone()).ok())
            .unwrap_or_default();
        let fetched = crate::fetch::fetch(
            proxy,
            text("method").unwrap_or("GET"),
            text("url").unwrap_or_default(),
            &headers,
            text("body"),
            deadline,
        )?;
        Ok(serde_json::json!({
            "status": fetched.status,
            "headers": fetched.headers,
            "body": fetched.body,
        }))
    }

    fn classify(&self, err: &wasmtime::Error, stderr: &str, memory_refused: bool) -> EvalError {
        if let Some(exit) = err.downcast_ref::<I32Exit>() {
            // Status 1 is CPython's for an uncaught exception; its last stderr line names it.
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            if memory_refused && (last.contains("MemoryError") || exit.0 != 0) {
                return EvalError {
                    kind: EvalErrorKind::MemoryLimit,
                    message: format!(
                        "the memory limit of {} bytes was reached",
                        self.memory_bytes
                    ),
                };
            }
            if exit.0 == 1 && !last.is_empty() {
                return EvalError {
                    kind: EvalErrorKind::Exception,
                    message: last.to_owned(),
                };
            }
            return EvalError {
                kind: EvalErrorKind::Exit,
                message: format!("the snippet exited with status {}", exit.0),
            };
        }
        if let Some(trap) = err.downcast_ref::<Trap>()
            && *trap == Trap::Interrupt
        {
            return EvalError {
                kind: EvalErrorKind::Timeout,
                message: "the timeout passed; the instance was interrupted".into(),
            };
        }
        let message = format!("{err:#}");
        if message.contains("write beyond capacity") {
            return EvalError {
                kind: EvalErrorKind::OutputLimit,
                message: format!("output past {} bytes was refused", self.output_cap),
            };
        }
        if memory_refused {
            return EvalError {
                kind: EvalErrorKind::MemoryLimit,
                message: format!(
                    "the memory limit of {} bytes was reached",
                    self.memory_bytes
                ),
            };
        }
        EvalError {
            kind: EvalErrorKind::Engine,
            message,
        }
    }

    /// Starts an instance on its own thread; it initialises CPython and blocks on stdin. A
    /// kept one (`session`) runs cell after cell in one scope.
    fn start_instance(&self, session: bool) -> Result<Waiting, PythonError> {
        let (reader, writer) = std::io::pipe().map_err(|err| PythonError::Engine {
            what: "create a stdin pipe",
            message: err.to_string(),
        })?;
        let stdout = CappedPipe::new(self.output_cap);
        let stderr = CappedPipe::new(self.output_cap);
        let (sender, heard) = mpsc::channel();
        let mut builder = WasiCtxBuilder::new();
        // The sandbox's environment, as a process would have it (credential placeholders,
        // never secrets), without the proxy's and the worker's own variables.
        for (name, value) in std::env::vars() {
            let internal = name.starts_with("AIRLOCK_")
                || name.to_ascii_lowercase().ends_with("_proxy")
                || name.starts_with("PYTHON");
            if !internal {
                builder.env(&name, &value);
            }
        }
        builder
            .args(&["python", "-I", "-c", PRELUDE])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("AIRLOCK_TOOLS", self.tools.join(","))
            .env("AIRLOCK_SESSION", if session { "1" } else { "" })
            .stdin(InputFile::new(std::fs::File::from(
                std::os::fd::OwnedFd::from(reader),
            )))
            .stdout(Tap::new(stdout.clone(), sender.clone()))
            .stderr(stderr.clone());
        for preopen in &self.preopens {
            let perms = if preopen.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            builder
                .preopened_dir(&preopen.host, &preopen.guest, perms)
                .map_err(|err| PythonError::Engine {
                    what: "open a preopened directory",
                    message: format!("{}: {err:#}", preopen.host.display()),
                })?;
        }
        let refused = Arc::new(AtomicBool::new(false));
        let (stdout_kept, stderr_kept, refused_kept) =
            (stdout.clone(), stderr.clone(), refused.clone());
        let mut store = Store::new(
            &self.engine,
            State {
                wasi: builder.build_p1(),
                limiter: Limiter {
                    memory_bytes: usize::try_from(self.memory_bytes).unwrap_or(usize::MAX),
                    refused: refused.clone(),
                },
            },
        );
        store.limiter(|state| &mut state.limiter);
        let deadline: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let watched = deadline.clone();
        let born = Instant::now();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            let now = Instant::now();
            let late = match *watched.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(deadline) => now >= deadline,
                None => now.duration_since(born) > WARM_START_LIMIT,
            };
            Ok(if late {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::Continue(1)
            })
        });
        let pre = self.pre.clone();
        std::thread::Builder::new()
            .name("python".into())
            .spawn(move || {
                let status = pre.instantiate(&mut store).and_then(|instance| {
                    instance
                        .get_typed_func::<(), ()>(&mut store, "_start")?
                        .call(&mut store, ())
                });
                let status = match status {
                    Err(err) if err.downcast_ref::<I32Exit>().is_some_and(|e| e.0 == 0) => Ok(()),
                    other => other,
                };
                let _ = sender.send(Heard::Ended(Ended {
                    status,
                    stdout,
                    stderr,
                    memory_refused: refused.load(Ordering::Relaxed),
                }));
            })
            .map_err(|err| PythonError::Engine {
                what: "start an instance thread",
                message: err.to_string(),
            })?;
        Ok(Waiting {
            stdin: writer,
            deadline,
            heard,
            stdout: stdout_kept,
            stderr: stderr_kept,
            refused: refused_kept,
        })
    }
}

fn deadline_of(deadline: &Mutex<Option<Instant>>) -> Instant {
    deadline
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_else(Instant::now)
}

/// Maps a module compiled earlier by this engine version and configuration, if there is one.
#[allow(
    unsafe_code,
    reason = "wasmtime's only way to load precompiled machine code; see the SAFETY comment"
)]
fn load_cached(engine: &Engine, path: &Path) -> Option<Module> {
    if !path.is_file() {
        return None;
    }
    // SAFETY: `deserialize_file` trusts the file to be wasmtime's own output. It is: the file
    // is written only by `precompile`/`PythonEngine::new` of this crate, under a name keyed by
    // the module's SHA-256 and this wasmtime version, in the install's guest directory (the
    // sandbox sees it read-only). wasmtime still checks its version and configuration header.
    unsafe { Module::deserialize_file(engine, path) }.ok()
}

/// Splits the prelude's result line off the end of stdout.
fn split_result(mut stdout: String) -> (String, Option<serde_json::Value>) {
    let Some(mark) = stdout.rfind(RESULT_MARK) else {
        return (stdout, None);
    };
    let line = stdout[mark + RESULT_MARK.len_utf8()..].trim_end_matches('\n');
    let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
        return (stdout, None);
    };
    stdout.truncate(mark);
    (stdout, Some(value))
}
