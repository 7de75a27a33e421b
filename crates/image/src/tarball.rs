//! Writing layer tars: what a template build makes (a captured upper directory, the files of
//! a `COPY`) goes into the store as a tar, through the same verified ingest and applier as a
//! pulled layer. Long names and link targets use GNU extensions (the `tar` crate's), extended
//! attributes PAX records (`SCHILY.xattr.*`), which the applier reads.

use std::io::{self, Read, Write};

use tar::{EntryType, Header};

/// Owner, mode and time of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Permission bits, setuid/setgid/sticky included (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch.
    pub mtime: u64,
}

impl Meta {
    /// Owned by root, modified at `mtime`.
    pub fn root(mode: u32, mtime: u64) -> Meta {
        Meta {
            mode,
            uid: 0,
            gid: 0,
            mtime,
        }
    }
}

/// An extended attribute: its full name and value.
pub type Xattr = (String, Vec<u8>);

/// A tar being written, entry by entry (paths relative, without a leading `/`).
pub struct TarWriter<W: Write> {
    builder: tar::Builder<W>,
}

impl<W: Write> std::fmt::Debug for TarWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TarWriter")
    }
}

fn header(kind: EntryType, meta: Meta, size: u64) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode & 0o7777);
    header.set_uid(u64::from(meta.uid));
    header.set_gid(u64::from(meta.gid));
    header.set_mtime(meta.mtime);
    header.set_size(size);
    header
}

/// One PAX record, `"<len> <key>=<value>\n"`, whose length counts its own digits.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    let mut record = format!("{len} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

impl<W: Write> TarWriter<W> {
    pub fn new(out: W) -> TarWriter<W> {
        let mut builder = tar::Builder::new(out);
        builder.mode(tar::HeaderMode::Complete);
        TarWriter { builder }
    }

    fn xattrs(&mut self, path: &str, xattrs: &[Xattr]) -> io::Result<()> {
        if xattrs.is_empty() {
            return Ok(());
        }
        let records: Vec<u8> = xattrs
            .iter()
            .flat_map(|(name, value)| pax_record(&format!("SCHILY.xattr.{name}"), value))
            .collect();
        let mut pax = header(
            EntryType::XHeader,
            Meta::root(0o644, 0),
            records.len() as u64,
        );
        let name = format!("PaxHeaders/{}", path.rsplit('/').next().unwrap_or(path));
        self.builder.append_data(&mut pax, name, records.as_slice())
    }

    pub fn dir(&mut self, path: &str, meta: Meta, xattrs: &[Xattr]) -> io::Result<()> {
        self.xattrs(path, xattrs)?;
        let mut header = header(EntryType::Directory, meta, 0);
        self.builder.append_data(&mut header, path, io::empty())
    }

    pub fn file(
        &mut self,
        path: &str,
        meta: Meta,
        size: u64,
        data: impl Read,
        xattrs: &[Xattr],
    ) -> io::Result<()> {
        self.xattrs(path, xattrs)?;
        let mut header = header(EntryType::Regular, meta, size);
        self.builder.append_data(&mut header, path, data.take(size))
    }

    pub fn symlink(&mut self, path: &str, target: &str, meta: Meta) -> io::Result<()> {
        let mut header = header(EntryType::Symlink, meta, 0);
        self.builder.append_link(&mut header, path, target)
    }

    /// A hard link to `target`, an entry written earlier in this tar.
    pub fn hard_link(&mut self, path: &str, target: &str, meta: Meta) -> io::Result<()> {
        let mut header = header(EntryType::Link, meta, 0);
        self.builder.append_link(&mut header, path, target)
    }

    /// Deletes `path` of the layers below (`.wh.<name>`).
    pub fn whiteout(&mut self, path: &str) -> io::Result<()> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (format!("{parent}/"), name),
            None => (String::new(), path),
        };
        let mut header = header(EntryType::Regular, Meta::root(0o644, 0), 0);
        self.builder
            .append_data(&mut header, format!("{parent}.wh.{name}"), io::empty())
    }

    /// Hides everything the layers below have in the directory `path`.
    pub fn opaque(&mut self, path: &str) -> io::Result<()> {
        let mut header = header(EntryType::Regular, Meta::root(0o644, 0), 0);
        self.builder
            .append_data(&mut header, format!("{path}/.wh..wh..opq"), io::empty())
    }

    /// Writes the end of the archive and returns the writer.
    pub fn finish(self) -> io::Result<W> {
        self.builder.into_inner()
    }
}

/// Reads every header of the tar at `path`; returns how many entries it has. An upload that
/// is no tar fails here rather than at the step that uses it.
pub fn check_tar(path: &std::path::Path) -> io::Result<u64> {
    let mut archive = tar::Archive::new(std::fs::File::open(path)?);
    let mut count = 0;
    for entry in archive.entries()? {
        entry?;
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_pax_record_length_counts_its_own_digits() {
        for value_len in [0usize, 1, 80, 89, 90, 995, 996, 10_000] {
            let record = pax_record("SCHILY.xattr.user.x", &vec![b'v'; value_len]);
            let text = String::from_utf8(record.clone()).unwrap();
            let declared: usize = text.split(' ').next().unwrap().parse().unwrap();
            assert_eq!(declared, record.len(), "value of {value_len} bytes");
        }
    }

    #[test]
    fn test_tar_writer_entries_read_back() {
        let mut writer = TarWriter::new(Vec::new());
        let meta = Meta {
            mode: 0o4755,
            uid: 1000,
            gid: 100,
            mtime: 1_700_000_000,
        };
        writer.dir("app", Meta::root(0o755, 5), &[]).unwrap();
        writer
            .file(
                "app/run",
                meta,
                3,
                &b"abc"[..],
                &[("user.note".into(), b"hi".to_vec())],
            )
            .unwrap();
        writer.symlink("app/link", "/etc/passwd", meta).unwrap();
        writer.hard_link("app/again", "app/run", meta).unwrap();
        writer.whiteout("etc/motd").unwrap();
        writer.opaque("opt").unwrap();
        let bytes = writer.finish().unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let names: Vec<(String, EntryType, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.header().entry_type(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("app".into(), EntryType::Directory, 0),
                ("app/run".into(), EntryType::Regular, 1000),
                ("app/link".into(), EntryType::Symlink, 1000),
                ("app/again".into(), EntryType::Link, 1000),
                ("etc/.wh.motd".into(), EntryType::Regular, 0),
                ("opt/.wh..wh..opq".into(), EntryType::Regular, 0),
            ]
        );
    }
}
