//! Judge0's text encodings: Ruby's `Base64.encode64` (a newline after every 60 characters
//! and at the end), base64 input, SQL decimals as JSON strings, and UUID v4 tokens.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};

use crate::auth::{AuthError, random_bytes};

/// Characters per line of Ruby's `encode64` (`pack("m")`): 45 input bytes.
const RUBY_LINE_CHARS: usize = 60;

/// `Base64.encode64`: standard alphabet, padded, `\n` after every 60 characters and after
/// the last line; empty input gives an empty string.
pub fn ruby_encode64(bytes: &[u8]) -> String {
    let flat = STANDARD.encode(bytes);
    let mut out = String::with_capacity(flat.len() + flat.len() / RUBY_LINE_CHARS + 1);
    for line in flat.as_bytes().chunks(RUBY_LINE_CHARS) {
        // Base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// Why a base64 attribute was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("is not valid base64 (standard alphabet; line breaks and missing padding are accepted)")]
pub struct NotBase64;

/// Decodes what clients send with `base64_encoded=true`: the standard alphabet, with or
/// without padding, line breaks anywhere (Ruby's and Python's encoders both appear). Ruby's
/// `decode64` would skip any other character silently; here it is an error instead.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, NotBase64> {
    let compact: String = text.chars().filter(|c| !matches!(c, '\n' | '\r')).collect();
    let unpadded = compact.trim_end_matches('=');
    if compact.len() - unpadded.len() > 2 {
        return Err(NotBase64);
    }
    STANDARD_NO_PAD.decode(unpadded).map_err(|_| NotBase64)
}

/// A SQL decimal as Rails renders it (`BigDecimal#to_s`): at least one digit after the
/// point, no trailing zeros beyond it, rounded to milliseconds (isolate's resolution).
pub fn decimal(value: f64) -> String {
    let mut text = format!("{value:.3}");
    while text.ends_with('0') && !text.ends_with(".0") {
        text.pop();
    }
    if text == "-0.0" {
        text = "0.0".to_owned();
    }
    text
}

/// A random UUID, version 4 (RFC 9562): what Judge0 issues as tokens and the Python SDK
/// validates.
pub fn new_token() -> Result<String, AuthError> {
    let mut bytes = random_bytes::<16>()?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = crate::auth::hex(&bytes);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// Whether text is shaped like a token (lower-case hex UUID): checked before any lookup.
pub fn plausible_token(text: &str) -> bool {
    text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ruby_encode64_breaks_lines_every_60_characters() {
        assert_eq!(ruby_encode64(b""), "");
        assert_eq!(ruby_encode64(b"hi"), "aGk=\n");
        let long = ruby_encode64(&[b'a'; 46]);
        let lines: Vec<&str> = long.split_terminator('\n').collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), 60);
        assert_eq!(lines[1], "YQ==");
        assert!(long.ends_with('\n'));
        assert_eq!(ruby_encode64(&[0u8; 45]).len(), 61, "exactly one full line");
    }

    #[test]
    fn test_decode_base64_accepts_ruby_and_python_forms() {
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64("").unwrap(), b"");
        let long = vec![7u8; 300];
        assert_eq!(decode_base64(&ruby_encode64(&long)).unwrap(), long);
        assert_eq!(decode_base64("aG\r\nk=\n").unwrap(), b"hi");
        for bad in ["a", "aGk===", "a*k=", "aGk= ", "aGk=aGk=", "-_8="] {
            assert_eq!(decode_base64(bad), Err(NotBase64), "{bad:?}");
        }
    }

    #[test]
    fn test_decimal_renders_like_bigdecimal() {
        assert_eq!(decimal(5.0), "5.0");
        assert_eq!(decimal(0.012), "0.012");
        assert_eq!(decimal(0.01), "0.01");
        assert_eq!(decimal(0.0), "0.0");
        assert_eq!(decimal(1.5), "1.5");
        assert_eq!(decimal(0.0123456), "0.012");
        assert_eq!(decimal(20.0), "20.0");
        assert_eq!(decimal(-0.0001), "0.0");
    }

    #[test]
    fn test_tokens_are_uuid_v4() {
        let token = new_token().unwrap();
        assert!(plausible_token(&token), "{token}");
        assert_eq!(&token[14..15], "4");
        assert!(matches!(&token[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(token, new_token().unwrap());
        assert!(!plausible_token("../../etc"));
        assert!(!plausible_token(&token.to_uppercase()));
    }
}
