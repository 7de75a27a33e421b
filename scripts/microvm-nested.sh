#!/usr/bin/env bash
# The microVM tier end to end on a machine whose /dev/kvm is PVM (docs: the nested rig of
# shared/reference/microvm-nested-test.md). QEMU from Debian's packages (fetched with
# `apt-get download` and unpacked with `dpkg-deb -x`: never installed, which would replace the
# image's qemu-utils) emulates an AMD CPU with SVM under TCG and boots a level-1 Debian 6.1
# kernel through its PVH entry; in L1, kvm-amd gives a real SVM-backed /dev/kvm, and
# Airlock's VMM (the static airlock-vmm) boots the project's guest kernel (scripts/guest-kernel.sh:
# no modules, no ACPI, so the VMM declares its virtio-mmio devices on the command line) as L2
# with an initramfs whose init runs L2's checks and switches its root to the busybox test
# image's disk under an overlay disk before it execs the agent. The first fork of L2's
# snapshot is a microvm-tier sandbox of the runtime: the VMM restores it inside the process
# tier's jail (airlock-jail), so L1's init moves its root to a tmpfs (the jail pivots its
# view's root, which an initramfs root cannot be pivoted away from) and mounts cgroup v2; then,
# in L1 still, `airlock seceval --tier microvm` and the daemon over HTTP (a sandbox of the
# snapshot's image created, a command run, the sandbox deleted) fork it again, and a sandbox
# of another image boots the kernel on that image's disk. Every check prints
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
for binary in "$bin/airlock" "$bin/airlock-probe" "$bin/airlock-vmm" "$bin/airlock-agent" "$bin/airlock-jail" "$driver"; do
    [ -x "$binary" ] || { echo "microvm-nested: ${binary:-the microvm_guest test} is missing (cargo build --workspace; scripts/sandbox-binaries.sh; cargo test --workspace --test microvm_guest --no-run)" >&2; exit 1; }
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
    for applet in sh mount insmod echo cat ls head grep sleep poweroff reboot mkdir dd od wc mv kill uname dmesg tail cp chmod switch_root touch sha256sum tr ifconfig httpd timeout; do
        ln -s busybox "$1/bin/$applet"
    done
}

# L2: the project's kernel (its drivers built in: virtio, vsock, block, ext4, overlayfs), a
# few checks, then the agent as the init, from the image's root filesystem when the VMM gives
# the guest its disks (found by serial: the image's read-only, the sandbox's overlay), else
# from the initramfs.
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
# The disk whose serial is $1 (the runtime names them airlock-root and airlock-overlay).
disk() {
    for dev in /sys/block/vd*; do
        [ "$(cat "$dev/serial" 2>/dev/null)" = "$1" ] && echo "/dev/${dev##*/}"
    done
}
root=$(disk airlock-root)
overlay=$(disk airlock-overlay)
if [ -z "$root" ] || [ -z "$overlay" ]; then
    echo "E2E no image disks: the initramfs stays the root"
    exec /bin/airlock-agent --listen-vsock 49983
fi
# The image read-only, the sandbox's writes in upper/ on its own disk, the agent on a tmpfs
# of its own (nothing of Airlock's is written into the image or the overlay).
mkdir -p /lower /disk /new-root
mount -t ext4 -o ro "$root" /lower || echo "E2E FAIL l2-image-root: mounting $root"
mount -t ext4 "$overlay" /disk || echo "E2E FAIL l2-image-root: mounting $overlay"
mount -t overlay overlay -o lowerdir=/lower,upperdir=/disk/upper,workdir=/disk/work /new-root ||
    echo "E2E FAIL l2-image-root: the overlay"
# The mount points Airlock's guest has (the daemon's commands start in /workspace).
mkdir -p /new-root/proc /new-root/sys /new-root/dev /new-root/tmp /new-root/workspace /new-root/.airlock
mount -t tmpfs -o mode=0755,size=64m tmpfs /new-root/.airlock
cp /bin/airlock-agent /new-root/.airlock/agent
mount -o remount,ro /new-root/.airlock
for fs in proc sys dev; do mount --move "/$fs" "/new-root/$fs"; done
echo "E2E PASS l2-image-root"
exec switch_root /new-root /.airlock/agent --listen-vsock 49983
EOF
chmod +x "$l2/init"
python3 scripts/initramfs.py "$l2" "$run/l2.cpio"

