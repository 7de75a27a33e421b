#!/usr/bin/env bash
# The microVM tier end to end on a machine whose /dev/kvm is PVM (docs: the nested rig of
# shared/reference/microvm-nested-test.md). QEMU from Debian's packages (fetched with
# `apt-get download` and unpacked with `dpkg-deb -x`: never installed, which would replace the
# image's qemu-utils) emulates an AMD CPU with SVM under TCG and boots a level-1 Debian 6.1
# kernel through its PVH entry; in L1, kvm-amd gives a real SVM-backed /dev/kvm, and
# Airlock's VMM (the static airlock-vmm) boots the project's guest kernel (scripts/guest-kernel.sh:
# no modules, no ACPI, so the VMM declares its virtio-mmio devices on the command line) as L2
# with an initramfs whose init runs L2's checks and then the agent. The first fork of L2's
# snapshot is a microvm-tier sandbox of the runtime: the VMM restores it inside the process
# tier's jail (airlock-jail), so L1's init moves its root to a tmpfs (the jail pivots its
# view's root, which an initramfs root cannot be pivoted away from) and mounts cgroup v2. Every check prints
# `E2E PASS <name>` or `E2E FAIL <name> ...` on the console (L2's console is echoed by the
# VMM onto L1's, which is QEMU's standard output); this script fails on any FAIL and on any
# expected PASS line missing.
#
# Cached under target/microvm-rig/<key>/ (key: the fetch steps' format number, the package
# list and the versions apt resolves): the .debs, the unpacked tree and the extracted vmlinux. Built per
# run: the two initramfs images (they hold this build's binaries).
# Usage: scripts/microvm-nested.sh [TARGET_DIR [GUEST_VMLINUX]]
#   (defaults: target/x86_64-unknown-linux-gnu/debug, and scripts/guest-kernel.sh's kernel)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/x86_64-unknown-linux-gnu/debug}"
guest_kernel="${2:-}"
if [ -z "$guest_kernel" ]; then
    guest_kernel="$(scripts/guest-kernel.sh "$(nproc)" | tail -n 1)"
fi
[ -f "$guest_kernel" ] || { echo "microvm-nested: no guest kernel at $guest_kernel" >&2; exit 1; }
driver="$(ls -t "$bin"/deps/microvm_guest-* 2>/dev/null | grep -v '\.d$' | head -n1 || true)"
for binary in "$bin/airlock-vmm" "$bin/airlock-agent" "$bin/airlock-jail" "$driver"; do
    [ -x "$binary" ] || { echo "microvm-nested: ${binary:-the microvm_guest test} is missing (cargo build --workspace; cargo test --workspace --test microvm_guest --no-run)" >&2; exit 1; }
done

kernel_package() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
kernel_package="$(kernel_package)"
if [ -z "$kernel_package" ]; then
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    kernel_package="$(kernel_package)"
fi
[ -n "$kernel_package" ] || { echo "microvm-nested: apt knows no linux-image-amd64 (run apt-get update)" >&2; exit 1; }
kernel_release="${kernel_package#linux-image-}"
# QEMU and the libraries of its that this image lacks, the kernel, busybox.
packages=(qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu
    libcapstone4 libfdt1 libpmem1 libndctl6 libdaxctl1 librdmacm1 libibverbs1 libnl-3-200
    libnl-route-3-200 libslirp0 libvdeplug2 "$kernel_package" busybox-static)
versions=""
for package in "${packages[@]}"; do
    version="$(apt-cache policy "$package" | awk '/Candidate:/ {print $2}')"
    [ -n "$version" ] && [ "$version" != "(none)" ] || { echo "microvm-nested: $package is not in the apt sources" >&2; exit 1; }
    versions+="$package=$version "
