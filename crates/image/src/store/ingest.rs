//! One layer into the store: its compressed blob verified and kept, its tar unpacked once into
//! a directory keyed by its diff id. Pulls and imports both come through here.
//!
//! Crash safety: bytes arrive in `tmp/<hex>.partial` (kept across a crash, so the next pull
//! resumes it with a range request), the unpack happens in `tmp/unpack-<hex>.<pid>.<n>/rootfs`,
//! and each is renamed into place only once the blob's digest and size and the tar's diff id
//! are verified. A final name therefore always holds complete, verified content; rows are
//! written after the files exist (`store::record`). Concurrency: a lock file per blob and per
//! layer (`locks/`), always taken in that order, so two pulls of a shared layer download and
//! unpack it once.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::Paths;
use crate::digest::{Digest, Hasher, HashingReader};
use crate::layer::{self, ApplyError, Decompressed, LayerReport, Limited, Limits, Ownership};
use crate::oci::LayerCompression;

/// A layer to ingest, as a manifest and config describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerJob {
    pub blob: Digest,
    pub size_bytes: u64,
    pub diff_id: Digest,
    pub compression: LayerCompression,
}

/// Progress of one layer, for a progress bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The layer's blob digest.
    pub blob: Digest,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Blob and layer were already in the store.
    Present,
    /// Bytes are arriving (and being unpacked as they come).
    Transferring,
    /// Verified and in place.
    Done,
}

/// Receives progress events; called from several threads.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Why a layer could not be ingested.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("layer {blob}: cannot {action} `{path}`")]
    Io {
        blob: Digest,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("layer {blob}: the transfer failed")]
    Transfer {
        blob: Digest,
        #[source]
        source: io::Error,
    },
    #[error(
        "layer {blob}: the content has digest {actual} and {actual_bytes} bytes, not the {expected_bytes} bytes the manifest names"
    )]
    BlobMismatch {
        blob: Digest,
        actual: Digest,
        actual_bytes: u64,
        expected_bytes: u64,
    },
    #[error(
        "layer {blob}: its uncompressed tar has diff id {actual}, but the config says {expected}"
    )]
    DiffIdMismatch {
        blob: Digest,
        expected: Digest,
        actual: Digest,
    },
    #[error("layer {blob}: cannot be unpacked")]
    Apply {
        blob: Digest,
        #[source]
        source: ApplyError,
    },
    #[error("layer {blob}: cannot be decompressed")]
    Decompress {
        blob: Digest,
        #[source]
        source: io::Error,
    },
}

impl IngestError {
    /// Whether the partial download may be resumed (only transfer failures leave good bytes).
    fn keeps_partial(&self) -> bool {
        matches!(self, IngestError::Transfer { .. })
    }
}

/// A network failure, carried through the blob reader to tell it from bad content.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TransferFailed(pub String);

/// Where a blob's new bytes come from.
pub(crate) enum Incoming {
    /// The network, in chunks; the first `resume_from` bytes are already in the partial file.
    Channel {
        chunks: mpsc::Receiver<Result<Bytes, TransferFailed>>,
        resume_from: u64,
    },
    /// A local file or archive member (imports, or a blob already in the store).
    Local(Box<dyn Read + Send>),
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Incoming::Channel { resume_from, .. } => {
                write!(f, "Incoming::Channel(resume_from={resume_from})")
            }
            Incoming::Local(_) => f.write_str("Incoming::Local"),
        }
    }
}

/// Held locks on a blob and its layer (released when dropped, or when the process dies).
#[derive(Debug)]
pub(crate) struct LayerLocks {
    _blob: File,
    _layer: File,
}

fn lock_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    file.lock()?;
    Ok(file)
}

