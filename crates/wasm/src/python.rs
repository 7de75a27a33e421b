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
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::guests::{GuestError, Guests};
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
const PRELUDE: &str = r#"
import ast, json, os, sys, traceback
def _airlock_eval(source):
    tree = ast.parse(source, "<eval>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<eval>", "exec"), scope)
    value = None if last is None else eval(compile(last, "<eval>", "eval"), scope)
    sys.stdout.flush()
    sys.stdout.write("\x1e" + json.dumps(value, default=repr) + "\n")
    sys.stdout.flush()
try:
    _airlock_eval(sys.stdin.read())
    _airlock_status = 0
except SystemExit as stop:
    if stop.code is None or isinstance(stop.code, int):
        _airlock_status = stop.code or 0
    else:
        print(stop.code, file=sys.stderr)
        _airlock_status = 1
except BaseException:
    traceback.print_exc()
    _airlock_status = 1
# The instance is thrown away: skip the interpreter's finalisation (tens of milliseconds).
sys.stdout.flush()
sys.stderr.flush()
os._exit(_airlock_status)
"#;

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
    done: mpsc::Receiver<Ended>,
}

/// How an instance's run ended.
struct Ended {
    status: Result<(), wasmtime::Error>,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    memory_refused: bool,
}

/// Compiles (or loads the cached) CPython module once, and runs snippets in fresh instances.
pub struct PythonEngine {
    engine: Engine,
    pre: InstancePre<State>,
    preopens: Vec<Preopen>,
    memory_bytes: u64,
    output_cap: usize,
    waiting: Mutex<Option<Waiting>>,
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
        preopens: Vec<Preopen>,
        memory_bytes: u64,
        output_cap: usize,
    ) -> Result<Arc<PythonEngine>, PythonError> {
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
            waiting: Mutex::new(None),
        });
        let first = python.start_instance()?;
        *python.lock_waiting() = Some(first);
        Ok(python)
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, Option<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `code` in the waiting instance (or a new one) and starts the next.
    pub fn eval(self: &Arc<Self>, code: &str, timeout: Duration) -> EvalOutcome {
        let started = Instant::now();
        let taken = self.lock_waiting().take();
        let instance = match taken {
            Some(waiting) => Ok(waiting),
            None => self.start_instance(),
        };
        // The next evaluation's instance initialises while this one runs.
        let next = self.clone();
        let _ = std::thread::Builder::new()
            .name("python-warm".into())
            .spawn(move || {
                if let Ok(waiting) = next.start_instance() {
                    let mut slot = next.lock_waiting();
                    if slot.is_none() {
                        *slot = Some(waiting);
                    }
                }
            });
        let mut outcome = match instance {
            Ok(waiting) => self.run(waiting, code, started + timeout),
            Err(err) => EvalOutcome::failed(EvalErrorKind::Engine, err.to_string()),
        };
        outcome.duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome
    }

    fn run(&self, waiting: Waiting, code: &str, deadline: Instant) -> EvalOutcome {
        *waiting.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        let Waiting {
            mut stdin, done, ..
        } = waiting;
        // The prelude reads to end of file: the code, then the closed pipe.
        let fed = stdin.write_all(code.as_bytes());
        drop(stdin);
        let Ok(ended) = done.recv() else {
            return EvalOutcome::failed(EvalErrorKind::Engine, "the Python instance vanished");
        };
        let stdout = String::from_utf8_lossy(&ended.stdout.contents()).into_owned();
        let stderr = String::from_utf8_lossy(&ended.stderr.contents()).into_owned();
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

    /// Starts an instance on its own thread; it initialises CPython and blocks on stdin.
    fn start_instance(&self) -> Result<Waiting, PythonError> {
        let (reader, writer) = std::io::pipe().map_err(|err| PythonError::Engine {
            what: "create a stdin pipe",
            message: err.to_string(),
        })?;
        let stdout = MemoryOutputPipe::new(self.output_cap);
        let stderr = MemoryOutputPipe::new(self.output_cap);
        let mut builder = WasiCtxBuilder::new();
        builder
            .args(&["python", "-I", "-c", PRELUDE])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(InputFile::new(std::fs::File::from(
                std::os::fd::OwnedFd::from(reader),
            )))
            .stdout(stdout.clone())
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
        let (sender, done) = mpsc::channel();
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
                let _ = sender.send(Ended {
                    status,
                    stdout,
                    stderr,
                    memory_refused: refused.load(Ordering::Relaxed),
                });
            })
            .map_err(|err| PythonError::Engine {
                what: "start an instance thread",
                message: err.to_string(),
            })?;
        Ok(Waiting {
            stdin: writer,
            deadline,
            done,
        })
    }
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