done
# Bump when the fetch-and-unpack steps below change.
rig_format=1
key="$(echo "format=$rig_format $versions" | sha256sum | cut -c1-16)"
rig="$PWD/target/microvm-rig/$key"
root="$rig/root"
if [ ! -f "$rig/ready" ]; then
    rm -rf "$rig"
    mkdir -p "$rig/debs" "$root"
    # shellcheck disable=SC2086
    (cd "$rig/debs" && apt-get download $versions 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    [ "$(find "$rig/debs" -name '*.deb' | wc -l)" -eq "${#packages[@]}" ] || { echo "microvm-nested: apt-get download fetched $(find "$rig/debs" -name '*.deb' | wc -l) of ${#packages[@]} packages" >&2; exit 1; }
    for deb in "$rig"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
    # Debian ships only the bzImage; the ELF vmlinux (PVH entry) is its xz payload.
    python3 - "$root/boot/vmlinuz-$kernel_release" "$rig/vmlinux" <<'EOF'
import lzma, sys
data = open(sys.argv[1], "rb").read()
start = data.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit("no xz stream in " + sys.argv[1])
out = lzma.LZMADecompressor().decompress(data[start:])
if out[:4] != b"\x7fELF":
    sys.exit("the xz payload is not an ELF")
open(sys.argv[2], "wb").write(out)
EOF
    rm -rf "$rig/debs"
    touch "$rig/ready"
fi
modules="$root/lib/modules/$kernel_release/kernel"
busybox="$root/bin/busybox"
run="$rig/run"
rm -rf "$run"
mkdir -p "$run"

# A busybox tree with the applets an init script uses.
busybox_tree() {
    mkdir -p "$1/bin" "$1/proc" "$1/sys" "$1/dev" "$1/tmp" "$1/modules"
    cp "$busybox" "$1/bin/busybox"
    for applet in sh mount insmod echo cat ls head grep sleep poweroff reboot mkdir dd od wc mv kill uname dmesg tail cp chmod switch_root touch; do
        ln -s busybox "$1/bin/$applet"
    done
}

# L2: the project's kernel (its drivers built in), a few checks, then the agent as the init
# (an initramfs root: no block device yet).
l2="$run/l2"
busybox_tree "$l2"
mkdir -p "$l2/root"
strip --strip-debug -o "$l2/bin/airlock-agent" "$bin/airlock-agent"
cat > "$l2/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "E2E PASS l2-init"
# The project's kernel, not Debian's: built here, without module support.
if grep -q 'debian-kernel@lists.debian.org' /proc/version || [ -e /proc/modules ]; then
    echo "E2E FAIL l2-own-kernel: $(cat /proc/version)"
else
    echo "E2E PASS l2-own-kernel"
fi
if grep -q '^0x0004$' /sys/bus/virtio/devices/*/device 2>/dev/null; then
    echo "E2E PASS l2-virtio-mmio"
else
    echo "E2E FAIL l2-virtio-mmio: no virtio device of type 4 (entropy)"
fi
if [ "$(dd if=/dev/hwrng bs=16 count=1 2>/dev/null | wc -c)" = 16 ]; then
    echo "E2E PASS l2-virtio-rng-read"
else
    echo "E2E FAIL l2-virtio-rng-read"
fi
if grep -q '^0x0013$' /sys/bus/virtio/devices/*/device 2>/dev/null; then
    echo "E2E PASS l2-virtio-vsock-device"
else
    echo "E2E FAIL l2-virtio-vsock-device: no virtio device of type 19 (vsock)"
fi
export HOME=/root PATH=/bin
exec /bin/airlock-agent --listen-vsock 49983
EOF
chmod +x "$l2/init"
python3 scripts/initramfs.py "$l2" "$run/l2.cpio"

# L1 (Debian's kernel): KVM for AMD, our VMM, L2's kernel and initramfs.
l1="$run/l1"
busybox_tree "$l1"
for module in virt/lib/irqbypass arch/x86/kvm/kvm drivers/crypto/ccp/ccp arch/x86/kvm/kvm-amd; do
    cp "$modules/$module.ko" "$l1/modules/"
done
strip --strip-debug -o "$l1/bin/airlock-vmm" "$bin/airlock-vmm"
strip --strip-debug -o "$l1/bin/airlock-jail" "$bin/airlock-jail"
strip --strip-debug -o "$l1/bin/microvm-guest" "$driver"
cp "$guest_kernel" "$l1/vmlinux"
cp "$run/l2.cpio" "$l1/l2.cpio"
cat > "$l1/init" <<'EOF'
#!/bin/sh
if [ ! -e /.tmpfs-root ]; then
    # The initramfs root cannot be pivoted away from (the jail pivots): run from a tmpfs.
    mkdir /new-root
    mount -t tmpfs -o mode=0755 tmpfs /new-root
    cp -a /bin /modules /vmlinux /l2.cpio /init /new-root/
    mkdir /new-root/proc /new-root/sys /new-root/dev /new-root/tmp /new-root/run
    touch /new-root/.tmpfs-root
    exec switch_root /new-root /init
fi
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+memory +pids +cpu" > /sys/fs/cgroup/cgroup.subtree_control || echo "E2E FAIL l1-cgroup-controllers"
chmod 1777 /tmp
for m in irqbypass kvm ccp kvm-amd; do insmod /modules/$m.ko || echo "E2E FAIL l1-insmod $m"; done
if [ -c /dev/kvm ]; then echo "E2E PASS l1-kvm"; else echo "E2E FAIL l1-kvm: no /dev/kvm"; fi
mkdir -p /run/e2e
if AIRLOCK_E2E_CMDLINE_DEVICES=1 AIRLOCK_E2E_VMM=/bin/airlock-vmm AIRLOCK_E2E_KERNEL=/vmlinux AIRLOCK_E2E_INITRD=/l2.cpio \
    AIRLOCK_E2E_DIR=/run/e2e AIRLOCK_JAIL_BIN=/bin/airlock-jail AIRLOCK_VMM_BIN=/bin/airlock-vmm \
    AIRLOCK_MICROVM_SNAPSHOT=/run/e2e/snapshot /bin/microvm-guest --ignored --nocapture --test-threads 1; then
    echo "E2E PASS l1-driver"
else
    echo "E2E FAIL l1-driver: the microvm_guest test failed"
    # A VMM killed by its allow-list is logged by the kernel with the syscall's number.
    dmesg | grep -a 'type=1326\|seccomp' | tail -n 5
    # The jailed VMM's console and errors.
    tail -n 20 /run/e2e/sandbox/agent.log 2>/dev/null
fi
poweroff -f
EOF
chmod +x "$l1/init"
python3 scripts/initramfs.py "$l1" "$run/l1.cpio"

expected=(l1-kvm l2-init l2-own-kernel l2-virtio-mmio l2-virtio-rng-read l2-virtio-vsock-device
    vsock-connect envd-health envd-command envd-file snapshot-written
    jailed-create jailed-envd-health jailed-envd-command jailed-envd-file jailed-vmm-confined
    jailed-vmm-namespaces jailed-vmm-view jailed-vmm-cgroup restore-still-counting jailed-destroyed
    restore-vsock-connect restore-vmm-confined forks-reseeded-own-identity l1-driver)
log="$run/console.log"
echo "microvm-nested: booting L1 (QEMU TCG, nested SVM); the console goes to $log"
started=$SECONDS
# A hang guard, not a timed assertion: TCG on a loaded 2-core box takes minutes.
LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu" \
    timeout 1800 nice -n 5 "$root/usr/bin/qemu-system-x86_64" -accel tcg -cpu EPYC,+svm -smp 1 -m 2048 \
    -kernel "$rig/vmlinux" -initrd "$run/l1.cpio" \
    -append 'console=ttyS0 panic=-1 quiet mitigations=off' \
    -nographic -no-reboot -monitor none </dev/null >"$log" 2>&1 || echo "microvm-nested: QEMU exited with status $?"
tr -d '\r' <"$log" | grep -a 'E2E ' || true
echo "microvm-nested: the rig ran $((SECONDS - started)) s"
failed=0
if grep -aq 'E2E FAIL' "$log"; then failed=1; fi
for name in "${expected[@]}"; do
    grep -aq "E2E PASS $name" "$log" || { echo "microvm-nested: no PASS line for $name" >&2; failed=1; }
done
if [ "$failed" -ne 0 ]; then
    echo "microvm-nested: FAILED; the last console lines:" >&2
    tr -d '\r' <"$log" | tail -n 40 >&2
    exit 1
fi
echo "microvm-nested: all ${#expected[@]} checks passed"