# L1 (Debian's kernel): KVM for AMD, our VMM, L2's kernel and initramfs, and L2's disks: the
# busybox test image's ext4 root disk, made by the image store from its OCI layout
# (scripts/test-images.sh) as the microvm tier takes it, and the first boot's overlay disk.
# In L1's initramfs: L1 has no other way in.
l1="$run/l1"
busybox_tree "$l1"
layout=target/test-images/layouts/busybox
digest_of() {
    python3 -c 'import json, sys
index = json.load(open(sys.argv[1]))
print(next(m["digest"] for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == sys.argv[2]))' "$layout/index.json" "$1"
}
image="$(digest_of plain)"
layered="$(digest_of layered)"
# The daemon's image store in L1, made here with both images' disks (L1 has no mke2fs): a
# sandbox of `plain` forks the snapshot (made on that disk), one of `layered` boots.
store="$l1/daemon-images"
"$bin/airlock" image --store "$store" import "$layout" >/dev/null
plain_disk="$("$bin/airlock" image --store "$store" disk "$image")"
"$bin/airlock" image --store "$store" disk "$layered" >/dev/null
cp "$plain_disk" "$l1/root.ext4"
printf 'plain=%s\nlayered=%s\nplain_disk=%s\n' "$image" "$layered" "${plain_disk#"$store"/}" >"$l1/images.env"
"$bin/airlock" image overlay-disk --size-mib 32 "$l1/overlay.img"
for module in virt/lib/irqbypass arch/x86/kvm/kvm drivers/crypto/ccp/ccp arch/x86/kvm/kvm-amd; do
    cp "$modules/$module.ko" "$l1/modules/"
done
# mke2fs and its libraries: the daemon makes a booted guest's fresh overlay disk with it.
cp /sbin/mke2fs "$l1/bin/mke2fs"
for lib in $(ldd /sbin/mke2fs | awk '$2 == "=>" {print $3} $1 ~ /^\/lib64\// {print $1}'); do
    mkdir -p "$l1$(dirname "$lib")"
    cp -L "$lib" "$l1$lib"
done
strip --strip-debug -o "$l1/bin/airlock-vmm" "$bin/airlock-vmm"
strip --strip-debug -o "$l1/bin/airlock-jail" "$bin/airlock-jail"
strip --strip-debug -o "$l1/bin/microvm-guest" "$driver"
# `airlock seceval --tier microvm` (the CLI) and the probe it uploads into the guest.
strip --strip-debug -o "$l1/bin/airlock" "$bin/airlock"
strip --strip-debug -o "$l1/bin/airlock-probe" "$bin/airlock-probe"
cp "$guest_kernel" "$l1/vmlinux"
cp "$run/l2.cpio" "$l1/l2.cpio"
# The daemon's sandbox egresses through its proxy to a small HTTP server of L1's, which the
# proxy's test resolver names allowed.test (the guest cannot reach L1 any other way).
mkdir -p "$l1/www"
echo "hello from L1" > "$l1/www/index.html"
cat > "$l1/egress.yaml" <<'EOF_POLICY'
version: 1
network:
  mode: proxy
  egress:
    - name: l1
      host: allowed.test
      ports: [8080]
      methods: [GET]
EOF_POLICY
cat > "$l1/init" <<'EOF'
#!/bin/sh
if [ ! -e /.tmpfs-root ]; then
    # The initramfs root cannot be pivoted away from (the jail pivots): run from a tmpfs.
    mkdir /new-root
    mount -t tmpfs -o mode=0755 tmpfs /new-root
    cp -a /bin /lib /lib64 /modules /vmlinux /l2.cpio /root.ext4 /overlay.img /daemon-images /images.env /init /www /egress.yaml /new-root/
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
image_sum="$(sha256sum </root.ext4)"
if AIRLOCK_E2E_CMDLINE_DEVICES=1 AIRLOCK_E2E_VMM=/bin/airlock-vmm AIRLOCK_E2E_KERNEL=/vmlinux \
    AIRLOCK_E2E_INITRD=/l2.cpio AIRLOCK_E2E_DIR=/run/e2e AIRLOCK_E2E_OVERLAY=/overlay.img \
    AIRLOCK_JAIL_BIN=/bin/airlock-jail AIRLOCK_VMM_BIN=/bin/airlock-vmm \
    AIRLOCK_MICROVM_SNAPSHOT=/run/e2e/snapshot AIRLOCK_MICROVM_ROOT_DISK=/root.ext4 \
    /bin/microvm-guest --ignored --nocapture --test-threads 1; then
    echo "E2E PASS l1-driver"
else
    echo "E2E FAIL l1-driver: the microvm_guest test failed"
    # A VMM killed by its allow-list is logged by the kernel with the syscall's number.
    dmesg | grep -a 'type=1326\|seccomp' | tail -n 5
    # The jailed VMM's console and errors.
    tail -n 20 /run/e2e/sandbox/agent.log 2>/dev/null
