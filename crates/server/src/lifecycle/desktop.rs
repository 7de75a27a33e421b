//! The `desktop` template: the host root, read-only, with what a computer-use agent needs on
//! the screen side — Xvfb, XFCE, xdotool, scrot, xrandr, x11vnc, noVNC under `/opt/noVNC`,
//! Chromium — as E2B's desktop template has them, so the unmodified `e2b-desktop` SDK drives
//! it (the SDK starts the X server and the session itself, through commands).
//!
//! On the process tier the sandbox sees the host's packages, so the host needs them
//! (`scripts/desktop-host.sh` installs them from Debian). What the template adds is the
//! environment: writable XDG directories under the sandbox's private `/tmp` (HOME is already
//! there), and the flags Chromium needs inside a sandbox. Chromium runs with `--no-sandbox`:
//! its own namespace sandbox needs nested user namespaces, which Airlock refuses, and Airlock's
//! sandbox is the boundary (docs/threat-model.md). Its debugging port (9222, loopback of the
//! sandbox) is what CDP clients reach through the data plane.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::ApiError;

/// E2B's name for the template, and the e2b-desktop SDK's default.
pub const DESKTOP_TEMPLATE: &str = "desktop";
/// What `GET /v1/templates` says of it.
pub const DESKTOP_DESCRIPTION: &str = "The host root, read-only, with a virtual desktop for computer use: Xvfb, XFCE, xdotool, scrot, x11vnc and noVNC on port 6080, Chromium with CDP on port 9222 (the host's packages: scripts/desktop-host.sh)";
/// Chromium's remote-debugging port inside the sandbox.
pub const CDP_PORT: u16 = 9222;
/// Where the sandbox's browser keeps its profile and puts downloads.
pub const BROWSER_PROFILE: &str = "/tmp/.airlock-chromium";
pub const DOWNLOADS_DIR: &str = "/tmp/Downloads";

/// The flags of every Chromium a desktop sandbox starts (through the Debian launcher's
/// `/etc/chromium.d/airlock-desktop` hook). `--test-type` hides the `--no-sandbox` infobar,
/// which would shift the page by ~56 px under a coordinate-driven agent; the profile is not
/// Chromium's default one, where remote debugging is refused.
fn chromium_flags() -> String {
    [
        "--no-sandbox",
        "--test-type",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-breakpad",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
        "--password-store=basic",
        &format!("--user-data-dir={BROWSER_PROFILE}"),
        &format!("--remote-debugging-port={CDP_PORT}"),
        "--window-position=0,0",
        "--start-maximized",
    ]
    .join(" ")
}

/// The variables a desktop sandbox starts with; a create's own `env` wins over each.
pub fn default_env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("XDG_CONFIG_HOME".to_owned(), "/tmp/.config".to_owned()),
        ("XDG_CACHE_HOME".to_owned(), "/tmp/.cache".to_owned()),
        ("XDG_DATA_HOME".to_owned(), "/tmp/.local/share".to_owned()),
        ("XDG_DOWNLOAD_DIR".to_owned(), DOWNLOADS_DIR.to_owned()),
        ("AIRLOCK_CHROMIUM_FLAGS".to_owned(), chromium_flags()),
    ])
}

/// Fills in the template's variables that `env` does not set.
pub fn apply_env(env: &mut BTreeMap<String, String>) {
    for (name, value) in default_env() {
        env.entry(name).or_insert(value);
    }
}

/// What the host root must hold for a desktop sandbox, and the package that brings it.
const HOST_NEEDS: &[(&str, &str)] = &[
    ("usr/bin/Xvfb", "xvfb"),
    ("usr/bin/xdpyinfo", "x11-utils"),
    ("usr/bin/xrandr", "x11-xserver-utils"),
    ("usr/bin/startxfce4", "xfce4"),
    ("usr/bin/dbus-launch", "dbus-x11"),
    ("usr/bin/xdotool", "xdotool"),
    ("usr/bin/scrot", "scrot"),
    ("usr/bin/x11vnc", "x11vnc"),
    ("usr/bin/websockify", "websockify"),
    ("opt/noVNC/utils/novnc_proxy", "novnc, linked at /opt/noVNC"),
    ("usr/bin/chromium", "chromium"),
    (
        "etc/chromium.d/airlock-desktop",
        "Airlock's Chromium flags hook",
    ),
];

/// A clear error before any sandbox starts when the root lacks the desktop's programs.
pub fn check_root(root: &Path) -> Result<(), ApiError> {
    let missing: Vec<String> = HOST_NEEDS
        .iter()
        .filter(|(path, _)| !root.join(path).exists())
        .map(|(path, package)| format!("/{path} ({package})"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::unprocessable(format!(
        "the desktop template needs on the host: {}; scripts/desktop-host.sh installs them",
        missing.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_desktop_env_caller_values_win() {
        let mut env = BTreeMap::from([("XDG_CONFIG_HOME".to_owned(), "/workspace/.c".to_owned())]);
        apply_env(&mut env);
        assert_eq!(env["XDG_CONFIG_HOME"], "/workspace/.c");
        assert_eq!(env["XDG_CACHE_HOME"], "/tmp/.cache");
        assert!(env["AIRLOCK_CHROMIUM_FLAGS"].contains("--no-sandbox"));
    }

    #[test]
    fn test_desktop_check_root_names_missing_programs() {
        let err = check_root(Path::new("/nonexistent/airlock-root")).unwrap_err();
        assert!(
            err.message.contains("/usr/bin/Xvfb (xvfb)"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("scripts/desktop-host.sh"),
            "{}",
            err.message
        );
    }
}
