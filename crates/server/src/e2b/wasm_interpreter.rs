//! E2B's code interpreter (port 49999) on a wasm sandbox, answered by the daemon: no Jupyter
//! kernel runs there. Each context is an evaluation context of the sandbox's worker (a kept
//! CPython instance or QuickJS runtime), so state survives between `run_code` calls in one
//! context and two contexts share nothing. `POST /execute` is one evaluation (audited like any
//! other), answered as the protocol's NDJSON lines; `/contexts` creates, lists, restarts
//! and removes contexts; `/health` is `"OK"`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use airlock_api::v1::{EvalErrorKind, EvalLanguage, EvalRequest, EvalResponse};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::http::{Body, full, json_response, with_type};
use crate::lifecycle::Daemon;

/// The largest request body read.
const MAX_BODY_BYTES: usize = 4 << 20;
/// An execution's timeout: the protocol has none (the client's own timeout closes the
/// connection), so the longest a cell may run before the worker stops it.
const EXECUTE_TIMEOUT_MS: u64 = 60_000;
/// How long setting or restoring a cell's `env_vars` may take.
const ENV_STEP_TIMEOUT_MS: u64 = 10_000;
/// The working directory contexts report: the preopened workspace.
const CWD: &str = "/workspace";

/// One context of one sandbox.
#[derive(Debug, Clone)]
struct Context {
    id: String,
    language: EvalLanguage,
    executions: u64,
}

/// The daemon's contexts by sandbox id (the kept instances themselves live in the sandbox's
/// worker); a sandbox's go when it ends.
#[derive(Debug, Default)]
pub struct CodeContexts(Mutex<HashMap<String, Vec<Context>>>);

impl CodeContexts {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Context>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every context of sandbox `id` (it ended).
    pub fn forget_sandbox(&self, id: &str) {
        self.lock().remove(id);
    }
}

fn contexts(daemon: &Daemon) -> MutexGuard<'_, HashMap<String, Vec<Context>>> {
    daemon.code_contexts.lock()
}

fn text(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    with_type(status, "text/plain", full(message.into()))
}

fn language_name(language: EvalLanguage) -> &'static str {
    match language {
        EvalLanguage::Python => "python",
        EvalLanguage::Javascript => "javascript",
    }
}

/// E2B's language names on this tier: python (the default) and javascript.
fn language_of(name: Option<&str>) -> Result<EvalLanguage, String> {
    match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("python" | "python3" | "") => Ok(EvalLanguage::Python),
        Some("javascript" | "js") => Ok(EvalLanguage::Javascript),
        Some(other) => Err(format!(
            "language {other:?} is not available on the wasm tier (python or javascript)"
        )),
    }
}