/// Blocks until this process holds the blob's and the layer's locks.
pub(crate) fn lock_layer(paths: &Paths, job: &LayerJob) -> Result<LayerLocks, IngestError> {
    let io = |path: PathBuf| {
        move |source| IngestError::Io {
            blob: job.blob.clone(),
            action: "lock",
            path,
            source,
        }
    };
    let blob_lock = paths.lock("blob", &job.blob);
    let layer_lock = paths.lock("layer", &job.diff_id);
    Ok(LayerLocks {
        _blob: lock_file(&blob_lock).map_err(io(blob_lock.clone()))?,
        _layer: lock_file(&layer_lock).map_err(io(layer_lock.clone()))?,
    })
}

/// The blob's bytes: the partial file's first, then the new ones, which are appended to it;
/// hashed, counted, and never more than the manifest's size.
struct BlobReader {
    prefix: Option<io::Take<File>>,
    incoming: Incoming,
    chunk: Bytes,
    sink: Option<File>,
    hasher: Hasher,
    max_bytes: u64,
    progress: Option<(ProgressFn, Digest, u64)>,
    reported: u64,
}

impl BlobReader {
    fn next_chunk(&mut self) -> io::Result<bool> {
        match &mut self.incoming {
            Incoming::Channel { chunks, .. } => match chunks.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.chunk = chunk;
                    Ok(true)
                }
                Some(Err(failed)) => Err(io::Error::other(failed)),
                None => Ok(false),
            },
            Incoming::Local(reader) => {
                let mut buffer = vec![0u8; 1 << 20];
                let n = reader.read(&mut buffer)?;
                buffer.truncate(n);
                self.chunk = Bytes::from(buffer);
                Ok(n > 0)
            }
        }
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(prefix) = &mut self.prefix {
            let n = prefix.read(buf)?;
            if n > 0 {
                self.hasher.update(&buf[..n]);
                return Ok(n);
            }
            self.prefix = None;
        }
        while self.chunk.is_empty() {
            if !self.next_chunk()? {
                return Ok(0);
            }
            if let Some(sink) = &mut self.sink {
                sink.write_all(&self.chunk)?;
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        self.hasher.update(&buf[..n]);
        if self.hasher.bytes() > self.max_bytes {
            return Err(io::Error::other(TransferFailed(format!(
                "more than the manifest's {} bytes",
                self.max_bytes
            ))));
        }
        if let Some((report, blob, total)) = &self.progress {
            let done = self.hasher.bytes();
            if done - self.reported >= 1 << 20 || done == *total {
                self.reported = done;
                report(&Progress {
                    blob: blob.clone(),
                    done_bytes: done,
                    total_bytes: *total,
                    phase: Phase::Transferring,
                });
            }
        }
        Ok(n)
    }
}

static UNPACK_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// What an ingest did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ingested {
    /// The unpack's report, when the layer was unpacked now.
    pub unpacked: Option<LayerReport>,
    /// The compression the bytes actually had.
    pub compression: Option<LayerCompression>,
}

/// Reads the blob from `incoming` (while holding [`lock_layer`]'s locks), keeps it unless it
/// is already stored, unpacks it unless its layer is, verifies both digests and publishes.
pub(crate) fn ingest(
    paths: &Paths,
    job: &LayerJob,
    incoming: Incoming,
    limits: &Limits,
    ownership: Ownership,
    progress: Option<ProgressFn>,
) -> Result<Ingested, IngestError> {
    let blob_path = paths.blob(&job.blob);
    let need_blob = !blob_path.exists();
    let need_layer = !paths.layer(&job.diff_id).exists();
    let partial = paths.tmp().join(format!("{}.partial", job.blob.hex()));
    let result = ingest_inner(
        paths, job, incoming, need_blob, need_layer, &partial, limits, ownership, progress,
    );
    if let Err(error) = &result
        && !error.keeps_partial()
    {
        let _ = fs::remove_file(&partial);
    }
    result
}

