//! Read access to an import's source: the files of a layout directory, or the members of a tar
//! archive (found by one scan, then read in place by offset; symlinked members followed).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Files of a layout directory or members of a tar archive, by normalised name.
pub(super) enum Source {
    Dir(PathBuf),
    Tar {
        file: PathBuf,
        members: HashMap<String, Member>,
    },
}

#[derive(Debug, Clone)]
pub(super) enum Member {
    File { offset: u64, size: u64 },
    Link(String),
}

pub(super) fn normalise(name: &str) -> String {
    name.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

impl Source {
    pub(super) fn scan_tar(file: &Path) -> io::Result<Source> {
        let mut archive = tar::Archive::new(BufReader::new(File::open(file)?));
        let mut members = HashMap::new();
        for entry in archive.entries()? {
            let entry = entry?;
            let name = normalise(&String::from_utf8_lossy(&entry.path_bytes()));
            let kind = entry.header().entry_type();
            if kind.is_file() {
                members.insert(
                    name,
                    Member::File {
                        offset: entry.raw_file_position(),
                        size: entry.size(),
                    },
                );
            } else if kind.is_symlink() || kind.is_hard_link() {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                let target = if kind.is_symlink() {
                    let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                    resolve_relative(dir, &target)
                } else {
                    normalise(&target)
                };
                members.insert(name, Member::Link(target));
            }
        }
        Ok(Source::Tar {
            file: file.to_path_buf(),
            members,
        })
    }

    pub(super) fn exists(&self, name: &str) -> bool {
        match self {
            Source::Dir(dir) => dir.join(name).is_file(),
            Source::Tar { members, .. } => members.contains_key(name),
        }
    }

    /// A member's bytes and size.
    pub(super) fn open(&self, name: &str) -> io::Result<(Box<dyn Read + Send>, u64)> {
        match self {
            Source::Dir(dir) => {
                let file = File::open(dir.join(name))?;
                let size = file.metadata()?.len();
                Ok((Box::new(file), size))
            }
            Source::Tar { file, members } => {
                let mut name = name.to_owned();
                for _ in 0..8 {
                    match members.get(&name) {
                        Some(Member::File { offset, size }) => {
                            let mut file = File::open(file)?;
                            file.seek(SeekFrom::Start(*offset))?;
                            return Ok((Box::new(file.take(*size)), *size));
                        }
                        Some(Member::Link(target)) => name.clone_from(target),
                        None => break,
                    }
                }
                Err(io::Error::new(io::ErrorKind::NotFound, "no such member"))
            }
        }
    }
}

fn resolve_relative(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        dir.split('/').filter(|c| !c.is_empty()).collect()
    };
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}
