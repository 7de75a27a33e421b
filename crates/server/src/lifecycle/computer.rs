//! The native computer API (`POST /v1/sandboxes/{id}/computer`, and the MCP tools): one action
//! on a sandbox's X display, run through its agent as the e2b-desktop SDK runs them (xdotool,
//! scrot, xclip), so both see the same screen. The display is `:0` (the sandbox's `DISPLAY`
//! wins); when nothing serves it yet, the first action starts Xvfb at the sandbox's
//! `resolution` metadata (`WIDTHxHEIGHT`, default 1024x768) with XFCE's window manager but no
//! session (the SDK's create starts the whole of XFCE itself). Moves go without xdotool's
//! `--sync`, which waits 15 s when the pointer is already at the target (xdotool 3.20160805);
//! the X server applies one client's fake events in order, so a click lands where the move put
//! the pointer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_api::v1::{
    ComputerAction, ComputerResult, ErrorCode, MAX_COMPUTER_TEXT_CHARS, MAX_SCROLL_CLICKS,
    MAX_TYPED_CHARS, MouseButton, ScrollDirection,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::Daemon;
use crate::agent::{Agent, Envelope, EnvelopeReader};
use crate::error::ApiError;

/// The display when the sandbox names none (E2B's default).
pub(super) const DEFAULT_DISPLAY: &str = ":0";
/// The screen Xvfb gets without `resolution` metadata (the e2b-desktop SDK's default).
pub const DEFAULT_RESOLUTION: (u32, u32) = (1024, 768);
/// The metadata key that sets it.
pub const RESOLUTION_KEY: &str = "resolution";
/// Bounds of a screen side, in pixels.
const MIN_SIDE_PX: u32 = 64;
const MAX_SIDE_PX: u32 = 8192;
/// One action's command may run this long.
const ACTION_MS: u64 = 30_000;
/// How long a started X server may take to answer.
const DISPLAY_WAIT: Duration = Duration::from_secs(20);
/// How long one xclip gets to take the clipboard before another is started.
const CLIPBOARD_ATTEMPT: Duration = Duration::from_secs(3);
/// The most of a command's stdout kept (a screenshot) and of its stderr (for errors).
const MAX_STDOUT_BYTES: usize = 64 << 20;
const MAX_STDERR_BYTES: usize = 4096;

/// `WIDTHxHEIGHT` → pixels, within bounds.
pub fn parse_resolution(value: &str) -> Result<(u32, u32), String> {
    let bad = || {
        format!(
            "metadata.resolution must be WIDTHxHEIGHT with sides of {MIN_SIDE_PX} to {MAX_SIDE_PX} pixels, got {value:?}"
        )
    };
    let (w, h) = value.split_once(['x', 'X']).ok_or_else(bad)?;
    let side = |s: &str| {
        s.trim()
            .parse::<u32>()
            .ok()
            .filter(|v| (MIN_SIDE_PX..=MAX_SIDE_PX).contains(v))
    };
    match (side(w), side(h)) {
        (Some(w), Some(h)) => Ok((w, h)),
        _ => Err(bad()),
    }
}

/// Sandboxes whose display answered once: their actions skip the probe (a process start
/// each). An action that fails drops its sandbox from it, so a display that died is probed,
/// and restarted, at the next action. Ids of ended sandboxes are forgotten in bulk.
static DISPLAY_UP: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());
const DISPLAY_UP_MAX: usize = 4096;

fn display_up() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<String>> {
    DISPLAY_UP
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records that sandbox `id`'s display answers (a warm pool's member, checked as it started).
pub(super) fn note_display_up(id: &str) {
    let mut up = display_up();
    if up.len() >= DISPLAY_UP_MAX {
        up.clear();
    }
    up.insert(id.to_owned());
}

