//! `airlock-wasm`: the wasm tier's worker (see the library's documentation).
//!
//!   airlock-wasm serve --listen 127.0.0.1:49998 [--preopen HOST:GUEST:rw]...
//!   airlock-wasm eval --language python --code 'sum(range(10))'
//!   airlock-wasm precompile        (the install step: the CPython module's `.cwasm`)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use airlock_api::v1::DropContextLine;
use airlock_wasm::{
    ConnectionHost, DEFAULT_MEMORY_BYTES, DEFAULT_OUTPUT_CAP_BYTES, DEFAULT_TIMEOUT_MS,
    EvalErrorKind, EvalOutcome, EvalRequest, Guests, Host, JsEngine, Language, MAX_TIMEOUT_MS,
    NoHost, Preopen, Prepared, PythonEngine, PythonOptions,
};
use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// The longest request line read.
const MAX_REQUEST_BYTES: u64 = 4 << 20;

#[derive(Parser)]
#[command(name = "airlock-wasm", about = "The wasm tier's worker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct EngineArgs {
    /// The guest modules' directory (default: `wasm-guests` beside the binary's directory).
    #[arg(long)]
    guests: Option<PathBuf>,
    /// A directory the guest sees, `HOST:GUEST:ro` or `HOST:GUEST:rw`; nothing else is visible.
    #[arg(long = "preopen")]
    preopens: Vec<Preopen>,
    /// Memory one evaluation may use.
    #[arg(long, default_value_t = DEFAULT_MEMORY_BYTES)]
    memory_bytes: u64,
    /// The most of stdout, and of stderr, kept per evaluation.
    #[arg(long, default_value_t = DEFAULT_OUTPUT_CAP_BYTES)]
    output_cap_bytes: usize,
    /// Do not load CPython (a JavaScript-only worker starts in milliseconds).
    #[arg(long)]
    no_python: bool,
    /// A tool the guest may call as `tools.NAME(args)` (the caller performs it).
    #[arg(long = "tool")]
    tools: Vec<String>,
    /// The egress proxy (from the environment, read before the worker confines itself).
    #[arg(skip)]
    network: Option<airlock_wasm::Network>,
    /// `serve` only: skip the worker's own Landlock and seccomp (a host without Landlock).
    #[arg(long)]
    unconfined: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Answers one JSON request line per TCP connection with one JSON outcome line.
    Serve {
        #[arg(long)]
        listen: String,
        #[command(flatten)]
        engines: EngineArgs,
    },
    /// Evaluates one snippet and prints its outcome as JSON.
    Eval {
        #[arg(long, value_parser = parse_language)]
        language: Language,
        #[arg(long)]
        code: String,
        #[arg(long)]
        timeout_ms: Option<u64>,
        #[command(flatten)]
        engines: EngineArgs,
    },
    /// Compiles the CPython module into the guests directory's cache.
    Precompile {
        #[arg(long)]
        guests: Option<PathBuf>,
    },
}

fn parse_language(text: &str) -> Result<Language, String> {
    match text {
        "javascript" | "js" | "node" => Ok(Language::Javascript),
        "python" | "py" | "python3" => Ok(Language::Python),
        other => Err(format!("unknown language {other:?} (javascript or python)")),
    }
}

struct Engines {
    js: JsEngine,
    python: Option<Arc<PythonEngine>>,
    /// `serve` only: the thread that runs JavaScript in contexts it made ahead of time.
    js_thread: Option<std::sync::Mutex<mpsc::Sender<JsJob>>>,
}

/// Work for the JS thread: evaluations in the contexts' kept runtimes.
enum JsJob {
    /// One evaluation in context `context`'s runtime, who performs its tool calls, and where
    /// its outcome goes.
    Eval {
        code: String,
        timeout: Duration,
        context: String,
        host: Arc<dyn Host>,
        reply: mpsc::Sender<EvalOutcome>,
    },
    /// Forget a context's runtime.
    Drop(String),
}

