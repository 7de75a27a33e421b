//! The Connect protocol as the E2B SDKs use it (JSON codec only): error codes and their HTTP
//! statuses, envelope framing `[flags u8][len u32 BE][json]`, proto3 JSON helpers (base64
//! `bytes`, enums as names or numbers) and the response bodies the server sends.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use hyper::{Response, StatusCode, header};
use serde::Deserialize;
use tokio::sync::mpsc;

/// Envelope flag: the payload is compressed (never accepted: compression is disabled).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the last message of a server stream, carrying `{}` or `{"error":…}`.
pub const FLAG_END_STREAM: u8 = 0x02;

/// Connect error codes that the agent answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error response (Connect protocol mapping).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// The response header that names the errno of a failed file operation when it is the
/// caller's doing (see [`caller_errno`]); the daemon maps it to its own error codes.
pub const ERRNO_HEADER: &str = "airlock-errno";

/// The errnos of file operations that are the caller's doing, not the agent's: a read-only
/// path, a denied one, a full disk or quota, the file-size limit, a file or directory where
/// the other is wanted.
pub fn caller_errno(err: &std::io::Error) -> Option<&'static str> {
    match err.raw_os_error()? {
        libc::EISDIR => Some("EISDIR"),
        libc::ENOTDIR => Some("ENOTDIR"),
        libc::EEXIST => Some("EEXIST"),
        libc::EROFS => Some("EROFS"),
        libc::EACCES => Some("EACCES"),
        libc::EPERM => Some("EPERM"),
        libc::ENOSPC => Some("ENOSPC"),
        libc::EDQUOT => Some("EDQUOT"),
        libc::EFBIG => Some("EFBIG"),
        _ => None,
    }
}

/// An RPC failure: a code and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct RpcError {
    pub code: Code,
    pub message: String,
    /// The caller's errno behind a file error, sent as [`ERRNO_HEADER`].
    pub errno: Option<&'static str>,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            errno: None,
        }
    }

    /// Maps a filesystem error on `path` to the closest code. Connect has no code for a
    /// read-only file system or a full disk; the errno header says which.
    pub fn from_io(err: &std::io::Error, what: &str) -> RpcError {
        use std::io::ErrorKind as K;
        let code = match err.kind() {
            K::NotFound => Code::NotFound,
            K::AlreadyExists => Code::AlreadyExists,
            K::PermissionDenied | K::ReadOnlyFilesystem => Code::PermissionDenied,
            K::StorageFull | K::QuotaExceeded | K::FileTooLarge => Code::ResourceExhausted,
            K::NotADirectory | K::IsADirectory | K::InvalidInput | K::InvalidFilename => {
                Code::InvalidArgument
            }
            _ => Code::Internal,
        };
        RpcError {
            errno: caller_errno(err),
            ..RpcError::new(code, format!("{what}: {err}"))
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

pub type RpcResult<T> = Result<T, RpcError>;

/// Whether the request's content type selects the (only) supported codec, JSON.
pub fn is_json_content_type(content_type: Option<&str>, streaming: bool) -> bool {
    let Some(ct) = content_type else {
        return true;
    };
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if streaming {
        base == "application/connect+json"
    } else {
        base == "application/json"
    }
}

/// Parses a unary request body (a JSON message; an empty body is the empty message).
pub fn parse_message<T: for<'de> Deserialize<'de>>(body: &[u8]) -> RpcResult<T> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("invalid request message: {e}"),
        )
    })
}

/// Splits envelopes off the front of a buffer as bytes arrive.
#[derive(Debug, Default)]
pub struct EnvelopeReader {
    buf: BytesMut,
}

impl EnvelopeReader {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete envelope `(flags, payload)`, if one is buffered. A compressed
    /// envelope is an error.
    pub fn next_envelope(&mut self) -> RpcResult<Option<(u8, Bytes)>> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = len as usize;
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "compressed envelopes are not supported (use identity encoding)",
            ));
        }
        self.buf.advance(5);
        Ok(Some((flags, self.buf.split_to(len).freeze())))
    }

    /// Bytes left over that do not form a whole envelope.
    pub fn leftover(&self) -> usize {
        self.buf.len()
    }
}

/// Parses the single envelope of a server-streaming request body.
pub fn parse_single_envelope<T: for<'de> Deserialize<'de>>(body: &[u8]) -> RpcResult<T> {
    let mut reader = EnvelopeReader::default();
    reader.push(body);
    let Some((_, payload)) = reader.next_envelope()? else {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "streaming request body is not one complete envelope",
        ));
    };
    if reader.leftover() != 0 {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "streaming request body has bytes after its envelope",
        ));
    }
    parse_message(&payload)
}

/// One envelope around `json`.
pub fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + json.len());
    out.extend_from_slice(&[flags]);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    out.freeze()
}