#[allow(
    clippy::too_many_arguments,
    reason = "one internal call site; a struct would only rename them"
)]
fn ingest_inner(
    paths: &Paths,
    job: &LayerJob,
    incoming: Incoming,
    need_blob: bool,
    need_layer: bool,
    partial: &Path,
    limits: &Limits,
    ownership: Ownership,
    progress: Option<ProgressFn>,
) -> Result<Ingested, IngestError> {
    let blob = &job.blob;
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| IngestError::Io {
            blob: blob.clone(),
            action,
            path,
            source,
        }
    };
    let resume_from = match &incoming {
        Incoming::Channel { resume_from, .. } => *resume_from,
        Incoming::Local(_) => 0,
    };
    let (prefix, sink) = if need_blob {
        let mut sink = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(partial)
            .map_err(io("create", partial))?;
        sink.set_len(resume_from).map_err(io("truncate", partial))?;
        sink.seek(SeekFrom::End(0)).map_err(io("seek", partial))?;
        let prefix = File::open(partial)
            .map_err(io("open", partial))?
            .take(resume_from);
        (Some(prefix), Some(sink))
    } else {
        (None, None)
    };
    let source = BlobReader {
        prefix,
        incoming,
        chunk: Bytes::new(),
        sink,
        hasher: Hasher::default(),
        max_bytes: job.size_bytes,
        progress: progress.map(|p| (p, blob.clone(), job.size_bytes)),
        reported: 0,
    };
    let mut compressed = BufReader::with_capacity(1 << 20, source);
    let classify = |error: io::Error| -> IngestError {
        if error.get_ref().is_some_and(|e| e.is::<TransferFailed>()) {
            IngestError::Transfer {
                blob: blob.clone(),
                source: error,
            }
        } else {
            IngestError::Decompress {
                blob: blob.clone(),
                source: error,
            }
        }
    };
    let unpack = paths.tmp().join(format!(
        "unpack-{}.{}.{}",
        job.diff_id.hex(),
        std::process::id(),
        UNPACK_SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let rootfs = unpack.join("rootfs");
    if need_layer {
        remove_leftovers(paths, &job.diff_id);
    }
    let verified = (|| -> Result<(Option<LayerReport>, LayerCompression), IngestError> {
        let (report, diff_id, compression) = {
            let mut decompressed =
                Decompressed::new(&mut compressed, job.compression).map_err(classify)?;
            let compression = decompressed.compression();
            let max_bytes = limits.max_layer_bytes.saturating_add(1 << 20);
            if need_layer {
                // Two stages on two threads: this one inflates, the other hashes the tar and
                // writes the files (inflating alone takes about as long as the rest).
                let (report, diff_id) = std::thread::scope(|scope| {
                    let (chunks, received) = std::sync::mpsc::sync_channel(16);
                    let applier = scope.spawn(|| {
                        let input = ChunkReader {
                            chunks: received,
                            current: Vec::new(),
                            at: 0,
                        };
                        let mut tar = HashingReader::new(Limited {
                            inner: input,
                            bytes: 0,
                            max_bytes,
                        });
                        let report = unpack_into(job, &mut tar, &unpack, limits, ownership)?;
                        // What the tar did not read (padding, trailing bytes) is in the diff id.
                        io::copy(&mut tar, &mut io::sink()).map_err(classify)?;
                        Ok::<_, IngestError>((report, tar.hasher.finish()))
                    });
                    feed(&mut decompressed, &chunks);
                    drop(chunks);
                    applier.join().unwrap_or_else(|_| {
                        Err(IngestError::Decompress {
                            blob: blob.clone(),
                            source: io::Error::other("the unpacking thread panicked"),
                        })
                    })
                })?;
                (Some(report), diff_id, compression)
            } else {
                let mut tar = HashingReader::new(Limited {
                    inner: decompressed,
                    bytes: 0,
                    max_bytes,
                });
                io::copy(&mut tar, &mut io::sink()).map_err(classify)?;
                (None, tar.hasher.finish(), compression)
            }
        };
        io::copy(&mut compressed, &mut io::sink()).map_err(classify)?;
        let source = compressed.get_ref();
        let actual = source.hasher.clone().finish();
        let actual_bytes = source.hasher.bytes();
        if &actual != blob || actual_bytes != job.size_bytes {
            return Err(IngestError::BlobMismatch {
                blob: blob.clone(),
                actual,
                actual_bytes,
                expected_bytes: job.size_bytes,
            });
        }
        if diff_id != job.diff_id {
            return Err(IngestError::DiffIdMismatch {
                blob: blob.clone(),
                expected: job.diff_id.clone(),
                actual: diff_id,
            });
        }
        Ok((report, compression))
    })();
    let (report, compression) = match verified {
        Ok(done) => done,
        Err(error) => {
            let _ = fs::remove_dir_all(&unpack);
            return Err(error);
        }
    };
    if need_blob {
        if let Some(sink) = compressed.get_mut().sink.as_mut() {
            sink.flush().map_err(io("write", partial))?;
        }
        let blob_path = paths.blob(blob);
        fs::rename(partial, &blob_path).map_err(io("publish", &blob_path))?;
    }
    if let Some(report) = &report {
        let meta = paths.layer_meta(&job.diff_id);
        let meta_tmp = unpack.join("meta.json");
        fs::write(&meta_tmp, serde_json::to_vec(report).unwrap_or_default())
            .map_err(io("write", &meta_tmp))?;
        fs::rename(&meta_tmp, &meta).map_err(io("publish", &meta))?;
        let layer_dir = paths.layer(&job.diff_id);
        fs::rename(&rootfs, &layer_dir).map_err(io("publish", &layer_dir))?;
        let _ = fs::remove_dir_all(&unpack);
    }
    Ok(Ingested {
        unpacked: report,
        compression: Some(compression),
    })
}

/// Sends `input` in chunks until its end, an error (passed on) or a receiver that hung up.
fn feed(input: &mut impl Read, chunks: &std::sync::mpsc::SyncSender<io::Result<Vec<u8>>>) {
    loop {
        let mut chunk = vec![0u8; 256 << 10];
        match input.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                chunk.truncate(n);
                if chunks.send(Ok(chunk)).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = chunks.send(Err(e));
                return;
            }
        }
    }
}