/// What one command printed, and how it ended.
pub(super) struct Output {
    pub(super) code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Output {
    pub(super) fn checked(self, what: &str) -> Result<Vec<u8>, ApiError> {
        if self.code == 0 {
            return Ok(self.stdout);
        }
        let stderr = String::from_utf8_lossy(&self.stderr);
        Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "{what} failed (exit {}): {}",
                self.code,
                stderr.trim().lines().last().unwrap_or("no message")
            ),
        ))
    }
}

/// Starts `argv` through the agent; `None` for `timeout_ms` leaves it running in the
/// background (its stream is dropped; the process outlives it, envd's rule).
pub(super) async fn start(
    agent: &Agent,
    argv: &[&str],
    env: &BTreeMap<String, String>,
    timeout_ms: Option<u64>,
) -> Result<EnvelopeReader, ApiError> {
    let process = json!({ "cmd": argv[0], "args": &argv[1..], "envs": env, "cwd": "/tmp" });
    agent
        .start_process(&json!({ "process": process }), timeout_ms, None)
        .await
}

/// Runs `argv` to its end and collects its output.
pub(super) async fn run(
    agent: &Agent,
    argv: &[&str],
    env: &BTreeMap<String, String>,
) -> Result<Output, ApiError> {
    let mut reader = start(agent, argv, env, Some(ACTION_MS)).await?;
    let mut output = Output {
        code: -1,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    loop {
        let Some(Envelope::Message(value)) = reader.next().await? else {
            return Ok(output);
        };
        let event = value.get("event").unwrap_or(&Value::Null);
        if let Some(data) = event.get("data") {
            for (stream, into, cap) in [
                ("stdout", &mut output.stdout, MAX_STDOUT_BYTES),
                ("stderr", &mut output.stderr, MAX_STDERR_BYTES),
            ] {
                if let Some(bytes) = data
                    .get(stream)
                    .and_then(Value::as_str)
                    .and_then(|b| BASE64.decode(b).ok())
                {
                    if into.len() + bytes.len() > cap {
                        return Err(ApiError::new(
                            ErrorCode::AgentError,
                            format!("`{}` printed more than {cap} bytes", argv[0]),
                        ));
                    }
                    into.extend_from_slice(&bytes);
                }
            }
        } else if let Some(end) = event.get("end") {
            let exited = end.get("exited").and_then(Value::as_bool).unwrap_or(false);
            let code = end
                .get("exitCode")
                .or_else(|| end.get("exit_code"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            output.code = if exited {
                i32::try_from(code).unwrap_or(-1)
            } else {
                -1
            };
            return Ok(output);
        }
    }
}

/// Common key names (the e2b-desktop SDK's and computer-use models') → X keysyms; anything
/// else passes through, as xdotool reads it.
fn keysym(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let mapped = match lower.as_str() {
        "enter" | "return" => "Return",
        "esc" | "escape" => "Escape",
        "backspace" => "BackSpace",
        "tab" => "Tab",
        "space" => "space",
        "delete" | "del" => "Delete",
        "insert" => "Insert",
        "home" => "Home",
        "end" => "End",
        "up" => "Up",
        "down" => "Down",
        "left" => "Left",
        "right" => "Right",
        "page_up" | "pageup" => "Page_Up",
        "page_down" | "pagedown" => "Page_Down",
        "ctrl" | "control" => "Control_L",
        "alt" => "Alt_L",
        "shift" => "Shift_L",
        "cmd" | "super" | "win" | "meta" => "Super_L",
        _ if lower.len() <= 3 && lower.starts_with('f') && lower[1..].parse::<u8>().is_ok() => {
            return lower.to_ascii_uppercase();
        }
        _ => return name.to_owned(),
    };
    mapped.to_owned()
}

fn chord(keys: &str) -> Result<String, ApiError> {
    let parts: Vec<&str> = keys.split('+').map(str::trim).collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(ApiError::invalid(format!(
            "keys must be key names joined by +, got {keys:?}"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| keysym(p))
        .collect::<Vec<_>>()
        .join("+"))
}

/// Width and height from a PNG's header.
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let side = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    Some((side(16), side(20)))
}

fn number(text: &str, key: &str) -> Option<u32> {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.trim().parse().ok())
}

fn check_text(text: &str, max_chars: usize) -> Result<(), ApiError> {
    let chars = text.chars().count();
    if chars > max_chars {
        return Err(ApiError::invalid(format!(
            "the text is {chars} characters; the most is {max_chars}"
        )));
    }
    if text.contains('\0') {
        return Err(ApiError::invalid("the text contains a NUL byte"));
    }
    Ok(())
}

impl Daemon {
    /// Runs one computer action in sandbox `id`.
    pub async fn computer(
        self: &Arc<Self>,
        id: &str,
        action: &ComputerAction,
    ) -> Result<ComputerResult, ApiError> {
        let agent = self.agent(id).await?;
        let mut env = self.sandbox_env(id)?;
        env.entry("DISPLAY".to_owned())
            .or_insert_with(|| DEFAULT_DISPLAY.to_owned());
        if !display_up().contains(id) {
            self.ensure_display(id, &agent, &env).await?;
            note_display_up(id);
        }
        let result = self.act(&agent, &env, action).await;
        if result.is_err() {
            display_up().remove(id);
        }
        result
    }

    async fn act(
        &self,
        agent: &Agent,
        env: &BTreeMap<String, String>,
        action: &ComputerAction,
    ) -> Result<ComputerResult, ApiError> {
        let (agent, env) = (agent.clone(), env.clone());
        let xy = |x: u32, y: u32| [x.to_string(), y.to_string()];
        let done = |out: Output, what: &str| out.checked(what).map(|_| ComputerResult::Done);
        match action {
            ComputerAction::Screenshot {} => {
                let script = "f=$(mktemp /tmp/.airlock-screenshot-XXXXXX.png) || exit 1; \
                              scrot --pointer --overwrite \"$f\" && cat \"$f\"; rc=$?; rm -f \"$f\"; exit $rc";
                let png = run(&agent, &["/bin/sh", "-c", script], &env)
                    .await?
                    .checked("scrot")?;
                let (width_px, height_px) = png_size(&png)
                    .ok_or_else(|| ApiError::new(ErrorCode::AgentError, "scrot wrote no PNG"))?;
                Ok(ComputerResult::Screenshot {
                    png_base64: BASE64.encode(&png),
                    width_px,
                    height_px,
                })
            }
            ComputerAction::Click { x_px, y_px, button } => {
                let [x, y] = xy(*x_px, *y_px);
                let button = match button {
                    MouseButton::Left => "1",
                    MouseButton::Middle => "2",
                    MouseButton::Right => "3",
                };
                let argv = ["xdotool", "mousemove", &x, &y, "click", button];
                done(run(&agent, &argv, &env).await?, "xdotool click")
            }
            ComputerAction::DoubleClick { x_px, y_px } => {
                let [x, y] = xy(*x_px, *y_px);
                let argv = [
                    "xdotool",
                    "mousemove",
                    &x,
                    &y,
                    "click",
                    "--repeat",
                    "2",
                    "1",
                ];
                done(run(&agent, &argv, &env).await?, "xdotool double click")
            }
            ComputerAction::Move { x_px, y_px } => {
                let [x, y] = xy(*x_px, *y_px);
                // The query after the move is a round trip on the same connection: the action answers
                // once the server has the move.
                let argv = ["xdotool", "mousemove", &x, &y, "getmouselocation"];
                done(run(&agent, &argv, &env).await?, "xdotool mousemove")
            }
            ComputerAction::Drag {
                from_x_px,
                from_y_px,
                to_x_px,
                to_y_px,
            } => {
                let [x1, y1] = xy(*from_x_px, *from_y_px);
                let [x2, y2] = xy(*to_x_px, *to_y_px);
                // A short pause lets the browser see the move before the release.
                let script = "xdotool mousemove \"$1\" \"$2\" mousedown 1 \
                              && xdotool mousemove \"$3\" \"$4\" && sleep 0.05 \
                              && xdotool mouseup 1";
                let argv = ["/bin/sh", "-c", script, "sh", &x1, &y1, &x2, &y2];
                done(run(&agent, &argv, &env).await?, "xdotool drag")
            }
            ComputerAction::Scroll {
                direction,
                clicks,
                x_px,
                y_px,
            } => {
                if !(1..=MAX_SCROLL_CLICKS).contains(clicks) {
                    return Err(ApiError::invalid(format!(
                        "clicks must be 1 to {MAX_SCROLL_CLICKS}, got {clicks}"
                    )));
                }
                let button = match direction {
                    ScrollDirection::Up => "4",
                    ScrollDirection::Down => "5",
                    ScrollDirection::Left => "6",
                    ScrollDirection::Right => "7",
                };
                let clicks = clicks.to_string();
                // A coordinate left out is the pointer's own: scrolling at x alone keeps
                // the pointer's y, and neither scrolls where the pointer is. Notches go 15 ms
                // apart (xdotool's default is 100 ms: 10 s for the most clicks).
                let script = "if [ -n \"$1$2\" ]; then eval \"$(xdotool getmouselocation --shell)\" \
                              && xdotool mousemove \"${1:-$X}\" \"${2:-$Y}\"; fi \
                              && xdotool click --repeat \"$3\" --delay 15 \"$4\"";
                let (x, y) = (
                    x_px.map(|x| x.to_string()).unwrap_or_default(),
                    y_px.map(|y| y.to_string()).unwrap_or_default(),
                );
                let argv = ["/bin/sh", "-c", script, "sh", &x, &y, &clicks, button];
                done(run(&agent, &argv, &env).await?, "xdotool scroll")
            }
            ComputerAction::Type { text } => {
                check_text(text, MAX_TYPED_CHARS)?;
                let argv = ["xdotool", "type", "--delay", "12", "--", text.as_str()];
                done(run(&agent, &argv, &env).await?, "xdotool type")
            }
            ComputerAction::Key { keys } => {
                let keys = chord(keys)?;
                let argv = ["xdotool", "key", "--", keys.as_str()];
                done(run(&agent, &argv, &env).await?, "xdotool key")
            }
            ComputerAction::CursorPosition {} => {
                let argv = ["xdotool", "getmouselocation", "--shell"];
                let out = run(&agent, &argv, &env).await?.checked("xdotool")?;
                let text = String::from_utf8_lossy(&out);
                match (number(&text, "X="), number(&text, "Y=")) {
                    (Some(x_px), Some(y_px)) => Ok(ComputerResult::Position { x_px, y_px }),
                    _ => Err(ApiError::new(
                        ErrorCode::AgentError,
                        format!("xdotool answered {text:?}"),
                    )),
                }
            }
            ComputerAction::ScreenSize {} => {
                let argv = ["xdotool", "getdisplaygeometry", "--shell"];
                let out = run(&agent, &argv, &env).await?.checked("xdotool")?;
                let text = String::from_utf8_lossy(&out);
                match (number(&text, "WIDTH="), number(&text, "HEIGHT=")) {
                    (Some(width_px), Some(height_px)) => Ok(ComputerResult::Size {
                        width_px,
                        height_px,
                    }),
                    _ => Err(ApiError::new(
                        ErrorCode::AgentError,
                        format!("xdotool answered {text:?}"),
                    )),
                }
            }
            ComputerAction::ClipboardGet {} => {
                // No owner yet is an empty clipboard, not an error.
                let script = "xclip -selection clipboard -o 2>/dev/null || true";
                let out = run(&agent, &["/bin/sh", "-c", script], &env)
                    .await?
                    .checked("xclip")?;
                Ok(ComputerResult::Clipboard {
                    text: String::from_utf8_lossy(&out).into_owned(),
                })
            }
            ComputerAction::ClipboardSet { text } => {
                check_text(text, MAX_COMPUTER_TEXT_CHARS)?;
                // xclip owns the selection for as long as it runs: it runs in the background
                // (a command's leftovers end with it), until another owner takes over.
                let script = "printf %s \"$1\" | exec xclip -quiet -selection clipboard -i";
                let argv = ["/bin/sh", "-c", script, "sh", text.as_str()];
                let read = ["xclip", "-selection", "clipboard", "-o"];
                let started = Instant::now();
                // An xclip that did not get the selection (it lost a race with the X server's
                // start, or died) is replaced: the newest owner wins, older ones exit.
                while started.elapsed() < DISPLAY_WAIT {
                    drop(start(&agent, &argv, &env, None).await?);
                    let attempt = Instant::now();
                    while attempt.elapsed() < CLIPBOARD_ATTEMPT {
                        let out = run(&agent, &read, &env).await?;
                        if out.code == 0 && out.stdout == text.as_bytes() {
                            return Ok(ComputerResult::Done);
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                Err(ApiError::new(
                    ErrorCode::Conflict,
                    "xclip did not take the clipboard",
                ))
            }
        }
    }

    /// Starts Xvfb on the sandbox's display unless something serves it already.
    async fn ensure_display(
        &self,
        id: &str,
        agent: &Agent,
        env: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let display = env
            .get("DISPLAY")
            .map_or(DEFAULT_DISPLAY, String::as_str)
            .to_owned();
        let probe = ["xdpyinfo", "-display", display.as_str()];
        if run(agent, &probe, env).await?.code == 0 {
            return Ok(());
        }
        let (width, height) = self
            .store
            .get_sandbox(id)?
            .and_then(|row| row.request.metadata.get(RESOLUTION_KEY).cloned())
            .map(|value| parse_resolution(&value))
            .transpose()
            .map_err(ApiError::unprocessable)?
            .unwrap_or(DEFAULT_RESOLUTION);
        let screen = format!("{width}x{height}x24");
        let xvfb = [
            "Xvfb",
            display.as_str(),
            "-ac",
            "-screen",
            "0",
            screen.as_str(),
            "-nolisten",
            "tcp",
        ];
        drop(start(agent, &xvfb, env, None).await?);
        let started = Instant::now();
        while started.elapsed() < DISPLAY_WAIT {
            if run(agent, &probe, env).await?.code == 0 {
                // xdotool's pointer moves take effect only under a window manager; xfwm4 (the
                // template's, XFCE's own) also places and decorates the windows agents open.
                drop(start(agent, &["xfwm4", "--compositor=off"], env, None).await?);
                self.event(
                    Some(id),
                    "display",
                    &format!("started Xvfb {display} at {width}x{height}"),
                );
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "the X server on {display} did not answer within {} s",
                DISPLAY_WAIT.as_secs()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_resolution_parses_and_bounds() {
        assert_eq!(parse_resolution("1280x800"), Ok((1280, 800)));
        assert_eq!(parse_resolution("640X480"), Ok((640, 480)));
        assert!(parse_resolution("10x10").is_err());
        assert!(parse_resolution("1280").is_err());
        assert!(parse_resolution("ax800").is_err());
    }

    #[test]
    fn test_key_chords_map_common_names() {
        assert_eq!(chord("ctrl+a").unwrap(), "Control_L+a");
        assert_eq!(chord("enter").unwrap(), "Return");
        assert_eq!(chord("F5").unwrap(), "F5");
        assert_eq!(chord("Page_Down").unwrap(), "Page_Down");
        assert!(chord("ctrl+").is_err());
        assert!(chord("a b").is_err());
    }

    #[test]
    fn test_png_size_reads_the_header() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&1280u32.to_be_bytes());
        png.extend_from_slice(&720u32.to_be_bytes());
        assert_eq!(png_size(&png), Some((1280, 720)));
        assert_eq!(png_size(b"GIF89a"), None);
    }
}
