#!/usr/bin/env bash
# Schemathesis (property-based API testing, from PyPI) against a fresh airlockd: every operation
# of api/openapi.json with every check on (`--checks all`: server errors, status codes, content
# types, headers, response schemas, positive data accepted, negative data rejected, ...),
# bounded to 20 examples per operation with a fixed seed and one worker, so that a run is
# repeatable. The narrowings are in tests/schemathesis/hooks.py and schemathesis.toml, with
# their reasons. Installs its
# venv under target/schemathesis-venv (reused while the pins are unchanged). Builds nothing: run
# `cargo build --workspace` and `scripts/sandbox-binaries.sh` first. Exits non-zero on any failure.
#
#   scripts/schemathesis.sh                 the bounded run
#   scripts/schemathesis.sh -- --seed 7     extra `schemathesis run` arguments
set -euo pipefail
cd "$(dirname "$0")/.."

extra=()
if (($#)); then
    [ "$1" = "--" ] || { echo "usage: scripts/schemathesis.sh [-- SCHEMATHESIS_ARGS...]" >&2; exit 2; }
    shift
    extra=("$@")
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/schemathesis.sh: run as root (sandboxes need cgroups and namespaces)" >&2
    exit 1
fi

python=python3
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    python=/usr/bin/python3
fi
venv=target/schemathesis-venv
requirements=tests/schemathesis/requirements.txt
want=$({ cat "$requirements"; "$python" -VV; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.pins.sha256" 2>/dev/null)" != "$want" ] || ! [ -x "$venv/bin/schemathesis" ]; then
    echo "schemathesis: installing $requirements into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    echo "$want" >"$venv/.pins.sha256"
fi

bin=target/x86_64-unknown-linux-gnu/debug
for binary in airlockd airlock-jail airlock-agent; do
    [ -x "$bin/$binary" ] || { echo "scripts/schemathesis.sh: $bin/$binary is missing: run cargo build --workspace and scripts/sandbox-binaries.sh" >&2; exit 1; }
done

# A fresh daemon on a free loopback port, with its own state directory (not under /tmp, which
# sandboxes see as their own). Sandboxes outlive a daemon by design, so the exit trap deletes
# every one through the API before stopping it, however the run ends.
state=$(mktemp -d /var/tmp/airlock-schemathesis.XXXXXX)
key=$("$bin/airlockd" keys --state-dir "$state" create schemathesis)
log=$state/airlockd.log
AIRLOCK_JAIL_BIN=$bin/airlock-jail AIRLOCK_AGENT_BIN=$bin/airlock-agent \
    "$bin/airlockd" --listen 127.0.0.1:0 --state-dir "$state" --max-sandboxes 256 \
    >"$state/airlockd.out" 2>"$log" </dev/null &
daemon=$!
cleanup() {
    if [ -n "${url:-}" ] && kill -0 "$daemon" 2>/dev/null; then
        "$venv/bin/python" - "$url" "$key" <<'PY' || true
import sys, requests
url, key = sys.argv[1], sys.argv[2]
headers = {"X-API-Key": key}
for sandbox in requests.get(f"{url}/v1/sandboxes", headers=headers, timeout=30).json()["sandboxes"]:
    requests.delete(f"{url}/v1/sandboxes/{sandbox['id']}", headers=headers, timeout=60)
for snapshot in requests.get(f"{url}/v1/snapshots", headers=headers, timeout=30).json()["snapshots"]:
    requests.delete(f"{url}/v1/snapshots/{snapshot['id']}", headers=headers, timeout=60)
PY
    fi
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    # The daemon unmounts its disk scratch storage once nothing is left on it; whatever a
    # failed run left goes with the lazy unmount.
    if mountpoint -q "$state/storage" 2>/dev/null; then umount -l "$state/storage" || true; fi
    rm -rf "$state"
}
trap cleanup EXIT
url=
for _ in $(seq 100); do
    line=$(head -n1 "$state/airlockd.out" 2>/dev/null || true)
    if [[ $line == "airlockd listening on http://"* ]]; then
        url=${line#airlockd listening on }
        break
    fi
    kill -0 "$daemon" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "scripts/schemathesis.sh: airlockd did not start; its log:" >&2
    cat "$log" >&2
    exit 1
fi

echo "=== schemathesis $("$venv/bin/schemathesis" --version | awk '{print $NF}') against $url"
status=0
PYTHONPATH=tests/schemathesis SCHEMATHESIS_HOOKS=hooks \
    "$venv/bin/schemathesis" --config-file tests/schemathesis/schemathesis.toml \
    run api/openapi.json --url "$url" \
    --header "X-API-Key: $key" \
    --checks all --max-examples 20 --seed 19 --workers 1 \
    --generation-database none --no-color \
    "${extra[@]}" || status=$?
if ! kill -0 "$daemon" 2>/dev/null; then
    echo "scripts/schemathesis.sh: airlockd died during the run; its log:" >&2
    cat "$log" >&2
    exit 1
fi
if ((status)); then
    echo "schemathesis: FAILED (exit $status)" >&2
    exit "$status"
fi
echo "schemathesis: passed"
