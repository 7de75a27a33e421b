//! The MCP tools. Each takes one JSON object (its schema generated from the struct) and
//! answers one text item of compact JSON with the same value as structured content; `run_code`
//! adds the images a run produced as MCP image content.

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_api::v1::{CreateSandboxRequest, ExecEvent, ExecRequest, PauseMode, SandboxState};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hyper::{Method, StatusCode};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use serde_json::{Value, json};

use super::AirlockMcp;
use super::args::*;
use crate::client::{Client, ClientError};
use crate::lifecycle::{INTERPRETER_PORT, INTERPRETER_TEMPLATE};

type ToolResult = Result<CallToolResult, ErrorData>;

/// Where background commands' output is kept, per pid, for `process_output`.
const BACKGROUND_DIR: &str = "/tmp/.airlock-mcp";

fn ok(value: Value) -> ToolResult {
    Ok(CallToolResult::structured(value))
}

fn failed(code: &str, message: impl Into<String>) -> ToolResult {
    Ok(CallToolResult::structured_error(
        json!({"code": code, "message": message.into()}),
    ))
}

fn client_failed(err: &ClientError) -> ToolResult {
    let code = err.code().map_or("agent_error", |c| c.as_str());
    let message = match err {
        ClientError::Api { message, .. } => message.clone(),
        other => {
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    };
    failed(code, message)
}

macro_rules! attempt {
    ($call:expr) => {
        match $call {
            Ok(value) => value,
            Err(err) => return client_failed(&err),
        }
    };
}

/// The sandbox a tool call names, or a fresh one of `template` (then `true`: the call removes
/// it when done).
async fn named_or_fresh(
    client: &Client,
    named: Option<&str>,
    template: &str,
) -> Result<(String, bool), ClientError> {
    if let Some(id) = named {
        return Ok((id.to_owned(), false));
    }
    let request = CreateSandboxRequest {
        template: Some(template.to_owned()),
        ..CreateSandboxRequest::default()
    };
    Ok((client.create(&request).await?.sandbox.id, true))
}

fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A shell word for `/bin/sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

fn state(text: &str) -> Option<SandboxState> {
    serde_json::from_value(Value::String(text.to_owned())).ok()
}

/// One finished command: its output as text, its status.
async fn command(client: &Client, id: &str, request: &ExecRequest) -> Result<Value, ClientError> {
    let output = client.exec_collect(id, request).await?;
    Ok(json!({
        "pid": output.pid,
        "stdout": String::from_utf8_lossy(&output.stdout),
        "stderr": String::from_utf8_lossy(&output.stderr),
        "exit_code": output.exit_code,
        "exited": output.exited,
        "oom_killed": output.oom_killed,
    }))
}

fn shell(command: String) -> ExecRequest {
    ExecRequest {
        shell: Some(command),
        ..ExecRequest::default()
    }
}

#[tool_router(router = tool_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        description = "One computer-use action on a desktop sandbox's screen (template desktop): screenshot (answers the PNG as image content), click, double_click, move, drag, scroll, type, key, cursor_position, screen_size, clipboard_get, clipboard_set. Coordinates are screen pixels."
    )]
    async fn computer(
        &self,
        Parameters(args): Parameters<ComputerArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        // The flat arguments become the API's tagged action, which refuses what does not fit.
        let action =
            match serde_json::from_value::<airlock_api::v1::ComputerAction>(to_value(&args)) {
                Ok(action) => action,
                Err(err) => {
                    return failed(
                        "invalid_request",
                        format!("action {:?}: {err}", args.action),
                    );
                }
            };
        let client = self.client_for(&context);
        let result = attempt!(client.computer(&args.sandbox_id, &action).await);
        match result {
            airlock_api::v1::ComputerResult::Screenshot {
                png_base64,
                width_px,
                height_px,
            } => {
                let mut answer = CallToolResult::structured(json!({
                    "result": "screenshot", "width_px": width_px, "height_px": height_px,
                    "png": "(an image content item)",
                }));
                answer
                    .content
                    .push(ContentBlock::image(png_base64, "image/png"));
                Ok(answer)
            }
            other => ok(to_value(&other)),
        }
    }

    #[tool(
        description = "Create a sandbox and answer its id. Template code-interpreter-v1 serves run_code."
    )]
    async fn sandbox_create(
        &self,
        Parameters(args): Parameters<CreateArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let mut request = CreateSandboxRequest {
            template: args.template,
            timeout_ms: args.timeout_s.map(|s| s.saturating_mul(1000)),
            env: args.env,
            metadata: args.metadata,
            ..CreateSandboxRequest::default()
        };
        request.resources.memory_bytes = args.memory_mib.map(|m| m.saturating_mul(1 << 20));
        let created = attempt!(client.create(&request).await);
        ok(to_value(&created.sandbox))
    }

    #[tool(
        description = "List sandboxes, optionally only those in one state.",
        annotations(read_only_hint = true)
    )]
    async fn sandbox_list(
        &self,
        Parameters(args): Parameters<ListArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let states = match args.state.as_deref() {
            None => Vec::new(),
            Some(text) => match state(text) {
                Some(state) => vec![state],
                None => return failed("invalid_request", format!("unknown state {text:?}")),
            },
        };
        let listed = attempt!(
            self.client_for(&context)
                .list(&states, &BTreeMap::new())
                .await
        );
        ok(json!({ "sandboxes": to_value(&listed) }))
    }

    #[tool(
        description = "A sandbox's state, template, limits, metadata and expiry.",
        annotations(read_only_hint = true)
    )]
    async fn sandbox_info(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let sandbox = attempt!(self.client_for(&context).get(&args.sandbox_id).await);
        ok(to_value(&sandbox))
    }

    #[tool(
        description = "Kill a sandbox: its processes end and its files are removed.",
        annotations(destructive_hint = true)
    )]
    async fn sandbox_kill(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        attempt!(self.client_for(&context).delete(&args.sandbox_id).await);
        ok(json!({ "killed": args.sandbox_id }))
    }

    #[tool(description = "Pause a sandbox (its processes are frozen).")]
    async fn sandbox_pause(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let sandbox = attempt!(
            self.client_for(&context)
                .pause(&args.sandbox_id, PauseMode::Frozen)
                .await
        );
        ok(to_value(&sandbox))
    }

    #[tool(description = "Resume a paused sandbox.")]
    async fn sandbox_resume(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let sandbox = attempt!(
            self.client_for(&context)
                .resume(&args.sandbox_id, None)
                .await
        );
        ok(to_value(&sandbox))
    }

    #[tool(description = "Set how long from now a sandbox lives.")]
    async fn sandbox_set_timeout(
        &self,
        Parameters(args): Parameters<TimeoutArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let sandbox = attempt!(
            client
                .set_timeout(&args.sandbox_id, args.timeout_s.saturating_mul(1000))
                .await
        );
        ok(to_value(&sandbox))
    }

    #[tool(
        description = "Evaluate a JavaScript or Python snippet in a fresh wasm-tier isolate (no shell, no processes): result as JSON, stdout, stderr, error."
    )]
    async fn eval(
        &self,
        Parameters(args): Parameters<EvalArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        use airlock_api::v1::{EvalLanguage, EvalRequest};
        let client = self.client_for(&context);
        let template = match args.language {
            EvalLanguage::Javascript => crate::lifecycle::WASM_JS_TEMPLATE,
            EvalLanguage::Python => crate::lifecycle::WASM_PYTHON_TEMPLATE,
        };
        let (id, fresh) =
            attempt!(named_or_fresh(&client, args.sandbox_id.as_deref(), template).await);
        let request = EvalRequest {
            language: args.language,
            code: args.code,
            timeout_ms: args.timeout_ms,
            context_id: None,
        };
        let answer = client.eval(&id, &request).await;
        if fresh {
            let _ = client.delete(&id).await;
        }
        ok(to_value(&attempt!(answer)))
    }

    #[tool(
        description = "Run code in a Jupyter kernel (E2B's run_code): stdout, stderr, results (images as image content), error with traceback."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let (id, fresh) = attempt!(
            named_or_fresh(&client, args.sandbox_id.as_deref(), INTERPRETER_TEMPLATE).await
        );
        let result = execute(&client, &id, &args).await;
        if fresh {
            let _ = client.delete(&id).await;
        }
        result
    }

    #[tool(
        description = "Run a shell command (sh -c) in a sandbox: its output and exit code, or with background its pid at once."
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommandArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let mut request = shell(args.command.clone());
        request.cwd = args.cwd;
        request.env = args.env;
        request.timeout_ms = args.timeout_s.map(|s| s.saturating_mul(1000));
        request.stdin_base64 = args.stdin.map(|text| BASE64.encode(text));
        if !args.background {
            return ok(attempt!(command(&client, &args.sandbox_id, &request).await));
        }
        // The command's output goes to a file named by its shell's pid.
        request.shell = Some(format!(
            "mkdir -p {BACKGROUND_DIR} && exec >{BACKGROUND_DIR}/$$.out 2>&1 && exec /bin/sh -c {}",
            quote(&args.command)
        ));
        let mut stream = attempt!(client.exec(&args.sandbox_id, &request).await);
        match attempt!(stream.next_event().await) {
            // The command outlives this stream (envd's rule).
            Some(ExecEvent::Start { pid }) => ok(json!({ "pid": pid, "background": true })),
            other => failed(
                "agent_error",
                format!("the command did not start: {other:?}"),
            ),
        }
    }

    #[tool(
        description = "The output so far of a background command (stdout and stderr interleaved), and whether it still runs.",
        annotations(read_only_hint = true)
    )]
    async fn process_output(
        &self,
        Parameters(args): Parameters<ProcessArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let pid = args.pid;
        let output = match client
            .read_file(&args.sandbox_id, &format!("{BACKGROUND_DIR}/{pid}.out"))
            .await
        {
            Ok(output) => output,
            // Just started: its shell has not opened the file yet.
            Err(err) if err.code() == Some(airlock_api::v1::ErrorCode::NotFound) => Vec::new(),
            Err(err) => return client_failed(&err),
        };
        let probe = attempt!(
            command(
                &client,
                &args.sandbox_id,
                &shell(format!("kill -0 {pid} 2>/dev/null"))
            )
            .await
        );
        ok(json!({
            "pid": pid,
            "output": String::from_utf8_lossy(&output),
            "running": probe["exit_code"] == 0,
        }))
    }

    #[tool(
        description = "Kill a command by its pid (SIGKILL).",
        annotations(destructive_hint = true)
    )]
    async fn process_kill(
        &self,
        Parameters(args): Parameters<ProcessArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let done = attempt!(
            command(
                &client,
                &args.sandbox_id,
                &shell(format!("kill -9 {}", args.pid))
            )
            .await
        );
        if done["exit_code"] != 0 {
            return failed(
                "not_found",
                format!(
                    "no process {} to kill: {}",
                    args.pid,
                    done["stderr"].as_str().unwrap_or("").trim()
                ),
            );
        }
        ok(json!({ "killed": args.pid }))
    }

    #[tool(description = "Read a file.", annotations(read_only_hint = true))]
    async fn file_read(
        &self,
        Parameters(args): Parameters<ReadArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let bytes = attempt!(
            self.client_for(&context)
                .read_file(&args.sandbox_id, &args.path)
                .await
        );
        let content = match args.encoding {
            Some(Encoding::Base64) => BASE64.encode(&bytes),
            _ => String::from_utf8_lossy(&bytes).into_owned(),
        };
        ok(json!({ "path": args.path, "size_bytes": bytes.len(), "content": content }))
    }

    #[tool(description = "Write a file (created or replaced, parent directories made).")]
    async fn file_write(
        &self,
        Parameters(args): Parameters<WriteArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let bytes = match args.encoding {
            Some(Encoding::Base64) => match BASE64.decode(&args.content) {
                Ok(bytes) => bytes,
                Err(err) => {
                    return failed("invalid_request", format!("content is not base64: {err}"));
                }
            },
            _ => args.content.into_bytes(),
        };
        let entry = attempt!(
            self.client_for(&context)
                .write_file(&args.sandbox_id, &args.path, bytes)
                .await
        );
        ok(to_value(&entry))
    }

    #[tool(
        description = "Replace text in a file: `old` must occur once, or every occurrence with replace_all."
    )]
    async fn file_edit(
        &self,
        Parameters(args): Parameters<EditArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        let bytes = attempt!(client.read_file(&args.sandbox_id, &args.path).await);
        let Ok(text) = String::from_utf8(bytes) else {
            return failed("unprocessable", format!("{} is not UTF-8 text", args.path));
        };
        let count = text.matches(&args.old).count();
        if args.old.is_empty() || count == 0 || (count > 1 && !args.replace_all) {
            let why = if count > 1 {
                format!("occurs {count} times (give replace_all)")
            } else {
                "does not occur".to_owned()
            };
            return failed(
                "unprocessable",
                format!("the old text {why} in {}", args.path),
            );
        }
        let edited = text.replace(&args.old, &args.new);
        attempt!(
            client
                .write_file(&args.sandbox_id, &args.path, edited.into_bytes())
                .await
        );
        ok(json!({ "path": args.path, "replacements": count }))
    }

    #[tool(description = "List a directory.", annotations(read_only_hint = true))]
    async fn file_list(
        &self,
        Parameters(args): Parameters<ListDirArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let listed = attempt!(
            self.client_for(&context)
                .list_dir(&args.sandbox_id, &args.path, args.depth.unwrap_or(1))
                .await
        );
        ok(to_value(&listed))
    }

    #[tool(
        description = "A file's kind, size, mode and owner.",
        annotations(read_only_hint = true)
    )]
    async fn file_stat(
        &self,
        Parameters(args): Parameters<PathArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let entry = attempt!(
            self.client_for(&context)
                .stat(&args.sandbox_id, &args.path)
                .await
        );
        ok(to_value(&entry))
    }

    #[tool(description = "Make a directory and its parents.")]
    async fn file_mkdir(
        &self,
        Parameters(args): Parameters<PathArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let entry = attempt!(
            self.client_for(&context)
                .mkdir(&args.sandbox_id, &args.path)
                .await
        );
        ok(to_value(&entry))
    }

    #[tool(description = "Move or rename a file or directory.")]
    async fn file_move(
        &self,
        Parameters(args): Parameters<MoveArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let entry = attempt!(
            self.client_for(&context)
                .rename(&args.sandbox_id, &args.source, &args.destination)
                .await
        );
        ok(to_value(&entry))
    }

    #[tool(
        description = "Remove a file or a directory with its contents.",
        annotations(destructive_hint = true)
    )]
    async fn file_remove(
        &self,
        Parameters(args): Parameters<PathArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        attempt!(
            self.client_for(&context)
                .remove(&args.sandbox_id, &args.path)
                .await
        );
        ok(json!({ "removed": args.path }))
    }

    #[tool(
        description = "Find files under a directory by name glob and/or content regex.",
        annotations(read_only_hint = true)
    )]
    async fn file_search(
        &self,
        Parameters(args): Parameters<SearchArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let mut line = format!("find {} -type f", quote(&args.path));
        if let Some(glob) = &args.name_glob {
            line.push_str(&format!(" -name {}", quote(glob)));
        }
        if let Some(regex) = &args.content_regex {
            line.push_str(&format!(" -exec grep -l -E -e {} {{}} +", quote(regex)));
        }
        let done =
            attempt!(command(&self.client_for(&context), &args.sandbox_id, &shell(line)).await);
        let paths: Vec<&str> = done["stdout"].as_str().unwrap_or("").lines().collect();
        if done["exit_code"] != 0 && paths.is_empty() {
            return failed(
                "not_found",
                done["stderr"].as_str().unwrap_or("").trim().to_owned(),
            );
        }
        ok(json!({ "paths": paths }))
    }

    #[tool(
        description = "How to reach a port of a sandbox over HTTP: the daemon's URL and the routing headers.",
        annotations(read_only_hint = true)
    )]
    async fn sandbox_url(
        &self,
        Parameters(args): Parameters<UrlArgs>,
        context: RequestContext<RoleServer>,
    ) -> ToolResult {
        let client = self.client_for(&context);
        attempt!(client.get(&args.sandbox_id).await);
        ok(json!({
            "url": client.base_url(),
            "headers": {"E2b-Sandbox-Id": args.sandbox_id, "E2b-Sandbox-Port": args.port.to_string()},
        }))
    }
}

/// `POST /execute` on the sandbox's port 49999 through the daemon's data plane; the lines
/// folded into one answer. Past the timeout the request is dropped, which interrupts the kernel.
async fn execute(client: &Client, id: &str, args: &RunCodeArgs) -> ToolResult {
    let body = json!({
        "code": args.code,
        "language": args.language,
        "context_id": args.context_id,
        "env_vars": (!args.env.is_empty()).then_some(&args.env),
    });
    let port = INTERPRETER_PORT.to_string();
    let headers = [
        ("content-type", "application/json"),
        ("e2b-sandbox-id", id),
        ("e2b-sandbox-port", port.as_str()),
    ];
    let timeout = Duration::from_secs(args.timeout_s.unwrap_or(300).max(1));
    let call = client.raw(Method::POST, "/execute", &headers, body.to_string());
    let (status, _, answer) = match tokio::time::timeout(timeout, call).await {
        Ok(result) => attempt!(result),
        Err(_) => {
            return failed(
                "timeout",
                format!(
                    "the execution ran past {} s and was interrupted",
                    timeout.as_secs()
                ),
            );
        }
    };
    let text = String::from_utf8_lossy(&answer);
    if status != StatusCode::OK {
        let code = match status.as_u16() {
            404 => "not_found",
            400 | 422 => "invalid_request",
            502 => "agent_error",
            _ => "internal",
        };
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| text.trim().to_owned());
        return failed(code, format!("sandbox {id}: {message}"));
    }
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let (mut results, mut images, mut error, mut count) =
        (Vec::new(), Vec::new(), Value::Null, Value::Null);
    for line in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        match line["type"].as_str().unwrap_or("") {
            "stdout" => stdout.push_str(line["text"].as_str().unwrap_or("")),
            "stderr" => stderr.push_str(line["text"].as_str().unwrap_or("")),
            "number_of_executions" => count = line["execution_count"].clone(),
            "error" => {
                error = json!({"name": line["name"], "value": line["value"], "traceback": line["traceback"]})
            }
            "result" => {
                let mut result = line;
                if let Some(fields) = result.as_object_mut() {
                    fields.remove("type");
                    for (field, mime) in [("png", "image/png"), ("jpeg", "image/jpeg")] {
                        if let Some(Value::String(data)) = fields.remove(field) {
                            images.push(ContentBlock::image(data, mime));
                            fields.insert(field.to_owned(), json!("(an image content item)"));
                        }
                    }
                }
                results.push(result);
            }
            _ => {}
        }
    }
    let value = json!({
        "sandbox_id": id, "stdout": stdout, "stderr": stderr, "results": results,
        "error": error, "execution_count": count,
    });
    let mut answer = CallToolResult::structured(value);
    answer.content.extend(images);
    Ok(answer)
}