/// The end-of-stream envelope: `{}` or `{"error":{…}}`.
pub fn end_envelope(error: Option<&RpcError>) -> Bytes {
    match error {
        None => envelope(FLAG_END_STREAM, b"{}"),
        Some(e) => envelope(
            FLAG_END_STREAM,
            serde_json::json!({"error": e.to_json()})
                .to_string()
                .as_bytes(),
        ),
    }
}

/// Base64 (standard alphabet, padding) as proto3 JSON writes `bytes`.
pub fn encode_bytes(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Decodes a proto3 JSON `bytes` value: standard or URL-safe alphabet, padding optional.
pub fn decode_bytes(text: &str) -> RpcResult<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, config);
    let url = GeneralPurpose::new(&base64::alphabet::URL_SAFE, config);
    standard
        .decode(text)
        .or_else(|_| url.decode(text))
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("invalid base64 bytes: {e}")))
}

/// A proto3 JSON enum value: its name or its number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum EnumValue {
    Number(i64),
    Name(String),
}

impl EnumValue {
    /// Resolves the value against `(name, number)` pairs; a name may also be given without
    /// `prefix`.
    pub fn resolve(&self, prefix: &str, values: &[(&str, i64)]) -> Option<i64> {
        match self {
            EnumValue::Number(n) => values.iter().any(|(_, v)| v == n).then_some(*n),
            EnumValue::Name(name) => values
                .iter()
                .find(|(full, _)| *full == name || full.strip_prefix(prefix) == Some(name.as_str()))
                .map(|(_, v)| *v),
        }
    }
}

/// The response body: a whole message, a stream of frames, or a file.
#[derive(Debug)]
pub enum ResponseBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
    File(crate::files::FileBody),
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ResponseBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ResponseBody::Stream(rx) => rx.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d)))),
            ResponseBody::File(file) => Poll::Ready(file.next_chunk().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ResponseBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(d)) => SizeHint::with_exact(d.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

pub type HttpResponse = Response<ResponseBody>;

/// A response with a complete body.
pub fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> HttpResponse {
    let mut response = Response::new(ResponseBody::Full(Some(body.into())));
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

/// A 204 with no body.
pub fn no_content() -> HttpResponse {
    let mut response = Response::new(ResponseBody::Full(None));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// A unary success: 200 `application/json`.
pub fn unary_ok(message: &serde_json::Value) -> HttpResponse {
    full(StatusCode::OK, "application/json", message.to_string())
}

/// A unary error: the code's HTTP status and the Connect error JSON (and the errno header).
pub fn unary_error(error: &RpcError) -> HttpResponse {
    let mut response = full(
        error.code.http_status(),
        "application/json",
        error.to_json().to_string(),
    );
    if let Some(errno) = error.errno {
        response
            .headers_mut()
            .insert(ERRNO_HEADER, header::HeaderValue::from_static(errno));
    }
    response
}

/// A server-stream response whose frames come from `rx` (already enveloped).
pub fn stream_response(rx: mpsc::Receiver<Bytes>) -> HttpResponse {
    let mut response = Response::new(ResponseBody::Stream(rx));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/connect+json"),
    );
    response
}

/// A stream that ends at once, with `error` in its end frame (HTTP 200, as Connect requires).
pub fn stream_error(error: &RpcError) -> HttpResponse {
    let mut response = Response::new(ResponseBody::Full(Some(end_envelope(Some(error)))));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/connect+json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_across_partial_pushes() {
        let mut reader = EnvelopeReader::default();
        let frame = envelope(0, br#"{"a":1}"#);
        reader.push(&frame[..3]);
        assert_eq!(reader.next_envelope().unwrap(), None);
        reader.push(&frame[3..]);
        let (flags, payload) = reader.next_envelope().unwrap().unwrap();
        assert_eq!((flags, &payload[..]), (0, &br#"{"a":1}"#[..]));
    }

    #[test]
    fn compressed_envelopes_are_rejected() {
        let mut reader = EnvelopeReader::default();
        reader.push(&envelope(FLAG_COMPRESSED, b"{}"));
        assert_eq!(
            reader.next_envelope().unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn enum_values_resolve_by_name_short_name_and_number() {
        let values = [("SIGNAL_SIGTERM", 15), ("SIGNAL_SIGKILL", 9)];
        let name = EnumValue::Name("SIGNAL_SIGKILL".into());
        assert_eq!(name.resolve("SIGNAL_", &values), Some(9));
        assert_eq!(
            EnumValue::Name("SIGTERM".into()).resolve("SIGNAL_", &values),
            Some(15)
        );
        assert_eq!(EnumValue::Number(9).resolve("SIGNAL_", &values), Some(9));
        assert_eq!(EnumValue::Number(3).resolve("SIGNAL_", &values), None);
    }

    #[test]
    fn bytes_decode_with_or_without_padding_and_url_safe() {
        assert_eq!(decode_bytes("aGk=").unwrap(), b"hi");
        assert_eq!(decode_bytes("aGk").unwrap(), b"hi");
        assert_eq!(decode_bytes("-_8=").unwrap(), [0xfb, 0xff]);
        assert!(decode_bytes("***").is_err());
    }
}
