//! `airlock bench start --tier wasm`: start-to-result of a JavaScript and a Python snippet in
//! the wasm worker (`airlock-wasm serve`, a fresh isolate per evaluation, over loopback TCP as
//! the daemon's tunnel reaches it), beside the process tier's full cycle (create, run,
//! teardown) of `/bin/true` and of `/usr/bin/python3 -c` the same Python snippet, interleaved
//! in one run and reported as ratios.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_api::SandboxConfig;
use airlock_runtime::Runtime;
use anyhow::Context;

use crate::percentile;

const JS_SNIPPET: &str = "[1, 2, 3].map(x => x * 2).reduce((a, b) => a + b)";
/// No output: the process tier's workload writes to the bench's own stdout.
const PY_SNIPPET: &str = "x = sum(i * i for i in range(1000))";
const JS: &str = "wasm: JavaScript (QuickJS)";
const PY: &str = "wasm: Python (CPython WASI)";
const PROCESS_TRUE: &str = "process tier: /bin/true";
const PROCESS_PY: &str = "process tier: python3 -c";

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

impl Worker {
    fn start() -> anyhow::Result<Worker> {
        let exe = std::env::current_exe().context("cannot find airlock's own path")?;
        let binary = std::env::var_os("AIRLOCK_WASM_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| exe.with_file_name("airlock-wasm"));
        let mut child = Command::new(&binary)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start {} (cargo build -p airlock-wasm)",
                    binary.display()
                )
            })?;
        let stdout = child.stdout.take().context("the worker has no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .strip_prefix("listening ")
            .context("the worker did not start (scripts/wasm-guests.sh installs its guest)")?
            .trim()
            .to_owned();
        Ok(Worker { child, addr })
    }

    /// One evaluation, request to parsed answer.
    fn eval(&self, language: &str, code: &str) -> anyhow::Result<()> {
        let mut stream = TcpStream::connect(&self.addr)?;
        stream.set_nodelay(true)?;
        let mut line =
            serde_json::to_vec(&serde_json::json!({"language": language, "code": code}))?;
        line.push(b'\n');
        stream.write_all(&line)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        let answer: serde_json::Value = serde_json::from_slice(&answer)?;
        anyhow::ensure!(
            answer["error"].is_null(),
            "the {language} snippet failed: {answer}"
        );
        Ok(())
    }
}

pub fn start(iterations: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 10, "--iterations must be at least 10");
    let worker = Worker::start()?;
    let runtime = Runtime::new()?;
    let run = |argv: &[&str]| -> anyhow::Result<()> {
        let config = SandboxConfig::new(argv.iter().map(|a| (*a).to_owned()).collect());
        let outcome = runtime.run(&config, None, |_| {})?;
        anyhow::ensure!(
            outcome.exit_code() == 0,
            "{argv:?} failed: {:?}",
            outcome.ending
        );
        Ok(())
    };
    let python = std::path::Path::new("/usr/bin/python3").is_file();
    let mut samples: Vec<(&str, Vec<Duration>)> = vec![
        (JS, Vec::new()),
        (PY, Vec::new()),
        (PROCESS_TRUE, Vec::new()),
    ];
    if python {
        samples.push((PROCESS_PY, Vec::new()));
    }
    for round in 0..iterations + 5 {
        for (name, times) in &mut samples {
            let started = Instant::now();
            match *name {
                JS => worker.eval("javascript", JS_SNIPPET)?,
                PY => {
                    worker.eval("python", PY_SNIPPET)?;
                }
                PROCESS_TRUE => run(&["/bin/true"])?,
                _ => run(&["/usr/bin/python3", "-c", PY_SNIPPET])?,
            }
            if round >= 5 {
                times.push(started.elapsed());
            }
            // The next Python instance initialises in the background after an evaluation; a
            // caller that waits no time at all measures that start instead (see the README).
            if *name == PY {
                std::thread::sleep(Duration::from_millis(400));
            }
        }
    }
    println!(
        "{:<30} {:>9} {:>9} {:>9}",
        "contender", "p50 ms", "p95 ms", "p99 ms"
    );
    let mut p50s = Vec::new();
    for (name, times) in &mut samples {
        times.sort();
        let p50 = percentile(times, 50);
        println!(
            "{name:<30} {p50:>9.3} {:>9.3} {:>9.3}",
            percentile(times, 95),
            percentile(times, 99)
        );
        p50s.push((*name, p50));
    }
    let p50 = |wanted: &str| p50s.iter().find(|(n, _)| *n == wanted).map(|(_, v)| *v);
    if let (Some(js), Some(process)) = (p50(JS), p50(PROCESS_TRUE)) {
        let verdict = if js <= 1.0 && process / js >= 10.0 {
            "meets"
        } else {
            "misses"
        };
        println!(
            "JS p50 {js:.3} ms; process tier / JS (p50): {:.1}x ({verdict} the <= 1 ms and >= 10x target)",
            process / js
        );
    }
    if let (Some(py), Some(process)) = (p50(PY), p50(PROCESS_PY)) {
        let verdict = if py / process <= 0.5 {
            "meets"
        } else {
            "misses"
        };
        println!(
            "ratio wasm Python / process tier python3 -c (p50): {:.2}x ({verdict} the <= 0.5x target)",
            py / process
        );
    }
    Ok(ExitCode::SUCCESS)
}