fi
# The seceval microvm column: one more fork of the snapshot, a sandbox of the runtime; the
# VMM's confinement read from L1, the probe run inside the guest.
if AIRLOCK_PROBE_BIN=/bin/airlock-probe AIRLOCK_JAIL_BIN=/bin/airlock-jail AIRLOCK_VMM_BIN=/bin/airlock-vmm \
    AIRLOCK_MICROVM_SNAPSHOT=/run/e2e/snapshot AIRLOCK_MICROVM_ROOT_DISK=/root.ext4 \
    /bin/airlock seceval --tier microvm --only tier.microvm --only kern. >/run/e2e/seceval.txt 2>&1; then
    echo "E2E PASS seceval-microvm"
else
    echo "E2E FAIL seceval-microvm: airlock seceval --tier microvm failed"
    dmesg | grep -a 'type=1326\|seccomp' | tail -n 5
fi
cat /run/e2e/seceval.txt
for case in vsock vmm-namespaces vmm-view vmm-seccomp vmm-cgroup; do
    if grep -q "^  tier.microvm-$case  *blocked(" /run/e2e/seceval.txt; then
        echo "E2E PASS seceval-microvm-$case"
    else
        echo "E2E FAIL seceval-microvm-$case: not blocked"
    fi
done
# The guest-kernel cases: what the project's guest kernel leaves out, met by the guest's root.
unblocked=""
for case in bpf userfaultfd io-uring-setup keyctl add-key init-module finit-module kexec-load \
    iopl acct open-by-handle-at i386-abi x32-abi af-packet af-xdp; do
    grep -q "^  kern.$case  *blocked(guest-kernel)" /run/e2e/seceval.txt || unblocked="$unblocked $case"
done
if [ -z "$unblocked" ]; then
    echo "E2E PASS seceval-microvm-guest-kernel"
else
    echo "E2E FAIL seceval-microvm-guest-kernel: not blocked by the guest kernel:$unblocked"
fi
# The daemon over HTTP on the microvm tier: `airlock serve` in L1, and the CLI, a client of its
# API, creates a sandbox (one more fork) under a `network: proxy` policy, runs commands in it
# (its egress among them) and deletes it.
# Its image store holds the busybox test images and their disks; the operator's root disk is
# the `plain` image's own (so its sandboxes fork the snapshot) and the kernel boots the others.
ifconfig lo 127.0.0.1 up
httpd -p 127.0.0.1:8080 -h /www
# From here no guest's console is echoed onto L1's (the jailed VMMs log to their sandboxes),
# so L1 prints what its Airlock processes wait in every 90 s (not `E2E ` lines): a step that
# hangs leaves its state in the console's last lines, which a failed rig prints.
(
    while sleep 90; do
        for p in /proc/[0-9]*; do
            c=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | cut -c1-90)
            case "$c" in
                *airlock*) echo "state: ${p#/proc/} $(cat "$p/wchan" 2>/dev/null) $c" ;;
            esac
            case "$c" in
                *'airlock serve'*)
                    for t in "$p"/task/*; do
                        echo "state:   task ${t##*/} $(cat "$t/comm" "$t/wchan" 2>/dev/null | tr '\n' ' ')"
                    done ;;
            esac
        done
        tail -n 2 /run/e2e/daemon.log 2>/dev/null | sed 's/^/state: daemon.log: /'
    done
) &
export AIRLOCK_URL=http://127.0.0.1:3000
. /images.env
mkdir -p /run/e2e/daemon
mv /daemon-images /run/e2e/daemon/images
AIRLOCK_JAIL_BIN=/bin/airlock-jail AIRLOCK_VMM_BIN=/bin/airlock-vmm \
    AIRLOCK_MICROVM_SNAPSHOT=/run/e2e/snapshot AIRLOCK_MICROVM_ROOT_DISK="/run/e2e/daemon/images/$plain_disk" \
    AIRLOCK_MICROVM_KERNEL=/vmlinux AIRLOCK_MICROVM_INITRD=/l2.cpio AIRLOCK_MICROVM_CMDLINE_DEVICES=1 \
    /bin/airlock serve --listen 127.0.0.1:3000 --state-dir /run/e2e/daemon --insecure-no-auth \
    --scratch memory --test-egress-resolve allowed.test=127.0.0.1:8080 >/run/e2e/daemon.log 2>&1 &
