#!/usr/bin/env bash
# Prepares this host for the `desktop` template on the process tier, whose sandboxes see the
# host's root read-only: installs the Debian (bookworm) packages that the e2b-desktop SDK and
# airlockd's computer API run inside the sandbox, exposes Debian's noVNC where the SDK looks
# for it (/opt/noVNC), and lets a sandbox pass Chromium the flags it needs (the Debian
# launcher resets CHROMIUM_FLAGS, so /etc/chromium.d/airlock-desktop appends
# AIRLOCK_CHROMIUM_FLAGS, which only desktop sandboxes set). Idempotent; run as root.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/desktop-host.sh: run as root (apt-get, /opt and /etc/chromium.d)" >&2
    exit 1
fi

# Without recommends: XFCE's three processes the SDK waits for (xfce4-session, xfwm4,
# xfdesktop) and dbus-launch; the X server and tools; the stream; the browser.
packages=(
    xvfb x11-utils x11-xserver-utils xfce4 dbus-x11 xdotool scrot xclip
    x11vnc novnc websockify net-tools procps xdg-utils libgtk-3-bin
    chromium fonts-liberation
)
missing=()
for package in "${packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "desktop-host: installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
fi

# The SDK runs `cd /opt/noVNC/utils && ./novnc_proxy ... --web /opt/noVNC`; Debian's
# novnc_proxy uses the system websockify when utils/websockify is absent.
if [ ! -e /opt/noVNC ]; then
    mkdir -p /opt
    ln -s /usr/share/novnc /opt/noVNC
fi
if [ ! -x /opt/noVNC/utils/novnc_proxy ]; then
    echo "scripts/desktop-host.sh: /opt/noVNC/utils/novnc_proxy is missing (is /opt/noVNC another noVNC?)" >&2
    exit 1
fi

hook=/etc/chromium.d/airlock-desktop
want='# Written by Airlock (scripts/desktop-host.sh): desktop sandboxes set AIRLOCK_CHROMIUM_FLAGS.
if [ -n "${AIRLOCK_CHROMIUM_FLAGS:-}" ]; then
    export CHROMIUM_FLAGS="$CHROMIUM_FLAGS $AIRLOCK_CHROMIUM_FLAGS"
fi'
if [ "$(cat "$hook" 2>/dev/null)" != "$want" ]; then
    printf '%s\n' "$want" >"$hook"
fi
