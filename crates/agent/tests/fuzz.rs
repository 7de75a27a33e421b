//! Bounded, deterministic mutation fuzzing of the agent's input handling that runs on stable
//! Rust: the Connect framing, every RPC's JSON messages and the file API's paths, through the
//! invariants of `airlock_agent::fuzzing`, which the cargo-fuzz targets in `crates/agent/fuzz`
//! check too (libFuzzer needs `cargo fuzz` and its own instrumented build; this needs neither).
//!
//! Each target first replays every input kept in `fuzz/regressions/<target>/` (inputs that once
//! broke an invariant), then mutates its seeds with a fixed-seed generator.
//! `AIRLOCK_FUZZ_ITERATIONS` bounds the run (default 3000 per target); `AIRLOCK_FUZZ_SEED`
//! picks another deterministic sequence.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use airlock_agent::fuzzing::{Rng, connect_framing, file_paths, json_messages, mutate};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    inputs.sort();
    inputs
}

fn fuzz(target: &str, check: fn(&[u8]), seeds: &[&[u8]], dictionary: &[&[u8]]) {
    for (name, input) in regressions(target) {
        if std::panic::catch_unwind(|| check(&input)).is_err() {
            panic!("{target}: the kept regression input {name} breaks an invariant again");
        }
    }
    let iterations = env_number("AIRLOCK_FUZZ_ITERATIONS", 3000);
    let mut rng = Rng::new(env_number("AIRLOCK_FUZZ_SEED", 0xa9e7_f022) ^ target.len() as u64);
    let mut input = seeds[0].to_vec();
    for i in 0..iterations {
        if i % 3 == 0 {
            input = seeds[rng.below(seeds.len())].to_vec();
        }
        input = mutate(&input, seeds, dictionary, &mut rng);
        if std::panic::catch_unwind(|| check(&input)).is_err() {
            panic!(
                "{target}, iteration {i}: an invariant broke on this input (keep it in fuzz/regressions/{target}/):\n{:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}

const JSON_DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"\"\\u0000\"",
    b"\"process\"",
    b"\"cmd\"",
    b"\"args\"",
    b"\"envs\"",
    b"\"cwd\"",
    b"\"pty\"",
    b"\"size\"",
    b"\"cols\"",
    b"\"rows\"",
    b"\"pid\"",
    b"\"tag\"",
    b"\"input\"",
    b"\"stdin\"",
    b"\"signal\"",
    b"\"SIGNAL_SIGKILL\"",
    b"\"path\"",
    b"\"source\"",
    b"\"destination\"",
    b"\"depth\"",
    b"\"recursive\"",
    b"\"watcherId\"",
    b"\"18446744073709551616\"",
    b"\"aGk=\"",
    b"\"-_8\"",
];

#[test]
fn test_fuzz_connect_framing() {
    let seeds: &[&[u8]] = &[
        b"\x00\x00\x00\x00\x02{}",
        b"\x00\x00\x00\x00\x0d{\"pid\": 7}\x02\x00\x00\x00\x02{}",
        b"\x01\x00\x00\x00\x02{}",
        b"\x00\xff\xff\xff\xff",
        b"",
    ];
    fuzz(
        "connect_framing",
        connect_framing,
        seeds,
        &[b"\x00", b"\x01", b"\x02", b"\xff", b"{}"],
    );
}

#[test]
fn test_fuzz_json_messages() {
    let seeds: &[&[u8]] = &[
        br#"{"process":{"cmd":"/bin/sh","args":["-c","echo hi"],"envs":{"A":"b"},"cwd":"/tmp"},"pty":{"size":{"cols":80,"rows":24}},"tag":"t"}"#,
        br#"{"process":{"pid":12},"signal":"SIGNAL_SIGKILL"}"#,
        br#"{"process":{"tag":"t"},"input":{"stdin":"aGk="}}"#,
        br#"{"path":"~/x","depth":"3"}"#,
        br#"{"source":"/a","destination":"b"}"#,
        br#"{"path":"/workspace","recursive":true,"includeEntry":true}"#,
        br#"{"watcherId":"w1"}"#,
        b"  ",
    ];
    fuzz("json_messages", json_messages, seeds, JSON_DICTIONARY);
}

#[test]
fn test_fuzz_file_paths() {
    let seeds: &[&[u8]] = &[
        b"path=%2Fworkspace%2Fa+b&username=user",
        b"path=~%2F..%2F..%2Fetc%2Fshadow",
        b"username=root&path=..%2F..%2Fx",
        b"path=%00",
        b"b\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"../x\"\r\n\r\ndata\r\n--b--\r\n",
        b"xyz\n\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/abs\\\"q\"\r\nContent-Type: text/plain\r\n\r\n\r\n--xyz--",
    ];
    let dictionary: &[&[u8]] = &[
        b"%",
        b"%2F",
        b"%2e%2e",
        b"+",
        b"%+5",
        b"&",
        b"=",
        b"path=",
        b"~",
        b"~/",
        b"../",
        b"/",
        b"\r\n",
        b"--",
        b"filename=\"",
        b"\"",
        b"\\",
        b";",
        b"name=\"file\"",
        b"Content-Disposition: form-data",
    ];
    fuzz("file_paths", file_paths, seeds, dictionary);
}
