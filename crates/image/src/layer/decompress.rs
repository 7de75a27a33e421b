//! Layer decompression: gzip (multi-member), zstd (multi-frame) or none, chosen by the media
//! type and overruled by the bytes' magic number; and the uncompressed size limit.

use std::io::{self, BufRead, Cursor, Read};

use flate2::bufread::MultiGzDecoder;
use ruzstd::decoding::{FrameDecoder, StreamingDecoder};

use crate::oci::LayerCompression;

/// A layer decompressing from `R`.
pub enum Decompressed<R: BufRead> {
    Plain(Chained<R>),
    Gzip(Box<MultiGzDecoder<Chained<R>>>),
    Zstd(Box<ZstdFrames<Chained<R>>>),
}

type Chained<R> = io::Chain<Cursor<Vec<u8>>, R>;

impl<R: BufRead> std::fmt::Debug for Decompressed<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decompressed::Plain(_) => "Decompressed::Plain",
            Decompressed::Gzip(_) => "Decompressed::Gzip",
            Decompressed::Zstd(_) => "Decompressed::Zstd",
        })
    }
}

impl<R: BufRead> Decompressed<R> {
    /// Sniffs the first bytes; the media type's `declared` compression only decides when the
    /// bytes match no known magic number (so a mislabelled layer still reads).
    pub fn new(mut input: R, declared: LayerCompression) -> io::Result<Decompressed<R>> {
        let mut head = Vec::with_capacity(4);
        (&mut input).take(4).read_to_end(&mut head)?;
        let compression = match LayerCompression::sniff(&head) {
            LayerCompression::None => declared,
            sniffed => sniffed,
        };
        let input = Cursor::new(head).chain(input);
        Ok(match compression {
            LayerCompression::None => Decompressed::Plain(input),
            LayerCompression::Gzip => Decompressed::Gzip(Box::new(MultiGzDecoder::new(input))),
            LayerCompression::Zstd => Decompressed::Zstd(Box::new(ZstdFrames::new(input)?)),
        })
    }

    /// The compression actually used.
    pub fn compression(&self) -> LayerCompression {
        match self {
            Decompressed::Plain(_) => LayerCompression::None,
            Decompressed::Gzip(_) => LayerCompression::Gzip,
            Decompressed::Zstd(_) => LayerCompression::Zstd,
        }
    }
}

impl<R: BufRead> Read for Decompressed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decompressed::Plain(r) => r.read(buf),
            Decompressed::Gzip(r) => r.read(buf),
            Decompressed::Zstd(r) => r.read(buf),
        }
    }
}

/// Consecutive zstd frames, as `zstd` and `cat a.zst b.zst` produce. ruzstd's window limit
/// (128 MiB) bounds its memory.
pub struct ZstdFrames<R: Read> {
    decoder: Option<StreamingDecoder<R, FrameDecoder>>,
    /// A read failed: every later one fails too, without the decoder (its state is not
    /// trusted after an error).
    failed: bool,
}

/// The zstd data is malformed, and the decoder failed on it: ruzstd 0.9.1 (the newest) panics
/// when read again after an error (an index out of bounds in its FSE decoder, found by the
/// `apply_layer` fuzz target), so a failed stream is not read again, and a panic in it is the
/// layer's error, not the process's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed zstd data (the decoder failed on it)")]
pub struct MalformedZstd;

/// The path fragment of ruzstd's sources, by which a fuzz target lets its panics unwind.
pub const DECODER_SOURCE: &str = "/ruzstd-";

/// A decoder of the next frame in `input` (its header read).
fn open_frame<R: BufRead>(input: R) -> io::Result<StreamingDecoder<R, FrameDecoder>> {
    guarded(|| StreamingDecoder::new(input).map_err(io::Error::other))
}

/// Runs one decoder step, turning its panic into [`MalformedZstd`].
fn guarded<T>(step: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(step))
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::InvalidData, MalformedZstd)))
}