daemon=$!
tries=0
until /bin/airlock sandbox ls >/dev/null 2>&1 || [ $tries -ge 300 ]; do tries=$((tries + 1)); sleep 1; done
# A lifetime beyond the default 5 minutes: at emulation speed its checks take longer.
if id=$(/bin/airlock sandbox create --tier microvm --memory 512MiB --timeout 30m --image "$plain" --policy /egress.yaml 2>/run/e2e/create.err); then
    echo "E2E PASS daemon-create"
    out=$(/bin/airlock sandbox exec "$id" -- /bin/sh -c 'cat /etc/motd; cat /proc/version' 2>&1)
    case "$out" in
        *"Welcome to the Airlock test image"*"Linux version 6.1"*) echo "E2E PASS daemon-exec" ;;
        *) echo "E2E FAIL daemon-exec: $out" ;;
    esac
    # Egress: HTTP_PROXY (the agent's relay, vsock, the VMM's forward, the proxy) reaches the
    # allowed host; another is refused by the proxy, which audits it; and nothing else leaves
    # the guest: loopback is its one interface, and L1's server is not on it.
    # (The proxy's trust bundle is where the environment points, for TLS through it.)
    out=$(/bin/airlock sandbox exec "$id" -- /bin/sh -c 'echo "proxy=$HTTP_PROXY"; head -n 1 "$SSL_CERT_FILE"; wget -q -O - http://allowed.test:8080/' 2>&1)
    case "$out" in
        *"proxy=http://127.0.0.1:3128"*"-----BEGIN CERTIFICATE-----"*"hello from L1"*) echo "E2E PASS microvm-egress-allowed" ;;
        *) echo "E2E FAIL microvm-egress-allowed: $out" ;;
    esac
    out=$(/bin/airlock sandbox exec "$id" -- /bin/sh -c 'wget -O /dev/null http://denied.test:8080/ 2>&1; echo "status=$?"' 2>&1)
    # The daemon's audit log (never a recursive grep of its state: its disks and guest memory
    # are gigabytes, which busybox reads for many minutes at emulation speed).
    if cat /run/e2e/daemon/audit.jsonl* 2>/dev/null | grep 'denied.test' | grep -q '"outcome":"denied"'; then
        case "$out" in
            *"403"*"status=1"*) echo "E2E PASS microvm-egress-denied" ;;
            *) echo "E2E FAIL microvm-egress-denied: $out" ;;
        esac
    else
        echo "E2E FAIL microvm-egress-denied: no audit event: $out"
    fi
    out=$(/bin/airlock sandbox exec "$id" -- /bin/sh -c 'ls /sys/class/net; nc -w 5 127.0.0.1 8080 </dev/null 2>/dev/null && echo "loopback:open"; nc -w 5 10.0.2.2 8080 </dev/null 2>/dev/null && echo "l1:open"; echo done' 2>&1)
    case "$out" in
        *open*) echo "E2E FAIL microvm-egress-no-other-route: $out" ;;
        "lo"*done) echo "E2E PASS microvm-egress-no-other-route" ;;
        *) echo "E2E FAIL microvm-egress-no-other-route: $out" ;;
    esac
    # Persistence of the VM through the daemon's API: a process counting in the guest, the
    # sandbox paused to disk (its VMM ends), resumed (the same process counts on), snapshotted,
    # and two forks of the snapshot that diverge, each with its own token, id and entropy.
    sx() { /bin/airlock sandbox exec "$@" 2>&1; }
    # The count once it exceeds $2 (a hang guard of 300 tries, not a timed assertion).
    count_above() {
        tries=0
        while [ $tries -lt 300 ]; do
            value=$(sx "$1" -- /bin/cat /tmp/count)
            case "$value" in ''|*[!0-9]*) ;; *) [ "$value" -gt "$2" ] && { echo "$value"; return 0; } ;; esac
            tries=$((tries + 1)); sleep 1
        done
        echo "no count above $2 in $1: $value"; return 1
    }
    # The VMMs running besides this sandbox's (none unless an earlier step left one).
    vmm_count() { grep -la '^airlock-vmm' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; }
    others=$(($(vmm_count) - 1))
    sx "$id" -- /bin/sh -c 'setsid /bin/sh -c "i=0; while true; do i=\$((i+1)); echo \$i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 1; done" </dev/null >/dev/null 2>&1 & echo $! > /tmp/counter.pid' >/dev/null
    counter=$(sx "$id" -- /bin/cat /tmp/counter.pid)
    before=$(count_above "$id" 1)
    echo "E2E counting in $id: pid $counter, count $before"
    if /bin/airlock sandbox pause "$id" --keep files >/run/e2e/pause.out 2>&1 &&
        [ "$(vmm_count)" -eq "$others" ] &&
        [ -s "/run/e2e/daemon/sandboxes/$id/paused/state.json" ]; then
        paused=1
        echo "E2E PASS daemon-pause-to-disk"
        du -k "/run/e2e/daemon/sandboxes/$id/paused/memory" 2>&1
    else
        echo "E2E FAIL daemon-pause-to-disk: $(cat /run/e2e/pause.out)"
        tail -n 20 /run/e2e/daemon.log
    fi
    if [ -n "${paused:-}" ] && /bin/airlock sandbox resume "$id" >/run/e2e/resume.out 2>&1 &&
        after=$(count_above "$id" "$before") &&
        [ "$(sx "$id" -- /bin/sh -c "kill -0 $counter && echo alive")" = alive ]; then
        echo "E2E PASS daemon-resume-still-counting ($before, then $after, pid $counter)"
    else
        echo "E2E FAIL daemon-resume-still-counting: $(cat /run/e2e/resume.out) ${after:-}"
        tail -n 20 /run/e2e/daemon.log
    fi
    if snap=$(/bin/airlock sandbox snapshot "$id" --name counting 2>/run/e2e/snapshot.err) &&
        [ -s "/run/e2e/daemon/vm-snapshots/$snap/paused/state.json" ] &&
        count_above "$id" "$before" >/dev/null; then
        echo "E2E PASS daemon-vm-snapshot"
    else
        echo "E2E FAIL daemon-vm-snapshot: $(cat /run/e2e/snapshot.err)"
        tail -n 20 /run/e2e/daemon.log
    fi
    forks=""
    for n in 1 2; do
        if /bin/airlock sandbox create --tier microvm --template counting --json >/run/e2e/fork$n.json 2>&1; then
            forks="$forks $(sed -n 's/^ *"id": "\([a-z0-9]*\)".*/\1/p' /run/e2e/fork$n.json | head -n1)"
        else
            echo "E2E FAIL daemon-forks: $(cat /run/e2e/fork$n.json)"
        fi
    done
    set -- $forks
    if [ $# -eq 2 ]; then
        a=$1 b=$2
        token_a=$(sed -n 's/^ *"access_token": "\(.*\)".*/\1/p' /run/e2e/fork1.json)
        token_b=$(sed -n 's/^ *"access_token": "\(.*\)".*/\1/p' /run/e2e/fork2.json)
        sx "$a" -- /bin/sh -c 'echo only-in-a > /workspace/mark' >/dev/null
        seen_b=$(sx "$b" -- /bin/sh -c 'cat /workspace/mark 2>/dev/null || echo absent')
        rand_a=$(sx "$a" -- /bin/sh -c 'head -c 16 /dev/urandom | od -An -tx1')
        rand_b=$(sx "$b" -- /bin/sh -c 'head -c 16 /dev/urandom | od -An -tx1')
        id_a=$(sx "$a" -- /bin/sh -c 'echo $AIRLOCK_SANDBOX_ID')
        id_b=$(sx "$b" -- /bin/sh -c 'echo $AIRLOCK_SANDBOX_ID')
        counts_a=$(count_above "$a" "$before") && counts_b=$(count_above "$b" "$before") &&
            alive=$(sx "$b" -- /bin/sh -c "kill -0 $counter && echo alive")
        echo "E2E forks $a ($id_a, $rand_a, $counts_a) and $b ($id_b, $rand_b, $counts_b): b sees $seen_b"
        if [ "$seen_b" = absent ] && [ "$rand_a" != "$rand_b" ] && [ -n "$token_a" ] &&
            [ "$token_a" != "$token_b" ] && [ "$id_a" = "$a" ] && [ "$id_b" = "$b" ] &&
            [ "${alive:-}" = alive ]; then
            echo "E2E PASS daemon-forks-diverge"
        else
            echo "E2E FAIL daemon-forks-diverge"
        fi
    else
        echo "E2E FAIL daemon-forks-diverge: $# forks"
        tail -n 20 /run/e2e/daemon.log
    fi
    # The fork call (E2B's fork too): a snapshot made for it, one restore, the snapshot dropped.
    if forked=$(/bin/airlock sandbox fork "$id" 2>/run/e2e/fork.err) &&
        count_above "$forked" "$before" >/dev/null &&
        [ "$(/bin/airlock sandbox snapshots | grep -c "$id")" -eq 1 ]; then
        forks="$forks $forked"
        echo "E2E PASS daemon-fork-call"
    else
        forks="$forks $forked"
        echo "E2E FAIL daemon-fork-call: $(cat /run/e2e/fork.err)"
    fi
    # A warm pool of the snapshot: its member is a pre-created VM shell (the jailed VMM with
    # its VM made, waiting), which a fork's create claims and restores; the fork counts on
    # from the snapshot with its own id. The fill's wait is a hang guard, not a timing.
    pool_ready() {
        tries=0
        while [ $tries -lt 300 ]; do
            /bin/airlock sandbox pool counting >/run/e2e/pool.out 2>&1 &&
                grep -q '"ready": 1' /run/e2e/pool.out && return 0
            tries=$((tries + 1)); sleep 1
        done
        return 1
    }
    if /bin/airlock sandbox pool counting --size 1 >/run/e2e/pool.out 2>&1 && pool_ready &&
        /bin/airlock sandbox create --tier microvm --template counting --json >/run/e2e/fork-shell.json 2>&1; then
        shelled=$(sed -n 's/^ *"id": "\([a-z0-9]*\)".*/\1/p' /run/e2e/fork-shell.json | head -n1)
        forks="$forks $shelled"
        created=$(/bin/airlock sandbox logs "$shelled" 2>&1 | grep -m1 ' create ')
        echo "E2E fork from the pool: $created"
        if [ -n "$shelled" ] && echo "$created" | grep -q 'pre-created VM shell' &&
            count_above "$shelled" "$before" >/dev/null &&
            [ "$(sx "$shelled" -- /bin/sh -c 'echo $AIRLOCK_SANDBOX_ID')" = "$shelled" ]; then
            echo "E2E PASS daemon-fork-vm-shell"
        else
            echo "E2E FAIL daemon-fork-vm-shell: $shelled"
            tail -n 20 /run/e2e/daemon.log
        fi
    else
        echo "E2E FAIL daemon-fork-vm-shell: $(cat /run/e2e/pool.out /run/e2e/fork-shell.json 2>/dev/null)"
        tail -n 20 /run/e2e/daemon.log
    fi
    # The claim started a refill: the pool's removal ends it too (a hang guard waits for it).
    /bin/airlock sandbox pool counting --size 0 >/dev/null || echo "E2E FAIL daemon-fork-vm-shell: the pool's removal"
    tries=0
    until /bin/airlock sandbox pool counting 2>&1 | grep -q '"starting": 0' || [ $tries -ge 300 ]; do
        tries=$((tries + 1)); sleep 1
    done
    /bin/airlock sandbox snapshot-rm counting || echo "E2E FAIL daemon-delete: snapshot-rm failed"
    for sandbox in $id $forks; do
        /bin/airlock sandbox rm "$sandbox" || echo "E2E FAIL daemon-delete: rm $sandbox failed"
    done
    # A delete answers before its teardown ends; a list answers after every teardown begun
    # before it, so the list comes first and the leftovers are looked for after it.
    listed="$(/bin/airlock sandbox ls | grep "$id")"
    left="$(find /run/e2e/daemon/sandboxes /run/e2e/daemon/vm-snapshots -mindepth 1 2>/dev/null)"
    vmms="$(vmm_count)"
    if [ -n "$listed" ] || [ "$vmms" -ne "$others" ] || [ -n "$left" ]; then
        echo "E2E FAIL daemon-delete: left: listed [$listed] VMMs [$vmms, $others before] files [$left]"
    else
        echo "E2E PASS daemon-delete"
    fi
else
    echo "E2E FAIL daemon-create: $(cat /run/e2e/create.err)"
    tail -n 20 /run/e2e/daemon.log
fi
# Another image: a fresh boot of the kernel on that image's disk (its second layer's file, its
# whiteout of motd, its config's environment), then gone with its VMM.
vmms_before=$(grep -la '^airlock-vmm' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)
if id=$(/bin/airlock sandbox create --tier microvm --memory 512MiB --image "$layered" 2>/run/e2e/create.err); then
    out=$(/bin/airlock sandbox exec "$id" -- /bin/sh -c 'cat /opt/keep/new; [ -e /etc/motd ] || echo no-motd; echo "image=$AIRLOCK_IMAGE"' 2>&1)
    case "$out" in
        *"new in layer two"*"no-motd"*"image=busybox"*) echo "E2E PASS daemon-image-boot" ;;
        *) echo "E2E FAIL daemon-image-boot: $out" ;;
    esac
    /bin/airlock sandbox rm "$id" || echo "E2E FAIL daemon-image-boot: rm failed"
    /bin/airlock sandbox ls >/dev/null
    vmms_after=$(grep -la '^airlock-vmm' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)
    if [ "$vmms_after" -ne "$vmms_before" ]; then
        echo "E2E FAIL daemon-image-boot: its VMM is left ($vmms_after VMMs, $vmms_before before)"
    fi
