#!/usr/bin/env bash
# The Judge0 compatibility suite: the unmodified `judge0` Python SDK (PyPI) and raw HTTP against
# a fresh airlockd started with --judge0-listen. Installs what it needs (python3-venv, and the
# toolchains of the languages it submits: gcc, g++, nodejs) and a venv under target/judge0-venv
# that is reused while tests/judge0/requirements.txt is unchanged. Builds nothing: run
# `cargo build --workspace` and `scripts/sandbox-binaries.sh` first. Exits non-zero on any failure.
#
#   scripts/judge0-tests.sh                  everything
#   scripts/judge0-tests.sh --install-only   only the packages and the venv
#   scripts/judge0-tests.sh -- -k batch -x   extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."

suite=tests/judge0
venv=target/judge0-venv
install_only=0
pytest_args=()
while (($#)); do
    case $1 in
        --install-only) install_only=1 ;;
        --) shift; pytest_args=("$@"); break ;;
        *) echo "usage: scripts/judge0-tests.sh [--install-only] [-- PYTEST_ARGS...]" >&2; exit 2 ;;
    esac
    shift
done

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/judge0-tests.sh: run as root (apt-get, and sandboxes need cgroups and namespaces)" >&2
    exit 1
fi

need=()
command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3 python3-venv)
[ -x /usr/bin/gcc ] || need+=(gcc)        # C (50)
[ -x /usr/bin/g++ ] || need+=(g++)        # C++ (54)
[ -x /usr/bin/node ] || need+=(nodejs)    # JavaScript (63)
[ -x /usr/bin/unzip ] || need+=(unzip)    # additional_files and the multi-file program (89)
[ -x /usr/bin/mawk ] || need+=(mawk)      # the operator's language file in the tests
if ((${#need[@]})); then
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${need[@]}" >/dev/null
fi

python=/usr/bin/python3
want=$({ cat "$suite/requirements.txt"; "$python" -VV; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.pins.sha256" 2>/dev/null)" != "$want" ] \
    || ! "$venv/bin/python" -c 'import judge0, pytest' 2>/dev/null; then
    echo "judge0-tests: installing $suite/requirements.txt into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$suite/requirements.txt"
    echo "$want" >"$venv/.pins.sha256"
fi

if ((install_only)); then
    exit 0
fi
sdk=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("judge0"))')
echo "=== Judge0 suite with the judge0 Python SDK $sdk"
"$venv/bin/python" -m pytest "$suite" "${pytest_args[@]}"
