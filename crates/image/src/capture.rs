//! A container-tier sandbox's upper directory as a layer tar: what a template build's `RUN`
//! changed in the image's root.
//!
//! The upper directory is already in overlay form; the tar is in OCI form, as the store keeps
//! every layer's blob: a whiteout (a character device 0/0) becomes `.wh.<name>`, an opaque
//! directory (`trusted.overlay.opaque=y`) gets `.wh..wh..opq`. Owners carry the sandbox's
//! host ids (overlayfs refuses an idmapped upper directory) and are shifted back to the
//! image's 0..65535. Hard links stay hard links. Only `user.*` extended attributes and file
//! capabilities are kept (a namespaced capability, which names the sandbox's root, becomes a
//! plain one); overlayfs' own `trusted.overlay.*` bookkeeping is dropped, and device nodes,
//! FIFOs and sockets are skipped with a warning, as the applier would skip them.
//!
//! Only call this once the sandbox has ended: nothing may change the tree while it is read.
//! Symlinks are never followed (every entry is `lstat`ed and opened with `O_NOFOLLOW`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::tarball::{Meta, TarWriter, Xattr};

/// The sandbox's host id range that the upper directory's owners are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    pub uid_base: u32,
    pub gid_base: u32,
}

/// Ids a sandbox maps (`0..65536` inside).
const RANGE: u32 = 65_536;
/// `VFS_CAP_REVISION_2` and `_3` in a `security.capability` value's first word.
const CAP_REVISION_MASK: u32 = 0xff00_0000;
const CAP_REVISION_2: u32 = 0x0200_0000;
const CAP_REVISION_3: u32 = 0x0300_0000;
const CAP_V2_BYTES: usize = 20;
const CAP_V3_BYTES: usize = 24;

/// What a capture wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureReport {
    /// Entries written (whiteouts and opaque markers included).
    pub entries: u64,
    /// Bytes of regular-file data.
    pub file_bytes: u64,
    /// What was skipped, and why.
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot read `{path}` of the upper directory")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the layer tar")]
    Write(#[source] io::Error),
    #[error("`{path}` is owned by host id {id}, outside the sandbox's range starting at {base}")]
    ForeignOwner { path: String, id: u32, base: u32 },
}

struct Capture<'a, W: Write> {
    root: &'a Path,
    ids: HostIds,
    tar: TarWriter<W>,
    /// (device, inode) of files with several links -> the first one's path.
    links: HashMap<(u64, u64), String>,
    report: CaptureReport,
}

fn shift(path: &str, id: u32, base: u32) -> Result<u32, CaptureError> {
    id.checked_sub(base)
        .filter(|inside| *inside < RANGE)
        .ok_or_else(|| CaptureError::ForeignOwner {
            path: path.to_owned(),
            id,
            base,
        })
}