else
    echo "E2E FAIL daemon-image-boot: $(cat /run/e2e/create.err)"
    tail -n 20 /run/e2e/daemon.log
fi
kill "$daemon"
# `airlock bench vm`'s Linux guest lines, which need hardware KVM: L1's is SVM-backed, so the
# bench runs them here (boots of the kernel on the image's disk, pauses to disk, cold restores
# and restores in pre-created VM shells). This shows the code path; its figures are of
# emulation speed and say nothing about performance.
if AIRLOCK_JAIL_BIN=/bin/airlock-jail AIRLOCK_VMM_BIN=/bin/airlock-vmm AIRLOCK_MICROVM_KERNEL=/vmlinux \
    AIRLOCK_MICROVM_INITRD=/l2.cpio AIRLOCK_MICROVM_CMDLINE_DEVICES=1 AIRLOCK_MICROVM_ROOT_DISK=/root.ext4 \
    /bin/airlock bench vm --only-linux --linux-runs 1 >/run/e2e/bench-vm.txt 2>&1 &&
    grep -q '^restore in a pre-created VM shell -> agent ready ' /run/e2e/bench-vm.txt; then
    echo "E2E PASS bench-vm-linux"
else
    echo "E2E FAIL bench-vm-linux"
fi
sed 's/^/E2E bench vm, emulation speed (not performance): /' /run/e2e/bench-vm.txt
left="$(find /tmp -maxdepth 1 -name 'airlock-bench-vm-linux-*' 2>/dev/null)"
vmms="$(grep -la '^airlock-vmm' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
[ "$vmms" -eq 0 ] && [ -z "$left" ] || echo "E2E FAIL bench-vm-linux: left $vmms VMMs and [$left]"
# Guests ran on the image's disk (a boot, three forks, the bench's boots and restores), and the
# daemon's fork on the store's (the same bytes, the other boot on the layered image's); not
# one byte changed.
if [ "$(sha256sum </root.ext4)" = "$image_sum" ] &&
    [ "$(sha256sum <"/run/e2e/daemon/images/$plain_disk")" = "$image_sum" ]; then
    echo "E2E PASS image-disk-unchanged"