/// Serves one request for port 49999 of wasm sandbox `id`.
pub async fn serve(
    daemon: &Arc<Daemon>,
    id: &str,
    parts: &Parts,
    body: Incoming,
) -> Response<Body> {
    let Ok(collected) = http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
    else {
        return text(StatusCode::BAD_REQUEST, "cannot read the request body");
    };
    let bytes = collected.to_bytes();
    let json_body = || -> Result<Value, Refusal> {
        if bytes.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            )
        })
    };
    let path = parts.uri.path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match (&parts.method, segments.as_slice()) {
        (&Method::GET, ["health"]) => json_response(StatusCode::OK, &"OK"),
        (&Method::POST, ["contexts"]) => match json_body() {
            Ok(request) => create_context(daemon, id, &request),
            Err((status, message)) => text(status, message),
        },
        (&Method::GET, ["contexts"]) => {
            let listed: Vec<Value> = contexts(daemon)
                .get(id)
                .into_iter()
                .flatten()
                .map(info)
                .collect();
            json_response(StatusCode::OK, &listed)
        }
        (&Method::POST, ["contexts", context, "restart"]) => {
            forget(daemon, id, context, false).await
        }
        (&Method::DELETE, ["contexts", context]) => forget(daemon, id, context, true).await,
        (&Method::POST, ["execute"]) => match json_body() {
            Ok(request) => execute(daemon, id, &request).await,
            Err((status, message)) => text(status, message),
        },
        (_, ["health" | "execute" | "contexts"] | ["contexts", _] | ["contexts", _, "restart"]) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        }
        _ => text(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn info(context: &Context) -> Value {
    json!({"id": context.id, "language": language_name(context.language), "cwd": CWD})
}

/// A refused request: its status and plain-text message.
type Refusal = (StatusCode, String);

fn not_found(context: &str) -> Refusal {
    (
        StatusCode::NOT_FOUND,
        format!("Context {context} not found"),
    )
}

fn create_context(daemon: &Arc<Daemon>, id: &str, request: &Value) -> Response<Body> {
    let language = match language_of(request["language"].as_str()) {
        Ok(language) => language,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let Ok(suffix) = crate::auth::new_sandbox_id() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot make a context id",
        );
    };
    let context = Context {
        id: format!("ctx-{}", suffix.trim_start_matches("sbx-")),
        language,
        executions: 0,
    };
    let answer = info(&context);
    contexts(daemon)
        .entry(id.to_owned())
        .or_default()
        .push(context);
    json_response(StatusCode::OK, &answer)
}

/// Restart (`remove: false`) or remove a context; either way its kept instances end.
async fn forget(daemon: &Arc<Daemon>, id: &str, context: &str, remove: bool) -> Response<Body> {
    let known = contexts(daemon)
        .get(id)
        .is_some_and(|list| list.iter().any(|c| c.id == context));
    if !known {
        let (status, message) = not_found(context);
        return text(status, message);
    }
    if let Err(err) = daemon.drop_eval_context(id, context).await {
        return text(StatusCode::BAD_GATEWAY, err.message);
    }
    if remove && let Some(list) = contexts(daemon).get_mut(id) {
        list.retain(|c| c.id != context);
    }
    json_response(StatusCode::OK, &Value::Null)
}

/// The context an execution runs in: the named one, or the language's default one.
fn context_for(daemon: &Daemon, id: &str, request: &Value) -> Result<Context, Refusal> {
    let named = request["context_id"].as_str();
    let language = request["language"].as_str();
    if named.is_some() && language.is_some() {
        return Err((
            StatusCode::BAD_REQUEST,
            "Only one of context_id or language can be provided".to_owned(),
        ));
    }
    let mut all = contexts(daemon);
    let list = all.entry(id.to_owned()).or_default();
    let context = match named {
        Some(named) => list
            .iter_mut()
            .find(|c| c.id == named)
            .ok_or_else(|| not_found(named))?,
        None => {
            let language = language_of(language).map_err(|m| (StatusCode::BAD_REQUEST, m))?;
            let default = format!("default-{}", language_name(language));
            if !list.iter().any(|c| c.id == default) {
                list.push(Context {
                    id: default.clone(),
                    language,
                    executions: 0,
                });
            }
            list.iter_mut()
                .find(|c| c.id == default)
                .ok_or_else(|| not_found(&default))?
        }
    };
    context.executions += 1;
    Ok(context.clone())
}

