#!/usr/bin/env bash
# What sandboxes leave on the host: Airlock's cgroups (every hierarchy), mounts whose source or
# mount point names airlock, loop devices backed by airlock files, and airlock-jail,
# airlock-agent and airlockd processes. `leftovers.sh record FILE` writes what is there now;
# `leftovers.sh check FILE` waits a few seconds for stragglers, then fails listing anything not
# in FILE. Run around the whole suite, so a leak from any test fails it (on a clean CI machine
# FILE starts empty).
set -euo pipefail

list() {
    find /sys/fs/cgroup -mindepth 1 -maxdepth 6 -type d -name 'airlock-*' -printf 'cgroup %p\n' 2>/dev/null || true
    awk '$0 ~ /airlock/ { print "mount " $2 }' /proc/self/mounts
    losetup --list --noheadings --output NAME,BACK-FILE 2>/dev/null | awk '$2 ~ /airlock/ { print "loop " $1 " " $2 }' || true
    for comm in /proc/[0-9]*/comm; do
        name=$(cat "$comm" 2>/dev/null) || continue
        case "$name" in
            airlock-jail | airlock-agent | airlockd) echo "process ${comm%/comm} $name" ;;
        esac
    done
}

# Whether a leftover line is an Airlock cgroup with no task left in it or below it.
empty_cgroup() {
    case "$1" in
        "cgroup "*) [ -z "$(find "${1#cgroup }" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] ;;
        *) return 1 ;;
    esac
}

case "${1:-}" in
    record) list | sort >"$2" ;;
    check)
        for _ in $(seq 20); do
            new=$(list | sort | comm -13 "$2" -)
            [ -z "$new" ] && exit 0
            sleep 0.5
        done
        echo "scripts/leftovers.sh: the suite left these on the host:" >&2
        while IFS= read -r line; do
            # A cgroup with no task holds no memory, but it is still a leak of a sandbox.
            if empty_cgroup "$line"; then echo "$line (empty)"; else echo "$line"; fi
        done <<<"$new" >&2
        exit 1
        ;;
    *)
        echo "usage: scripts/leftovers.sh record|check FILE" >&2
        exit 2
        ;;
esac