else
    echo "E2E FAIL image-disk-unchanged: /root.ext4 or the store's disk changed"
fi
poweroff -f
EOF
chmod +x "$l1/init"
python3 scripts/initramfs.py "$l1" "$run/l1.cpio"

expected=(l1-kvm l2-init l2-own-kernel l2-virtio-mmio l2-virtio-rng-read l2-virtio-vsock-device
    l2-image-root vsock-connect envd-health envd-command envd-file image-root-read
    image-overlay-write snapshot-written
    jailed-create jailed-envd-health jailed-envd-command jailed-envd-file jailed-vmm-confined
    jailed-vmm-namespaces jailed-vmm-view jailed-vmm-cgroup restore-still-counting jailed-destroyed
    image-write-survives-restore image-write-in-overlay-disk
    restore-vsock-connect restore-vmm-confined forks-reseeded-own-identity l1-driver
    seceval-microvm seceval-microvm-vsock seceval-microvm-vmm-namespaces seceval-microvm-vmm-view
    seceval-microvm-vmm-seccomp seceval-microvm-vmm-cgroup seceval-microvm-guest-kernel
    daemon-create daemon-exec
    microvm-egress-allowed microvm-egress-denied microvm-egress-no-other-route
    daemon-pause-to-disk daemon-resume-still-counting daemon-vm-snapshot daemon-forks-diverge
    daemon-fork-call daemon-fork-vm-shell daemon-delete daemon-image-boot bench-vm-linux
    image-disk-unchanged)
