//! Credentials the sandbox uses without seeing them. The sandbox holds a placeholder; the proxy
//! swaps it for the real secret only in the credential's own header, and only when the
//! destination, method and path match the credential's binding. A placeholder anywhere else (an
//! unbound destination, the URL, another header) refuses the request. Responses from a bound
//! destination have every secret turned back into its placeholder, headers and body alike.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use airlock_policy::egress::Injection;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hyper::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{AUTHORIZATION, HeaderValue};

use crate::policy::Policy;

/// Real credential values by credential name. Read by the caller from each credential's
/// `CredentialSource`, outside the sandbox. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Secrets {
    values: HashMap<String, String>,
}

impl Secrets {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.values.insert(name.into(), value.into());
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.values.keys().collect();
        names.sort();
        f.debug_struct("Secrets")
            .field("names", &names)
            .finish_non_exhaustive()
    }
}

impl FromIterator<(String, String)> for Secrets {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self {
            values: iter.into_iter().collect(),
        }
    }
}

/// Placeholder strings by credential name (see [`generate_placeholder`]).
pub type Placeholders = HashMap<String, String>;

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("the system random generator failed")]
    Random,
}

/// A fresh opaque placeholder, `airlock-cred-<name>-<32 hex digits>` (the name reduced to
/// `[a-z0-9_-]`, at most 32 characters).
pub fn generate_placeholder(name: &str) -> Result<String, CredentialError> {
    let clean: String = name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(32)
        .collect();
    Ok(format!("airlock-cred-{clean}-{}", random_hex(16)?))
}

/// `bytes` random bytes as lower-case hex, from the crypto provider's generator.
pub(crate) fn random_hex(bytes: usize) -> Result<String, CredentialError> {
    let mut buffer = vec![0u8; bytes];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut buffer)
        .map_err(|_| CredentialError::Random)?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// The decoded user:password of a `Basic` value, if it is one.
fn basic_decoded(value: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    BASE64.decode(token.trim()).ok()
}

fn percent_decoded(raw: &str) -> Vec<u8> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let decoded = (bytes[index] == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match decoded {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    out
}

/// A placeholder used where its credential is not bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub(crate) credential: String,
    /// `destination`, `url`, or `header <name>`.
    pub(crate) location: String,
}

/// What a request into which credentials may be injected looks like to the binding check.
#[derive(Debug)]
pub(crate) struct RequestFacts<'a> {
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) method: &'a str,
    /// Normalized path (no query).
    pub(crate) path: &'a str,
    /// The request target as sent (path and query).
    pub(crate) target: &'a str,
}

/// Replaces placeholders by secrets where bound; returns the injected credentials' names.
pub(crate) fn apply_credentials(
    policy: &Policy,
    facts: &RequestFacts<'_>,
    headers: &mut HeaderMap,
) -> Result<Vec<String>, Mismatch> {
    let mut injected = Vec::new();
    let decoded_target = percent_decoded(facts.target);
    for credential in &policy.credentials {
        let placeholder = credential.placeholder.as_bytes();
        let mismatch = |location: String| Mismatch {
            credential: credential.name.clone(),
            location,
        };
        let in_url = contains(facts.target.as_bytes(), placeholder)
            || contains(&decoded_target, placeholder);
        let hit_headers: Vec<hyper::header::HeaderName> = headers
            .iter()
            .filter(|(_, value)| {
                contains(value.as_bytes(), placeholder)
                    || basic_decoded(value.as_bytes()).is_some_and(|d| contains(&d, placeholder))
            })
            .map(|(name, _)| name.clone())
            .collect();
        if !in_url && hit_headers.is_empty() {
            continue;
        }
        if in_url {
            return Err(mismatch("url".into()));
        }
        if !credential.bound_to(facts.host, facts.port, facts.method, facts.path) {
            return Err(mismatch("destination".into()));
        }
        for name in hit_headers {
            let location = || mismatch(format!("header {name}"));
            let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
            let mut replaced = Vec::with_capacity(values.len());
            for value in values {
                let bytes = value.as_bytes();
                let uses = contains(bytes, placeholder)
                    || basic_decoded(bytes).is_some_and(|d| contains(&d, placeholder));
                if !uses {
                    replaced.push(value);
                    continue;
                }
                let new = inject_value(
                    &credential.inject,
                    &name,
                    bytes,
                    placeholder,
                    &credential.secret,
                )
                .ok_or_else(location)?;
                let mut new = HeaderValue::from_bytes(&new).map_err(|_| location())?;
                new.set_sensitive(true);
                replaced.push(new);
            }
            headers.remove(&name);
            for value in replaced {
                headers.append(name.clone(), value);
            }
        }
        injected.push(credential.name.clone());
    }
    Ok(injected)
}

