//! The invariants of the agent's input handling, for fuzzers: the Connect envelope framing,
//! the JSON request messages of every RPC, and the file API's path handling (query decoding,
//! `~` and relative paths, multipart file names). Shared by the cargo-fuzz targets
//! (`crates/agent/fuzz`) and the bounded stable runs (`crates/agent/tests/fuzz.rs`). Each
//! function panics on a broken invariant; that is the finding.

use std::path::{Path, PathBuf};

use crate::connect::{
    self, Code, EnumValue, EnvelopeReader, FLAG_COMPRESSED, FLAG_END_STREAM, RpcError,
};
use crate::multipart::{Multipart, Part};
use crate::user::User;
use crate::{filesystem, process, watch, wire};

/// Envelope framing: bytes pushed in arbitrary pieces come out as the envelopes they declare,
/// nothing is lost or invented, and one envelope round-trips.
pub fn connect_framing(data: &[u8]) {
    let mut reader = EnvelopeReader::default();
    // The first byte picks where the input is cut into pieces.
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let mut consumed = 0usize;
    let mut failed = false;
    for piece in data.chunks(step) {
        reader.push(piece);
        loop {
            match reader.next_envelope() {
                Ok(Some((flags, payload))) => {
                    assert_eq!(flags & FLAG_COMPRESSED, 0, "a compressed envelope came out");
                    consumed += 5 + payload.len();
                }
                Ok(None) => break,
                Err(err) => {
                    assert_eq!(err.code, Code::InvalidArgument);
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            break;
        }
    }
    if !failed {
        assert_eq!(
            consumed + reader.leftover(),
            data.len(),
            "bytes lost or invented"
        );
    }
    if let Ok(value) = connect::parse_single_envelope::<serde_json::Value>(data) {
        let declared = data
            .get(1..5)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
        assert_eq!(
            declared.map(|len| len + 5),
            Some(data.len()),
            "trailing bytes accepted"
        );
        let _ = value;
    }
    // Any payload round-trips through one envelope.
    let mut reader = EnvelopeReader::default();
    reader.push(&connect::envelope(0, data));
    let (flags, payload) = match reader.next_envelope() {
        Ok(Some(envelope)) => envelope,
        other => panic!("one envelope did not come back: {other:?}"),
    };
    assert_eq!((flags, &payload[..]), (0, data));
    // An end-of-stream error carries any message intact.
    let message = String::from_utf8_lossy(data).into_owned();
    let end = connect::end_envelope(Some(&RpcError::new(Code::Internal, message.clone())));
    let mut reader = EnvelopeReader::default();
    reader.push(&end);
    let Ok(Some((flags, payload))) = reader.next_envelope() else {
        panic!("the end envelope does not parse");
    };
    assert_eq!(flags, FLAG_END_STREAM);
    let json: serde_json::Value = serde_json::from_slice(&payload).unwrap_or_default();
    assert_eq!(json["error"]["message"].as_str(), Some(message.as_str()));
}

fn parses<T: serde::de::DeserializeOwned>(data: &[u8]) {
    if let Err(err) = connect::parse_message::<T>(data) {
        assert_eq!(err.code, Code::InvalidArgument, "{err}");
        assert!(!err.message.is_empty());
    }
    if let Err(err) = connect::parse_single_envelope::<T>(data) {
        assert_eq!(err.code, Code::InvalidArgument, "{err}");
    }
}

/// Every RPC's request message: parsing either succeeds or fails with `invalid_argument`, and
/// the proto3 helpers (bytes, enums, lenient integers) never panic.
pub fn json_messages(data: &[u8]) {
    parses::<process::StartRequest>(data);
    parses::<process::SelectRequest>(data);
    parses::<process::SendInputRequest>(data);
    parses::<process::SendSignalRequest>(data);
    parses::<process::UpdateRequest>(data);
    parses::<process::StreamInputRequest>(data);
    parses::<filesystem::PathRequest>(data);
    parses::<filesystem::MoveRequest>(data);
    parses::<filesystem::ListDirRequest>(data);
    parses::<watch::WatchRequest>(data);
    parses::<watch::WatcherIdRequest>(data);
    let text = String::from_utf8_lossy(data);
    if let Ok(bytes) = connect::decode_bytes(&text) {
        let again = connect::decode_bytes(&connect::encode_bytes(&bytes));
        assert_eq!(
            again.ok().as_deref(),
            Some(&bytes[..]),
            "base64 does not round-trip"
        );
    }
    if let Ok(value) = serde_json::from_slice::<EnumValue>(data) {
        let values = [("SIGNAL_SIGTERM", 15), ("SIGNAL_SIGKILL", 9)];
        if let Some(number) = value.resolve("SIGNAL_", &values) {
            assert!(values.iter().any(|(_, v)| *v == number));
        }
    }
    let _ = serde_json::from_slice::<wire::Lenient>(data);
}

/// The file API's paths: a `path=` query decodes strictly, resolves to an absolute path that
/// is the request's own (absolute), under the home (`~`, relative), and never anything else;
/// multipart bodies end and name their files the same way.
pub fn file_paths(data: &[u8]) {
    let user = User {
        name: "user".into(),
        uid: 1000,
        gid: 1000,
        home: PathBuf::from("/home/user"),
    };
    let text = String::from_utf8_lossy(data);
    if crate::http::form_decode(&text).is_some() {
        for (i, byte) in text.bytes().enumerate() {
            if byte == b'%' {
                let hex = text.as_bytes().get(i + 1..i + 3);
                assert!(
                    hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)),
                    "malformed percent-encoding accepted: {text:?}"
                );
            }
        }
    }
    if let Ok(Some(path)) = crate::http::query_param(Some(&text), "path") {
        check_resolved(&user, &path);
    }
    // Multipart: the first line is the boundary, the rest the body, in two pieces.
    let (boundary, body) = match text.split_once('\n') {
        Some((b, rest)) if !b.is_empty() && b.len() <= 70 => {
            (b.to_owned(), rest.as_bytes().to_vec())
        }
        _ => return,
    };
    let mut parser = Multipart::new(&boundary);
    let half = body.len() / 2;
    parser.push(&body[..half]);
    drain_parts(&mut parser, &user, body.len());
    parser.push(&body[half..]);
    parser.finish();
    drain_parts(&mut parser, &user, body.len());
}

