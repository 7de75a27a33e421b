#!/usr/bin/env bash
# The E2B compatibility suite: the unmodified e2b SDKs against a fresh airlockd. The Python suite
# (tests/e2b) runs under the newest SDK and under 2.45.1 (the v1 create/connect routes); the npm
# SDK runs one smoke test. Installs what it needs (python3-venv, nodejs/npm when absent; venvs
# under target/e2b-venv-*; npm ci in tests/e2b/js) and reuses it while the pins are unchanged.
# Builds nothing: run `cargo build --workspace` and `scripts/sandbox-binaries.sh` first. Exits non-zero on any failure.
#
#   scripts/e2b-tests.sh                  everything
#   scripts/e2b-tests.sh --install-only   only the venvs and node_modules
#   scripts/e2b-tests.sh -- -k files -x   extra pytest arguments for both runs
set -euo pipefail
cd "$(dirname "$0")/.."

suite=tests/e2b
versions=(latest 2.45)
install_only=0
pytest_args=()
while (($#)); do
    case $1 in
        --install-only) install_only=1 ;;
        --) shift; pytest_args=("$@"); break ;;
        *) echo "usage: scripts/e2b-tests.sh [--install-only] [-- PYTEST_ARGS...]" >&2; exit 2 ;;
    esac
    shift
done

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/e2b-tests.sh: run as root (apt-get, and sandboxes need cgroups and namespaces)" >&2
    exit 1
fi

apt_updated=0
apt_install() {
    if ((!apt_updated)); then apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

python=python3
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3 python3-venv
    python=/usr/bin/python3
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    apt_install nodejs npm
fi
# The code-interpreter template runs the host's kernels: ipykernel (with matplotlib and pandas)
# from Debian, and bash_kernel from PyPI (Debian has none) for bash contexts, installed into
# /usr/local for the system Python with its kernelspec under /usr/local/share/jupyter.
kernel_packages=(python3-ipykernel python3-matplotlib python3-pandas python3-pexpect python3-filetype python3-pip)
missing=()
for package in "${kernel_packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
    apt_install "${missing[@]}"
fi
bash_kernel_version=0.10.0
if [ "$(/usr/bin/python3 -c 'import importlib.metadata as m; print(m.version("bash_kernel"))' 2>/dev/null)" != "$bash_kernel_version" ] \
    || [ ! -f /usr/local/share/jupyter/kernels/bash/kernel.json ]; then
    echo "e2b-tests: installing bash_kernel $bash_kernel_version for /usr/bin/python3"
    /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
        --break-system-packages "bash_kernel==$bash_kernel_version"
    /usr/bin/python3 -m bash_kernel.install --prefix /usr/local >/dev/null
fi
# The desktop template on the process tier runs the host's X server, XFCE, noVNC and Chromium
# (tests/e2b/test_desktop.py): Debian's packages and the two host links the template needs.
scripts/desktop-host.sh
# The stream test's own browser trusts airlockd's local CA through an NSS database (certutil).
command -v certutil >/dev/null || apt_install libnss3-tools
# Deno's Jupyter kernel serves javascript and typescript contexts: Deno from npm (the ELF its
# postinstall puts beside the package), its kernelspec written under /usr/local/share/jupyter.
deno_version=2.9.6
deno_bin="$(npm root -g)/deno/deno"
if [ "$("$deno_bin" --version 2>/dev/null | head -n1 | cut -d' ' -f2)" != "$deno_version" ]; then
    echo "e2b-tests: installing deno $deno_version from npm"
    npm install -g --no-audit --no-fund --loglevel=error "deno@$deno_version"
fi
deno_spec=/usr/local/share/jupyter/kernels/deno/kernel.json
deno_json="{\"argv\": [\"$deno_bin\", \"jupyter\", \"--kernel\", \"--conn\", \"{connection_file}\"], \"display_name\": \"Deno\", \"language\": \"typescript\"}"
if [ "$(cat "$deno_spec" 2>/dev/null)" != "$deno_json" ]; then
    mkdir -p "$(dirname "$deno_spec")"
    echo "$deno_json" >"$deno_spec"
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if ((node_major < 20)); then
    echo "scripts/e2b-tests.sh: the e2b npm SDK needs Node.js 20 or later, found $(node --version)" >&2
    exit 1
fi

# A venv per SDK version, rebuilt only when its pins or the interpreter change.
for name in "${versions[@]}"; do
    venv=target/e2b-venv-$name
    requirements=$suite/requirements-$name.txt
    want=$({ cat "$requirements"; "$python" -VV; } | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$venv/.pins.sha256" 2>/dev/null)" != "$want" ] \
        || ! "$venv/bin/python" -c 'import e2b, pytest' 2>/dev/null; then
        echo "e2b-tests: installing $requirements into $venv"
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
        echo "$want" >"$venv/.pins.sha256"
    fi
done

js=$suite/js
want=$(sha256sum "$js/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$js/node_modules/.lock.sha256" 2>/dev/null)" != "$want" ]; then
    echo "e2b-tests: npm ci in $js"
    (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want" >"$js/node_modules/.lock.sha256"
fi

if ((install_only)); then
    exit 0
fi

failed=()
for name in "${versions[@]}"; do
    sdk=$("target/e2b-venv-$name/bin/python" -c 'from importlib.metadata import version; print(version("e2b"))')
    echo "=== E2B suite with the Python SDK $sdk$([ "$name" = latest ] && echo ' and the npm SDK')"
    # The npm smoke test needs one run only: the newest Python SDK's.
    if AIRLOCK_E2B_JS=$([ "$name" = latest ] && echo 1 || echo 0) \
        "target/e2b-venv-$name/bin/python" -m pytest "$suite" "${pytest_args[@]}"; then
        :
    else
        failed+=("e2b $sdk")
    fi
done

if ((${#failed[@]})); then
    echo "e2b-tests: FAILED with ${failed[*]}" >&2
    exit 1
fi
echo "e2b-tests: all passed (${versions[*]})"
