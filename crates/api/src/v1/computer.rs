//! `POST /v1/sandboxes/{id}/computer`: one action on a desktop sandbox's screen, keyboard or
//! clipboard, named as computer-use models name their tool calls, so they map one to one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The longest text one `type` or `clipboard_set` action may carry.
pub const MAX_COMPUTER_TEXT_BYTES: usize = 64 << 10;
/// The most wheel clicks of one `scroll`.
pub const MAX_SCROLL_CLICKS: u32 = 100;

/// A mouse button.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MouseButton {
    #[default]
    Left,
    Middle,
    Right,
}

/// Which way the wheel turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScrollDirection {
    Up,
    Down,
    Left,
    Right,
}

/// One action. Coordinates are screen pixels from the top-left corner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum ComputerAction {
    /// A PNG of the whole screen, the pointer included.
    Screenshot,
    /// Move to the point, then press and release `button` (left by default).
    Click {
        x_px: u32,
        y_px: u32,
        #[serde(default)]
        button: MouseButton,
    },
    DoubleClick {
        x_px: u32,
        y_px: u32,
    },
    Move {
        x_px: u32,
        y_px: u32,
    },
    /// Press the left button at `from`, move to `to`, release.
    Drag {
        from_x_px: u32,
        from_y_px: u32,
        to_x_px: u32,
        to_y_px: u32,
    },
    /// Turn the wheel `clicks` notches (1 to 100), at the point if one is given.
    Scroll {
        direction: ScrollDirection,
        #[schemars(range(min = 1, max = 100))]
        clicks: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        x_px: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        y_px: Option<u32>,
    },
    /// Type the text as keystrokes (at most 64 KiB).
    Type {
        text: String,
    },
    /// Press a key or a chord: X keysyms or common names joined by `+` (`Return`, `ctrl+a`,
    /// `enter`, `esc`, `page_down`).
    Key {
        keys: String,
    },
    CursorPosition,
    ScreenSize,
    /// The clipboard's text.
    ClipboardGet,
    /// Set the clipboard's text (at most 64 KiB).
    ClipboardSet {
        text: String,
    },
}

/// The answer to one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum ComputerResult {
    /// The action ran (input actions).
    Done,
    Screenshot {
        /// The PNG, base64.
        png_base64: String,
        width_px: u32,
        height_px: u32,
    },
    Position {
        x_px: u32,
        y_px: u32,
    },
    Size {
        width_px: u32,
        height_px: u32,
    },
    Clipboard {
        text: String,
    },
}
