//! A streaming `multipart/form-data` parser: bytes are pushed as they arrive and parts come
//! out as start (name, filename), data pieces and end, without holding a whole part in memory.

use bytes::{Buf, Bytes, BytesMut};

/// Longest accepted header block of one part.
const MAX_HEADER_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Start {
        name: String,
        filename: Option<String>,
    },
    Data(Bytes),
    End,
    /// The closing boundary was seen; anything after it is ignored.
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    #[error("malformed multipart body: {0}")]
    Malformed(&'static str),
    #[error("a multipart part's headers are longer than {MAX_HEADER_BYTES} bytes")]
    HeadersTooLong,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first boundary.
    Preamble,
    /// Just after a boundary: `--` (the end) or CRLF (a part follows).
    AfterBoundary,
    Headers,
    Body,
    Done,
}

#[derive(Debug)]
pub struct Multipart {
    /// `\r\n--boundary`: what ends a part's body.
    delimiter: Vec<u8>,
    buf: BytesMut,
    state: State,
    eof: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let mut start = 0;
    while let Some(offset) = haystack[start..=haystack.len() - needle.len()]
        .iter()
        .position(|b| *b == first)
    {
        let at = start + offset;
        if &haystack[at..at + needle.len()] == needle {
            return Some(at);
        }
        start = at + 1;
    }
    None
}

/// Extracts `key="value"` (or unquoted) from a Content-Disposition header value.
fn disposition_param(value: &str, key: &str) -> Option<String> {
    let mut rest = value;
    while let Some(semi) = rest.find(';') {
        rest = rest[semi + 1..].trim_start();
        let (k, v) = rest.split_once('=')?;
        if let Some(quoted) = v.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.extend(chars.next()),
                    '"' => break,
                    c => out.push(c),
                }
            }
            if k.trim().eq_ignore_ascii_case(key) {
                return Some(out);
            }
            // Skip past the closing quote before looking for the next parameter.
            let consumed = quoted.len() - chars.as_str().len();
            rest = &quoted[consumed..];
        } else {
            let end = v.find(';').unwrap_or(v.len());
            if k.trim().eq_ignore_ascii_case(key) {
                return Some(v[..end].trim().to_string());
            }
            rest = &v[end..];
        }
    }
    None
}

impl Multipart {
    pub fn new(boundary: &str) -> Multipart {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(boundary.as_bytes());
        // A CRLF in front lets the first boundary match like every later one.
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"\r\n");
        Multipart {
            delimiter,
            buf,
            state: State::Preamble,
            eof: false,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.state != State::Done {
            self.buf.extend_from_slice(data);
        }
    }

    /// Marks the end of the input.
    pub fn finish(&mut self) {
        self.eof = true;
    }

