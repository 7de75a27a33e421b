//! Git pushes under `git_push_refs`. A smart-HTTP push is `POST <repo>/git-receive-pack`
//! whose body starts with the ref update commands, as pkt-lines, up to a flush packet; the
//! pack follows. The proxy reads that command section before anything goes upstream, checks
//! every ref it names against the rules' ref globs, and then sends the bytes it read followed
//! by the rest of the body, unchanged. A command section that is malformed, compressed, cut
//! short, signed (`push-cert`, which git would apply as a unit the proxy cannot split), or
//! larger than [`MAX_COMMAND_BYTES`] is refused: what cannot be read is not let through.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use hyper::HeaderMap;
use hyper::StatusCode;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::CONTENT_ENCODING;

use crate::http::ProxyBody;
use crate::policy::path_matches;

/// The most bytes of ref update commands read before the pack (a push of thousands of refs
/// stays well below it).
pub(crate) const MAX_COMMAND_BYTES: usize = 1 << 20;

/// Why a push is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum PushError {
    #[error("no rule lets git pushes reach this repository")]
    NoRepository,
    #[error(
        "the push would change {refname}, which this sandbox may not push to (it may change: {allowed})"
    )]
    RefDenied { refname: String, allowed: String },
    #[error("the push body is compressed ({0}); its ref updates cannot be checked")]
    Compressed(String),
    #[error("the push signs its ref updates (push-cert), which the proxy does not let through")]
    Signed,
    #[error("the push's ref update commands are malformed: {0}")]
    Malformed(&'static str),
    #[error("the push's ref update commands are longer than {MAX_COMMAND_BYTES} bytes")]
    TooLong,
    #[error("the push's body ended before its ref update commands did")]
    Truncated,
    #[error("reading the push's body failed")]
    Read,
}

impl PushError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            PushError::NoRepository | PushError::RefDenied { .. } | PushError::Signed => {
                StatusCode::FORBIDDEN
            }
            PushError::Compressed(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            PushError::TooLong => StatusCode::PAYLOAD_TOO_LARGE,
            PushError::Malformed(_) | PushError::Truncated | PushError::Read => {
                StatusCode::BAD_REQUEST
            }
        }
    }

    pub(crate) fn code(&self) -> &'static str {
        match self {
            PushError::NoRepository | PushError::RefDenied { .. } | PushError::Signed => {
                "git_push_denied"
            }
            _ => "git_push_unreadable",
        }
    }
}

/// One ref update: `<old-oid> <new-oid> <refname>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefUpdate {
    pub(crate) old: String,
    pub(crate) new: String,
    pub(crate) refname: String,
}

/// Whether `path` (normalized) is a push endpoint.
pub(crate) fn is_receive_pack(method: &str, path: &str) -> bool {
    method == "POST" && path.ends_with("/git-receive-pack")
}

fn is_oid(text: &str) -> bool {
    (text.len() == 40 || text.len() == 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parses the command section at the start of `buffer`: `Ok(None)` while it needs more
/// bytes, else the updates and the length of the section (through its flush packet).
pub(crate) fn parse_commands(buffer: &[u8]) -> Result<Option<(Vec<RefUpdate>, usize)>, PushError> {
    let mut updates = Vec::new();
    let mut offset = 0;
    loop {
        let Some(header) = buffer.get(offset..offset + 4) else {
            return Ok(None);
        };
        let header = std::str::from_utf8(header).map_err(|_| PushError::Malformed("bad length"))?;
        let length = usize::from_str_radix(header, 16)
            .map_err(|_| PushError::Malformed("a packet length is not hexadecimal"))?;
        match length {
            0 => return Ok(Some((updates, offset + 4))),
            1..=4 => return Err(PushError::Malformed("a delimiter or empty packet")),
            _ => {}
        }
        let Some(payload) = buffer.get(offset + 4..offset + length) else {
            return Ok(None);
        };
        offset += length;
        let line = payload.strip_suffix(b"\n").unwrap_or(payload);
        // The first command carries the capabilities after a NUL.
        let line = line.split(|b| *b == 0).next().unwrap_or(line);
        let line =
            std::str::from_utf8(line).map_err(|_| PushError::Malformed("a command is not text"))?;
        if line.starts_with("push-cert") {
            return Err(PushError::Signed);
        }
        if let Some(oid) = line.strip_prefix("shallow ") {
            if !is_oid(oid) {
                return Err(PushError::Malformed("a shallow line names no object"));
            }
            continue;
        }
        let mut fields = line.splitn(3, ' ');
        let (Some(old), Some(new), Some(refname)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(PushError::Malformed("a command is not `<old> <new> <ref>`"));
        };
        if !is_oid(old) || !is_oid(new) || refname.is_empty() || refname.contains(' ') {
            return Err(PushError::Malformed("a command is not `<old> <new> <ref>`"));
        }
        updates.push(RefUpdate {
            old: old.to_owned(),
            new: new.to_owned(),
            refname: refname.to_owned(),
        });
    }
}

/// Whether every update names a ref that one of `globs` matches.
pub(crate) fn check_refs(updates: &[RefUpdate], globs: &[&str]) -> Result<(), PushError> {
    for update in updates {
        let allowed = globs
            .iter()
            .any(|glob| path_matches(&format!("/{glob}"), &format!("/{}", update.refname)));
        if !allowed {
            return Err(PushError::RefDenied {
                refname: update.refname.clone(),
                allowed: if globs.is_empty() {
                    "nothing".to_owned()
                } else {
                    globs.join(", ")
                },
            });
        }
    }
    Ok(())
}

/// Reads and checks a push's command section against `globs` (the refs the rules that allow
/// this request let it change; empty when none does). Returns the body to forward (the bytes
/// read, then the rest) and the refs it changes, for the audit line.
pub(crate) async fn guard_push(
    headers: &HeaderMap,
    mut body: Incoming,
    globs: &[&str],
) -> Result<(ProxyBody, Vec<String>), PushError> {
    if globs.is_empty() {
        return Err(PushError::NoRepository);
    }
    if let Some(encoding) = headers.get(CONTENT_ENCODING)
        && !encoding.as_bytes().eq_ignore_ascii_case(b"identity")
    {
        return Err(PushError::Compressed(
            String::from_utf8_lossy(encoding.as_bytes()).into_owned(),
        ));
    }
    let mut buffer = BytesMut::new();
    let updates = loop {
        if let Some((updates, _)) = parse_commands(&buffer)? {
            break updates;
        }
        if buffer.len() > MAX_COMMAND_BYTES {
            return Err(PushError::TooLong);
        }
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => buffer.extend_from_slice(&data),
                Err(_) => return Err(PushError::Truncated),
            },
            Some(Err(_)) => return Err(PushError::Read),
            None => return Err(PushError::Truncated),
        }
    };
    check_refs(&updates, globs)?;
    let refs = updates.into_iter().map(|u| u.refname).collect();
    let forwarded = PrefixedBody {
        prefix: Some(buffer.freeze()),
        rest: body,
    };
    Ok((forwarded.boxed(), refs))
}

