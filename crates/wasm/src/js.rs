//! JavaScript in QuickJS-NG, one fresh runtime and context per evaluation.
//!
//! The context has QuickJS's standard objects and a `console` that writes to capped buffers;
//! nothing else: no `std`/`os` modules, no filesystem, no network. Everything an evaluation
//! does not bring itself (the standard objects, `console`, `fetch`, `tools`, the interrupt
//! handler) is made by [`JsEngine::prepare`], ahead of the evaluation that uses it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rquickjs::function::Rest;
use rquickjs::{CaughtError, Coerced, Context, Ctx, Function, Object, Runtime, Value};

use crate::host::{Host, NoHost, check_tool};
use crate::wire::{EvalErrorKind, EvalOutcome};

/// The deadline of an evaluation, pushed back by the time the guest waits for tool calls.
type Deadline = Rc<Cell<Instant>>;

/// The QuickJS stack limit: deep recursion becomes a RangeError, not a host stack overflow.
const MAX_STACK_BYTES: usize = 1 << 20;

/// `fetch(url, {method, headers, body})` as a Promise of a small Response (`status`, `ok`,
/// `headers.get`, `text()`, `json()`), over the host's `__airlock_http`.
const FETCH_GLUE: &str = r#"
(() => {
  const http = globalThis.__airlock_http;
  delete globalThis.__airlock_http;
  globalThis.fetch = (url, init = {}) => {
    try {
      const [status, headers, body] = http(String(init.method || "GET").toUpperCase(), String(url),
        JSON.stringify(init.headers || {}), init.body == null ? null : String(init.body));
      const names = JSON.parse(headers);
      const code = Number(status);
      return Promise.resolve({
        status: code, ok: code >= 200 && code < 300, url: String(url),
        headers: { get: (name) => names[String(name).toLowerCase()] ?? null },
        text: () => Promise.resolve(body),
        json: () => Promise.resolve(JSON.parse(body)),
      });
    } catch (error) {
      return Promise.reject(error);
    }
  };
})();
"#;

/// `tools.NAME(args)` as a Promise of the call's value, over the host's `__airlock_tool`.
const TOOLS_GLUE: &str = r#"
((names) => {
  const call = globalThis.__airlock_tool;
  delete globalThis.__airlock_tool;
  const tools = {};
  for (const name of names) {
    tools[name] = (args) => {
      try {
        return Promise.resolve(JSON.parse(call(name, JSON.stringify(args === undefined ? null : args))));
      } catch (error) {
        return Promise.reject(error);
      }
    };
  }
  globalThis.tools = Object.freeze(tools);
})"#;

/// Evaluates JavaScript snippets under a memory limit and an output cap.
#[derive(Debug, Clone)]
pub struct JsEngine {
    memory_bytes: u64,
    output_cap: usize,
    /// The egress proxy; `None`: no network.
    proxy: Option<crate::fetch::Network>,
    /// The names of `tools`' functions.
    tools: Vec<String>,
}

/// A runtime and context no evaluation has used yet, with the host's functions installed.
/// What they read per evaluation (its deadline, output and tool host) is set in these cells.
pub struct Prepared {
    runtime: Runtime,
    context: Context,
    deadline: Deadline,
    timed_out: Rc<Cell<bool>>,
    output: Rc<RefCell<Output>>,
    host: HostSlot,
}

/// Who performs the current evaluation's tool calls.
type HostSlot = Rc<RefCell<Arc<dyn Host>>>;

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prepared")
    }
}

#[derive(Default)]
struct Output {
    stdout: String,
    stderr: String,
    overflowed: bool,
}

impl Output {
    fn push(&mut self, to_stderr: bool, line: &str, cap: usize) {
        let buffer = if to_stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        if buffer.len() + line.len() + 1 > cap {
            self.overflowed = true;
            return;
        }
        buffer.push_str(line);
        buffer.push('\n');
    }
}

impl JsEngine {
    pub fn new(
        memory_bytes: u64,
        output_cap: usize,
        proxy: Option<crate::fetch::Network>,
        tools: Vec<String>,
    ) -> JsEngine {
        JsEngine {
            memory_bytes,
            output_cap,
            proxy,
            tools,
        }
    }

    /// Runs `code` in a fresh runtime; the completion value of the script is the result.
    pub fn eval(&self, code: &str, timeout: Duration) -> EvalOutcome {
        let started = Instant::now();
        let mut outcome = self.eval_inner(code, started + timeout, Arc::new(NoHost));
        outcome.duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome
    }

