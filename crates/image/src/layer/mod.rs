//! The layer applier: one layer tar written into its own directory, in overlayfs form, with
//! every write resolved beneath the directory's handle.
//!
//! Rules (ARCHITECTURE.md, "The layer applier"):
//! - Paths: a leading `/` and `.` components are dropped (`./etc/passwd` and `/etc/passwd`
//!   both mean `etc/passwd`); a `..` component refuses the whole layer. Hard-link targets
//!   follow the same rule. Symlink targets are stored verbatim: they are resolved inside the
//!   container, never here.
//! - Parents are opened with `openat2(RESOLVE_IN_ROOT)`: a symlink in the layer is followed as
//!   if the layer directory were `/`, so no write lands outside it; missing parents are created
//!   `0755 root`. The last component is never followed (`O_EXCL`, `O_NOFOLLOW`, `*at` calls
//!   with one component).
//! - `.wh.NAME` becomes a whiteout (character device 0/0) named `NAME`, unless this layer
//!   already has `NAME` (a whiteout only hides lower layers); `.wh..wh..opq` sets
//!   `trusted.overlay.opaque=y` (`user.overlay.opaque=y` when not root) on its directory.
//! - Device nodes, FIFOs and other special files are never created: skipped with a warning.
//! - Ownership (ids up to 65535), modes (setuid included), mtimes and xattrs are kept:
//!   `user.*` and `security.capability` are written, `trusted.*` and `user.overlay.*` refuse
//!   the layer (they would forge overlay metadata), other namespaces are skipped with a warning.
//! - Limits: uncompressed size, entry count and path length ([`Limits`]), each error naming
//!   the entry.

mod decompress;
mod entries;
mod writer;

use std::fmt;
use std::io::{self, Read};
use std::os::fd::BorrowedFd;

pub use decompress::{DECODER_SOURCE, Decompressed, LimitExceeded, Limited, MalformedZstd};
pub use writer::Ownership;

/// Bounds on what one layer may make the applier do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Uncompressed tar bytes (headers, padding and file data).
    pub max_layer_bytes: u64,
    /// Tar headers, extension headers included.
    pub max_entries: u64,
    /// Bytes of an entry's path (or link target) after normalisation.
    pub max_path_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_layer_bytes: 32 << 30,
            max_entries: 1_000_000,
            max_path_bytes: 4096,
        }
    }
}

/// The largest PAX extension block read (xattrs and long names live there).
const MAX_PAX_BYTES: usize = 1 << 20;
/// At most this many warnings are kept per layer (the count goes on).
const MAX_WARNINGS: usize = 100;

/// What applying a layer did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerReport {
    /// Tar entries applied (extension headers not counted).
    pub entries: u64,
    /// Bytes of regular-file data written.
    pub file_bytes: u64,
    /// Entries skipped on purpose (device nodes, FIFOs, unsupported xattrs), at most 100.
    pub warnings: Vec<String>,
    /// How many warnings there were in all.
    pub warning_count: u64,
}

impl LayerReport {
    fn warn(&mut self, message: String) {
        self.warning_count += 1;
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(message);
        }
    }
}

/// An entry's name for messages: lossy UTF-8 with control characters escaped.
#[derive(Clone, PartialEq, Eq)]
pub struct EntryName(pub Vec<u8>);

impl fmt::Display for EntryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = String::from_utf8_lossy(&self.0);
        let shown: String = text
            .chars()
            .take(300)
            .flat_map(char::escape_debug)
            .collect();
        f.write_str(&shown)?;
        if text.chars().count() > 300 {
            f.write_str("...")?;
        }
        Ok(())
    }
}

impl fmt::Debug for EntryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{self}`")
    }
}

/// Why a layer entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a `..` path component")]
    DotDot,
    #[error("path of {len} bytes is longer than {max}")]
    PathTooLong { len: usize, max: usize },
    #[error("a path component longer than 255 bytes")]
    NameTooLong,
    #[error("a NUL byte in the path")]
    Nul,
    #[error("{what} id {id} is above 65535")]
    Id { what: &'static str, id: u64 },
    #[error("xattr `{0}` would forge overlayfs metadata")]
    OverlayXattr(String),
    #[error("GNU sparse files are not supported")]
    Sparse,
    #[error("PAX size {pax} disagrees with the header's {header}")]
    PaxSize { pax: u64, header: u64 },
    #[error("an empty symlink target")]
    EmptyLink,
    #[error("hard link target `{0}` does not exist in this layer")]
    LinkTarget(EntryName),
    #[error("a whiteout of `{0}`")]
    BadWhiteout(EntryName),
    #[error("the layer root can only be a directory")]
    RootNotDirectory,
    #[error("a parent is not a directory inside the layer")]
    ParentNotDirectory,
    #[error("{what} of more than {max} bytes")]
    ExtensionTooLarge { what: &'static str, max: usize },
    #[error("two {0} headers for one entry")]
    DuplicateExtension(&'static str),
}

/// Why applying a layer failed. The layer directory is then incomplete and must be discarded.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("layer tar is malformed at byte {offset}")]
    Malformed {
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("layer entry `{entry}` (at byte {offset}): refused: {problem}")]
    Refused {
        entry: EntryName,
        offset: u64,
        problem: Refusal,
    },
    #[error("layer entry `{entry}`: cannot {action}")]
    Write {
        entry: EntryName,
        action: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("layer has more than {max} entries (at entry `{entry}`)")]
    TooManyEntries { entry: EntryName, max: u64 },
    #[error("layer is larger than {max_bytes} bytes uncompressed (at entry `{entry}`)")]
    TooLarge { entry: EntryName, max_bytes: u64 },
    #[error("layer stream cannot be read")]
    Read(#[source] io::Error),
}

/// Applies the uncompressed layer tar `input` into the empty directory `root`. Directories
/// that the layer replaces are moved into `trash` (a directory outside `root` on the same
/// filesystem), which the caller removes.
pub fn apply(
    input: impl Read,
    root: BorrowedFd<'_>,
    trash: BorrowedFd<'_>,
    limits: &Limits,
    ownership: Ownership,
) -> Result<LayerReport, ApplyError> {
    let mut report = LayerReport::default();
    if ownership == Ownership::Caller {
        report.warn(
            "not running as root: files belong to the caller, not to the image's ids".to_owned(),
        );
    }
    let mut applier = writer::Applier::new(root, trash, ownership, limits.max_path_bytes);
    let input = Limited {
        inner: input,
        bytes: 0,
        max_bytes: limits.max_layer_bytes,
    };
    entries::for_each(input, limits, &mut report, |entry, data, report| {
        applier.apply(entry, data, report)
    })?;
    applier.finish(&mut report)?;
    Ok(report)
}
