//! Bounded, deterministic mutation fuzzing of the daemon's request handling that runs on
//! stable Rust: every JSON body (native `/v1` and E2B's), the policy inside a create request,
//! the route table and E2B's routing headers, through `airlock_server::fuzzing`, which the
//! cargo-fuzz target in `crates/server/fuzz` checks too (libFuzzer needs `cargo fuzz` and its own
//! instrumented build; this needs neither).
//!
//! It first replays every input kept in `fuzz/regressions/request_bodies/`, then mutates its
//! seeds with a fixed-seed generator. `AIRLOCK_FUZZ_ITERATIONS` bounds the run (default 3000);
//! `AIRLOCK_FUZZ_SEED` picks another deterministic sequence.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use airlock_policy::fuzzing::Rng;
use airlock_server::fuzzing::request_bodies;
use json_mutator::mutate;

/// The agent's mutations minus its envelope-length one: request bodies have no length prefix.
mod json_mutator {
    use airlock_policy::fuzzing::Rng;

    pub fn mutate(input: &[u8], seeds: &[&[u8]], dictionary: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..=rng.below(4) {
            let at = if out.is_empty() {
                0
            } else {
                rng.below(out.len() + 1)
            };
            match rng.below(5) {
                0 if !out.is_empty() => {
                    let i = rng.below(out.len());
                    out[i] ^= 1 << rng.below(8);
                }
                1 | 2 => {
                    let word = dictionary[rng.below(dictionary.len())];
                    out.splice(at..at, word.iter().copied());
                }
                3 if !out.is_empty() => {
                    let end = (at + 1 + rng.below(16)).min(out.len());
                    out.drain(at.min(end)..end);
                }
                _ => {
                    let other = seeds[rng.below(seeds.len())];
                    if !other.is_empty() {
                        let from = rng.below(other.len());
                        let to = (from + 1 + rng.below(64)).min(other.len());
                        out.splice(at..at, other[from..to].iter().copied());
                    }
                }
            }
        }
        out.truncate(64 * 1024);
        out
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const SEEDS: &[&[u8]] = &[
    br#"{"tier":"process","template":"base","resources":{"memory_bytes":536870912,"pids_max":64,"cpu_millis":1500,"disk_bytes":1073741824},"timeout_ms":60000,"env":{"A":"b"},"metadata":{"team":"x"},"workspace":{"type":"host","path":"/srv/ws"}}"#,
    br#"{"policy":{"version":1,"extends":["workspace"],"network":{"mode":"proxy","egress":[{"host":"api.example.com","ports":[443]}]}}}"#,
    br#"{"argv":["sh","-c","echo"],"env":{"K":"v"},"cwd":"/workspace","user":"root","timeout_ms":1000,"stdin_base64":"aGk="}"#,
    br#"{"timeout_ms":1}"#,
    br#"{"path":"/workspace/a"}"#,
    br#"{"source":"/a","destination":"/b"}"#,
    br#"{"templateID":"base","timeout":300,"autoPause":false,"secure":true,"metadata":{"k":"v"},"envVars":{"E":"1"},"volumeMounts":[]}"#,
    br#"{"timeout":30}"#,
    b"/v1/sandboxes/abc123/files?path=%2Fetc",
    b"49983-abcdefghij0123456789.localhost:3000",
    b"2026-11-29T21:00:00.123Z",
    b" ",
];

const DICTIONARY: &[&[u8]] = &[
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
    b"0",
    b"18446744073709551616",
    b"1e999",
    b"1.5",
    b"\"\\u0000\"",
    b"\"tier\"",
    b"\"microvm\"",
    b"\"policy\"",
    b"\"version\"",
    b"\"argv\"",
    b"\"shell\"",
    b"\"timeout_ms\"",
    b"\"workspace\"",
    b"\"type\"",
    b"\"host\"",
    b"\"fresh\"",
    b"\"metadata\"",
    b"\"templateID\"",
    b"\"envVars\"",
    b"/v1/sandboxes/",
    b"/envd/",
    b"/files",
    b"%2F",
    b"..",
    b"49983-",
    b".localhost",
    b":",
    b"T",
    b"Z",
    b"+01:00",
];

#[test]
fn test_fuzz_request_bodies() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/request_bodies");
    let mut kept: Vec<_> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    kept.sort();
    for path in kept {
        let input = std::fs::read(&path).unwrap();
        if std::panic::catch_unwind(|| request_bodies(&input)).is_err() {
            panic!(
                "the kept regression input {} breaks an invariant again",
                path.display()
            );
        }
    }
    let iterations = env_number("AIRLOCK_FUZZ_ITERATIONS", 3000);
    let mut rng = Rng::new(env_number("AIRLOCK_FUZZ_SEED", 0x5e7e_b0d1));
    let mut input = SEEDS[0].to_vec();
    for i in 0..iterations {
        if i % 3 == 0 {
            input = SEEDS[rng.below(SEEDS.len())].to_vec();
        }
        input = mutate(&input, SEEDS, DICTIONARY, &mut rng);
        if std::panic::catch_unwind(|| request_bodies(&input)).is_err() {
            panic!(
                "iteration {i}: an invariant broke on this input (keep it in fuzz/regressions/request_bodies/):\n{:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}