/// The most JavaScript contexts (kept runtimes) one worker keeps.
const MAX_JS_CONTEXTS: usize = 16;

/// QuickJS runtimes are bound to one thread: this one owns the contexts' kept runtimes (an
/// evaluation without a context runs on its connection's thread instead, see [`JsSlot`]).
fn start_js_thread(js: JsEngine) -> anyhow::Result<mpsc::Sender<JsJob>> {
    let (sender, jobs) = mpsc::channel::<JsJob>();
    std::thread::Builder::new()
        .name("javascript".into())
        .spawn(move || {
            let mut kept: std::collections::HashMap<String, airlock_wasm::Prepared> =
                std::collections::HashMap::new();
            for job in jobs {
                let (code, timeout, context, host, reply) = match job {
                    JsJob::Drop(context) => {
                        kept.remove(&context);
                        continue;
                    }
                    JsJob::Eval {
                        code,
                        timeout,
                        context,
                        host,
                        reply,
                    } => (code, timeout, context, host, reply),
                };
                if !kept.contains_key(&context) && kept.len() >= MAX_JS_CONTEXTS {
                    let _ = reply.send(EvalOutcome::failed(
                        EvalErrorKind::Invalid,
                        format!("this worker already keeps {MAX_JS_CONTEXTS} JavaScript contexts; remove one"),
                    ));
                    continue;
                }
                let runtime = match kept.entry(context) {
                    std::collections::hash_map::Entry::Occupied(entry) => Ok(entry.into_mut()),
                    std::collections::hash_map::Entry::Vacant(entry) => {
                        js.prepare().map(|prepared| entry.insert(prepared))
                    }
                };
                let outcome = match runtime {
                    Ok(runtime) => js.eval_prepared(runtime, &code, timeout, host),
                    Err(err) => EvalOutcome::failed(EvalErrorKind::Engine, err),
                };
                let _ = reply.send(outcome);
            }
        })
        .context("cannot start the JavaScript thread")?;
    Ok(sender)
}

/// A connection thread's JavaScript isolates: `next`, a runtime and context no evaluation has
/// used, made before the thread waits for a connection (so an evaluation pays only for its own
/// code and never waits for another thread), and `spent`, the one its last evaluation used,
/// torn down once the answer is sent. Each evaluation without a context takes `next`; none is
/// ever used twice.
#[derive(Default)]
struct JsSlot {
    next: Option<Prepared>,
    spent: Option<Prepared>,
}

impl Engines {
    fn start(args: &EngineArgs) -> anyhow::Result<Engines> {
        let js = JsEngine::new(
            args.memory_bytes,
            args.output_cap_bytes,
            args.network.clone(),
            args.tools.clone(),
        );
        let python = if args.no_python {
            None
        } else {
            let guests = Guests::new(guests_dir(args.guests.clone())?);
            let python = PythonEngine::new(
                &guests,
                guests.dir(),
                PythonOptions {
                    preopens: args.preopens.clone(),
                    memory_bytes: args.memory_bytes,
                    output_cap: args.output_cap_bytes,
                    tools: args.tools.clone(),
                    proxy: args.network.clone(),
                },
            )
            .context("cannot start the Python engine")?;
            Some(python)
        };
        Ok(Engines {
            js,
            python,
            js_thread: None,
        })
    }

    /// Forgets context `id` in both engines.
    fn drop_context(&self, id: &str) {
        if let Some(python) = &self.python {
            python.drop_context(id);
        }
        if let Some(thread) = &self.js_thread {
            let _ = thread
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(JsJob::Drop(id.to_owned()));
        }
    }

