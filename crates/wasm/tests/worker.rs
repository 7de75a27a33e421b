//! The worker binary as the daemon uses it: `serve` on loopback, one request line per
//! connection. Needs the guest modules (scripts/wasm-guests.sh).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

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

fn worker(args: &[&str]) -> Worker {
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-wasm"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .stdout(Stdio::piped())
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

impl Worker {
    fn send(&self, request: &Value) -> Value {
        let mut stream = TcpStream::connect(&self.addr).unwrap_or_else(|e| panic!("connect: {e}"));
        let mut line = serde_json::to_vec(request).unwrap_or_else(|e| panic!("{e}"));
        line.push(b'\n');
        stream
            .write_all(&line)
            .unwrap_or_else(|e| panic!("write: {e}"));
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("read: {e}"));
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("bad answer {answer:?}: {e}"))
    }

    fn eval(&self, language: &str, code: &str) -> Value {
        self.send(&json!({"language": language, "code": code}))
    }
}

fn error_kind(outcome: &Value) -> &str {
    outcome["error"]["kind"].as_str().unwrap_or("none")
}

#[test]
fn test_worker_javascript_snippet_returns_result_and_console() {
    let worker = worker(&["--no-python"]);
    let outcome = worker.eval(
        "javascript",
        "console.log('sum', 1 + 2); ({n: [1, 2, 3].map(x => x * 2)})",
    );
    assert_eq!(outcome["error"], Value::Null, "{outcome}");
    assert_eq!(outcome["result"], json!({"n": [2, 4, 6]}));
    assert_eq!(outcome["stdout"], "sum 3\n");
    let thrown = worker.eval("javascript", "throw new TypeError('nope')");
    assert_eq!(error_kind(&thrown), "exception", "{thrown}");
    assert!(
        thrown["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("nope")
    );
}

#[test]
fn test_worker_javascript_has_no_ambient_authority() {
    let worker = worker(&["--no-python"]);
    for name in [
        "require",
        "process",
        "std",
        "os",
        "XMLHttpRequest",
        "__airlock_http",
    ] {
        let outcome = worker.eval("javascript", &format!("typeof {name}"));
        assert_eq!(outcome["result"], "undefined", "{name}: {outcome}");
    }
    // `fetch` exists but, with no egress proxy in the environment, reaches nothing.
    let outcome = worker.eval(
        "javascript",
        "(async () => (await fetch('http://example.com/')).status)()",
    );
    assert_eq!(error_kind(&outcome), "exception", "{outcome}");
    assert!(
        outcome["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("no network"),
        "{outcome}"
    );
}

#[test]
fn test_worker_serve_confines_itself_with_seccomp() {
    let worker = worker(&["--no-python"]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", worker.child.id()))
        .unwrap_or_else(|e| panic!("{e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(
        field("Seccomp:"),
        "2",
        "a seccomp filter is installed: {status}"
    );
    // Still serves under it (threads are created with clone, not clone3).
    assert_eq!(worker.eval("javascript", "'ok'")["result"], "ok");
}

#[test]
fn test_worker_javascript_snippets_share_no_state() {
    let worker = worker(&["--no-python"]);
    // Set-then-read pairs: each connection thread keeps its own made-ahead isolate, so a read
    // lands both on the thread that served the set and on another one.
    for round in 0..6 {
        let set = worker.eval(
            "javascript",
            "globalThis.leaked = 41; var declared = 1; Object.prototype.polluted = 1; \
             console.log('set'); 'set'",
        );
        assert_eq!(set["result"], "set", "round {round}: {set}");
        let read = worker.eval(
            "javascript",
            "[typeof leaked, typeof declared, ({}).polluted === undefined]",
        );
        assert_eq!(
            read["result"],
            json!(["undefined", "undefined", true]),
            "round {round}: {read}"
        );
        // Nor is the earlier snippet's output carried over.
        assert_eq!(read["stdout"], "", "round {round}: {read}");
    }
}

#[test]
fn test_worker_javascript_limits_hold_in_every_fresh_isolate() {
    let worker = worker(&["--no-python", "--memory-bytes", "33554432"]);
    // More rounds than there are made-ahead isolates: every one has the limits installed.
    for round in 0..4 {
        let looped =
            worker.send(&json!({"language": "javascript", "code": "for(;;){}", "timeout_ms": 200}));
        assert_eq!(error_kind(&looped), "timeout", "round {round}: {looped}");
        let bomb = worker.eval(
            "javascript",
            "let a = []; for (;;) { a.push(new Array(4096).fill(7)); }",
        );
        assert_eq!(error_kind(&bomb), "memory_limit", "round {round}: {bomb}");
    }
}

#[test]
fn test_worker_javascript_async_result_is_awaited() {
    let worker = worker(&["--no-python"]);
    let outcome = worker.eval(
        "javascript",
        "(async () => { await null; return {done: true}; })()",
    );
    assert_eq!(outcome["result"], json!({"done": true}), "{outcome}");
    let rejected = worker.eval("javascript", "Promise.reject(new Error('later'))");
    assert_eq!(error_kind(&rejected), "exception", "{rejected}");
}

#[test]
fn test_worker_javascript_infinite_loop_stops_at_timeout() {
    let worker = worker(&["--no-python"]);
    let outcome =
        worker.send(&json!({"language": "javascript", "code": "for(;;){}", "timeout_ms": 200}));
    assert_eq!(error_kind(&outcome), "timeout", "{outcome}");
    // The worker still serves.
    assert_eq!(worker.eval("javascript", "6 * 7")["result"], 42);
}

#[test]
fn test_worker_javascript_memory_bomb_stops_at_limit() {
    let worker = worker(&["--no-python", "--memory-bytes", "33554432"]);
    let outcome = worker.eval(
        "javascript",
        "let a = []; for (;;) { a.push(new Array(4096).fill(7)); }",
    );
    assert_eq!(error_kind(&outcome), "memory_limit", "{outcome}");
    assert_eq!(worker.eval("javascript", "1 + 1")["result"], 2);
}

#[test]
fn test_worker_javascript_output_past_cap_is_refused() {
    let python = worker(&["--output-cap-bytes", "1000"]);
    let flooded = python.eval("python", "for _ in range(100): print('x' * 100)");
    assert_eq!(error_kind(&flooded), "output_limit", "{flooded}");
    let worker = worker(&["--no-python", "--output-cap-bytes", "1000"]);
    let outcome = worker.eval(
        "javascript",
        "for (let i = 0; i < 1000; i++) console.log('xxxxxxxxxx'); 1",
    );
    assert_eq!(error_kind(&outcome), "output_limit", "{outcome}");
    assert!(outcome["stdout"].as_str().unwrap_or("").len() <= 1000);
}

#[test]
fn test_worker_request_with_unknown_field_is_invalid() {
    let worker = worker(&["--no-python"]);
    let outcome = worker.send(&json!({"language": "javascript", "code": "1", "shell": true}));
    assert_eq!(error_kind(&outcome), "invalid", "{outcome}");
    let outcome = worker.send(&json!({"language": "javascript", "code": "1", "timeout_ms": 0}));
    assert_eq!(error_kind(&outcome), "invalid", "{outcome}");
    let outcome = worker.eval("python", "1");
    assert_eq!(
        error_kind(&outcome),
        "invalid",
        "a JS-only worker: {outcome}"
    );
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-wasm-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    dir
}

#[test]
fn test_worker_python_snippet_returns_last_expression() {
    let worker = worker(&[]);
    let outcome = worker.eval(
        "python",
        "import json, sys\nprint('v', sys.version_info[:2])\n{'sum': sum(range(10))}",
    );
    assert_eq!(outcome["error"], Value::Null, "{outcome}");
    assert_eq!(outcome["result"], json!({"sum": 45}));
    assert_eq!(outcome["stdout"], "v (3, 12)\n");
    let raised = worker.eval("python", "raise ValueError('bad value')");
    assert_eq!(error_kind(&raised), "exception", "{raised}");
    assert_eq!(raised["error"]["message"], "ValueError: bad value");
    let exited = worker.eval("python", "import sys; sys.exit(3)");
    assert_eq!(error_kind(&exited), "exit", "{exited}");
}

#[test]
fn test_worker_python_instances_share_no_state() {
    let worker = worker(&[]);
    assert_eq!(
        worker.eval("python", "import builtins; builtins.leak = 1; 1")["result"],
        1
    );
    let second = worker.eval("python", "import builtins; hasattr(builtins, 'leak')");
    assert_eq!(second["result"], false, "{second}");
}

#[test]
fn test_worker_python_infinite_loop_stops_at_timeout() {
    let worker = worker(&[]);
    let outcome =
        worker.send(&json!({"language": "python", "code": "while True: pass", "timeout_ms": 300}));
    assert_eq!(error_kind(&outcome), "timeout", "{outcome}");
    assert_eq!(worker.eval("python", "2 + 3")["result"], 5);
}

#[test]
fn test_worker_python_memory_bomb_stops_at_limit() {
    let worker = worker(&["--memory-bytes", "134217728"]);
    let outcome = worker.eval(
        "python",
        "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))",
    );
    assert_eq!(error_kind(&outcome), "memory_limit", "{outcome}");
    assert_eq!(worker.eval("python", "'alive'")["result"], "alive");
}

#[test]
fn test_worker_python_sees_only_its_preopens() {
    let ro = scratch("ro");
    let rw = scratch("rw");
    std::fs::write(ro.join("in.txt"), "from the host").unwrap_or_else(|e| panic!("{e}"));
    let ro_arg = format!("{}:/data:ro", ro.display());
    let rw_arg = format!("{}:/workspace:rw", rw.display());
    let worker = worker(&["--preopen", &ro_arg, "--preopen", &rw_arg]);
    assert_eq!(
        worker.eval("python", "open('/data/in.txt').read()")["result"],
        "from the host"
    );
    let written = worker.eval(
        "python",
        "open('/workspace/out.txt', 'w').write('from the guest')",
    );
    assert_eq!(written["result"], 14, "{written}");
    assert_eq!(
        std::fs::read_to_string(rw.join("out.txt")).unwrap_or_default(),
        "from the guest"
    );
    for (code, why) in [
        (
            "open('/etc/passwd').read()",
            "a host path outside the preopens",
        ),
        (
            "open('/workspace/../../../etc/passwd').read()",
            "a `..` path out of a preopen",
        ),
        (
            "open('/data/new.txt', 'w')",
            "a write into a read-only preopen",
        ),
        ("import os; os.listdir('/')", "the root"),
        (
            "import os; os.symlink('/etc', '/workspace/etc'); open('/workspace/etc/passwd').read()",
            "a symlink out",
        ),
    ] {
        let outcome = worker.eval("python", code);
        if code.contains("listdir") {
            // The root lists only the preopens' names, never the host's entries.
            let names = outcome["result"].as_array().cloned().unwrap_or_default();
            assert!(
                names.iter().all(|n| n == "data" || n == "workspace"),
                "{why}: {outcome}"
            );
            continue;
        }
        assert_eq!(error_kind(&outcome), "exception", "{why}: {outcome}");
    }
    assert!(!ro.join("new.txt").exists());
    assert!(Path::new("/etc/passwd").exists());
    let _ = std::fs::remove_dir_all(&ro);
    let _ = std::fs::remove_dir_all(&rw);
}

#[test]
fn test_worker_python_has_no_sockets_or_processes() {
    let worker = worker(&[]);
    for code in [
        "import socket; socket.create_connection(('127.0.0.1', 1))",
        "import subprocess; subprocess.run(['true'])",
        "import os; os.system('true')",
    ] {
        let outcome = worker.eval("python", code);
        assert_eq!(error_kind(&outcome), "exception", "{code}: {outcome}");
    }
}
