//! The `desktop` template's warm display: a warm pool's member starts its X server and XFCE
//! session before any claim, at [`WARM_RESOLUTION`], so that a create served from the pool
//! takes its first screenshot without starting either.
//!
//! Two clients start displays, differently:
//!
//! - The native computer API starts one only when none answers, at the sandbox's
//!   `metadata.resolution`; the pool key carries that resolution (default 1024x768), so a
//!   create asking for another goes cold.
//! - The e2b-desktop SDK always runs `Xvfb :0 -ac -screen 0 WxHx24 -retro -dpi 96 -nolisten tcp
//!   -nolisten unix` and then `startxfce4` itself, and the create request does not carry the
//!   resolution. The member starts its server with exactly the SDK's command for the warm
//!   resolution, and puts two small scripts first on the login shell's `PATH` (`bash -l` reads
//!   `$HOME/.bash_profile`; HOME is the sandbox's `/tmp`): `Xvfb` with the warm command's
//!   arguments stands for the running server (it waits for it to end) instead of failing
//!   beside it; `Xvfb` with other arguments for the same display stops the warm session first
//!   and runs the real server, at the size asked for; `startxfce4` stands for the warm session
//!   while it runs; `xdpyinfo`, which the SDK polls next, waits (at most 2 s) until an `Xvfb`
//!   command has settled which server answers. So the SDK gets one display either way, of the
//!   size it asked for.
//!
//! What the session starts before the claim does not see the claim's env (as for the code
//! interpreter's kernel); commands run after it, and what they open, do.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use airlock_api::v1::ErrorCode;

use super::computer::{DEFAULT_DISPLAY, DEFAULT_RESOLUTION, RESOLUTION_KEY, parse_resolution};
use super::computer::{run, start};
use crate::agent::Agent;
use crate::error::ApiError;

/// The size of a member's warm display: the SDK's and the computer API's default.
pub const WARM_RESOLUTION: (u32, u32) = DEFAULT_RESOLUTION;
/// Where a member keeps the warm display's state and scripts (the sandbox's own `/tmp`).
const WARM_DIR: &str = "/tmp/.airlock-desktop";
/// How long the X server and the session may take to come up on a loaded machine.
const SERVER_WAIT: Duration = Duration::from_secs(30);
const SESSION_WAIT: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(100);

/// The resolution a create asks of a desktop's display, for the pool key: its
/// `metadata.resolution` (checked by normalize) or the default.
pub fn requested_resolution(metadata: &BTreeMap<String, String>) -> (u32, u32) {
    metadata
        .get(RESOLUTION_KEY)
        .and_then(|value| parse_resolution(value).ok())
        .unwrap_or(DEFAULT_RESOLUTION)
}

