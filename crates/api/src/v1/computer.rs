//! `POST /v1/sandboxes/{id}/computer`: one action on a desktop sandbox's screen, keyboard or
//! clipboard, named as computer-use models name their tool calls, so they map one to one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The longest text one `clipboard_set` action may carry, in characters.
pub const MAX_COMPUTER_TEXT_CHARS: usize = 16 << 10;
/// The longest text one `type` action may carry: keystrokes go 12 ms apart, as the
/// e2b-desktop SDK types them, so this is about six seconds of typing.
pub const MAX_TYPED_CHARS: usize = 512;
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

/// One action. Coordinates are screen pixels from the top-left corner. Actions without fields
/// are empty struct variants: serde ignores unknown fields beside a unit variant's tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum ComputerAction {
    /// A PNG of the whole screen, the pointer included.
    Screenshot {},
    /// Move to the point, then press and release `button` (left by default).
    Click {
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        x_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        y_px: u32,
        #[serde(default)]
        button: MouseButton,
    },
    DoubleClick {
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        x_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        y_px: u32,
    },
    Move {
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        x_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        y_px: u32,
    },
    /// Press the left button at `from`, move to `to`, release.
    Drag {
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        from_x_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        from_y_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        to_x_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        to_y_px: u32,
    },
    /// Turn the wheel `clicks` notches (1 to 100) at the point; a coordinate left out is the
    /// pointer's own.
    Scroll {
        direction: ScrollDirection,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(min = 1, max = 100))]
        clicks: u32,
        #[serde(
            default,
            deserialize_with = "crate::whole::optional",
            skip_serializing_if = "Option::is_none"
        )]
        #[schemars(range(max = u32::MAX))]
        x_px: Option<u32>,
        #[serde(
            default,
            deserialize_with = "crate::whole::optional",
            skip_serializing_if = "Option::is_none"
        )]
        #[schemars(range(max = u32::MAX))]
        y_px: Option<u32>,
    },
    /// Type the text as keystrokes (at most 512 characters; the clipboard takes more).
    Type {
        #[schemars(length(max = MAX_TYPED_CHARS), regex(pattern = r"^[^\u0000]*$"))]
        text: String,
    },
    /// Press a key or a chord: X keysyms or common names joined by `+` (`Return`, `ctrl+a`,
    /// `enter`, `esc`, `page_down`).
    Key {
        #[schemars(regex(pattern = r"^[ \t]*[!-*,-~]+[ \t]*(\+[ \t]*[!-*,-~]+[ \t]*)*$"))]
        keys: String,
    },
    CursorPosition {},
    ScreenSize {},
    /// The clipboard's text.
    ClipboardGet {},
    /// Set the clipboard's text (at most 16,384 characters).
    ClipboardSet {
        #[schemars(length(max = MAX_COMPUTER_TEXT_CHARS), regex(pattern = r"^[^\u0000]*$"))]
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
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
        x_px: u32,
        #[serde(deserialize_with = "crate::whole::integer")]
        #[schemars(range(max = u32::MAX))]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ComputerAction, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn test_computer_action_without_fields_refuses_unknown_ones() {
        assert_eq!(
            parse(r#"{"action": "clipboard_get"}"#).unwrap(),
            ComputerAction::ClipboardGet {}
        );
        let err = parse(r#"{"action": "clipboard_get", "extra": 42}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"), "{err}");
        assert!(parse(r#"{"action": "screenshot", "x_px": 1}"#).is_err());
    }

    #[test]
    fn test_computer_action_coordinates_are_whole_numbers_in_range() {
        assert_eq!(
            parse(r#"{"action": "move", "x_px": 5.0, "y_px": 7}"#).unwrap(),
            ComputerAction::Move { x_px: 5, y_px: 7 }
        );
        for bad in [
            r#"{"action": "move", "x_px": 5.5, "y_px": 7}"#,
            r#"{"action": "move", "x_px": -1, "y_px": 7}"#,
            r#"{"action": "click", "x_px": 4294967296, "y_px": 1}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