/// The bytes already read, then the rest of the body.
#[derive(Debug)]
struct PrefixedBody {
    prefix: Option<Bytes>,
    rest: Incoming,
}

impl Body for PrefixedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(prefix) = self.prefix.take()
            && !prefix.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.as_ref().is_none_or(Bytes::is_empty) && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let extra = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(extra));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(extra));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: &str = "0000000000000000000000000000000000000000";
    const ONE: &str = "1111111111111111111111111111111111111111";

    fn pkt(payload: &str) -> String {
        format!("{:04x}{payload}", payload.len() + 4)
    }

    #[test]
    fn test_parse_commands_reads_updates_up_to_the_flush() {
        let body = format!(
            "{}{}0000PACK...",
            pkt(&format!(
                "{ZERO} {ONE} refs/heads/agent\0report-status side-band-64k\n"
            )),
            pkt(&format!("{ONE} {ZERO} refs/tags/v1\n"))
        );
        let (updates, used) = parse_commands(body.as_bytes()).unwrap().unwrap();
        assert_eq!(
            updates
                .iter()
                .map(|u| u.refname.as_str())
                .collect::<Vec<_>>(),
            ["refs/heads/agent", "refs/tags/v1"]
        );
        assert_eq!(&body[used..], "PACK...");
        assert_eq!(updates[0].old, ZERO);
        assert_eq!(updates[0].new, ONE);
    }

    #[test]
    fn test_parse_commands_waits_for_more_bytes() {
        let line = pkt(&format!("{ZERO} {ONE} refs/heads/agent\n"));
        for cut in 0..line.len() {
            assert_eq!(
                parse_commands(&line.as_bytes()[..cut]),
                Ok(None),
                "cut {cut}"
            );
        }
        assert_eq!(parse_commands(line.as_bytes()), Ok(None), "no flush yet");
    }

    #[test]
    fn test_parse_commands_refuses_what_it_cannot_read() {
        assert_eq!(
            parse_commands(b"zzzz"),
            Err(PushError::Malformed("a packet length is not hexadecimal"))
        );
        assert_eq!(
            parse_commands(b"0001"),
            Err(PushError::Malformed("a delimiter or empty packet"))
        );
        let cert = format!("{}0000", pkt("push-cert\0report-status\n"));
        assert_eq!(parse_commands(cert.as_bytes()), Err(PushError::Signed));
        let short = format!("{}0000", pkt(&format!("{ZERO} refs/heads/x\n")));
        assert!(matches!(
            parse_commands(short.as_bytes()),
            Err(PushError::Malformed(_))
        ));
        let shallow = format!(
            "{}{}0000",
            pkt(&format!("shallow {ONE}")),
            pkt(&format!("{ZERO} {ONE} refs/heads/x\n"))
        );
        assert_eq!(
            parse_commands(shallow.as_bytes()).unwrap().unwrap().0.len(),
            1
        );
        // A probe (git's check before a large push) names no ref at all.
        assert_eq!(parse_commands(b"0000"), Ok(Some((Vec::new(), 4))));
    }

    #[test]
    fn test_check_refs_allows_only_matching_refs() {
        let update = |refname: &str| RefUpdate {
            old: ZERO.into(),
            new: ONE.into(),
            refname: refname.into(),
        };
        let globs = ["refs/heads/agent-1"];
        assert_eq!(check_refs(&[update("refs/heads/agent-1")], &globs), Ok(()));
        let denied = check_refs(
            &[update("refs/heads/agent-1"), update("refs/heads/main")],
            &globs,
        );
        assert!(
            matches!(denied, Err(PushError::RefDenied { refname, .. }) if refname == "refs/heads/main")
        );
        assert!(check_refs(&[update("refs/heads/agent-1x")], &globs).is_err());
        assert!(check_refs(&[update("refs/heads/agent-7")], &["refs/heads/agent-*"]).is_ok());
        assert!(check_refs(&[update("refs/tags/v1")], &["refs/heads/**"]).is_err());
    }
}
