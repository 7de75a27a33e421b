#!/usr/bin/env bash
# Builds the image store's test images offline, from Debian's packages, into
# target/test-images/ (or $AIRLOCK_TEST_IMAGES): rootfs tars cached under a key of their inputs,
# then OCI layouts made by scripts/oci-layout.py. The tests (crates/image/tests) serve these
# from Debian's docker-registry on 127.0.0.1, pushed with skopeo.
#   busybox.tar  busybox-static installed into an empty tree: seconds to build.
#   python.tar   `mmdebstrap --variant=minbase --include=python3 bookworm`: minutes, so cached.
# Usage: scripts/test-images.sh [--no-python]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${AIRLOCK_TEST_IMAGES:-$PWD/target/test-images}"
mkdir -p "$out"

key() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# --- busybox rootfs --------------------------------------------------------------------------
busybox_version=$(dpkg-query -W -f '${Version}' busybox-static)
busybox_key=$(key busybox "$busybox_version" "$(sha256sum "$0" | cut -c1-16)")
if [ ! -s "$out/busybox-$busybox_key.tar" ]; then
    tree=$(mktemp -d)
    trap 'rm -rf "$tree"' EXIT
    mkdir -p "$tree"/{bin,etc,tmp,root,opt/keep,var/empty}
    cp /bin/busybox "$tree/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$tree/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\napp:x:1000:1000:app:/tmp:/bin/sh\n' >"$tree/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\napp:x:1000:\n' >"$tree/etc/group"
    echo "Welcome to the Airlock test image" >"$tree/etc/motd"
    echo one >"$tree/opt/keep/one"
    echo two >"$tree/opt/keep/two"
    chmod 1777 "$tree/tmp"
    tar --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner -C "$tree" -cf "$out/busybox-$busybox_key.tar.tmp" .
    mv "$out/busybox-$busybox_key.tar.tmp" "$out/busybox-$busybox_key.tar"
    rm -rf "$tree"
    trap - EXIT
fi
ln -sfn "busybox-$busybox_key.tar" "$out/busybox.tar"

# --- python rootfs (mmdebstrap) -------------------------------------------------------------
if [ "${1:-}" != "--no-python" ]; then
    python_args=(--variant=minbase --include=python3 --mode=root bookworm)
    python_key=$(key mmdebstrap "$(mmdebstrap --version)" "${python_args[@]}")
    if [ ! -s "$out/python-$python_key.tar" ]; then
        echo "test-images: mmdebstrap ${python_args[*]} (takes minutes; cached afterwards)" >&2
        # mmdebstrap picks the output format by the name's extension: keep `.tar` last.
        mmdebstrap --quiet "${python_args[@]}" "$out/python-$python_key.tmp.tar"
        mv "$out/python-$python_key.tmp.tar" "$out/python-$python_key.tar"
    fi
    ln -sfn "python-$python_key.tar" "$out/python.tar"
fi

# --- OCI layouts ----------------------------------------------------------------------------
layouts_key=$(key "$(readlink "$out/busybox.tar")" "$(readlink "$out/python.tar" 2>/dev/null || true)" \
    "$(sha256sum scripts/oci-layout.py | cut -c1-16)")
if [ "$(cat "$out/layouts.key" 2>/dev/null || true)" != "$layouts_key" ]; then
    rm -rf "$out/layouts"
    python3 scripts/oci-layout.py "$out"
    echo "$layouts_key" >"$out/layouts.key"
fi
echo "test-images: ready in $out" >&2
