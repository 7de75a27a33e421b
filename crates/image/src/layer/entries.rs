//! Tar entries with their extensions folded in (GNU long names, PAX records), read in raw
//! mode so that every extension is bounded here: the tar crate's own folding reads a long
//! name of any size into memory.

use std::io::{self, Read};

use tar::{EntryType, PaxExtensions};

use super::{ApplyError, EntryName, LayerReport, Limits, MAX_PAX_BYTES, Refusal};
use crate::layer::decompress::LimitExceeded;

/// One entry's metadata, extensions applied.
#[derive(Debug, Clone)]
pub(crate) struct EntryMeta {
    pub path: Vec<u8>,
    pub link: Vec<u8>,
    pub kind: EntryType,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime_seconds: i64,
    pub mtime_nanos: u32,
    pub xattrs: Vec<(String, Vec<u8>)>,
    /// Where the entry's header starts in the uncompressed stream.
    pub offset: u64,
}

impl EntryMeta {
    pub fn name(&self) -> EntryName {
        EntryName(self.path.clone())
    }

    pub fn refused(&self, problem: Refusal) -> ApplyError {
        ApplyError::Refused {
            entry: self.name(),
            offset: self.offset,
            problem,
        }
    }
}

/// Maps a read error: the size limit names the entry, anything else is a malformed tar.
pub(crate) fn read_error(error: io::Error, entry: &[u8], offset: u64) -> ApplyError {
    if let Some(limit) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<LimitExceeded>())
    {
        return ApplyError::TooLarge {
            entry: EntryName(entry.to_vec()),
            max_bytes: limit.max_bytes,
        };
    }
    ApplyError::Malformed {
        offset,
        source: error,
    }
}

#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

fn read_capped(
    data: &mut impl Read,
    cap: usize,
    what: &'static str,
    offset: u64,
) -> Result<Vec<u8>, ApplyError> {
    let mut bytes = Vec::new();
    data.take(cap as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| read_error(e, what.as_bytes(), offset))?;
    if bytes.len() > cap {
        return Err(ApplyError::Refused {
            entry: EntryName(what.as_bytes().to_vec()),
            offset,
            problem: Refusal::ExtensionTooLarge { what, max: cap },
        });
    }
    Ok(bytes)
}

fn trim_nuls(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// `seconds[.fraction]`, as PAX writes times.
fn parse_pax_time(value: &str) -> Option<(i64, u32)> {
    let (seconds, fraction) = value.split_once('.').unwrap_or((value, ""));
    let seconds: i64 = seconds.parse().ok()?;
    let digits: String = fraction.chars().take(9).collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let nanos = if digits.is_empty() {
        0
    } else {
        digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32)
    };
    Some((seconds, nanos))
}