/// The arguments the e2b-desktop SDK gives Xvfb for a `width`x`height` screen on `:0`.
fn sdk_xvfb_args((width, height): (u32, u32)) -> Vec<String> {
    let screen = format!("{width}x{height}x24");
    [
        DEFAULT_DISPLAY,
        "-ac",
        "-screen",
        "0",
        &screen,
        "-retro",
        "-dpi",
        "96",
        "-nolisten",
        "tcp",
        "-nolisten",
        "unix",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `Xvfb` first on the login shell's PATH in a member (see the module's doc). `decided` tells
/// the `xdpyinfo` script that the display the SDK waits for is the one it asked for.
const XVFB_SCRIPT: &str = r#"#!/bin/sh
# Airlock: this desktop sandbox came from a warm pool; its X server already runs.
warm=/tmp/.airlock-desktop
pid=$(cat "$warm/xvfb.pid" 2>/dev/null)
if [ -n "$pid" ] && [ "$*" = "$(cat "$warm/xvfb.args")" ] && kill -0 "$pid" 2>/dev/null; then
    : >"$warm/decided"
    exec tail --pid="$pid" -f /dev/null
fi
if [ -n "$pid" ] && [ "$1" = "$(cut -d' ' -f1 "$warm/xvfb.args")" ]; then
    # Another size on the warm display: stop the warm server (its X clients end with it),
    # then start the one asked for and say so once it answers.
    rm -f "$warm/xvfb.pid"
    kill "$pid" 2>/dev/null
    i=0
    while [ "$i" -lt 100 ] && { kill -0 "$pid" 2>/dev/null \
        || pgrep -x 'xfce4-session|xfwm4|xfdesktop' >/dev/null; }; do
        sleep 0.1
        i=$((i + 1))
    done
    pkill -KILL -x 'xfce4-session|xfwm4|xfdesktop' 2>/dev/null
    /usr/bin/Xvfb "$@" &
    server=$!
    i=0
    while [ "$i" -lt 200 ] && kill -0 "$server" 2>/dev/null \
        && ! /usr/bin/xdpyinfo -display "$1" >/dev/null 2>&1; do
        sleep 0.05
        i=$((i + 1))
    done
    : >"$warm/decided"
    wait "$server"
    exit $?
fi
: >"$warm/decided"
exec /usr/bin/Xvfb "$@"
"#;

/// `xdpyinfo` first on the login shell's PATH in a member: until an `Xvfb` command has decided
/// which server the display is (at most 2 s), the warm one may be on its way out.
const XDPYINFO_SCRIPT: &str = r#"#!/bin/sh
warm=/tmp/.airlock-desktop
i=0
while [ ! -e "$warm/decided" ] && [ "$i" -lt 40 ]; do
    sleep 0.05
    i=$((i + 1))
done
: >"$warm/decided" 2>/dev/null
exec /usr/bin/xdpyinfo "$@"
"#;

/// `startxfce4` first on the login shell's PATH in a member.
const STARTXFCE4_SCRIPT: &str = r#"#!/bin/sh
# Airlock: this desktop sandbox came from a warm pool; its XFCE session already runs.
if [ -f /tmp/.airlock-desktop/xvfb.pid ] && session=$(pgrep -x -o xfce4-session); then
    exec tail --pid="$session" -f /dev/null
fi
exec /usr/bin/startxfce4 "$@"
"#;

const BASH_PROFILE: &str = "# Airlock: the warm display's Xvfb and startxfce4 (see /tmp/.airlock-desktop/bin).\n\
PATH=/tmp/.airlock-desktop/bin:$PATH\n";

/// Whether every one of XFCE's three processes that the SDK waits for runs, and its panel (the
/// last of the session's programs to start).
const SESSION_UP: &str = "pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null \
                          && pgrep -x xfdesktop >/dev/null && pgrep -x xfce4-panel >/dev/null";
/// One screenshot before the member is ready: the desktop has been drawn once, and the first
/// claim's first screenshot is not the session's first.
const FIRST_SCREENSHOT: &str = "f=$(mktemp /tmp/.airlock-warm-XXXXXX.png) && scrot --overwrite \"$f\"; \
                                rc=$?; rm -f \"$f\"; exit $rc";

/// Starts a member's warm display and session through `agent`, with the template's `env`,
/// and waits until XFCE's session is up and has been captured once.
pub(super) async fn start_warm_display(
    agent: &Agent,
    env: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    let mut env = env.clone();
    env.insert("DISPLAY".to_owned(), DEFAULT_DISPLAY.to_owned());
    let args = sdk_xvfb_args(WARM_RESOLUTION);
    let install = "set -e; umask 022; mkdir -p \"$1/bin\"; \
                   printf %s \"$2\" >\"$1/bin/Xvfb\"; printf %s \"$3\" >\"$1/bin/startxfce4\"; \
                   printf %s \"$4\" >\"$1/bin/xdpyinfo\"; chmod 755 \"$1\"/bin/*; \
                   printf %s \"$5\" >\"$1/xvfb.args\"; printf %s \"$6\" >/tmp/.bash_profile";
    let joined = args.join(" ");
    let argv = [
        "/bin/sh",
        "-c",
        install,
        "sh",
        WARM_DIR,
        XVFB_SCRIPT,
        STARTXFCE4_SCRIPT,
        XDPYINFO_SCRIPT,
        joined.as_str(),
        BASH_PROFILE,
    ];
    run(agent, &argv, &env)
        .await?
        .checked("installing the warm display's scripts")?;
    let server = "echo $$ >\"$0/xvfb.pid\"; exec /usr/bin/Xvfb \"$@\"";
    let mut argv: Vec<&str> = vec!["/bin/sh", "-c", server, WARM_DIR];
    argv.extend(args.iter().map(String::as_str));
    drop(start(agent, &argv, &env, None).await?);
    let probe = ["xdpyinfo", "-display", DEFAULT_DISPLAY];
    wait(agent, &probe, &env, SERVER_WAIT, "the warm X server").await?;
    drop(start(agent, &["/usr/bin/startxfce4"], &env, None).await?);
    let session = ["/bin/sh", "-c", SESSION_UP];
    wait(agent, &session, &env, SESSION_WAIT, "the warm XFCE session").await?;
    run(agent, &["/bin/sh", "-c", FIRST_SCREENSHOT], &env)
        .await?
        .checked("the warm display's first screenshot")?;
    Ok(())
}

async fn wait(
    agent: &Agent,
    argv: &[&str],
    env: &BTreeMap<String, String>,
    within: Duration,
    what: &str,
) -> Result<(), ApiError> {
    let started = Instant::now();
    while started.elapsed() < within {
        if run(agent, argv, env).await?.code == 0 {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    Err(ApiError::new(
        ErrorCode::Conflict,
        format!("{what} did not come up within {} s", within.as_secs()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_warm_xvfb_args_are_the_sdks_command() {
        // e2b_desktop 2.7.2, Sandbox.create: f"Xvfb {display} -ac -screen 0 {w}x{h}x24"
        // f" -retro -dpi {dpi or 96} -nolisten tcp -nolisten unix"
        assert_eq!(
            sdk_xvfb_args((1024, 768)).join(" "),
            ":0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix"
        );
    }

    #[test]
    fn test_requested_resolution_defaults_and_parses() {
        let mut metadata = BTreeMap::new();
        assert_eq!(requested_resolution(&metadata), (1024, 768));
        metadata.insert(RESOLUTION_KEY.to_owned(), "1280X720".to_owned());
        assert_eq!(requested_resolution(&metadata), (1280, 720));
    }
}
