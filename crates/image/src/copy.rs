//! A template build's `COPY` as a layer tar: the entries of an uploaded file context that a
//! source pattern selects, placed at the destination as Docker places them, with the step's
//! owner and mode. The tar then takes the same path into the store as any layer (the
//! applier, with its confinement and limits), so a hostile context can do no more than a
//! hostile image.
//!
//! Semantics: the context's entries are named relative to its root (E2B's SDK and `airlock
//! template build` both upload them so). A matched directory's contents go into the
//! destination; a matched file goes to the destination itself, or into it when it ends with
//! `/`, is an existing directory of the image, or several sources match. The destination's
//! directories are resolved through the image's symlinks (`/bin` may be `usr/bin`), so the
//! files land where the container will look for them. Hard links keep pointing at their
//! copied targets; device nodes and FIFOs are skipped.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use crate::glob;
use crate::stack::{Found, LayerStack};
use crate::tarball::{Meta, TarWriter};

/// What one `COPY` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    /// A pattern relative to the context's root (`.` is all of it).
    pub source: String,
    /// An absolute path in the image (the caller joins a relative one to the working
    /// directory); a trailing `/` makes it a directory.
    pub destination: String,
    /// The owner of everything copied.
    pub owner: (u32, u32),
    /// The mode of everything copied; `None` keeps the context's.
    pub mode: Option<u32>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyReport {
    pub entries: u64,
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("cannot read the uploaded files")]
    Read(#[source] io::Error),
    #[error("the uploaded files name `{0}`, which leaves the context")]
    Escape(String),
    #[error("no file of the uploaded context matches `{0}`")]
    NoMatch(String),
    #[error("the destination `{path}`")]
    Destination {
        path: String,
        #[source]
        source: crate::stack::StackError,
    },
    #[error("cannot write the layer tar")]
    Write(#[source] io::Error),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink(String),
    Link(String),
    Other,
}

#[derive(Debug, Clone)]
struct Entry {
    path: String,
    kind: Kind,
    mode: u32,
    mtime: u64,
}

/// `./a//b/` as `a/b`; `None` for a path with `..`.
fn normalise(path: &str) -> Option<String> {
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

fn entries(context: &Path) -> Result<Vec<Entry>, CopyError> {
    let file = File::open(context).map_err(CopyError::Read)?;
    let mut archive = tar::Archive::new(file);
    let mut list = Vec::new();
    for entry in archive.entries().map_err(CopyError::Read)? {
        let entry = entry.map_err(CopyError::Read)?;
        let raw = entry
            .path()
            .map_err(CopyError::Read)?
            .to_string_lossy()
            .into_owned();
        let path = normalise(&raw).ok_or_else(|| CopyError::Escape(raw.clone()))?;
        let header = entry.header();
        let link = || {
            entry
                .link_name()
                .ok()
                .flatten()
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let kind = match header.entry_type() {
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Symlink => Kind::Symlink(link()),
            tar::EntryType::Link => {
                let target = link();
                Kind::Link(normalise(&target).ok_or(CopyError::Escape(target))?)
            }
            _ => Kind::Other,
        };
        if path.is_empty() {
            continue;
        }
        list.push(Entry {
            path,
            kind,
            mode: header.mode().unwrap_or(0o644) & 0o7777,
            mtime: header.mtime().unwrap_or(0),
        });
    }
    Ok(list)
}

fn under<'a>(root: &str, path: &'a str) -> Option<&'a str> {
    if root.is_empty() {
        return Some(path);
    }
    if path == root {
        return Some("");
    }
    path.strip_prefix(root)?.strip_prefix('/')
}

fn join(base: &str, rest: &str) -> String {
    let base = base.trim_end_matches('/');
    match (base.is_empty(), rest.is_empty()) {
        (_, true) => base.to_owned(),
        (true, false) => rest.to_owned(),
        (false, false) => format!("{base}/{rest}"),
    }
}

/// Writes `spec`'s layer tar, from the plain tar `context`, to `out`.
pub fn copy_layer<W: Write>(
    context: &Path,
    spec: &CopySpec,
    stack: &LayerStack,
    out: W,
) -> Result<(W, CopyReport), CopyError> {
    let listed = entries(context)?;
    let source = normalise(&spec.source).ok_or_else(|| CopyError::Escape(spec.source.clone()))?;
    let is_dir = |path: &str| {
        path.is_empty()
            || listed.iter().any(|e| {
                (e.path == path && e.kind == Kind::Dir)
                    || under(path, &e.path).is_some_and(|r| !r.is_empty())
            })
    };
    let mut roots: Vec<String> = if source.is_empty() {
        vec![String::new()]
    } else {
        listed
            .iter()
            .filter(|e| glob::matches(&source, &e.path))
            .map(|e| e.path.clone())
            .collect()
    };
    roots.sort();
    roots.dedup();
    let nested: Vec<String> = roots
        .iter()
        .filter(|r| roots.iter().any(|o| o != *r && under(o, r).is_some()))
        .cloned()
        .collect();
    roots.retain(|r| !nested.contains(r));
    if roots.is_empty() {
        return Err(CopyError::NoMatch(spec.source.clone()));
    }
    let destination_error = |source| CopyError::Destination {
        path: spec.destination.clone(),
        source,
    };
    let (dest, dest_found) = stack
        .resolve(&spec.destination, true)
        .map_err(destination_error)?;
    let into_dir = spec.destination.ends_with('/')
        || roots.len() > 1
        || roots.iter().any(|r| is_dir(r))
        || matches!(dest_found, Found::Dir(_));
    let dest = dest.trim_start_matches('/').to_owned();
    // Where each selected entry goes (paths relative to the image's root).
    let mut target: HashMap<String, String> = HashMap::new();
    for root in &roots {
        let root_is_dir = is_dir(root);
        for entry in &listed {
            let Some(rest) = under(root, &entry.path) else {
                continue;
            };
            let place = if root_is_dir {
                if rest.is_empty() {
                    continue;
                }
                join(&dest, rest)
            } else if into_dir {
                join(&dest, root.rsplit('/').next().unwrap_or(root))
            } else {
                dest.clone()
            };
            target.insert(entry.path.clone(), place);
        }
    }
    let mut tar = TarWriter::new(out);
    let mut report = CopyReport::default();
    let meta = |entry: &Entry| Meta {
        mode: spec.mode.unwrap_or(entry.mode),
        uid: spec.owner.0,
        gid: spec.owner.1,
        mtime: entry.mtime,
    };
    if into_dir && !dest.is_empty() && dest_found == Found::Missing {
        let mode = spec.mode.unwrap_or(0o755);
        let made = Meta {
            mode,
            uid: spec.owner.0,
            gid: spec.owner.1,
            mtime: listed.first().map_or(0, |e| e.mtime),
        };
        tar.dir(&dest, made, &[]).map_err(CopyError::Write)?;
        report.entries += 1;
    }
    // The second pass streams the files' data in the context's order.
    let file = File::open(context).map_err(CopyError::Read)?;
    let mut archive = tar::Archive::new(file);
    let mut index = 0;
    for raw in archive.entries().map_err(CopyError::Read)? {
        let mut raw = raw.map_err(CopyError::Read)?;
        let path = raw
            .path()
            .map_err(CopyError::Read)?
            .to_string_lossy()
            .into_owned();
        let Some(path) = normalise(&path).filter(|p| !p.is_empty()) else {
            continue;
        };
        // The same entries in the same order as the first pass listed them.
        let Some(entry) = listed.get(index).cloned() else {
            break;
        };
        index += 1;
        if entry.path != path {
            return Err(CopyError::Read(io::Error::other(
                "the uploaded files changed while they were read",
            )));
        }
        let Some(place) = target.get(&entry.path) else {
            continue;
        };
        let write = CopyError::Write;
        match &entry.kind {
            Kind::Dir => tar.dir(place, meta(&entry), &[]).map_err(write)?,
            Kind::File => {
                let size = raw.header().size().map_err(CopyError::Read)?;
                tar.file(place, meta(&entry), size, &mut raw, &[])
                    .map_err(write)?;
            }
            Kind::Symlink(link) => tar.symlink(place, link, meta(&entry)).map_err(write)?,
            Kind::Link(link) => match target.get(link) {
                Some(to) => tar.hard_link(place, to, meta(&entry)).map_err(write)?,
                None => {
                    report.warnings.push(format!(
                        "{}: a hard link to {link}, which is not copied: skipped",
                        entry.path
                    ));
                    continue;
                }
            },
            Kind::Other => {
                report
                    .warnings
                    .push(format!("{}: a device node or FIFO, skipped", entry.path));
                continue;
            }
        }
        report.entries += 1;
    }
    let out = tar.finish().map_err(CopyError::Write)?;
    Ok((out, report))
}