async fn execute(daemon: &Arc<Daemon>, id: &str, request: &Value) -> Response<Body> {
    let Some(code) = request["code"].as_str() else {
        return text(StatusCode::BAD_REQUEST, "code is required");
    };
    let env_vars = match env_vars(request) {
        Ok(vars) => vars,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let context = match context_for(daemon, id, request) {
        Ok(context) => context,
        Err((status, message)) => return text(status, message),
    };
    if !env_vars.is_empty() && context.language != EvalLanguage::Python {
        return text(
            StatusCode::BAD_REQUEST,
            "env_vars are not available for JavaScript on the wasm tier (QuickJS has no process environment)",
        );
    }
    let eval = EvalRequest {
        language: context.language,
        code: code.to_owned(),
        timeout_ms: Some(EXECUTE_TIMEOUT_MS),
        context_id: Some(context.id.clone()),
    };
    let answer = match with_env(daemon, id, &context, &env_vars, &eval).await {
        Ok(answer) => answer,
        Err(err) => return text(StatusCode::BAD_GATEWAY, err.message),
    };
    daemon.audit_eval(id, &eval, &answer);
    let mut body = Vec::new();
    for line in lines(&context, &answer) {
        body.extend_from_slice(line.to_string().as_bytes());
        body.push(b'\n');
    }
    with_type(StatusCode::OK, "application/x-ndjson", full(body))
}

/// The request's `env_vars` (names to string values; absent or null is none).
fn env_vars(request: &Value) -> Result<serde_json::Map<String, Value>, String> {
    match &request["env_vars"] {
        Value::Null => Ok(serde_json::Map::new()),
        Value::Object(vars) => {
            if let Some((name, _)) = vars.iter().find(|(_, value)| !value.is_string()) {
                return Err(format!("env_vars: the value of {name:?} is not a string"));
            }
            Ok(vars.clone())
        }
        _ => Err("env_vars must be an object of names to strings".to_owned()),
    }
}

/// A Python expression for the JSON object `vars`.
fn python_json(vars: &Value) -> String {
    // A JSON string is also a Python string literal.
    let literal = serde_json::to_string(&vars.to_string()).unwrap_or_default();
    format!("__import__('json').loads({literal})")
}

/// Evaluates `eval` with `vars` set in the Python guest's `os.environ` for it alone, as a
/// Jupyter kernel applies a cell's `env_vars`: a step in the same context sets them and
/// answers the values they replace, and a step after the cell puts those back.
async fn with_env(
    daemon: &Arc<Daemon>,
    id: &str,
    context: &Context,
    vars: &serde_json::Map<String, Value>,
    eval: &EvalRequest,
) -> Result<EvalResponse, crate::error::ApiError> {
    if vars.is_empty() {
        return daemon.eval(id, eval).await;
    }
    let step = |code: String| EvalRequest {
        language: EvalLanguage::Python,
        code,
        timeout_ms: Some(ENV_STEP_TIMEOUT_MS),
        context_id: Some(context.id.clone()),
    };
    let set = step(format!(
        "(lambda os, new: [{{k: os.environ.get(k) for k in new}}, os.environ.update(new)][0])(__import__('os'), {})",
        python_json(&Value::Object(vars.clone()))
    ));
    let replaced = daemon.eval(id, &set).await?;
    if let Some(error) = replaced.error {
        return Err(crate::error::ApiError::internal(format!(
            "cannot set env_vars in the context: {}",
            error.message
        )));
    }
    let answer = daemon.eval(id, eval).await;
    let previous = replaced.result.unwrap_or(Value::Null);
    let restore = step(format!(
        "(lambda os, old: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v) for k, v in old.items()] and None)(__import__('os'), {})",
        python_json(&previous)
    ));
    // Best effort: a cell that timed out ended the instance, and its environment with it.
    let _ = daemon.eval(id, &restore).await;
    answer
}

/// The protocol's lines for one evaluation's answer.
fn lines(context: &Context, answer: &EvalResponse) -> Vec<Value> {
    let now = crate::e2b::time::format_ms(now_ms());
    let mut lines =
        vec![json!({"type": "number_of_executions", "execution_count": context.executions})];
    if !answer.stdout.is_empty() {
        lines.push(json!({"type": "stdout", "text": answer.stdout, "timestamp": now}));
    }
    match &answer.error {
        None => {
            if !answer.stderr.is_empty() {
                lines.push(json!({"type": "stderr", "text": answer.stderr, "timestamp": now}));
            }
            if let Some(value) = answer.result.as_ref().filter(|v| !v.is_null()) {
                let text = match context.language {
                    EvalLanguage::Python => python_text(value),
                    EvalLanguage::Javascript => js_text(value),
                };
                lines.push(
                    json!({"type": "result", "is_main_result": true, "text": text,
                    "json": value, "extra": {}}),
                );
            }
        }
        Some(error) => {
            let (name, value, traceback) = match error.kind {
                EvalErrorKind::Exception => split_exception(&error.message, &answer.stderr),
                EvalErrorKind::Timeout => (
                    "TimeoutError".to_owned(),
                    error.message.clone(),
                    String::new(),
                ),
                EvalErrorKind::MemoryLimit => (
                    "MemoryError".to_owned(),
                    error.message.clone(),
                    String::new(),
                ),
                EvalErrorKind::OutputLimit => (
                    "OutputLimitError".to_owned(),
                    error.message.clone(),
                    String::new(),
                ),
                EvalErrorKind::Exit => (
                    "SystemExit".to_owned(),
                    error.message.clone(),
                    String::new(),
                ),
                EvalErrorKind::Invalid | EvalErrorKind::Engine => (
                    "EngineError".to_owned(),
                    error.message.clone(),
                    String::new(),
                ),
            };
            lines.push(
                json!({"type": "error", "name": name, "value": value, "traceback": traceback}),
            );
        }
    }
    lines.push(json!({"type": "end_of_execution"}));
    lines
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `Name: value` (Python's last traceback line, QuickJS's first line) into its parts; the
/// traceback is Python's stderr, or the rest of QuickJS's message (its stack).
fn split_exception(message: &str, stderr: &str) -> (String, String, String) {
    let (first, rest) = message.split_once('\n').unwrap_or((message, ""));
    let (name, value) = match first.split_once(": ") {
        Some((name, value)) if !name.contains(' ') => (name.to_owned(), value.to_owned()),
        _ => ("Error".to_owned(), first.to_owned()),
    };
    let traceback = if stderr.trim().is_empty() {
        rest.to_owned()
    } else {
        stderr.to_owned()
    };
    (name, value, traceback)
}

/// The value as Python's `repr` would show it (a string's quotes left out, as E2B's `text`).
fn python_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => python_repr(other),
    }
}