/// The header value with the secret in place of the placeholder, or `None` when this header or
/// this form is not where the credential goes.
fn inject_value(
    inject: &Injection,
    header: &hyper::header::HeaderName,
    value: &[u8],
    placeholder: &[u8],
    secret: &str,
) -> Option<Vec<u8>> {
    match inject {
        Injection::Header { name } => {
            if !header.as_str().eq_ignore_ascii_case(name) || !contains(value, placeholder) {
                return None;
            }
            Some(replace_all(value, placeholder, secret.as_bytes()))
        }
        Injection::Bearer => {
            let text = std::str::from_utf8(value).ok()?.trim();
            let (scheme, token) = text.split_once(' ')?;
            (header == AUTHORIZATION
                && scheme.eq_ignore_ascii_case("bearer")
                && token.trim().as_bytes() == placeholder)
                .then(|| format!("Bearer {secret}").into_bytes())
        }
        Injection::Basic { username } => {
            let decoded = basic_decoded(value)?;
            let password = decoded.splitn(2, |b| *b == b':').nth(1)?;
            (header == AUTHORIZATION && password == placeholder).then(|| {
                format!("Basic {}", BASE64.encode(format!("{username}:{secret}"))).into_bytes()
            })
        }
    }
}

fn replace_all(haystack: &[u8], needle: &[u8], replacement: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len() + replacement.len());
    let mut index = 0;
    while index < haystack.len() {
        if haystack[index..].starts_with(needle) {
            out.extend_from_slice(replacement);
            index += needle.len();
        } else {
            out.push(haystack[index]);
            index += 1;
        }
    }
    out
}

/// Turns secrets back into placeholders in what an upstream sends.
#[derive(Debug)]
pub(crate) struct Redactor {
    needles: Vec<(Vec<u8>, Vec<u8>)>,
    first_bytes: [bool; 256],
    longest: usize,
}

impl Redactor {
    /// For responses from `host:port`: `None` when no credential is bound there (it never
    /// received a secret from this proxy).
    pub(crate) fn for_destination(policy: &Policy, host: &str, port: u16) -> Option<Self> {
        let mut needles = Vec::new();
        for credential in &policy.credentials {
            let bound = credential
                .endpoints
                .iter()
                .any(|e| e.port == port && e.host.matches(host));
            if !bound {
                continue;
            }
            needles.push((
                credential.secret.clone().into_bytes(),
                credential.placeholder.clone().into_bytes(),
            ));
            if let Injection::Basic { username } = &credential.inject {
                needles.push((
                    BASE64
                        .encode(format!("{username}:{}", credential.secret))
                        .into_bytes(),
                    BASE64
                        .encode(format!("{username}:{}", credential.placeholder))
                        .into_bytes(),
                ));
            }
        }
        if needles.is_empty() {
            return None;
        }
        let mut first_bytes = [false; 256];
        for (needle, _) in &needles {
            if let Some(first) = needle.first() {
                first_bytes[usize::from(*first)] = true;
            }
        }
        let longest = needles.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        Some(Self {
            needles,
            first_bytes,
            longest,
        })
    }

