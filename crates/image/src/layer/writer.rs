//! The applier's filesystem side: every write goes through `airlock_jail::beneath`.

use std::ffi::OsStr;
use std::fs::{File, FileTimes, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_jail::beneath;
use tar::EntryType;

use super::entries::{EntryMeta, read_error};
use super::{ApplyError, EntryName, LayerReport, Refusal};

/// Whose ids the files get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The image's uids and gids, and `trusted.overlay.opaque` (needs root).
    Image,
    /// The caller's own ids, and `user.overlay.opaque` (for an overlay mounted `userxattr`).
    Caller,
}

impl Ownership {
    /// `Image` as root, `Caller` otherwise.
    pub fn for_this_process() -> Ownership {
        if airlock_jail::host::effective_uid() == 0 {
            Ownership::Image
        } else {
            Ownership::Caller
        }
    }

    fn opaque_xattr(self) -> &'static str {
        match self {
            Ownership::Image => "trusted.overlay.opaque",
            Ownership::Caller => "user.overlay.opaque",
        }
    }
}

/// What is at a name already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existing {
    Nothing,
    Directory,
    /// A character device 0/0: only ever one of our whiteouts (devices are never created).
    Whiteout,
    Other,
}

/// A directory whose mode and mtime are set last (its children change its mtime, and a
/// read-only mode would stop an unprivileged applier from filling it).
struct DeferredDir {
    path: Vec<u8>,
    inode: u64,
    mode: u32,
    mtime: (i64, u32),
}

pub(crate) struct Applier<'r> {
    root: BorrowedFd<'r>,
    trash: BorrowedFd<'r>,
    trashed: u64,
    ownership: Ownership,
    max_path: usize,
    /// The last parent directory opened, by its normalised path.
    parent_cache: Option<(Vec<u8>, OwnedFd)>,
    deferred: Vec<DeferredDir>,
    buffer: Vec<u8>,
}

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

/// Splits a tar path into components: `/` and `.` dropped, `..` refused, lengths checked.
pub(crate) fn normalize(path: &[u8], max_bytes: usize) -> Result<Vec<&[u8]>, Refusal> {
    if path.contains(&0) {
        return Err(Refusal::Nul);
    }
    let mut components = Vec::new();
    let mut len = 0usize;
    for component in path.split(|&b| b == b'/') {
        match component {
            b"" | b"." => continue,
            b".." => return Err(Refusal::DotDot),
            _ if component.len() > 255 => return Err(Refusal::NameTooLong),
            _ => {
                len += component.len() + usize::from(!components.is_empty());
                components.push(component);
            }
        }
    }
    if len > max_bytes {
        return Err(Refusal::PathTooLong {
            len,
            max: max_bytes,
        });
    }
    Ok(components)
}

fn time_of(seconds: i64, nanos: u32) -> SystemTime {
    let offset = Duration::new(seconds.unsigned_abs(), nanos.min(999_999_999));
    if seconds >= 0 {
        UNIX_EPOCH.checked_add(offset).unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH.checked_sub(offset).unwrap_or(UNIX_EPOCH)
    }
}

fn id(what: &'static str, value: u64, meta: &EntryMeta) -> Result<u32, ApplyError> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v <= airlock_api::sandbox::MAX_SANDBOX_ID)
        .ok_or_else(|| meta.refused(Refusal::Id { what, id: value }))
}

/// What to do with an xattr an image asks for.
enum XattrRule {
    Write,
    Skip,
}