    /// Evaluates `request`; one without a context in JavaScript uses `js`'s fresh isolate.
    fn eval(&self, request: &EvalRequest, host: Arc<dyn Host>, js: &mut JsSlot) -> EvalOutcome {
        if let Some(context) = &request.context_id
            && !airlock_api::v1::valid_context_id(context)
        {
            return EvalOutcome::failed(
                EvalErrorKind::Invalid,
                "context_id: 1 to 64 of A-Z a-z 0-9 _ . -",
            );
        }
        let timeout_ms = request.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
            return EvalOutcome::failed(
                EvalErrorKind::Invalid,
                format!("timeout_ms must be 1..={MAX_TIMEOUT_MS}, not {timeout_ms}"),
            );
        }
        let timeout = Duration::from_millis(timeout_ms);
        match request.language {
            Language::Javascript => match (&request.context_id, &self.js_thread) {
                (Some(context), Some(thread)) => {
                    let (reply, outcome) = mpsc::channel();
                    let sent = thread
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .send(JsJob::Eval {
                            code: request.code.clone(),
                            timeout,
                            context: context.clone(),
                            host,
                            reply,
                        });
                    match sent.ok().and_then(|()| outcome.recv().ok()) {
                        Some(outcome) => outcome,
                        None => EvalOutcome::failed(
                            EvalErrorKind::Engine,
                            "the JavaScript thread ended",
                        ),
                    }
                }
                _ => match js.next.take().map_or_else(|| self.js.prepare(), Ok) {
                    Ok(fresh) => {
                        let outcome = self.js.eval_prepared(&fresh, &request.code, timeout, host);
                        js.spent = Some(fresh);
                        outcome
                    }
                    Err(err) => EvalOutcome::failed(EvalErrorKind::Engine, err),
                },
            },
            Language::Python => match (&self.python, &request.context_id) {
                (Some(python), Some(context)) => {
                    python.eval_kept(context, &request.code, timeout, host.as_ref())
                }
                (Some(python), None) => python.eval(&request.code, timeout, host.as_ref()),
                (None, _) => EvalOutcome::failed(
                    EvalErrorKind::Invalid,
                    "this worker has no Python engine (template wasm-js)",
                ),
            },
        }
    }
}

/// The flag's directory, or the first `wasm-guests` in the binary's ancestors (the install step
/// puts it in `target/`, and the binary is in `target/<triple>/<profile>/`).
fn guests_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir);
    }
    let exe = std::env::current_exe().context("cannot find the worker's own path")?;
    exe.ancestors()
        .skip(1)
        .take(4)
        .map(|dir| dir.join("wasm-guests"))
        .find(|dir| dir.is_dir())
        .with_context(|| {
            format!(
                "no wasm-guests directory near {} (run scripts/wasm-guests.sh, or pass --guests)",
                exe.display()
            )
        })
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve {
            listen,
            mut engines,
        } => {
            engines.network = airlock_wasm::proxy_from_env();
            let listener =
                TcpListener::bind(&listen).with_context(|| format!("cannot listen on {listen}"))?;
            if !engines.unconfined {
                let guests = guests_dir(engines.guests.clone())?;
                airlock_wasm::confine(&guests, &engines.preopens)
                    .context("cannot confine the worker")?;
            }
            let mut engines = Engines::start(&engines)?;
            engines.js_thread = Some(std::sync::Mutex::new(start_js_thread(engines.js.clone())?));
            let engines = Arc::new(engines);
            // Ready: the engines are loaded (a test or a supervisor waits for this line).
            println!("listening {}", listener.local_addr()?);
            let pool = Arc::new(ConnectionPool {
                listener,
                engines,
                idle: AtomicUsize::new(0),
            });
            // Two wait from the start: the first connection starts no thread either.
            pool.spawn_waiter();
            pool.serve(true);
            Ok(())
        }
        Command::Eval {
            language,
            code,
            timeout_ms,
            mut engines,
        } => {
            engines.network = airlock_wasm::proxy_from_env();
            let engines = Engines::start(&engines)?;
            let outcome = engines.eval(
                &EvalRequest {
                    language,
                    code,
                    timeout_ms,
                    context_id: None,
                },
                Arc::new(NoHost),
                &mut JsSlot::default(),
            );
            println!("{}", serde_json::to_string(&outcome)?);
            Ok(())
        }
        Command::Precompile { guests } => {
            let guests = Guests::new(guests_dir(guests)?);
            let path = airlock_wasm::precompile(&guests, guests.dir())?;
            println!("{}", path.display());
            Ok(())
        }
    }
}