/// Reads the chunks [`feed`] sends.
struct ChunkReader {
    chunks: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    at: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            match self.chunks.recv() {
                Ok(chunk) => {
                    self.current = chunk?;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Applies the tar into `<unpack>/rootfs`, with `<unpack>/trash` for replaced directories.
fn unpack_into(
    job: &LayerJob,
    tar: &mut impl Read,
    unpack: &Path,
    limits: &Limits,
    ownership: Ownership,
) -> Result<LayerReport, IngestError> {
    let blob = &job.blob;
    let io = |action: &'static str, path: PathBuf| {
        move |source| IngestError::Io {
            blob: blob.clone(),
            action,
            path,
            source,
        }
    };
    let rootfs = unpack.join("rootfs");
    let trash = unpack.join("trash");
    for dir in [&rootfs, &trash] {
        fs::create_dir_all(dir).map_err(io("create", dir.clone()))?;
    }
    let root_dir = File::open(&rootfs).map_err(io("open", rootfs.clone()))?;
    let trash_dir = File::open(&trash).map_err(io("open", trash.clone()))?;
    layer::apply(tar, root_dir.as_fd(), trash_dir.as_fd(), limits, ownership).map_err(|source| {
        match source {
            ApplyError::Malformed { source, .. } | ApplyError::Read(source)
                if source.get_ref().is_some_and(|e| e.is::<TransferFailed>()) =>
            {
                IngestError::Transfer {
                    blob: blob.clone(),
                    source,
                }
            }
            source => IngestError::Apply {
                blob: blob.clone(),
                source,
            },
        }
    })
}

/// Removes unpack directories of this layer left by a killed ingest (the caller holds the
/// layer's lock, so none of them is in use).
fn remove_leftovers(paths: &Paths, diff_id: &Digest) {
    let prefix = format!("unpack-{}.", diff_id.hex());
    if let Ok(entries) = fs::read_dir(paths.tmp()) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}
