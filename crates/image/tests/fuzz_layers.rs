//! A bounded, deterministic mutation fuzzer of the layer applier that runs on stable Rust, with
//! the invariants of `airlock_image::fuzzing::check_one` (nothing written outside the layer's
//! directory, no device node or FIFO inside it, no panic), which the cargo-fuzz target in
//! `crates/image/fuzz` checks too. It replays the inputs kept in `fuzz/regressions/apply_layer/`
//! first, then mutates the hostile corpus and a well-formed layer with a fixed-seed generator.
//! `AIRLOCK_FUZZ_ITERATIONS` bounds the run (default 2000); `AIRLOCK_FUZZ_SEED` picks another
//! deterministic sequence; `AIRLOCK_WRITE_FUZZ_SEEDS=1` rewrites `fuzz/seeds/` from the seeds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use airlock_image::fuzzing::{Outcome, Rng, TarWriter, check_one, hostile_layers, mutate};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn test_mutated_layers_never_escape() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/apply_layer");
    let mut kept: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    kept.sort();
    for path in kept {
        let input = std::fs::read(&path).unwrap();
        if std::panic::catch_unwind(|| check_one(&input)).is_err() {
            panic!(
                "the kept regression input {} breaks an invariant again",
                path.display()
            );
        }
    }
    let mut seeds: Vec<Vec<u8>> = hostile_layers()
        .into_iter()
        .filter(|(name, _)| *name != "huge-file-count")
        .map(|(_, tar)| tar)
        .collect();
    seeds.push(
        TarWriter::new()
            .dir("etc")
            .file("etc/.wh.motd", b"")
            .file("etc/conf", b"c")
            .hard_link("etc/link", "etc/conf")
            .symlink("etc/up", "..")
            .file("etc/up/x", b"x")
            .finish(),
    );
    if std::env::var_os("AIRLOCK_WRITE_FUZZ_SEEDS").is_some() {
        // Refreshes the cargo-fuzz target's starting corpus from the same seeds.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}.tar")), seed).unwrap();
        }
    }
    let seed_refs: Vec<&[u8]> = seeds.iter().map(Vec::as_slice).collect();
    let iterations = env_number("AIRLOCK_FUZZ_ITERATIONS", 2000);
    let mut rng = Rng::new(env_number("AIRLOCK_FUZZ_SEED", 0x1a7e_5eed));
    let mut input = seeds[0].clone();
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..iterations {
        if i % 4 == 0 {
            input = seeds[rng.below(seeds.len())].clone();
        }
        input = mutate(&input, &seed_refs, &mut rng);
        let outcome = std::panic::catch_unwind(|| check_one(&input));
        if let Ok(outcome) = outcome {
            *outcomes.entry(format!("{outcome:?}")).or_insert(0u64) += 1;
        } else {
            let path = std::env::temp_dir().join(format!("airlock-fuzz-layer-{i}.tar"));
            std::fs::write(&path, &input).unwrap();
            panic!(
                "iteration {i} broke an invariant; input kept in {}",
                path.display()
            );
        }
    }
    eprintln!("outcomes: {outcomes:?}");
    // The mutator must reach past the tar parser: some inputs apply, some are refused.
    if iterations >= 1000 {
        for kind in [Outcome::Applied, Outcome::Refused] {
            assert!(
                outcomes.contains_key(&format!("{kind:?}")),
                "no input ended {kind:?}: {outcomes:?}"
            );
        }
    }
}