/// Calls `apply` for every entry of the tar `input`, with its data as a reader.
pub(crate) fn for_each<R: Read>(
    input: R,
    limits: &Limits,
    report: &mut LayerReport,
    mut apply: impl FnMut(&EntryMeta, &mut dyn Read, &mut LayerReport) -> Result<(), ApplyError>,
) -> Result<(), ApplyError> {
    let mut archive = tar::Archive::new(input);
    let entries = archive
        .entries()
        .map_err(|e| read_error(e, b"(archive start)", 0))?
        .raw(true);
    let mut pending = Pending::default();
    let mut headers = 0u64;
    let mut last_name: Vec<u8> = b"(archive start)".to_vec();
    let mut last_offset = 0u64;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_error(e, &last_name, last_offset))?;
        let offset = entry.raw_header_position();
        headers += 1;
        let header = entry.header().clone();
        let header_path = header.path_bytes().into_owned();
        if headers > limits.max_entries {
            return Err(ApplyError::TooManyEntries {
                entry: EntryName(header_path),
                max: limits.max_entries,
            });
        }
        last_name.clone_from(&header_path);
        last_offset = offset;
        let kind = header.entry_type();
        let slot = match kind {
            EntryType::GNULongName => Some((
                &mut pending.long_name,
                "GNU long name",
                limits.max_path_bytes + 1,
            )),
            EntryType::GNULongLink => Some((
                &mut pending.long_link,
                "GNU long link",
                limits.max_path_bytes + 1,
            )),
            EntryType::XHeader => Some((&mut pending.pax, "PAX header", MAX_PAX_BYTES)),
            _ => None,
        };
        if let Some((slot, what, cap)) = slot {
            if slot.is_some() {
                return Err(ApplyError::Refused {
                    entry: EntryName(header_path),
                    offset,
                    problem: Refusal::DuplicateExtension(what),
                });
            }
            let size = header
                .entry_size()
                .map_err(|e| read_error(e, &header_path, offset))?;
            if kind != EntryType::XHeader && size > cap as u64 {
                return Err(ApplyError::Refused {
                    entry: EntryName(header_path),
                    offset,
                    problem: Refusal::PathTooLong {
                        len: usize::try_from(size.saturating_sub(1)).unwrap_or(usize::MAX),
                        max: limits.max_path_bytes,
                    },
                });
            }
            *slot = Some(read_capped(&mut entry, cap, what, offset)?);
            continue;
        }
        if kind == EntryType::XGlobalHeader {
            // Global records (e.g. git's `comment`) describe the archive, not an entry.
            read_capped(&mut entry, MAX_PAX_BYTES, "PAX global header", offset)?;
            continue;
        }
        let taken = std::mem::take(&mut pending);
        let mut meta = EntryMeta {
            path: taken.long_name.map(trim_nuls).unwrap_or(header_path),
            link: taken
                .long_link
                .map(trim_nuls)
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned()))
                .unwrap_or_default(),
            kind,
            mode: header
                .mode()
                .map_err(|e| read_error(e, &last_name, offset))?,
            uid: header
                .uid()
                .map_err(|e| read_error(e, &last_name, offset))?,
            gid: header
                .gid()
                .map_err(|e| read_error(e, &last_name, offset))?,
            mtime_seconds: 0,
            mtime_nanos: 0,
            xattrs: Vec::new(),
            offset,
        };
        let mtime = header
            .mtime()
            .map_err(|e| read_error(e, &last_name, offset))?;
        meta.mtime_seconds = i64::try_from(mtime).unwrap_or(i64::MAX);
        let size = header
            .entry_size()
            .map_err(|e| read_error(e, &last_name, offset))?;
        if let Some(pax) = &taken.pax {
            for record in PaxExtensions::new(pax) {
                let record = record.map_err(|e| ApplyError::Malformed { offset, source: e })?;
                let Ok(key) = record.key() else { continue };
                let value = record.value_bytes();
                let text = std::str::from_utf8(value).ok();
                match key {
                    "path" => meta.path = value.to_vec(),
                    "linkpath" => meta.link = value.to_vec(),
                    "uid" => meta.uid = text.and_then(|t| t.parse().ok()).unwrap_or(u64::MAX),
                    "gid" => meta.gid = text.and_then(|t| t.parse().ok()).unwrap_or(u64::MAX),
                    "mtime" => {
                        if let Some((seconds, nanos)) = text.and_then(parse_pax_time) {
                            (meta.mtime_seconds, meta.mtime_nanos) = (seconds, nanos);
                        }
                    }
                    "size" => {
                        let pax = text.and_then(|t| t.parse().ok()).unwrap_or(u64::MAX);
                        if pax != size {
                            return Err(meta.refused(Refusal::PaxSize { pax, header: size }));
                        }
                    }
                    _ => {
                        if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                            meta.xattrs.push((name.to_owned(), value.to_vec()));
                        }
                    }
                }
            }
        }
        last_name.clone_from(&meta.path);
        if kind == EntryType::GNUSparse {
            return Err(meta.refused(Refusal::Sparse));
        }
        apply(&meta, &mut entry, report)?;
        report.entries += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_pax_time_fraction_scaled() {
        assert_eq!(parse_pax_time("12.5"), Some((12, 500_000_000)));
        assert_eq!(parse_pax_time("7"), Some((7, 0)));
        assert_eq!(parse_pax_time("1.0000000019"), Some((1, 1)));
        assert_eq!(parse_pax_time("x"), None);
    }
}
