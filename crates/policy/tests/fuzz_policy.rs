//! A bounded, deterministic mutation fuzzer of the policy parser that runs on stable Rust.
//!
//! Why not only cargo-fuzz: libFuzzer's coverage instrumentation needs `cargo fuzz` with a
//! nightly toolchain (or `--sanitizer none`, which still needs the cargo-fuzz binary and a C++
//! build of libFuzzer), and CI here has stable Rust only and no network at run time. This test
//! needs neither: it mutates seed policies with a fixed-seed generator (byte flips, dictionary
//! insertions, deletions, splices, duplicated lines) and runs each input through
//! `airlock_policy::fuzzing::check_one`, the same invariants the cargo-fuzz target
//! (`crates/policy/fuzz`) checks. `AIRLOCK_FUZZ_ITERATIONS` bounds the run (default 2000);
//! `AIRLOCK_FUZZ_SEED` picks another deterministic sequence.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use airlock_policy::fuzzing::{Rng, check_one, mutate};

const SEEDS: &[&str] = &[
    "version: 1\n",
    "version: 1\nextends: [read-only]\n",
    "version: 1
extends: [networked-dev]
tier: process
filesystem:
  rules:
    \"~/.ssh\": deny
    /etc/ssl/private: deny
    \":workspace\": rw
  protected: [\":workspace/.agents\"]
process:
  user: \"1000:1000\"
  syscalls:
    deny_extra: [kcmp]
    allow_extra: [io_uring_setup]
resources: {memory: 1GiB, pids: 256, cpus: 1.5, disk: 2G, timeout: 10m}
network:
  mode: proxy
  egress:
    - {name: api, host: api.example.com, ports: [443], methods: [GET, POST], paths: [\"/v1/**\"]}
    - {host: \"*.example.org\", access: read-only}
    - {name: db, host: db.example.net, ports: [5432], allowed_ips: [10.20.0.0/16]}
credentials:
  - name: token
    source: {env: TOKEN}
    env: API_TOKEN
    inject: {header: X-Api-Key}
    endpoints: [{host: api.example.com, methods: [GET], paths: [\"/v1/**\"]}]
approvals: {unmatched: ask, timeout: 30s}
audit: {egress: all}
",
];

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn test_mutated_policies_never_break_an_invariant() {
    let iterations = env_number("AIRLOCK_FUZZ_ITERATIONS", 2000);
    let mut rng = Rng::new(env_number("AIRLOCK_FUZZ_SEED", 0x5eed_a1c0));
    let mut seeds: Vec<Vec<u8>> = SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect();
    for name in airlock_policy::profiles::names() {
        seeds.push(
            airlock_policy::profiles::text(name)
                .unwrap()
                .as_bytes()
                .to_vec(),
        );
    }
    let seed_refs: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
    let mut accepted = 0u64;
    let mut input = seeds[0].clone();
    for i in 0..iterations {
        // Mostly build on the previous input (deeper mutations), sometimes restart from a seed.
        if i % 3 == 0 {
            input = seeds[rng.below(seeds.len())].clone();
        }
        input = mutate(&input, &seed_refs, &mut rng);
        let result = std::panic::catch_unwind(|| check_one(&input));
        if result.is_err() {
            panic!(
                "iteration {i}: an invariant broke on this input:\n{:?}",
                String::from_utf8_lossy(&input)
            );
        }
        if std::str::from_utf8(&input)
            .ok()
            .and_then(|text| airlock_policy::Policy::from_yaml("x", text).ok())
            .is_some()
        {
            accepted += 1;
        }
    }
    for seed in &seeds {
        check_one(seed);
    }
    // A fuzzer whose inputs are all refused tests only the error paths.
    assert!(
        iterations < 100 || accepted > 0,
        "no mutated input was a valid policy in {iterations} runs"
    );
    eprintln!("{iterations} inputs, {accepted} valid policies");
}