    /// A fresh runtime and context, made ahead of the evaluation that will use it (creating
    /// the context's standard objects and the host's functions is most of an evaluation's
    /// cost).
    pub fn prepare(&self) -> Result<Prepared, String> {
        let runtime = Runtime::new().map_err(|e| e.to_string())?;
        runtime.set_memory_limit(usize::try_from(self.memory_bytes).unwrap_or(usize::MAX));
        runtime.set_max_stack_size(MAX_STACK_BYTES);
        let context = Context::full(&runtime).map_err(|e| e.to_string())?;
        let deadline: Deadline = Rc::new(Cell::new(Instant::now()));
        let timed_out = Rc::new(Cell::new(false));
        let output = Rc::new(RefCell::new(Output::default()));
        let host: HostSlot = Rc::new(RefCell::new(Arc::new(NoHost)));
        context
            .with(|ctx| -> rquickjs::Result<()> {
                install_console(&ctx, &output, self.output_cap)?;
                install_fetch(&ctx, self.proxy.clone(), deadline.clone())?;
                // Without tools there is no `tools` (and no glue to evaluate).
                if !self.tools.is_empty() {
                    install_tools(&ctx, &self.tools, host.clone(), deadline.clone())?;
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
        // Only now: the glue above runs with no deadline set yet.
        let (watched, flag) = (deadline.clone(), timed_out.clone());
        runtime.set_interrupt_handler(Some(Box::new(move || {
            let late = Instant::now() >= watched.get();
            if late {
                flag.set(true);
            }
            late
        })));
        Ok(Prepared {
            runtime,
            context,
            deadline,
            timed_out,
            output,
            host,
        })
    }

    /// Runs `code` in `prepared` (fresh, or a context's kept runtime); `host` performs its
    /// tool calls.
    pub fn eval_prepared(
        &self,
        prepared: &Prepared,
        code: &str,
        timeout: Duration,
        host: Arc<dyn Host>,
    ) -> EvalOutcome {
        let started = Instant::now();
        let mut outcome = self.eval_in(prepared, code, started + timeout, host);
        outcome.duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome
    }

    fn eval_inner(&self, code: &str, deadline: Instant, host: Arc<dyn Host>) -> EvalOutcome {
        match self.prepare() {
            Ok(prepared) => self.eval_in(&prepared, code, deadline, host),
            Err(err) => EvalOutcome::failed(EvalErrorKind::Engine, err),
        }
    }

    fn eval_in(
        &self,
        prepared: &Prepared,
        code: &str,
        deadline: Instant,
        host: Arc<dyn Host>,
    ) -> EvalOutcome {
        let Prepared {
            runtime,
            context,
            deadline: current,
            timed_out,
            output,
            host: slot,
        } = prepared;
        current.set(deadline);
        timed_out.set(false);
        *slot.borrow_mut() = host;
        output.take();
        let mut outcome = context.with(|ctx| {
            // A script whose value is a promise (an async function's) is run to its end.
            let evaluated: rquickjs::Result<Value> =
                ctx.eval(code)
                    .and_then(|value: Value| match value.as_promise() {
                        Some(promise) => promise.finish::<Value>(),
                        None => Ok(value),
                    });
            let value = match CaughtError::catch(&ctx, evaluated) {
                Ok(value) => value,
                Err(caught) => {
                    return EvalOutcome::failed(EvalErrorKind::Exception, caught.to_string());
                }
            };
            match ctx.json_stringify(value) {
                // `undefined` and functions have no JSON form: no result.
                Ok(None) => EvalOutcome::ok(None),
                Ok(Some(json)) => match json.to_string() {
                    Ok(text) => EvalOutcome::ok(serde_json::from_str(&text).ok()),
                    Err(err) => EvalOutcome::failed(EvalErrorKind::Engine, err.to_string()),
                },
                Err(err) => {
                    let caught = CaughtError::from_error(&ctx, err);
                    EvalOutcome::failed(EvalErrorKind::Exception, caught.to_string())
                }
            }
        });
        // The connection's host is not kept past its evaluation.
        *slot.borrow_mut() = Arc::new(NoHost);
        if let Some(error) = outcome.error.as_mut() {
            if timed_out.get() {
                error.kind = EvalErrorKind::Timeout;
                error.message = "the timeout passed; the script was interrupted".into();
            } else if error.message.contains("out of memory") || self.near_limit(runtime) {
                error.kind = EvalErrorKind::MemoryLimit;
                error.message = format!(
                    "the memory limit of {} bytes was reached",
                    self.memory_bytes
                );
            }
        }
        let output = output.take();
        if output.overflowed && outcome.error.is_none() {
            outcome.result = None;
            outcome.error = Some(crate::wire::EvalError {
                kind: EvalErrorKind::OutputLimit,
                message: format!("output past {} bytes was dropped", self.output_cap),
            });
        }
        outcome.stdout = output.stdout;
        outcome.stderr = output.stderr;
        outcome
    }
}

impl JsEngine {
    /// QuickJS throws `null` when it cannot even allocate the out-of-memory error; the heap's
    /// size then tells a refused allocation from a script's own `throw null`.
    fn near_limit(&self, runtime: &Runtime) -> bool {
        let used = u64::try_from(runtime.memory_usage().malloc_size).unwrap_or(0);
        used.saturating_mul(2) >= self.memory_bytes
    }
}

/// The host half of `fetch`: one HTTP request through the egress proxy, or a TypeError.
fn install_fetch<'js>(
    ctx: &Ctx<'js>,
    proxy: Option<crate::fetch::Network>,
    deadline: Deadline,
) -> rquickjs::Result<()> {
    let http = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>,
              method: String,
              url: String,
              headers: String,
              body: Option<String>|
              -> rquickjs::Result<Vec<String>> {
            let Some(proxy) = &proxy else {
                return Err(rquickjs::Exception::throw_type(
                    &ctx,
                    "fetch: this sandbox has no network (its policy needs `network: proxy` and egress rules)",
                ));
            };
            let headers: std::collections::BTreeMap<String, String> =
                serde_json::from_str(&headers).unwrap_or_default();
            let fetched = crate::fetch::fetch(
                proxy,
                &method,
                &url,
                &headers,
                body.as_deref(),
                deadline.get(),
            );
            match fetched {
                Ok(fetched) => Ok(vec![
                    fetched.status.to_string(),
                    serde_json::to_string(&fetched.headers).unwrap_or_default(),
                    fetched.body,
                ]),
                Err(message) => Err(rquickjs::Exception::throw_type(&ctx, &message)),
            }
        },
    )?;
    ctx.globals().set("__airlock_http", http)?;
    ctx.eval::<(), _>(FETCH_GLUE)
}

/// `tools.NAME(args)`: the call goes to `host`; the guest waits, and the wait is added to its
/// deadline (it is not the guest's time).
fn install_tools<'js>(
    ctx: &Ctx<'js>,
    names: &[String],
    host: HostSlot,
    deadline: Deadline,
) -> rquickjs::Result<()> {
    let known = names.to_vec();
    let call = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>, name: String, args: String| -> rquickjs::Result<String> {
            let throw = |message: &str| Err(rquickjs::Exception::throw_message(&ctx, message));
            if let Err(message) = check_tool(&known, &name) {
                return throw(&message);
            }
            let args = serde_json::from_str(&args).unwrap_or(serde_json::Value::Null);
            let asked = Instant::now();
            let host = host.borrow().clone();
            let answer = host.call_tool(&name, args);
            deadline.set(deadline.get() + asked.elapsed());
            match answer {
                Ok(value) => Ok(value.to_string()),
                Err(message) => throw(&format!("tool {name}: {message}")),
            }
        },
    )?;
    ctx.globals().set("__airlock_tool", call)?;
    let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".to_owned());
    let install: Function = ctx.eval(TOOLS_GLUE)?;
    install.call::<_, ()>((ctx.json_parse(names)?,))
}

/// `console.log/info/debug` to stdout, `console.error/warn` to stderr; arguments joined by spaces.
fn install_console<'js>(
    ctx: &Ctx<'js>,
    output: &Rc<RefCell<Output>>,
    cap: usize,
) -> rquickjs::Result<()> {
    let console = Object::new(ctx.clone())?;
    for (name, to_stderr) in [
        ("log", false),
        ("info", false),
        ("debug", false),
        ("error", true),
        ("warn", true),
    ] {
        let output = output.clone();
        let function = Function::new(ctx.clone(), move |args: Rest<Coerced<String>>| {
            let line: Vec<String> = args.0.into_iter().map(|arg| arg.0).collect();
            output.borrow_mut().push(to_stderr, &line.join(" "), cap);
        })?;
        console.set(name, function)?;
    }
    ctx.globals().set("console", console)
}