fn drain_parts(parser: &mut Multipart, user: &User, body_len: usize) {
    // Every call either consumes input or ends: more calls than bytes means a loop.
    for _ in 0..body_len + 16 {
        match parser.next_part() {
            Ok(Some(Part::Start {
                filename: Some(name),
                ..
            })) => check_resolved(user, &name),
            Ok(Some(Part::Done)) | Ok(None) | Err(_) => return,
            Ok(Some(_)) => {}
        }
    }
    panic!("the multipart parser did not make progress");
}

fn check_resolved(user: &User, path: &str) {
    let resolved = user.resolve(path);
    assert!(resolved.is_absolute(), "{path:?} resolved to {resolved:?}");
    if path.starts_with('/') {
        assert_eq!(resolved, Path::new(path));
    } else if path == "~" {
        assert_eq!(resolved, user.home);
    } else {
        assert!(
            resolved.starts_with(&user.home),
            "{path:?} left the home: {resolved:?}"
        );
    }
}

/// The policy parser's deterministic generator, shared by every stable fuzzing run.
pub use airlock_policy::fuzzing::Rng;

/// One mutation of `input`: byte flips, insertions from `dictionary`, deletions, splices with
/// other seeds, and changed length prefixes (the envelope header).
pub fn mutate(input: &[u8], seeds: &[&[u8]], dictionary: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = if out.is_empty() {
            0
        } else {
            rng.below(out.len() + 1)
        };
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 | 2 if !dictionary.is_empty() => {
                let word = dictionary[rng.below(dictionary.len())];
                out.splice(at..at, word.iter().copied());
            }
            3 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 if !seeds.is_empty() => {
                let other = seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let to = (from + 1 + rng.below(64)).min(other.len());
                    out.splice(at..at, other[from..to].iter().copied());
                }
            }
            _ if out.len() >= 5 => {
                let len = [0u32, 1, 2, 0x7fff_ffff, u32::MAX][rng.below(5)]
                    .saturating_add(rng.below(3) as u32);
                out[1..5].copy_from_slice(&len.to_be_bytes());
            }
            _ => {}
        }
    }
    out.truncate(64 * 1024);
    out
}
