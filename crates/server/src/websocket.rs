//! The server side of WebSocket (RFC 6455) that the language-server bridge needs: the
//! handshake's accept key, and frames read from a client (masked, possibly fragmented, with
//! pings and a close) and written to it (unmasked). Messages are bounded by [`MAX_MESSAGE`].

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// The largest message accepted from a client, fragments together.
pub const MAX_MESSAGE: usize = 16 << 20;
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

pub const TEXT: u8 = 0x1;
pub const BINARY: u8 = 0x2;
pub const CLOSE: u8 = 0x8;
pub const PING: u8 = 0x9;
pub const PONG: u8 = 0xA;
const CONTINUATION: u8 = 0x0;

#[derive(Debug, thiserror::Error)]
pub enum WebSocketError {
    #[error("reading from the WebSocket failed")]
    Io(#[from] std::io::Error),
    #[error("the client sent an unmasked frame")]
    Unmasked,
    #[error("the client sent a message longer than {MAX_MESSAGE} bytes")]
    TooLong,
    #[error("the client sent a malformed frame: {0}")]
    Protocol(&'static str),
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{}{GUID}", key.trim()).as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// One frame, unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    pub payload: Vec<u8>,
}

/// Reads one frame from a client; `Ok(None)` when the stream ended between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    room: usize,
) -> Result<Option<Frame>, WebSocketError> {
    let mut head = [0u8; 2];
    match reader.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    reader.read_exact(&mut head[1..]).await?;
    if head[0] & 0x70 != 0 {
        return Err(WebSocketError::Protocol("reserved bits set"));
    }
    if head[1] & 0x80 == 0 {
        return Err(WebSocketError::Unmasked);
    }
    let length = match head[1] & 0x7f {
        126 => u64::from(reader.read_u16().await?),
        127 => reader.read_u64().await?,
        n => u64::from(n),
    };
    let length = usize::try_from(length).map_err(|_| WebSocketError::TooLong)?;
    if length > room {
        return Err(WebSocketError::TooLong);
    }
    let mut mask = [0u8; 4];
    reader.read_exact(&mut mask).await?;
    let mut payload = vec![0u8; length];
    reader.read_exact(&mut payload).await?;
    for (i, byte) in payload.iter_mut().enumerate() {
        *byte ^= mask[i % 4];
    }
    Ok(Some(Frame {
        fin: head[0] & 0x80 != 0,
        opcode: head[0] & 0x0f,
        payload,
    }))
}

/// A frame for the client: final, unmasked.
pub fn encode(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// What the client said, a whole message at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Message(Vec<u8>),
    Ping(Vec<u8>),
    Close,
}

/// Reads whole messages from a client; a fragmented message may have control frames
/// (pings) between its fragments, so the fragments read so far are kept across calls.
#[derive(Debug, Default)]
pub struct MessageReader {
    partial: Option<Vec<u8>>,
}

impl MessageReader {
    /// Reads frames until a whole message, a ping or a close (or the end of the stream, which
    /// is a close too).
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
    ) -> Result<Incoming, WebSocketError> {
        loop {
            let room = MAX_MESSAGE - self.partial.as_ref().map_or(0, Vec::len);
            let Some(frame) = read_frame(reader, room).await? else {
                return Ok(Incoming::Close);
            };
            match frame.opcode {
                PING => return Ok(Incoming::Ping(frame.payload)),
                PONG => continue,
                CLOSE => return Ok(Incoming::Close),
                TEXT | BINARY if self.partial.is_none() => {
                    if frame.fin {
                        return Ok(Incoming::Message(frame.payload));
                    }
                    self.partial = Some(frame.payload);
                }
                CONTINUATION if self.partial.is_some() => {
                    let mut whole = self.partial.take().unwrap_or_default();
                    whole.extend_from_slice(&frame.payload);
                    if frame.fin {
                        return Ok(Incoming::Message(whole));
                    }
                    self.partial = Some(whole);
                }
                _ => return Err(WebSocketError::Protocol("an unexpected opcode")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut out = vec![first];
        if payload.len() < 126 {
            out.push(0x80 | payload.len() as u8);
        } else {
            out.push(0x80 | 126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn test_accept_key_is_rfc_6455s_example() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[tokio::test]
    async fn test_fragments_pings_and_close_are_read_as_messages() {
        let long = vec![b'x'; 300];
        let mut wire = masked(0x01, b"he");
        wire.extend(masked(0x89, b"p"));
        wire.extend(masked(0x80, b"llo"));
        wire.extend(masked(0x81, &long));
        wire.extend(masked(0x88, &[]));
        let mut reader = &wire[..];
        let mut messages = MessageReader::default();
        assert_eq!(
            messages.next(&mut reader).await.unwrap(),
            Incoming::Ping(b"p".to_vec())
        );
        assert_eq!(
            messages.next(&mut reader).await.unwrap(),
            Incoming::Message(b"hello".to_vec())
        );
        assert_eq!(
            messages.next(&mut reader).await.unwrap(),
            Incoming::Message(long)
        );
        assert_eq!(messages.next(&mut reader).await.unwrap(), Incoming::Close);
        assert_eq!(
            messages.next(&mut reader).await.unwrap(),
            Incoming::Close,
            "end of stream"
        );
    }

    #[tokio::test]
    async fn test_unmasked_and_oversized_frames_are_refused() {
        let mut unmasked: &[u8] = &[0x81, 0x01, b'x'];
        assert!(matches!(
            MessageReader::default().next(&mut unmasked).await,
            Err(WebSocketError::Unmasked)
        ));
        let mut huge: &[u8] = &[0x81, 0xff, 0, 0, 0, 0, 0x10, 0, 0, 0];
        assert!(matches!(
            MessageReader::default().next(&mut huge).await,
            Err(WebSocketError::TooLong)
        ));
    }

    #[test]
    fn test_encode_uses_the_shortest_length() {
        assert_eq!(encode(TEXT, b"hi"), [0x81, 2, b'h', b'i']);
        assert_eq!(&encode(TEXT, &[0; 200])[..4], &[0x81, 126, 0, 200]);
        assert_eq!(&encode(BINARY, &[0; 70000])[..2], &[0x82, 127]);
    }
}