impl<'r> Applier<'r> {
    pub fn new(
        root: BorrowedFd<'r>,
        trash: BorrowedFd<'r>,
        ownership: Ownership,
        max_path: usize,
    ) -> Applier<'r> {
        Applier {
            root,
            trash,
            trashed: 0,
            ownership,
            max_path,
            parent_cache: None,
            deferred: Vec::new(),
            buffer: vec![0; 256 << 10],
        }
    }

    pub fn apply(
        &mut self,
        meta: &EntryMeta,
        data: &mut dyn Read,
        report: &mut LayerReport,
    ) -> Result<(), ApplyError> {
        let path = meta.path.clone();
        let components = normalize(&path, self.max_path).map_err(|p| meta.refused(p))?;
        let Some((&name, parents)) = components.split_last() else {
            return self.apply_root(meta);
        };
        let parent_key = parents.join(&b'/');
        let parent = self.take_parent(parents, &parent_key, meta)?;
        let result = self.apply_in(&parent, name, meta, data, report);
        self.parent_cache = Some((parent_key, parent));
        result
    }

    fn apply_in(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        meta: &EntryMeta,
        data: &mut dyn Read,
        report: &mut LayerReport,
    ) -> Result<(), ApplyError> {
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            return self.apply_whiteout(parent, hidden, meta, report);
        }
        let is_directory = meta.kind == EntryType::Directory
            || (meta.kind == EntryType::Regular && meta.path.ends_with(b"/"));
        match meta.kind {
            _ if is_directory => self.directory(parent, name, meta),
            EntryType::Regular | EntryType::Continuous => {
                self.file(parent, name, meta, data, report)
            }
            EntryType::Symlink => self.symlink(parent, name, meta, report),
            EntryType::Link => self.hard_link(parent, name, meta),
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                report.warn(format!("skipped device node or FIFO `{}`", meta.name()));
                Ok(())
            }
            other => {
                report.warn(format!(
                    "skipped `{}` of unsupported tar type {:?}",
                    meta.name(),
                    other.as_byte() as char
                ));
                Ok(())
            }
        }
    }

    fn write_error<'m>(
        meta: &'m EntryMeta,
        action: &'static str,
    ) -> impl FnOnce(io::Error) -> ApplyError + 'm {
        move |source| ApplyError::Write {
            entry: meta.name(),
            action,
            source,
        }
    }

    fn apply_root(&mut self, meta: &EntryMeta) -> Result<(), ApplyError> {
        if meta.kind != EntryType::Directory {
            return Err(meta.refused(Refusal::RootNotDirectory));
        }
        let root = self
            .root
            .try_clone_to_owned()
            .map_err(Self::write_error(meta, "open the layer root"))?;
        self.set_directory_metadata(&root, b"", meta)
    }

    /// The parent directory of an entry, created (`0755`, root) where missing.
    fn take_parent(
        &mut self,
        parents: &[&[u8]],
        key: &[u8],
        meta: &EntryMeta,
    ) -> Result<OwnedFd, ApplyError> {
        if let Some((cached, fd)) = self.parent_cache.take()
            && cached == key
        {
            return Ok(fd);
        }
        self.ensure_directory(parents, meta)
    }

    fn ensure_directory(
        &mut self,
        components: &[&[u8]],
        meta: &EntryMeta,
    ) -> Result<OwnedFd, ApplyError> {
        let path = components.join(&b'/');
        match beneath::open_dir_in_root(self.root, Path::new(os(&path))) {
            Ok(fd) => Ok(fd),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !components.is_empty() => {
                let (&last, above) = components.split_last().unwrap_or((&&b""[..], &[]));
                let parent = self.ensure_directory(above, meta)?;
                match beneath::mkdir(parent.as_fd(), os(last), 0o755) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Self::write_error(meta, "create a parent directory")(e)),
                }
                let fd = beneath::open_dir(parent.as_fd(), os(last))
                    .map_err(|_| meta.refused(Refusal::ParentNotDirectory))?;
                File::from(
                    fd.try_clone()
                        .map_err(Self::write_error(meta, "open a parent directory"))?,
                )
                .set_permissions(Permissions::from_mode(0o755))
                .map_err(Self::write_error(meta, "set a parent directory's mode"))?;
                Ok(fd)
            }
            Err(_) => Err(meta.refused(Refusal::ParentNotDirectory)),
        }
    }

    fn existing(parent: &OwnedFd, name: &[u8], meta: &EntryMeta) -> Result<Existing, ApplyError> {
        match beneath::open_entry(parent.as_fd(), os(name)) {
            Ok(file) => {
                let stat = file
                    .metadata()
                    .map_err(Self::write_error(meta, "inspect an existing entry"))?;
                let kind = stat.file_type();
                use std::os::unix::fs::FileTypeExt;
                Ok(if kind.is_dir() {
                    Existing::Directory
                } else if kind.is_char_device() && stat.rdev() == 0 {
                    Existing::Whiteout
                } else {
                    Existing::Other
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Existing::Nothing),
            Err(e) => Err(Self::write_error(meta, "inspect an existing entry")(e)),
        }
    }

    /// Removes whatever has `name`: a directory is moved into the trash (removed later,
    /// outside the layer), anything else unlinked.
    fn clear(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        existing: Existing,
        meta: &EntryMeta,
    ) -> Result<(), ApplyError> {
        match existing {
            Existing::Nothing => Ok(()),
            Existing::Directory => {
                self.trashed += 1;
                let slot = format!("{}", self.trashed);
                beneath::rename_noreplace(parent.as_fd(), os(name), self.trash, OsStr::new(&slot))
                    .map_err(Self::write_error(meta, "replace an existing directory"))
            }
            Existing::Whiteout | Existing::Other => {
                beneath::unlink(parent.as_fd(), os(name), false)
                    .map_err(Self::write_error(meta, "replace an existing entry"))
            }
        }
    }

    fn apply_whiteout(
        &mut self,
        parent: &OwnedFd,
        hidden: &[u8],
        meta: &EntryMeta,
        report: &mut LayerReport,
    ) -> Result<(), ApplyError> {
        if hidden == b".wh..opq" {
            return beneath::set_xattr(parent.as_fd(), self.ownership.opaque_xattr(), b"y")
                .map_err(Self::write_error(meta, "mark its directory opaque"));
        }
        if hidden.starts_with(b".wh.") {
            report.warn(format!("skipped aufs metadata `{}`", meta.name()));
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(meta.refused(Refusal::BadWhiteout(EntryName(hidden.to_vec()))));
        }
        // Only lower layers are hidden: an entry of this layer with that name stays.
        if Self::existing(parent, hidden, meta)? == Existing::Nothing {
            beneath::whiteout(parent.as_fd(), os(hidden))
                .map_err(Self::write_error(meta, "create a whiteout"))?;
        }
        Ok(())
    }

    fn directory(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        meta: &EntryMeta,
    ) -> Result<(), ApplyError> {
        let existing = Self::existing(parent, name, meta)?;
        if existing != Existing::Directory {
            self.clear(parent, name, existing, meta)?;
            beneath::mkdir(parent.as_fd(), os(name), 0o700)
                .map_err(Self::write_error(meta, "create the directory"))?;
        }
        let dir = beneath::open_dir(parent.as_fd(), os(name))
            .map_err(Self::write_error(meta, "open the directory"))?;
        if existing == Existing::Whiteout {
            // A directory replacing one this layer deleted starts empty: lower content stays hidden.
            beneath::set_xattr(dir.as_fd(), self.ownership.opaque_xattr(), b"y")
                .map_err(Self::write_error(meta, "mark the directory opaque"))?;
        }
        let path = normalize(&meta.path, self.max_path)
            .map_err(|p| meta.refused(p))?
            .join(&b'/');
        self.set_directory_metadata(&dir, &path, meta)
    }

    fn set_directory_metadata(
        &mut self,
        dir: &OwnedFd,
        path: &[u8],
        meta: &EntryMeta,
    ) -> Result<(), ApplyError> {
        let file = File::from(
            dir.try_clone()
                .map_err(Self::write_error(meta, "open the directory"))?,
        );
        self.set_owner(&file, meta)?;
        self.set_xattrs(&file, meta, None)?;
        let inode = file
            .metadata()
            .map_err(Self::write_error(meta, "inspect the directory"))?
            .ino();
        self.deferred.push(DeferredDir {
            path: path.to_vec(),
            inode,
            mode: meta.mode & 0o7777,
            mtime: (meta.mtime_seconds, meta.mtime_nanos),
        });
        Ok(())
    }

    fn file(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        meta: &EntryMeta,
        data: &mut dyn Read,
        report: &mut LayerReport,
    ) -> Result<(), ApplyError> {
        let existing = Self::existing(parent, name, meta)?;
        self.clear(parent, name, existing, meta)?;
        let mut file = beneath::create_file(parent.as_fd(), os(name), 0o600)
            .map_err(Self::write_error(meta, "create the file"))?;
        loop {
            let n = match data.read(&mut self.buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(read_error(e, &meta.path, meta.offset)),
            };
            file.write_all(&self.buffer[..n])
                .map_err(Self::write_error(meta, "write the file"))?;
            report.file_bytes += n as u64;
        }
        // Owner first: chown clears setuid bits and file capabilities.
        self.set_owner(&file, meta)?;
        file.set_permissions(Permissions::from_mode(meta.mode & 0o7777))
            .map_err(Self::write_error(meta, "set the file's mode"))?;
        self.set_xattrs(&file, meta, Some(report))?;
        let time = time_of(meta.mtime_seconds, meta.mtime_nanos);
        file.set_times(FileTimes::new().set_accessed(time).set_modified(time))
            .map_err(Self::write_error(meta, "set the file's times"))
    }

    fn symlink(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        meta: &EntryMeta,
        report: &mut LayerReport,
    ) -> Result<(), ApplyError> {
        if meta.link.is_empty() {
            return Err(meta.refused(Refusal::EmptyLink));
        }
        if meta.link.contains(&0) {
            return Err(meta.refused(Refusal::Nul));
        }
        if meta.link.len() > self.max_path {
            return Err(meta.refused(Refusal::PathTooLong {
                len: meta.link.len(),
                max: self.max_path,
            }));
        }
        let existing = Self::existing(parent, name, meta)?;
        self.clear(parent, name, existing, meta)?;
        beneath::symlink(os(&meta.link), parent.as_fd(), os(name))
            .map_err(Self::write_error(meta, "create the symlink"))?;
        if self.ownership == Ownership::Image {
            let uid = id("uid", meta.uid, meta)?;
            let gid = id("gid", meta.gid, meta)?;
            beneath::chown_nofollow(parent.as_fd(), os(name), uid, gid)
                .map_err(Self::write_error(meta, "set the symlink's owner"))?;
        }
        beneath::set_times_nofollow(
            parent.as_fd(),
            os(name),
            meta.mtime_seconds,
            meta.mtime_nanos,
        )
        .map_err(Self::write_error(meta, "set the symlink's times"))?;
        if !meta.xattrs.is_empty() {
            report.warn(format!("skipped the xattrs of symlink `{}`", meta.name()));
        }
        Ok(())
    }

    fn hard_link(
        &mut self,
        parent: &OwnedFd,
        name: &[u8],
        meta: &EntryMeta,
    ) -> Result<(), ApplyError> {
        let target = normalize(&meta.link, self.max_path).map_err(|p| meta.refused(p))?;
        let missing = || meta.refused(Refusal::LinkTarget(EntryName(meta.link.clone())));
        let Some((&target_name, target_parents)) = target.split_last() else {
            return Err(missing());
        };
        let own = normalize(&meta.path, self.max_path).map_err(|p| meta.refused(p))?;
        if own == target {
            return Ok(());
        }
        let target_parent =
            beneath::open_dir_in_root(self.root, Path::new(os(&target_parents.join(&b'/'))))
                .map_err(|_| missing())?;
        match Self::existing(&target_parent, target_name, meta)? {
            Existing::Nothing | Existing::Directory => return Err(missing()),
            Existing::Whiteout | Existing::Other => {}
        }
        let existing = Self::existing(parent, name, meta)?;
        self.clear(parent, name, existing, meta)?;
        beneath::hard_link(
            target_parent.as_fd(),
            os(target_name),
            parent.as_fd(),
            os(name),
        )
        .map_err(Self::write_error(meta, "create the hard link"))
    }

    fn set_owner(&self, file: &File, meta: &EntryMeta) -> Result<(), ApplyError> {
        if self.ownership == Ownership::Caller {
            return Ok(());
        }
        let uid = id("uid", meta.uid, meta)?;
        let gid = id("gid", meta.gid, meta)?;
        std::os::unix::fs::fchown(file, Some(uid), Some(gid))
            .map_err(Self::write_error(meta, "set the owner"))
    }

    fn xattr_rule(&self, name: &str, meta: &EntryMeta) -> Result<XattrRule, ApplyError> {
        if name.starts_with("trusted.") || name.starts_with("user.overlay.") {
            return Err(meta.refused(Refusal::OverlayXattr(name.to_owned())));
        }
        Ok(
            if name.starts_with("user.")
                || (name == "security.capability" && self.ownership == Ownership::Image)
            {
                XattrRule::Write
            } else {
                XattrRule::Skip
            },
        )
    }

    fn set_xattrs(
        &self,
        file: &File,
        meta: &EntryMeta,
        mut report: Option<&mut LayerReport>,
    ) -> Result<(), ApplyError> {
        for (name, value) in &meta.xattrs {
            match self.xattr_rule(name, meta)? {
                XattrRule::Write => match beneath::set_xattr(file.as_fd(), name, value) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                        if let Some(report) = report.as_deref_mut() {
                            report.warn(format!(
                                "xattr `{name}` of `{}`: not supported here",
                                meta.name()
                            ));
                        }
                    }
                    Err(e) => return Err(Self::write_error(meta, "set an xattr")(e)),
                },
                XattrRule::Skip => {
                    if let Some(report) = report.as_deref_mut() {
                        report.warn(format!("skipped xattr `{name}` of `{}`", meta.name()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Directory modes and mtimes, once nothing more is written below them. A directory that a
    /// later entry replaced (its inode differs) keeps the replacement's metadata.
    pub fn finish(&mut self, report: &mut LayerReport) -> Result<(), ApplyError> {
        self.parent_cache = None;
        let _ = report;
        for dir in self.deferred.iter().rev() {
            let Ok(fd) = beneath::open_dir_in_root(self.root, Path::new(os(&dir.path))) else {
                continue;
            };
            let file = File::from(fd);
            let fail = |action| {
                let entry = EntryName(dir.path.clone());
                move |source| ApplyError::Write {
                    entry,
                    action,
                    source,
                }
            };
            if file
                .metadata()
                .map_err(fail("inspect the directory"))?
                .ino()
                != dir.inode
            {
                continue;
            }
            file.set_permissions(Permissions::from_mode(dir.mode))
                .map_err(fail("set the directory's mode"))?;
            let time = time_of(dir.mtime.0, dir.mtime.1);
            file.set_times(FileTimes::new().set_accessed(time).set_modified(time))
                .map_err(fail("set the directory's times"))?;
        }
        Ok(())
    }
}