fn python_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Number(number) => number.to_string(),
        Value::String(text) => format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_repr).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("'{k}': {}", python_repr(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

fn js_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_env_vars_take_string_values_only() {
        let vars = env_vars(&json!({"env_vars": {"A": "1", "B": "x\n'\\"}})).unwrap();
        assert_eq!(vars.len(), 2);
        assert!(env_vars(&json!({})).unwrap().is_empty());
        let err = env_vars(&json!({"env_vars": {"A": 1}})).unwrap_err();
        assert!(err.contains("\"A\""), "{err}");
        assert!(env_vars(&json!({"env_vars": ["A"]})).is_err());
        // The object reaches Python as a string literal, whatever the values hold.
        assert_eq!(
            python_json(&json!({"B": "x\n'"})),
            r#"__import__('json').loads("{\"B\":\"x\\n'\"}")"#
        );
    }

    #[test]
    fn test_python_text_matches_repr_for_json_values() {
        let value = json!({"a": [1, 2.5, null, true, "x'y"]});
        assert_eq!(
            python_text(&value),
            r#"{'a': [1, 2.5, None, True, 'x\'y']}"#
        );
        assert_eq!(python_text(&json!("plain")), "plain");
    }

    #[test]
    fn test_split_exception_takes_name_value_and_traceback() {
        let (name, value, traceback) = split_exception(
            "NameError: name 'x' is not defined",
            "Traceback ...\nNameError: ...\n",
        );
        assert_eq!(
            (name.as_str(), value.as_str()),
            ("NameError", "name 'x' is not defined")
        );
        assert!(traceback.starts_with("Traceback"));
        let (name, value, traceback) = split_exception("Error: boom\n    at <eval>", "");
        assert_eq!(
            (name.as_str(), value.as_str(), traceback.as_str()),
            ("Error", "boom", "    at <eval>")
        );
    }
}
