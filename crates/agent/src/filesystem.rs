//! `filesystem.Filesystem` unary RPCs (Stat, MakeDir, Move, ListDir, Remove) and the
//! `EntryInfo` JSON they share with the watchers.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::Deserialize;
use serde_json::json;

use crate::connect::{Code, RpcError, RpcResult};
use crate::user::{self, User};
use crate::wire::{Lenient, non_empty};

// Proto3 JSON requests: unknown fields are ignored on purpose (no deny_unknown_fields).

#[derive(Debug, Deserialize)]
pub struct PathRequest {
    #[serde(default)]
    path: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct MoveRequest {
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    destination: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ListDirRequest {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<Lenient>,
}

/// Caches uid/gid → name lookups for one response.
#[derive(Debug, Default)]
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn user(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| user::user_name(uid))
            .clone()
    }

    fn group(&mut self, gid: u32) -> String {
        self.groups
            .entry(gid)
            .or_insert_with(|| user::group_name(gid))
            .clone()
    }
}

/// Go's `FileMode.String()` for the type and permission bits, as envd reports `permissions`.
fn permissions_string(meta: &Metadata) -> String {
    let ft = meta.file_type();
    use std::os::unix::fs::FileTypeExt;
    let kind = if ft.is_dir() {
        "d"
    } else if ft.is_symlink() {
        "L"
    } else if ft.is_fifo() {
        "p"
    } else if ft.is_socket() {
        "S"
    } else if ft.is_block_device() {
        "D"
    } else if ft.is_char_device() {
        "Dc"
    } else {
        "-"
    };
    let mode = meta.permissions().mode();
    let mut text = String::from(kind);
    for (bit, ch) in [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ] {
        text.push(if mode & bit != 0 { ch } else { '-' });
    }
    text
}

/// RFC 3339 UTC time for seconds since the epoch (proleptic Gregorian calendar).
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if nanos == 0 {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{nanos:09}Z")
    }
}

/// `EntryInfo` JSON for `path` (not following a final symlink, whose target's type is used).
pub fn entry_info(path: &Path, names: &mut Names) -> std::io::Result<serde_json::Value> {
    let meta = std::fs::symlink_metadata(path)?;
    let mut entry = entry_from_metadata(path, &meta, names);
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(path)?;
        let kind = match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => "FILE_TYPE_DIRECTORY",
            _ => "FILE_TYPE_FILE",
        };
        entry["type"] = json!(kind);
        entry["symlinkTarget"] = json!(target.to_string_lossy());
        entry["isSymlink"] = json!(true);
    }
    Ok(entry)
}

fn entry_from_metadata(path: &Path, meta: &Metadata, names: &mut Names) -> serde_json::Value {
    let kind = if meta.is_dir() {
        "FILE_TYPE_DIRECTORY"
    } else {
        "FILE_TYPE_FILE"
    };
    let name = path
        .file_name()
        .map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy());
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or_else(
            || rfc3339(meta.mtime(), 0),
            |d| rfc3339(i64::try_from(d.as_secs()).unwrap_or(0), d.subsec_nanos()),
        );
    json!({
        "name": name,
        "type": kind,
        "path": path.to_string_lossy(),
        "size": meta.len().to_string(),
        "mode": meta.permissions().mode() & 0o7777,
        "permissions": permissions_string(meta),
        "owner": names.user(meta.uid()),
        "group": names.group(meta.gid()),
        "modifiedTime": modified,
    })
}

fn required<'a>(value: &'a Option<String>, field: &str) -> RpcResult<&'a str> {
    non_empty(value)
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, format!("{field} is required")))
}

fn not_found(path: &Path) -> RpcError {
    RpcError::new(
        Code::NotFound,
        format!("path '{}' does not exist", path.display()),
    )
}

/// `Stat`.
pub fn stat(request: &PathRequest, user: &User) -> RpcResult<serde_json::Value> {
    let path = user.resolve(required(&request.path, "path")?);
    match entry_info(&path, &mut Names::default()) {
        Ok(entry) => Ok(json!({ "entry": entry })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_found(&path)),
        Err(e) => Err(RpcError::from_io(
            &e,
            &format!("cannot stat '{}'", path.display()),
        )),
    }
}