    /// The next parsed item, or `None` when more input is needed.
    pub fn next_part(&mut self) -> Result<Option<Part>, MultipartError> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Preamble => match find(&self.buf, &self.delimiter) {
                    Some(at) => {
                        self.buf.advance(at + self.delimiter.len());
                        self.state = State::AfterBoundary;
                    }
                    None => {
                        let keep = self.delimiter.len() - 1;
                        if self.buf.len() > keep {
                            let drop = self.buf.len() - keep;
                            self.buf.advance(drop);
                        }
                        return Ok(None);
                    }
                },
                State::AfterBoundary => {
                    if self.buf.len() < 2 {
                        return Ok(None);
                    }
                    if self.buf.starts_with(b"--") {
                        self.state = State::Done;
                        self.buf.clear();
                        return Ok(Some(Part::Done));
                    }
                    // Transport padding (spaces, tabs) may precede the CRLF.
                    let Some(crlf) = find(&self.buf, b"\r\n") else {
                        return Ok(None);
                    };
                    if self.buf[..crlf].iter().any(|b| *b != b' ' && *b != b'\t') {
                        return Err(MultipartError::Malformed("garbage after a boundary"));
                    }
                    self.buf.advance(crlf + 2);
                    self.state = State::Headers;
                }
                State::Headers => {
                    let end = if self.buf.starts_with(b"\r\n") {
                        Some((0, 2)) // a part without headers
                    } else {
                        find(&self.buf, b"\r\n\r\n").map(|at| (at, 4))
                    };
                    let Some(end) = end else {
                        if self.buf.len() > MAX_HEADER_BYTES {
                            return Err(MultipartError::HeadersTooLong);
                        }
                        return Ok(None);
                    };
                    let (at, skip) = end;
                    let headers = String::from_utf8_lossy(&self.buf[..at]).into_owned();
                    self.buf.advance(at + skip);
                    self.state = State::Body;
                    let mut name = String::new();
                    let mut filename = None;
                    for line in headers.split("\r\n") {
                        let Some((key, value)) = line.split_once(':') else {
                            continue;
                        };
                        if key.trim().eq_ignore_ascii_case("content-disposition") {
                            name = disposition_param(value, "name").unwrap_or_default();
                            filename = disposition_param(value, "filename");
                        }
                    }
                    return Ok(Some(Part::Start { name, filename }));
                }
                State::Body => match find(&self.buf, &self.delimiter) {
                    Some(at) => {
                        if at > 0 {
                            return Ok(Some(Part::Data(self.buf.split_to(at).freeze())));
                        }
                        self.buf.advance(self.delimiter.len());
                        self.state = State::AfterBoundary;
                        return Ok(Some(Part::End));
                    }
                    None => {
                        let keep = self.delimiter.len() - 1;
                        if self.buf.len() > keep {
                            let n = self.buf.len() - keep;
                            return Ok(Some(Part::Data(self.buf.split_to(n).freeze())));
                        }
                        if self.eof {
                            return Err(MultipartError::Malformed("body ended inside a part"));
                        }
                        return Ok(None);
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(body: &[u8], piece: usize) -> Vec<Part> {
        let mut parser = Multipart::new("XyZ");
        let mut parts = Vec::new();
        for chunk in body.chunks(piece) {
            parser.push(chunk);
            while let Some(p) = parser.next_part().unwrap() {
                parts.push(p);
            }
        }
        parser.finish();
        while let Some(p) = parser.next_part().unwrap() {
            parts.push(p);
        }
        // Merge adjacent data pieces so that results compare across piece sizes.
        let mut merged: Vec<Part> = Vec::new();
        for p in parts {
            if let (Some(Part::Data(prev)), Part::Data(next)) = (merged.last_mut(), &p) {
                let mut joined = prev.to_vec();
                joined.extend_from_slice(next);
                *prev = Bytes::from(joined);
            } else {
                merged.push(p);
            }
        }
        merged
    }

    #[test]
    fn two_parts_parse_the_same_whatever_the_piece_size() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b+c.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--Xy not yet\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/x\"\r\n\r\n\r\n--XyZ--\r\n";
        let expected = vec![
            Part::Start {
                name: "file".into(),
                filename: Some("a b+c.txt".into()),
            },
            Part::Data(Bytes::from_static(b"hello\r\n--Xy not yet")),
            Part::End,
            Part::Start {
                name: "file".into(),
                filename: Some("/tmp/x".into()),
            },
            Part::End,
            Part::Done,
        ];
        for piece in [1, 2, 3, 7, 64, body.len()] {
            assert_eq!(parse_in_pieces(body, piece), expected, "piece size {piece}");
        }
    }

    #[test]
    fn a_truncated_body_is_an_error() {
        let mut parser = Multipart::new("XyZ");
        parser.push(b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc");
        parser.finish();
        let mut result = Ok(None);
        for _ in 0..5 {
            result = parser.next_part();
            if result.is_err() {
                break;
            }
        }
        assert!(result.is_err());
    }

    #[test]
    fn disposition_params_handle_quotes_and_escapes() {
        let v = " form-data; name=\"file\"; filename=\"we\\\"ird;name\"";
        assert_eq!(disposition_param(v, "name").as_deref(), Some("file"));
        assert_eq!(
            disposition_param(v, "filename").as_deref(),
            Some("we\"ird;name")
        );
        assert_eq!(
            disposition_param(" form-data; name=x", "name").as_deref(),
            Some("x")
        );
    }
}
