//! Small HTTP helpers over hyper: the boxed body type, JSON in and out, a channel-fed
//! streaming body, and query-string decoding.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Response, StatusCode, Uri};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::ApiError;
use airlock_api::v1::ErrorCode;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every response body, and every request body sent to an agent.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub const JSON: &str = "application/json";
pub const NDJSON: &str = "application/x-ndjson";
pub const OCTET_STREAM: &str = "application/octet-stream";

pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Any hyper body (an agent's response, a client's request) as our boxed body.
pub fn boxed<B>(body: B) -> Body
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => with_type(status, JSON, full(bytes)),
        Err(err) => error_response(&ApiError::internal(format!(
            "cannot encode the answer: {err}"
        ))),
    }
}

pub fn no_content() -> Response<Body> {
    let mut response = Response::new(empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

pub fn with_type(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub fn error_response(err: &ApiError) -> Response<Body> {
    let status =
        StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let bytes = serde_json::to_vec(&err.body()).unwrap_or_else(|_| b"{}".to_vec());
    with_type(status, JSON, full(bytes))
}

/// The declared `Content-Length`, if any and valid.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

pub fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("the request body is larger than the limit of {limit} bytes"),
    )
}

/// Reads a JSON body of at most `limit` bytes. An empty body reads as `{}`.
pub async fn read_json<T: DeserializeOwned>(
    mut body: Incoming,
    headers: &HeaderMap,
    limit: u64,
) -> Result<T, ApiError> {
    // The rest of a refused body is read and dropped while the 413 goes out (`linger`):
    // closing with unread data would reset the connection before the client reads the answer.
    if content_length(headers).is_some_and(|len| len > limit) {
        linger(body);
        return Err(too_large(limit));
    }
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|err| ApiError::invalid(format!("cannot read the body: {err}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if read.len().saturating_add(data.len()) > limit_usize {
            linger(body);
            return Err(too_large(limit));
        }
        read.extend_from_slice(&data);
    }
    let bytes: &[u8] = if read.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &read
    };
    // Every request body is an object; serde would also read a struct from an array.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid("invalid JSON body: it must be an object"));
    }
    serde_json::from_slice(bytes)
        .map_err(|err| ApiError::invalid(format!("invalid JSON body: {err}")))
}

/// Reads and discards, in the background and within bounds (64 MiB, 10 s), what is left of a
/// request body that nobody consumed, while its answer goes out. The answer never waits for a
/// body the client may never send. A body read to its end leaves the connection usable for
/// the next request; one cut short by the bounds closes it (hyper never parses the rest of a
/// body as a request). Reading rather than closing at once matters too: closing a socket with
/// unread data makes the kernel reset the connection, and the client would then see a broken
/// pipe instead of the answer.
pub fn linger(body: Incoming) {
    if body.is_end_stream() {
        return;
    }
    tokio::spawn(async move {
        let drained = Limited::new(body, 64 << 20).collect();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drained).await;
    });
}

/// A response body fed by a task through a channel; the sender's end closing ends the body.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, BoxError>>,
}

impl ChannelBody {
    /// The sender side and the body. `depth` bounds how far the producer runs ahead.
    pub fn new(depth: usize) -> (mpsc::Sender<Result<Bytes, BoxError>>, ChannelBody) {
        let (tx, rx) = mpsc::channel(depth);
        (tx, ChannelBody { rx })
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|result| result.map(Frame::data)))
    }
}

/// The query string's pairs, decoded as `application/x-www-form-urlencoded` (`+` is a space).
pub fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    let Some(query) = uri.query() else {
        return Vec::new();
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (form_decode(key), form_decode(value))
        })
        .collect()
}

pub fn form_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match (hex_value(bytes[i + 1]), hex_value(bytes[i + 2])) {
                    (Some(hi), Some(lo)) => {
                        out.push(hi << 4 | lo);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encodes a value for one path segment (a `/` too, so a reference stays one).
pub fn path_encode(value: &str) -> String {
    encode_query_value(value).replace('/', "%2F")
}

/// A path segment's percent-escapes decoded (`+` stays itself, as paths have it).
pub fn path_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(hi), Some(lo)) if hex_value(*hi).is_some() && hex_value(*lo).is_some() => {
                out.push(hex_value(*hi).unwrap_or(0) << 4 | hex_value(*lo).unwrap_or(0));
                i += 3;
            }
            (other, _, _) => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn encode_query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_query_decoding_follows_form_rules() {
        let uri: Uri = "/x?path=a+b%2Bc%20d%C3%A9&empty=&flag&bad=%zz%4"
            .parse()
            .unwrap();
        assert_eq!(
            query_pairs(&uri),
            vec![
                ("path".into(), "a b+c dé".into()),
                ("empty".into(), String::new()),
                ("flag".into(), String::new()),
                ("bad".into(), "%zz%4".into()),
            ]
        );
        assert_eq!(form_decode("%00"), "\0");
        let original = "/work space/a+b&c=d/é";
        let uri: Uri = format!("/x?p={}", encode_query_value(original))
            .parse()
            .unwrap();
        assert_eq!(query_pairs(&uri)[0].1, original);
        assert_eq!(
            path_decode("127.0.0.1%3A5000%2Fa+b%zz%4"),
            "127.0.0.1:5000/a+b%zz%4"
        );
    }
}
