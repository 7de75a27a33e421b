//! The wasm column: the attacks that apply to a wasm guest (filesystem, network, resource
//! exhaustion, processes, control plane), written as JavaScript and Python snippets and run in
//! the wasm worker (`airlock-wasm serve`, self-confined, with a read-write and a read-only
//! preopen) exactly as the daemon runs it. Each must be blocked. The catalog's other cases run
//! the native `airlock-probe`, which a wasm guest cannot run, and are reported n/a.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use anyhow::Context;
use serde_json::{Value, json};

/// One attack: its snippet and what a blocked outcome looks like.
struct WasmCase {
    id: &'static str,
    title: &'static str,
    language: &'static str,
    code: &'static str,
    timeout_ms: u64,
    /// Blocked when the error kind is one of these, or (for `result`) the result equals it.
    blocked_kinds: &'static [&'static str],
    blocked_result: Option<fn() -> Value>,
}

const CASES: &[WasmCase] = &[
    WasmCase {
        id: "fs.host-file",
        title: "read a host file outside the preopens",
        language: "python",
        code: "open('/etc/passwd').read()",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "fs.dotdot",
        title: "leave a preopen with ..",
        language: "python",
        code: "open('/workspace/../../etc/passwd').read()",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "fs.symlink",
        title: "leave a preopen through a symlink",
        language: "python",
        code: "import os\nos.symlink('/etc', '/workspace/out')\nopen('/workspace/out/passwd').read()",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "fs.write-ro",
        title: "write into a read-only preopen",
        language: "python",
        code: "open('/data/planted', 'w').write('x')",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "fs.root",
        title: "see anything of the host's root",
        language: "python",
        code: "import os\nsorted(set(os.listdir('/')) - {'workspace', 'data'})",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: Some(|| json!([])),
    },
    WasmCase {
        id: "ctl.sockets",
        title: "reach the agent's or the daemon's socket, /proc or /sys",
        language: "python",
        code: "import os\n[p for p in ['/run/airlock', '/var/lib/airlock', '/proc/self', '/sys', '/dev'] if os.path.exists(p)]",
        timeout_ms: 5000,
        blocked_kinds: &[],
        blocked_result: Some(|| json!([])),
    },
    WasmCase {
        id: "net.socket",
        title: "open a TCP socket",
        language: "python",
        code: "import socket\nsocket.create_connection(('127.0.0.1', 1))",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "net.fetch",
        title: "fetch without an egress proxy",
        language: "javascript",
        code: "(async () => (await fetch('http://example.com/')).status)()",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "proc.subprocess",
        title: "start a process",
        language: "python",
        code: "import subprocess\nsubprocess.run(['/bin/true'])",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
    WasmCase {
        id: "proc.js-host",
        title: "reach a host object (require, process, std, os)",
        language: "javascript",
        code: "[typeof require, typeof process, typeof std, typeof os].every(t => t === 'undefined')",
        timeout_ms: 5000,
        blocked_kinds: &[],
        blocked_result: Some(|| json!(true)),
    },
    WasmCase {
        id: "res.memory-py",
        title: "exhaust memory (Python)",
        language: "python",
        code: "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))",
        timeout_ms: 20000,
        blocked_kinds: &["memory_limit"],
        blocked_result: None,
    },
    WasmCase {
        id: "res.memory-js",
        title: "exhaust memory (JavaScript)",
        language: "javascript",
        code: "let a = []; for (;;) a.push(new Array(4096).fill(7));",
        timeout_ms: 20000,
        blocked_kinds: &["memory_limit"],
        blocked_result: None,
    },
    WasmCase {
        id: "res.cpu-py",
        title: "spin forever (Python)",
        language: "python",
        code: "while True: pass",
        timeout_ms: 300,
        blocked_kinds: &["timeout"],
        blocked_result: None,
    },
    WasmCase {
        id: "res.cpu-js",
        title: "spin forever (JavaScript)",
        language: "javascript",
        code: "for (;;) {}",
        timeout_ms: 300,
        blocked_kinds: &["timeout"],
        blocked_result: None,
    },
    WasmCase {
        id: "res.output",
        title: "flood the output",
        language: "python",
        code: "import sys\nfor _ in range(64): sys.stdout.write('x' * (1 << 16))",
        timeout_ms: 20000,
        blocked_kinds: &["output_limit"],
        blocked_result: None,
    },
    WasmCase {
        id: "res.stack",
        title: "overflow the host stack by recursion",
        language: "javascript",
        code: "function f() { return f() + 1; } f()",
        timeout_ms: 5000,
        blocked_kinds: &["exception"],
        blocked_result: None,
    },
];

/// Runs the wasm column; `Ok(false)` when any case was not blocked.
pub fn run(catalog_cases: usize) -> anyhow::Result<bool> {
    let exe = std::env::current_exe()?;
    let binary = std::env::var_os("AIRLOCK_WASM_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| exe.with_file_name("airlock-wasm"));
    let scratch = std::env::temp_dir().join(format!("airlock-seceval-wasm-{}", std::process::id()));
    let (workspace, data) = (scratch.join("workspace"), scratch.join("data"));
    std::fs::create_dir_all(&workspace)?;
    std::fs::create_dir_all(&data)?;
    let mut child = Command::new(&binary)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--memory-bytes",
            "134217728",
        ])
        .arg("--preopen")
        .arg(format!("{}:/workspace:rw", workspace.display()))
        .arg("--preopen")
        .arg(format!("{}:/data:ro", data.display()))
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let result = (|| -> anyhow::Result<bool> {
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
        let addr = line
            .strip_prefix("listening ")
            .context("the wasm worker did not start (scripts/wasm-guests.sh installs its guest)")?
            .trim()
            .to_owned();
        println!("\nwasm tier (isolates in the wasm worker)");
        let mut all_blocked = true;
        let mut blocked_count = 0;
        for case in CASES {
            let mut stream = TcpStream::connect(&addr)?;
            let mut request = serde_json::to_vec(&json!({
                "language": case.language, "code": case.code, "timeout_ms": case.timeout_ms,
            }))?;
            request.push(b'\n');
            stream.write_all(&request)?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            let outcome: Value = serde_json::from_str(&answer)
                .with_context(|| format!("{}: the worker answered {answer:?}", case.id))?;
            let kind = outcome["error"]["kind"].as_str().unwrap_or("none");
            let blocked = case.blocked_kinds.contains(&kind)
                || case
                    .blocked_result
                    .is_some_and(|want| outcome["error"].is_null() && outcome["result"] == want());
            all_blocked &= blocked;
            blocked_count += usize::from(blocked);
            let verdict = if blocked { "blocked" } else { "ALLOWED" };
            println!("  {:<18} {verdict:<8} {} ({kind})", case.id, case.title);
        }
        let planted = data.join("planted").exists();
        all_blocked &= !planted;
        println!(
            "  {} cases blocked of {}; the catalog's {catalog_cases} native cases are n/a: they run the airlock-probe binary, and a wasm guest runs no native code (the worker itself runs inside the process tier's jail, whose column covers them)",
            blocked_count,
            CASES.len()
        );
        Ok(all_blocked)
    })();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