    /// Redacts `input`; unless `last`, keeps back a tail that may start a secret.
    fn process(&self, input: &[u8], last: bool, out: &mut Vec<u8>) -> usize {
        let mut index = 0;
        while index < input.len() {
            let next = input[index..]
                .iter()
                .position(|b| self.first_bytes[usize::from(*b)])
                .map_or(input.len(), |p| index + p);
            out.extend_from_slice(&input[index..next]);
            index = next;
            if index >= input.len() {
                break;
            }
            let rest = &input[index..];
            if let Some((needle, replacement)) =
                self.needles.iter().find(|(n, _)| rest.starts_with(n))
            {
                out.extend_from_slice(replacement);
                index += needle.len();
                continue;
            }
            if !last
                && rest.len() < self.longest
                && self.needles.iter().any(|(n, _)| n.starts_with(rest))
            {
                return index;
            }
            out.push(input[index]);
            index += 1;
        }
        index
    }

    pub(crate) fn redact_headers(&self, headers: &mut HeaderMap) {
        let names: Vec<hyper::header::HeaderName> = headers.keys().cloned().collect();
        for name in names {
            let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
            if !values
                .iter()
                .any(|v| self.needles.iter().any(|(n, _)| contains(v.as_bytes(), n)))
            {
                continue;
            }
            headers.remove(&name);
            for value in values {
                let mut out = Vec::new();
                self.process(value.as_bytes(), true, &mut out);
                if let Ok(value) = HeaderValue::from_bytes(&out) {
                    headers.append(name.clone(), value);
                }
            }
        }
    }
}

/// A response body passed through a [`Redactor`].
#[derive(Debug)]
pub(crate) struct RedactedBody<B> {
    inner: B,
    redactor: Arc<Redactor>,
    carry: Vec<u8>,
    pending: Option<Frame<Bytes>>,
    finished: bool,
}

impl<B> RedactedBody<B> {
    pub(crate) fn new(inner: B, redactor: Arc<Redactor>) -> Self {
        Self {
            inner,
            redactor,
            carry: Vec::new(),
            pending: None,
            finished: false,
        }
    }

    fn flush(&mut self) -> Option<Frame<Bytes>> {
        if self.carry.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        self.redactor.process(&self.carry, true, &mut out);
        self.carry.clear();
        Some(Frame::data(Bytes::from(out)))
    }
}

impl<B> Body for RedactedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if let Some(frame) = this.pending.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        loop {
            if this.finished {
                return Poll::Ready(this.flush().map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.finished = true,
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.carry.extend_from_slice(&data);
                        let mut out = Vec::with_capacity(this.carry.len());
                        let used = this.redactor.process(&this.carry, false, &mut out);
                        this.carry.drain(..used);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(trailers) => {
                        return Poll::Ready(Some(Ok(match this.flush() {
                            Some(data) => {
                                this.pending = Some(trailers);
                                data
                            }
                            None => trailers,
                        })));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.carry.is_empty() && self.pending.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        let needles = vec![(b"s3cret-value".to_vec(), b"PLACEHOLDER".to_vec())];
        let mut first_bytes = [false; 256];
        first_bytes[usize::from(b's')] = true;
        Redactor {
            needles,
            first_bytes,
            longest: 12,
        }
    }

    #[test]
    fn test_redaction_across_chunk_boundaries() {
        let redactor = redactor();
        let input = b"xx s3cret-value yy s3cret-value".to_vec();
        for split in 0..input.len() {
            let mut carry = input[..split].to_vec();
            let mut out = Vec::new();
            let used = redactor.process(&carry, false, &mut out);
            carry.drain(..used);
            carry.extend_from_slice(&input[split..]);
            redactor.process(&carry, true, &mut out);
            assert_eq!(out, b"xx PLACEHOLDER yy PLACEHOLDER", "split at {split}");
        }
    }

    #[test]
    fn test_placeholders_are_opaque_and_distinct() {
        let a = generate_placeholder("GitHub Token!").unwrap();
        let b = generate_placeholder("GitHub Token!").unwrap();
        assert!(a.starts_with("airlock-cred-githubtoken-"), "{a}");
        assert_eq!(a.len(), "airlock-cred-githubtoken-".len() + 32);
        assert_ne!(a, b);
    }
}