impl<R: Read> std::fmt::Debug for ZstdFrames<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ZstdFrames")
    }
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(input: R) -> io::Result<ZstdFrames<R>> {
        let decoder = open_frame(input)?;
        Ok(ZstdFrames {
            decoder: Some(decoder),
            failed: false,
        })
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, MalformedZstd));
        }
        let read = self.read_frames(buf);
        if read.is_err() {
            // ruzstd panics when read again after an error (the fuzz target's find).
            self.failed = true;
            self.decoder = None;
        }
        read
    }
}

impl<R: BufRead> ZstdFrames<R> {
    fn read_frames(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = guarded(|| decoder.read(buf))?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let Some(decoder) = self.decoder.take() else {
                return Ok(0);
            };
            let mut input = decoder.into_inner();
            if input.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.decoder = Some(open_frame(input)?);
        }
    }
}

/// The uncompressed stream passed its limit. Carried inside an `io::Error`, so that the
/// applier can name the entry it was reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("more than {max_bytes} bytes")]
pub struct LimitExceeded {
    pub max_bytes: u64,
}

/// Fails reads past `max_bytes`.
#[derive(Debug)]
pub struct Limited<R> {
    pub inner: R,
    pub bytes: u64,
    pub max_bytes: u64,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.max_bytes {
            return Err(io::Error::other(LimitExceeded {
                max_bytes: self.max_bytes,
            }));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn test_a_failed_zstd_stream_keeps_failing_without_reading_the_decoder_again() {
        // The apply_layer fuzz target's find: ruzstd fails on it, then panics (an index past
        // its FSE table) when read again.
        let frame = include_bytes!("../../fuzz/regressions/apply_layer/zstd-fse-panic");
        let mut layer = Decompressed::new(&frame[..], LayerCompression::None).unwrap();
        assert_eq!(layer.compression(), LayerCompression::Zstd);
        let first = layer.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(first.to_string().contains("AccLogTooBig"), "{first}");
        for _ in 0..2 {
            let again = layer.read(&mut [0u8; 16]).unwrap_err();
            assert_eq!(again.kind(), io::ErrorKind::InvalidData);
            assert_eq!(
                again.to_string(),
                "malformed zstd data (the decoder failed on it)"
            );
        }
    }

    #[test]
    fn test_decompress_gzip_members_concatenated() {
        let mut data = gzip(b"hello ");
        data.extend(gzip(b"world"));
        let mut out = String::new();
        Decompressed::new(&data[..], LayerCompression::None)
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "hello world");
    }

    #[test]
    fn test_decompress_magic_overrules_media_type() {
        let data = gzip(b"x");
        let d = Decompressed::new(&data[..], LayerCompression::Zstd).unwrap();
        assert_eq!(d.compression(), LayerCompression::Gzip);
        let d = Decompressed::new(&b"plain tar"[..], LayerCompression::None).unwrap();
        assert_eq!(d.compression(), LayerCompression::None);
    }

    #[test]
    fn test_decompress_zstd_frames_concatenated() {
        // `printf 'ab\n' | zstd -c` then `printf 'cd\n' | zstd -c` (with content checksums).
        let data: &[u8] = &[
            0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x58, 0x19, 0x00, 0x00, 0x61, 0x62, 0x0a, 0x3a, 0x09,
            0x86, 0x75, 0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x58, 0x19, 0x00, 0x00, 0x63, 0x64, 0x0a,
            0x68, 0xe8, 0xbc, 0x0c,
        ];
        let mut out = Vec::new();
        Decompressed::new(data, LayerCompression::None)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"ab\ncd\n");
    }

    #[test]
    fn test_limited_past_max_fails_with_limit() {
        let mut limited = Limited {
            inner: &[0u8; 10][..],
            bytes: 0,
            max_bytes: 5,
        };
        let error = io::copy(&mut limited, &mut io::sink()).unwrap_err();
        assert!(
            error
                .get_ref()
                .unwrap()
                .downcast_ref::<LimitExceeded>()
                .is_some()
        );
    }
}
