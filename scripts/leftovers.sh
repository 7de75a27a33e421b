#!/usr/bin/env bash
# What sandboxes leave on the host: Airlock's cgroups (every hierarchy), mounts whose source or
# mount point names airlock, loop devices backed by airlock files, and airlock-jail,
# airlock-agent and airlockd processes. `leftovers.sh record FILE` writes what is there now;
# `leftovers.sh check FILE` waits a few seconds for stragglers, then fails listing anything not
# in FILE. Run around the whole suite, so a leak from any test fails it (on a clean CI machine
# FILE starts empty). `leftovers.sh clean FILE` ends and removes what is not in FILE, for a suite
# that was stopped or failed half-way: sandboxes outlive their daemon by design, and the daemons
# of the suite's temporary state directories never start again to adopt and end them.
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

# The lines of `list` that are not in the record FILE.
added() { list | sort | comm -13 "$1" -; }

# `added`, once it is empty or after ten seconds: processes just killed take a moment to end
# and be reaped, and their cgroups to empty.
settled() {
    local new
    for _ in $(seq 20); do
        new=$(added "$1")
        [ -z "$new" ] && return 0
        sleep 0.5
    done
    echo "$new"
}

# The tasks in cgroup directory $1 and below it.
tasks_in() { find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true; }

# Whether a leftover line is an Airlock cgroup with no task left in it or below it.
empty_cgroup() {
    case "$1" in
        "cgroup "*) [ -z "$(tasks_in "${1#cgroup }")" ] ;;
        *) return 1 ;;
    esac
}

# Ends the sandboxes, daemons and helpers in the new lines of `list` (on stdin), then releases
# their mounts, loop devices and cgroups. State directories stay, for a look at the logs.
clean() {
    local new cgroups
    new=$(cat)
    cgroups=$(awk '$1 == "cgroup" { print $2 }' <<<"$new")
    # A frozen task acts on SIGKILL only once thawed: thaw every new cgroup first.
    for dir in $cgroups; do
        if [ -f "$dir/freezer.state" ]; then echo THAWED >"$dir/freezer.state" 2>/dev/null || true; fi
        if [ -f "$dir/cgroup.freeze" ]; then echo 0 >"$dir/cgroup.freeze" 2>/dev/null || true; fi
    done
    for dir in $cgroups; do
        tasks_in "$dir" | xargs -r kill -KILL 2>/dev/null || true
    done
    awk '$1 == "process" { sub("/proc/", "", $2); print $2 }' <<<"$new" | xargs -r kill -KILL 2>/dev/null || true
    # Killed tasks leave their cgroups only once the kernel has torn them down.
    for _ in $(seq 20); do
        [ -z "$(for dir in $cgroups; do tasks_in "$dir"; done)" ] && break
        sleep 0.25
    done
    # Deepest mount first, so that a mount below another is not hidden by the lazy unmount.
    awk '$1 == "mount" { print $2 }' <<<"$new" | sort -r | while IFS= read -r mount; do
        umount -l "$(printf '%b' "$mount")" 2>/dev/null || true
    done
    awk '$1 == "loop" { print $2 }' <<<"$new" | xargs -r -n 1 losetup -d 2>/dev/null || true
    for dir in $cgroups; do
        find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

case "${1:-}" in
    record) list | sort >"$2" ;;
    clean)
        [ -f "$2" ] || exit 0
        new=$(added "$2")
        [ -z "$new" ] && exit 0
        echo "scripts/leftovers.sh: ending what the stopped suite left:" >&2
        echo "$new" >&2
        clean <<<"$new"
        left=$(settled "$2")
        if [ -n "$left" ]; then
            echo "scripts/leftovers.sh: still there after cleaning:" >&2
            echo "$left" >&2
            exit 1
        fi
        ;;
    check)
        new=$(settled "$2")
        [ -z "$new" ] && exit 0
        echo "scripts/leftovers.sh: the suite left these on the host:" >&2
        while IFS= read -r line; do
            # A cgroup with no task holds no memory, but it is still a leak of a sandbox.
            if empty_cgroup "$line"; then echo "$line (empty)"; else echo "$line"; fi
        done <<<"$new" >&2
        exit 1
        ;;
    *)
        echo "usage: scripts/leftovers.sh record|check|clean FILE" >&2
        exit 2
        ;;
esac
