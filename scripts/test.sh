#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and the root-only integration tests, then
# a short benchmark smoke run. Installs the system packages it needs on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)      # the benchmark's peer
command -v setpriv >/dev/null || need+=(util-linux)    # the unprivileged-caller test
if ((${#need[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "scripts/test.sh: missing ${need[*]}; install them or run as root" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: the integration tests create cgroups and idmapped mounts; run as root" >&2
    exit 1
fi

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Integration tests run the airlock, airlock-jail and airlock-probe binaries: build them all.
cargo build --workspace --locked
# The benchmark must keep working; its figures are printed, never asserted.
cargo run --quiet --locked --bin airlock -- bench start --iterations 20 --phases
cargo test --workspace --locked