/// The most connection threads left waiting in `accept` once their connection is done.
const MAX_IDLE_CONNECTION_THREADS: usize = 2;

/// Threads that each accept a connection and serve it. One is always waiting in `accept`, so
/// that a connection never waits for a thread to be started: the thread that takes the last
/// waiting place starts the next one before it serves its connection.
struct ConnectionPool {
    listener: TcpListener,
    engines: Arc<Engines>,
    idle: AtomicUsize,
}

impl ConnectionPool {
    /// Accepts and serves connections; a thread that is not `permanent` ends when enough others
    /// wait.
    fn serve(self: &Arc<Self>, permanent: bool) {
        let mut js = JsSlot::default();
        loop {
            // The isolate the next connection's JavaScript gets is made before it comes.
            if js.next.is_none() {
                js.next = self.engines.js.prepare().ok();
            }
            self.idle.fetch_add(1, Ordering::SeqCst);
            let accepted = self.listener.accept();
            let was_last = self.idle.fetch_sub(1, Ordering::SeqCst) == 1;
            match accepted {
                Ok((stream, _)) => {
                    if was_last {
                        self.spawn_waiter();
                    }
                    serve_one(&self.engines, stream, &mut js);
                    // Torn down after the answer went out, not before.
                    js.spent = None;
                }
                // Out of descriptors, say: not a busy loop, and no new thread.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            if !permanent && self.idle.load(Ordering::SeqCst) >= MAX_IDLE_CONNECTION_THREADS {
                return;
            }
        }
    }

    /// One more thread waiting in `accept`. Without it (out of threads) the busy ones still
    /// come back to `accept` when done.
    fn spawn_waiter(self: &Arc<Self>) {
        let pool = self.clone();
        let _ = std::thread::Builder::new()
            .name("connection".into())
            .spawn(move || pool.serve(false));
    }
}

fn serve_one(engines: &Engines, stream: TcpStream, js: &mut JsSlot) {
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let read = (&mut reader).take(MAX_REQUEST_BYTES).read_line(&mut line);
    let host = Arc::new(ConnectionHost::new(reader));
    let outcome = match read {
        Ok(_) => match serde_json::from_str::<EvalRequest>(&line) {
            Ok(request) => engines.eval(&request, host, js),
            Err(_) if let Ok(drop) = serde_json::from_str::<DropContextLine>(&line) => {
                engines.drop_context(&drop.drop_context);
                EvalOutcome::ok(None)
            }
            Err(err) => EvalOutcome::failed(EvalErrorKind::Invalid, format!("bad request: {err}")),
        },
        Err(err) => EvalOutcome::failed(EvalErrorKind::Invalid, format!("cannot read: {err}")),
    };
    let Ok(mut answer) = serde_json::to_vec(&outcome) else {
        return;
    };
    answer.push(b'\n');
    let _ = (&writer).write_all(&answer);
    // The caller reads to the end: it gets it now, not when the connection's last handle goes.
    let _ = writer.shutdown(std::net::Shutdown::Write);
    if js.spent.is_some() {
        wait_for_hang_up(&writer);
    }
}

/// How long a connection thread waits for its caller to hang up before it tears down the
/// isolate its evaluation used anyway.
const HANG_UP_WAIT: Duration = Duration::from_secs(1);

/// Returns once the caller has closed the connection (or after [`HANG_UP_WAIT`]): tearing
/// down an isolate and making the next one take a few hundred microseconds of CPU, and on a
/// busy machine the caller, woken by the answer, would otherwise wait for them on the same CPU.
fn wait_for_hang_up(stream: &TcpStream) {
    if stream.set_read_timeout(Some(HANG_UP_WAIT)).is_err() {
        return;
    }
    // Whatever else the caller sends is not read; a caller that keeps sending is not waited for.
    let mut unread = [0u8; 4096];
    for _ in 0..16 {
        match (&*stream).read(&mut unread) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
}