/// `MakeDir`: creates the directory and its parents; an existing directory is
/// `already_exists`, an existing file `invalid_argument`.
pub fn make_dir(request: &PathRequest, user: &User) -> RpcResult<serde_json::Value> {
    let path = user.resolve(required(&request.path, "path")?);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(RpcError::new(
                Code::AlreadyExists,
                format!("directory '{}' already exists", path.display()),
            ));
        }
        Ok(_) => {
            return Err(RpcError {
                errno: Some("EEXIST"),
                ..RpcError::new(
                    Code::InvalidArgument,
                    format!("path '{}' exists and is not a directory", path.display()),
                )
            });
        }
        Err(_) => {}
    }
    std::fs::create_dir_all(&path).map_err(|e| {
        RpcError::from_io(&e, &format!("cannot create directory '{}'", path.display()))
    })?;
    let entry = entry_info(&path, &mut Names::default())
        .map_err(|e| RpcError::from_io(&e, &format!("cannot stat '{}'", path.display())))?;
    Ok(json!({ "entry": entry }))
}

/// `Move`: renames, creating the destination's parents.
pub fn move_entry(request: &MoveRequest, user: &User) -> RpcResult<serde_json::Value> {
    let source = user.resolve(required(&request.source, "source")?);
    let destination = user.resolve(required(&request.destination, "destination")?);
    if std::fs::symlink_metadata(&source).is_err() {
        return Err(not_found(&source));
    }
    if let Some(parent) = destination.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| RpcError::from_io(&e, &format!("cannot create '{}'", parent.display())))?;
    }
    std::fs::rename(&source, &destination).map_err(|e| {
        RpcError::from_io(
            &e,
            &format!(
                "cannot move '{}' to '{}'",
                source.display(),
                destination.display()
            ),
        )
    })?;
    let entry = entry_info(&destination, &mut Names::default())
        .map_err(|e| RpcError::from_io(&e, &format!("cannot stat '{}'", destination.display())))?;
    Ok(json!({ "entry": entry }))
}

fn list_into(
    dir: &Path,
    depth_left: u64,
    names: &mut Names,
    out: &mut Vec<serde_json::Value>,
) -> std::io::Result<()> {
    let mut children: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    children.sort();
    for child in children {
        let Ok(meta) = std::fs::symlink_metadata(&child) else {
            continue; // removed while listing
        };
        if let Ok(entry) = entry_info(&child, names) {
            out.push(entry);
        }
        if meta.is_dir() && depth_left > 1 {
            // Unreadable subdirectories are listed but not entered.
            let _ = list_into(&child, depth_left - 1, names, out);
        }
    }
    Ok(())
}

/// `ListDir`: entries below the directory up to `depth` (0 means 1), without following
/// symlinks, the directory itself excluded.
pub fn list_dir(request: &ListDirRequest, user: &User) -> RpcResult<serde_json::Value> {
    let path = user.resolve(non_empty(&request.path).unwrap_or("~"));
    let depth = request.depth.map_or(1, |d| d.get().max(1));
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found(&path)),
        Err(e) => {
            return Err(RpcError::from_io(
                &e,
                &format!("cannot stat '{}'", path.display()),
            ));
        }
        Ok(m) if !m.is_dir() => {
            return Err(RpcError {
                errno: Some("ENOTDIR"),
                ..RpcError::new(
                    Code::InvalidArgument,
                    format!("path '{}' is not a directory", path.display()),
                )
            });
        }
        Ok(_) => {}
    }
    let mut entries = Vec::new();
    list_into(&path, depth, &mut Names::default(), &mut entries)
        .map_err(|e| RpcError::from_io(&e, &format!("cannot list '{}'", path.display())))?;
    Ok(json!({ "entries": entries }))
}

/// `Remove`: recursive; a missing path is not an error.
pub fn remove(request: &PathRequest, user: &User) -> RpcResult<serde_json::Value> {
    let path = user.resolve(required(&request.path, "path")?);
    let result = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
        Ok(_) => std::fs::remove_file(&path),
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RpcError::from_io(
            &e,
            &format!("cannot remove '{}'", path.display()),
        )),
        _ => Ok(json!({})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400, 0), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000, 5), "2023-11-14T22:13:20.000000005Z");
    }
}
