#!/usr/bin/env bash
# Runs every cargo-fuzz target (libFuzzer) for a bounded time: the policy parser, the agent's
# Connect framing, JSON messages and file paths, the daemon's request bodies, and the image
# store's layer applier (as root, like the store), and the VMM's virtio-mmio transport and
# its entropy, vsock and block queues with guest-chosen descriptors. Stable Rust
# works without a sanitizer (`--sanitizer none`); nightly users may drop that flag to add
# AddressSanitizer. Corpora grow under target/fuzz-corpus/, never in the repository; each
# target also reads its kept seeds and regression inputs. Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz --version 0.13.2
fi
corpora="$PWD/target/fuzz-corpus"
# One target directory for every fuzz crate, so the dependencies they share build once, and
# unoptimised builds (`--dev`): a bounded smoke run of seconds is dominated by the build, and
# cargo-fuzz's default (release, one codegen unit) costs minutes per crate on a cold machine.
builds="$PWD/target/fuzz-build"
run() {
    local crate=$1 target=$2
    local corpus="$corpora/$crate-$target"
    mkdir -p "$corpus"
    local inputs=("$corpus")
    for kept in "crates/$crate/fuzz/seeds" "crates/$crate/fuzz/regressions/$target"; do
        [ -d "$kept" ] && inputs+=("$PWD/$kept")
    done
    echo "fuzz: $crate/$target for ${seconds}s"
    (cd "crates/$crate" && cargo fuzz run --dev --target-dir "$builds" --sanitizer none "$target" "${inputs[@]}" -- \
        -max_total_time="$seconds" -print_final_stats=1 2>&1 | tail -n 3)
}
run policy parse_policy
run agent connect_framing
run agent json_messages
run agent file_paths
run server request_bodies
run image apply_layer
run vmm mmio_transport
run vmm rng_queue
run vmm vsock_queues
run vmm block_queue
