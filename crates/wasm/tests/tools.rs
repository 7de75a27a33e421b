//! Tool calls and Python's `fetch` through the worker binary: the test is the caller (the
//! daemon's part), answering each `tool_call` line on the evaluation's connection. Needs the
//! guest modules (scripts/wasm-guests.sh).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

struct Worker {
    child: Child,
    addr: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn worker(args: &[&str], proxy: Option<&str>) -> Worker {
    let mut command = Command::new(env!("CARGO_BIN_EXE_airlock-wasm"));
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .stdout(Stdio::piped());
    if let Some(proxy) = proxy {
        command.env("HTTP_PROXY", proxy);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the worker: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("no ready line: {e}"));
    let addr = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("the worker did not start (scripts/wasm-guests.sh?): {line:?}"))
        .trim()
        .to_owned();
    Worker { child, addr }
}

/// One evaluation; `answer` gives each tool call's result line (`None`: the test expected no
/// call). Returns the calls seen and the outcome.
fn eval(
    worker: &Worker,
    language: &str,
    code: &str,
    timeout_ms: u64,
    mut answer: impl FnMut(&Value) -> Value,
) -> (Vec<Value>, Value) {
    let stream = TcpStream::connect(&worker.addr).unwrap_or_else(|e| panic!("connect: {e}"));
    let mut writer = stream.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let mut reader = BufReader::new(stream);
    let request = json!({"language": language, "code": code, "timeout_ms": timeout_ms});
    writeln!(writer, "{request}").unwrap_or_else(|e| panic!("write: {e}"));
    let mut calls = Vec::new();
    loop {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("read: {e}"));
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
        let Some(call) = value.get("tool_call") else {
            return (calls, value);
        };
        let result = answer(call);
        calls.push(call.clone());
        writeln!(writer, "{}", json!({ "tool_result": result }))
            .unwrap_or_else(|e| panic!("write: {e}"));
    }
}

/// `add` sums `a` and `b`; `fail` fails; anything else is a test failure.
fn tools(call: &Value) -> Value {
    match call["name"].as_str() {
        Some("add") => {
            let sum =
                call["args"]["a"].as_i64().unwrap_or(0) + call["args"]["b"].as_i64().unwrap_or(0);
            json!({"status": "ok", "value": {"sum": sum}})
        }
        Some("fail") => json!({"status": "error", "message": "the upstream said no"}),
        other => panic!("unexpected tool call {other:?}"),
    }
}

fn error_message(outcome: &Value) -> String {
    outcome["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[test]
fn test_tools_javascript_call_reaches_the_caller_and_returns_its_value() {
    let worker = worker(&["--no-python", "--tool", "add", "--tool", "fail"], None);
    let (calls, outcome) = eval(
        &worker,
        "javascript",
        "(async () => { const a = await tools.add({a: 2, b: 3}); const b = await tools.add({a: a.sum, b: 10}); return [a.sum, b.sum, Object.keys(tools)]; })()",
        5_000,
        tools,
    );
    assert_eq!(outcome["error"], Value::Null, "{outcome}");
    assert_eq!(outcome["result"], json!([5, 15, ["add", "fail"]]));
    assert_eq!(
        calls,
        vec![
            json!({"name": "add", "args": {"a": 2, "b": 3}}),
            json!({"name": "add", "args": {"a": 5, "b": 10}}),
        ]
    );
    let (_, failed) = eval(
        &worker,
        "javascript",
        "(async () => { try { await tools.fail(1); } catch (e) { return String(e.message); } })()",
        5_000,
        tools,
    );
    assert_eq!(
        failed["result"], "tool fail: the upstream said no",
        "{failed}"
    );
    // A name that is not a binding never reaches the caller.
    let (calls, unknown) = eval(&worker, "javascript", "typeof tools.rm", 5_000, tools);
    assert_eq!((calls.len(), &unknown["result"]), (0, &json!("undefined")));
}

#[test]
fn test_tools_python_call_reaches_the_caller_and_returns_its_value() {
    let worker = worker(&["--tool", "add", "--tool", "fail"], None);
    let (calls, outcome) = eval(
        &worker,
        "python",
        "import airlock\nprint('before')\nfirst = tools.add({'a': 2, 'b': 3})\nsecond = airlock.tools.add(a=first['sum'], b=10)\nprint('after')\n[first['sum'], second['sum'], sorted(dir(tools))]",
        10_000,
        tools,
    );
    assert_eq!(outcome["error"], Value::Null, "{outcome}");
    assert_eq!(outcome["result"], json!([5, 15, ["add", "fail"]]));
    // The call frames are taken out of the output; the snippet's own lines stay.
    assert_eq!(outcome["stdout"], "before\nafter\n");
    assert_eq!(
        calls,
        vec![
            json!({"name": "add", "args": {"a": 2, "b": 3}}),
            json!({"name": "add", "args": {"a": 5, "b": 10}}),
        ]
    );
    let (_, failed) = eval(
        &worker,
        "python",
        "try:\n    tools.fail()\nexcept ToolError as e:\n    r = str(e)\nr",
        10_000,
        tools,
    );
    assert_eq!(
        failed["result"], "tool fail: the upstream said no",
        "{failed}"
    );
    let (calls, unknown) = eval(&worker, "python", "tools.rm('/')", 10_000, tools);
    assert_eq!(calls.len(), 0);
    assert!(
        error_message(&unknown).contains("no tool 'rm'"),
        "{unknown}"
    );
}

#[test]
fn test_tools_wait_for_an_answer_is_not_charged_to_the_timeout() {
    let worker = worker(&["--tool", "add"], None);
    for language in ["javascript", "python"] {
        let code = if language == "python" {
            "tools.add({'a': 1, 'b': 1})['sum']"
        } else {
            "(async () => (await tools.add({a: 1, b: 1})).sum)()"
        };
        // The answer comes after more than the whole timeout: the guest was suspended.
        let (_, outcome) = eval(&worker, language, code, 1_000, |call| {
            std::thread::sleep(Duration::from_millis(1_500));
            tools(call)
        });
        assert_eq!(outcome["error"], Value::Null, "{language}: {outcome}");
        assert_eq!(outcome["result"], 2, "{language}: {outcome}");
    }
}

/// A stand-in for the egress proxy: answers one absolute-form request with a JSON body and
/// hands back the request line it saw.
fn one_shot_proxy() -> (String, std::thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap_or_else(|e| panic!("{e}"));
        let mut reader = BufReader::new(stream.try_clone().unwrap_or_else(|e| panic!("{e}")));
        let mut first = String::new();
        reader.read_line(&mut first).unwrap_or_default();
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).unwrap_or_default();
            if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if header.trim().is_empty() {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap_or_default();
        let answer = format!("{{\"got\": {:?}}}", String::from_utf8_lossy(&body));
        let _ = write!(
            &stream,
            "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        first
    });
    (format!("http://{addr}"), handle)
}

#[test]
fn test_tools_python_fetch_goes_through_the_proxy() {
    let (proxy, seen) = one_shot_proxy();
    let online = worker(&[], Some(&proxy));
    let (calls, outcome) = eval(
        &online,
        "python",
        "r = fetch('http://upstream.test/items?x=1', method='post', body='hello')\n[r.status, r.ok, r.json(), r.headers['content-type']]",
        10_000,
        tools,
    );
    assert_eq!(calls.len(), 0, "fetch is the worker's, not a tool");
    assert_eq!(outcome["error"], Value::Null, "{outcome}");
    assert_eq!(
        outcome["result"],
        json!([201, true, {"got": "hello"}, "application/json"])
    );
    let request_line = seen.join().unwrap_or_default();
    assert_eq!(
        request_line.trim_end(),
        "POST http://upstream.test/items?x=1 HTTP/1.1"
    );

    let offline = worker(&[], None);
    let (_, refused) = eval(
        &offline,
        "python",
        "fetch('http://upstream.test/')",
        10_000,
        tools,
    );
    assert!(error_message(&refused).contains("no network"), "{refused}");
}

fn in_context(worker: &Worker, language: &str, context: &str, code: &str) -> Value {
    let request =
        json!({"language": language, "code": code, "timeout_ms": 10_000, "context_id": context});
    send(worker, &request)
}

fn send(worker: &Worker, request: &Value) -> Value {
    let mut stream = TcpStream::connect(&worker.addr).unwrap_or_else(|e| panic!("connect: {e}"));
    writeln!(stream, "{request}").unwrap_or_else(|e| panic!("write: {e}"));
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .unwrap_or_else(|e| panic!("read: {e}"));
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("bad answer {answer:?}: {e}"))
}