log="$run/console.log"
echo "microvm-nested: booting L1 (QEMU TCG, nested SVM); the console goes to $log"
# Boots L1 once, printing its E2E lines as they come with the seconds since the boot (the
# rig's own budget, never asserted). Status 3: QEMU printed nothing for 5 minutes and was
# stopped; the rig boots L1 again, three boots at most. No check is silent that long: the
# longest gap between E2E lines was 50 s, and from the daemon's steps on L1 prints state lines
# every 90 s. The 1800 s timeout is a hang guard, not a timed assertion. L1 has 4 GiB: the
# daemon's steps keep five 512 MiB guests, their disk copies and snapshots in L1's RAM (with
# 2 GiB, L1 hung at the fourth or fifth).
#
# L1 runs with a periodic tick (`nohz=off highres=off`). Tickless, L1 stalled in up to three
# boots of three (CI's run of 2026-12-06 among them), at any step from L2's first boot on. At a
# stall QEMU's monitor showed L1's one CPU with interrupts enabled, running a process (or, at
# other stalls, idle), and the local APIC's one-shot timer expired with its interrupt (vector
# 236) pending in IRR, never delivered; an NMI did not bring it back. That fits a lost update
# in QEMU 7.2's TCG (our reading of its source, not proven): the main loop thread sets
# CPU_INTERRUPT_POLL in the vCPU's interrupt_request under the big lock, while the emulated
# VMRUN ORs CPU_INTERRUPT_VIRQ into the same word from the vCPU's thread without it. Tickless,
# the lost wake-up's one-shot timer is never armed again and L1 never schedules again; a
# periodic timer fires again 4 ms later. With it, four runs in a row passed every check in
# their first boot (421-492 s), one of them with a release build beside it.
# If L1 is quiet for 2 minutes anyway, the rig prints QEMU's CPU use and what the monitor says
# of the vCPU (registers, local APIC) before it gives up on the boot.
l1_diagnose() {
    local qemu_pid ticks_before ticks_after
    qemu_pid=$(pgrep -P "$1" -f qemu-system || echo "$1")
    ticks_before=$(awk '{print $14 + $15}' "/proc/$qemu_pid/stat" 2>/dev/null || echo 0)
    sleep 5
    ticks_after=$(awk '{print $14 + $15}' "/proc/$qemu_pid/stat" 2>/dev/null || echo 0)
    echo "QEMU used $(( (ticks_after - ticks_before) * 100 / $(getconf CLK_TCK) / 5 ))% of a CPU over 5 s"
    python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(sys.argv[1])
time.sleep(0.5)
s.recv(4096)
for command in ("info cpus", "info registers", "info lapic"):
    s.sendall(command.encode() + b"\n")
    time.sleep(1)
    for line in s.recv(1 << 16).decode(errors="replace").replace("\r", "").splitlines():
        # The monitor echoes each command with terminal escapes: those lines are skipped.
        if line.strip() and "\x1b" not in line and not line.startswith(("(qemu)", "FPR", "XMM", "DR", "FCW")):
            print(command + ": " + line)' "$2" || echo "the monitor did not answer"
}
boot_l1() {
    local began=$SECONDS shown=0 size=-1 quiet_since=$SECONDS lines now diagnosed=0
    local monitor="$run/monitor.sock"
    rm -f "$monitor"
    LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu" \
        timeout 1800 "$root/usr/bin/qemu-system-x86_64" -accel tcg -cpu EPYC,+svm -smp 1 -m 4096 \
        -kernel "$rig/vmlinux" -initrd "$run/l1.cpio" \
        -append 'console=ttyS0 panic=-1 quiet mitigations=off nohz=off highres=off' \
        -nographic -no-reboot -monitor "unix:$monitor,server=on,wait=off" \
        </dev/null >"$log" 2>&1 &
    local qemu=$!
    while kill -0 "$qemu" 2>/dev/null; do
        sleep 10
        lines="$(tr -d '\r' <"$log" | grep -a 'E2E ' || true)"
        if [ -n "$lines" ]; then
            echo "$lines" | tail -n +$((shown + 1)) | sed "s/^/microvm-nested: +$((SECONDS - began))s /"
            shown=$(echo "$lines" | wc -l)
        fi
        now=$(stat -c %s "$log")
        if [ "$now" -ne "$size" ]; then
            size=$now quiet_since=$SECONDS diagnosed=0
        elif [ $((SECONDS - quiet_since)) -ge 120 ] && [ "$diagnosed" -eq 0 ]; then
            diagnosed=1
            echo "microvm-nested: +$((SECONDS - began))s L1 quiet for 2 minutes; what QEMU says of its vCPU:"
            l1_diagnose "$qemu" "$monitor" | sed 's/^/microvm-nested:   /'
        elif [ $((SECONDS - quiet_since)) -ge 300 ]; then
            echo "microvm-nested: L1 printed nothing for 5 minutes; stopping QEMU. Its last lines:"
            tr -d '\r' <"$log" | tail -n 20 | sed 's/^/microvm-nested:   /'
            kill "$qemu" 2>/dev/null || true
            wait "$qemu" || true
            return 3
        fi
    done
    wait "$qemu" || echo "microvm-nested: QEMU exited with status $?"
    tr -d '\r' <"$log" | grep -a 'E2E ' | tail -n +$((shown + 1)) || true
}
started=$SECONDS
for boot in 1 2 3; do
    status=0
    boot_l1 || status=$?
    [ "$status" -eq 3 ] && [ "$boot" -lt 3 ] || break
    echo "microvm-nested: booting L1 again"
done
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
