//! `sha256:<hex>` content digests, and readers and writers that compute them on the way.

use std::fmt;
use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};

/// A content digest. Only SHA-256 exists in practice (OCI image spec, `sha256:` + 64 hex).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

/// Why a digest string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("`{0}` is not a digest: expected `sha256:` and 64 lowercase hex digits")]
    Malformed(String),
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(text: &str) -> Result<Digest, DigestError> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| DigestError::Malformed(text.to_owned()))?;
        let valid = hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !valid {
            return Err(DigestError::Malformed(text.to_owned()));
        }
        Ok(Digest(text.to_owned()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(hasher: Sha256) -> Digest {
        let mut text = String::with_capacity(71);
        text.push_str("sha256:");
        for byte in hasher.finalize() {
            text.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
            text.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
        }
        Digest(text)
    }

    /// The 64 hex digits: file and directory names in the store.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for tables.
    pub fn short(&self) -> &str {
        &self.0[7..19]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Digest {
    type Err = DigestError;
    fn from_str(text: &str) -> Result<Digest, DigestError> {
        Digest::parse(text)
    }
}

/// A running SHA-256 with a byte count.
#[derive(Debug, Clone, Default)]
pub struct Hasher {
    sha: Sha256,
    bytes: u64,
}

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        self.sha.update(data);
        self.bytes += data.len() as u64;
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn finish(self) -> Digest {
        Digest::from_hasher(self.sha)
    }
}

/// Reads through to `inner`, hashing what passes.
#[derive(Debug)]
pub struct HashingReader<R> {
    pub inner: R,
    pub hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Hasher::default(),
        }
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A writer that only hashes: the digest of whatever is copied into it.
#[derive(Debug, Default)]
pub struct HashingSink(pub Hasher);

impl Write for HashingSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_digest_of_empty_is_known_value() {
        assert_eq!(
            Digest::of(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn test_digest_parse_uppercase_and_short_refused() {
        let good = Digest::of(b"x");
        assert_eq!(Digest::parse(good.as_str()).unwrap(), good);
        assert!(Digest::parse(&good.as_str().to_uppercase()).is_err());
        assert!(Digest::parse("sha256:abc").is_err());
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse(&format!("sha256:../{}", &good.hex()[3..])).is_err());
    }
}