#[test]
fn test_contexts_keep_state_per_context_in_both_languages() {
    let worker = worker(&[], None);
    for (language, define, read, missing) in [
        (
            "python",
            "counter = 41\nprint('defined')",
            "counter += 1\ncounter",
            "is not defined",
        ),
        (
            "javascript",
            "var counter = 41; console.log('defined')",
            "++counter",
            "is not defined",
        ),
    ] {
        let defined = in_context(&worker, language, "first", define);
        assert_eq!(defined["error"], Value::Null, "{language}: {defined}");
        assert_eq!(defined["stdout"], "defined\n", "{language}: {defined}");
        let read_back = in_context(&worker, language, "first", read);
        assert_eq!(read_back["result"], 42, "{language}: {read_back}");
        // The cell's own output only, not the earlier cell's.
        assert_eq!(read_back["stdout"], "", "{language}: {read_back}");
        let other = in_context(&worker, language, "second", read);
        assert!(
            error_message(&other).contains(missing),
            "{language}: {other}"
        );
        // A fresh evaluation sees no context's state.
        let fresh = send(&worker, &json!({"language": language, "code": read}));
        assert!(
            error_message(&fresh).contains(missing),
            "{language}: {fresh}"
        );
        let again = in_context(&worker, language, "first", read);
        assert_eq!(again["result"], 43, "{language}: {again}");
    }
    // Dropping a context forgets both languages' state.
    let dropped = send(&worker, &json!({"drop_context": "first"}));
    assert_eq!(dropped["error"], Value::Null, "{dropped}");
    for (language, read, missing) in [
        ("python", "counter", "is not defined"),
        ("javascript", "counter", "is not defined"),
    ] {
        let gone = in_context(&worker, language, "first", read);
        assert!(error_message(&gone).contains(missing), "{language}: {gone}");
    }
}

#[test]
fn test_contexts_python_timeout_ends_the_kept_instance() {
    let worker = worker(&[], None);
    assert_eq!(
        in_context(&worker, "python", "c", "x = 1")["error"],
        Value::Null
    );
    let stopped = send(
        &worker,
        &json!({"language": "python", "code": "while True: pass", "timeout_ms": 300, "context_id": "c"}),
    );
    assert_eq!(stopped["error"]["kind"], "timeout", "{stopped}");
    assert!(
        error_message(&stopped).contains("state is lost"),
        "{stopped}"
    );
    let after = in_context(&worker, "python", "c", "x");
    assert!(error_message(&after).contains("NameError"), "{after}");
    // An exception does not end it.
    assert_eq!(
        in_context(&worker, "python", "c", "y = 2")["error"],
        Value::Null
    );
    let raised = in_context(&worker, "python", "c", "1 / 0");
    assert_eq!(raised["error"]["kind"], "exception", "{raised}");
    assert_eq!(in_context(&worker, "python", "c", "y")["result"], 2);
}