impl<W: Write> Capture<'_, W> {
    fn read_error(&self, rel: &str) -> impl FnOnce(io::Error) -> CaptureError {
        let path = self.root.join(rel);
        move |source| CaptureError::Read { path, source }
    }

    fn meta(&self, rel: &str, meta: &std::fs::Metadata) -> Result<Meta, CaptureError> {
        Ok(Meta {
            mode: meta.mode() & 0o7777,
            uid: shift(rel, meta.uid(), self.ids.uid_base)?,
            gid: shift(rel, meta.gid(), self.ids.gid_base)?,
            mtime: u64::try_from(meta.mtime()).unwrap_or(0),
        })
    }

    fn open(&self, rel: &str, directory: bool) -> Result<File, CaptureError> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).custom_flags(if directory {
            libc::O_NOFOLLOW | libc::O_DIRECTORY
        } else {
            libc::O_NOFOLLOW | libc::O_NONBLOCK
        });
        options
            .open(self.root.join(rel))
            .map_err(self.read_error(rel))
    }

    /// The attributes worth keeping, and whether the directory is opaque.
    fn xattrs(&mut self, rel: &str, file: &File) -> Result<(Vec<Xattr>, bool), CaptureError> {
        let names =
            airlock_jail::beneath::list_xattrs(file.as_fd()).map_err(self.read_error(rel))?;
        let mut kept = Vec::new();
        let mut opaque = false;
        for name in names {
            let keep = (name.starts_with("user.") && !name.starts_with("user.overlay."))
                || name == "security.capability"
                || name == "trusted.overlay.opaque";
            if !keep {
                continue;
            }
            let Some(value) = airlock_jail::beneath::get_xattr(file.as_fd(), &name)
                .map_err(self.read_error(rel))?
            else {
                continue;
            };
            match name.as_str() {
                "trusted.overlay.opaque" => opaque = value.first() == Some(&b'y'),
                "security.capability" => match self.plain_capability(value) {
                    Some(value) => kept.push((name, value)),
                    None => self.report.warnings.push(format!(
                        "{rel}: a file capability of another user namespace, dropped"
                    )),
                },
                _ => kept.push((name, value)),
            }
        }
        Ok((kept, opaque))
    }

    /// A version 3 (namespaced) capability of the sandbox's root as version 2, which an
    /// image carries; `None` for one of another namespace.
    fn plain_capability(&self, mut value: Vec<u8>) -> Option<Vec<u8>> {
        let word = |bytes: &[u8]| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if value.len() < 4 {
            return None;
        }
        let magic = word(&value);
        match magic & CAP_REVISION_MASK {
            CAP_REVISION_2 if value.len() == CAP_V2_BYTES => Some(value),
            CAP_REVISION_3 if value.len() == CAP_V3_BYTES => {
                if word(&value[CAP_V2_BYTES..]) != self.ids.uid_base {
                    return None;
                }
                value.truncate(CAP_V2_BYTES);
                let plain = (magic & !CAP_REVISION_MASK) | CAP_REVISION_2;
                value[..4].copy_from_slice(&plain.to_le_bytes());
                Some(value)
            }
            _ => None,
        }
    }

    fn entry(&mut self, rel: &str) -> Result<(), CaptureError> {
        let stat = std::fs::symlink_metadata(self.root.join(rel)).map_err(self.read_error(rel))?;
        let kind = stat.file_type();
        let write = CaptureError::Write;
        if kind.is_char_device() && stat.rdev() == 0 {
            self.tar.whiteout(rel).map_err(write)?;
        } else if kind.is_dir() {
            let meta = self.meta(rel, &stat)?;
            let dir = self.open(rel, true)?;
            let (xattrs, opaque) = self.xattrs(rel, &dir)?;
            self.tar.dir(rel, meta, &xattrs).map_err(write)?;
            if opaque {
                self.tar.opaque(rel).map_err(write)?;
                self.report.entries += 1;
            }
            self.children(rel)?;
        } else if kind.is_symlink() {
            let meta = self.meta(rel, &stat)?;
            let target = std::fs::read_link(self.root.join(rel)).map_err(self.read_error(rel))?;
            self.tar
                .symlink(rel, &target.to_string_lossy(), meta)
                .map_err(write)?;
        } else if kind.is_file() {
            let meta = self.meta(rel, &stat)?;
            if stat.nlink() > 1 {
                let key = (stat.dev(), stat.ino());
                if let Some(first) = self.links.get(&key) {
                    let first = first.clone();
                    self.tar.hard_link(rel, &first, meta).map_err(write)?;
                    self.report.entries += 1;
                    return Ok(());
                }
                self.links.insert(key, rel.to_owned());
            }
            let file = self.open(rel, false)?;
            let (xattrs, _) = self.xattrs(rel, &file)?;
            self.tar
                .file(rel, meta, stat.len(), &file, &xattrs)
                .map_err(write)?;
            self.report.file_bytes += stat.len();
        } else {
            self.report
                .warnings
                .push(format!("{rel}: a device node, FIFO or socket, skipped"));
            return Ok(());
        }
        self.report.entries += 1;
        Ok(())
    }

    fn children(&mut self, rel: &str) -> Result<(), CaptureError> {
        let dir = if rel.is_empty() {
            self.root.to_path_buf()
        } else {
            self.root.join(rel)
        };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(self.read_error(rel))? {
            match entry
                .map_err(self.read_error(rel))?
                .file_name()
                .into_string()
            {
                Ok(name) => names.push(name),
                Err(name) => self.report.warnings.push(format!(
                    "{rel}/{}: not a UTF-8 name, skipped",
                    name.to_string_lossy()
                )),
            }
        }
        names.sort();
        for name in names {
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            self.entry(&child)?;
        }
        Ok(())
    }
}

/// Writes the upper directory at `upper` (its contents, not itself) as a layer tar to `out`.
pub fn capture_upper<W: Write>(
    upper: &Path,
    ids: HostIds,
    out: W,
) -> Result<(W, CaptureReport), CaptureError> {
    let mut capture = Capture {
        root: upper,
        ids,
        tar: TarWriter::new(out),
        links: HashMap::new(),
        report: CaptureReport::default(),
    };
    capture.children("")?;
    let report = capture.report;
    let out = capture.tar.finish().map_err(CaptureError::Write)?;
    Ok((out, report))
}
