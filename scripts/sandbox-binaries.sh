#!/usr/bin/env bash
# Builds the binaries that `airlock` starts beside itself and inside sandboxes, and puts them in
# target/x86_64-unknown-linux-gnu/PROFILE/, where `airlock`, `airlockd` and the tests look:
# - `airlock-jail` (the helper) and `airlock-agent`, for x86_64-unknown-linux-musl when that
#   target and musl-gcc (Debian's musl-tools, for ring's C code) are installed or installable,
#   else for glibc. Both start once per sandbox, and a static glibc program's start-up runs
#   about 80 `cpuid` instructions that trap to the hypervisor on a VM (0.6 ms per exec on the
#   development machine); musl's runs none. ARCHITECTURE.md, "The sandbox binaries", has the
#   figures.
# - `airlock-probe` and `airlock-vmm`, for glibc: they are not on a sandbox's start path.
#
#   scripts/sandbox-binaries.sh [debug|release] [--glibc]
#
# `--glibc` builds the two for glibc even where musl is installed (to compare the two builds).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/sandbox-binaries.sh [debug|release] [--glibc]" >&2; exit 2; }
profile=debug
flags=()
glibc=false
for argument in "$@"; do
    case "$argument" in
        debug) profile=debug; flags=() ;;
        release) profile=release; flags=(--release) ;;
        --glibc) glibc=true ;;
        *) usage ;;
    esac
done
host=x86_64-unknown-linux-gnu
lean=x86_64-unknown-linux-musl
dest=target/$host/$profile

lean_ready() {
    rustup target list --installed 2>/dev/null | grep -qx "$lean" && command -v musl-gcc >/dev/null
}
if ! $glibc && ! lean_ready && command -v rustup >/dev/null; then
    # Bounded: a network that drops the download instead of refusing it must not stall a build.
    timeout 180 rustup target add "$lean" >/dev/null 2>&1 ||
        echo "sandbox-binaries: rustup cannot add $lean" >&2
    if ! command -v musl-gcc >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        { apt-get -o DPkg::Lock::Timeout=900 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq musl-tools; } \
            >/dev/null 2>&1 || echo "sandbox-binaries: apt-get cannot install musl-tools" >&2
    fi
fi
if $glibc; then
    target=$host
elif lean_ready; then
    target=$lean
else
    target=$host
    echo "sandbox-binaries: building airlock-jail and airlock-agent for glibc, which is slower to" \
        "start on a VM (no $lean target or no musl-gcc)" >&2
fi

# One build, so that the jail's library is compiled once for both binaries.
cargo build "${flags[@]}" --locked --target "$target" -p airlock-jail -p airlock-agent \
    --features airlock-jail/bin,airlock-agent/bin --bins
if [ "$target" != "$host" ]; then
    mkdir -p "$dest"
    for binary in airlock-jail airlock-agent; do
        # A rename, so that a running helper keeps its file and a hard link of cargo's is not
        # written through.
        cp "target/$target/$profile/$binary" "$dest/.$binary.new"
        mv -f "$dest/.$binary.new" "$dest/$binary"
    done
fi
cargo build "${flags[@]}" --locked -p airlock-probe -p airlock-vmm
echo "sandbox-binaries: airlock-jail and airlock-agent ($target), airlock-probe and airlock-vmm in $dest"
