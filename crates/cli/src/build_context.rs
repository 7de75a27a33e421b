//! The build context of `airlock template build`: the directory's files less what
//! `.dockerignore` excludes (Docker's rules: `#` comments, `!` re-includes, the last matching
//! pattern wins, `**` spans directories), and for each `COPY` the tar of the files it takes,
//! named relative to the context's root, with the hash the daemon caches it under. The hash
//! is E2B's: the step (`COPY src dest`), then each file's path, mode, size and content (a
//! symlink's target), so it does not change with owners or times.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use airlock_image::glob;
use airlock_image::tarball::{Meta, TarWriter};
use sha2::{Digest, Sha256};

/// One file of the context.
#[derive(Debug, Clone)]
pub struct ContextEntry {
    /// Relative to the context's root, `/`-separated.
    pub path: String,
    pub meta: std::fs::Metadata,
}

/// The context's files, walked once.
#[derive(Debug)]
pub struct Context {
    pub root: PathBuf,
    pub entries: Vec<ContextEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("COPY {0}: no file of the build context matches (or .dockerignore excludes them all)")]
    NoMatch(String),
    #[error("{0}: not a UTF-8 file name")]
    Name(PathBuf),
    #[error("cannot write the files' tar")]
    Write(#[source] io::Error),
}

/// `.dockerignore`'s patterns, in order: (pattern, excludes).
fn ignore_patterns(root: &Path) -> Vec<(String, bool)> {
    let Ok(text) = std::fs::read_to_string(root.join(".dockerignore")) else {
        return Vec::new();
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.strip_prefix('!') {
            Some(rest) => (rest.trim().trim_start_matches('/').to_owned(), false),
            None => (l.trim_start_matches('/').to_owned(), true),
        })
        .collect()
}

fn ignored(patterns: &[(String, bool)], path: &str) -> bool {
    let mut excluded = false;
    for (pattern, excludes) in patterns {
        if glob::matches_or_parent(pattern, path) {
            excluded = *excludes;
        }
    }
    excluded
}

impl Context {
    /// Walks `root` (symlinks are entries, never followed).
    pub fn walk(root: &Path) -> Result<Context, ContextError> {
        let patterns = ignore_patterns(root);
        let mut entries = Vec::new();
        let mut pending = vec![String::new()];
        while let Some(dir) = pending.pop() {
            let host = if dir.is_empty() {
                root.to_path_buf()
            } else {
                root.join(&dir)
            };
            let mut names = Vec::new();
            for entry in
                std::fs::read_dir(&host).map_err(|e| ContextError::Read(host.clone(), e))?
            {
                let entry = entry.map_err(|e| ContextError::Read(host.clone(), e))?;
                let name = entry
                    .file_name()
                    .into_string()
                    .map_err(|_| ContextError::Name(entry.path()))?;
                names.push(name);
            }
            names.sort();
            for name in names {
                let path = if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                };
                if ignored(&patterns, &path) && !patterns.iter().any(|(_, excludes)| !excludes) {
                    continue;
                }
                let full = root.join(&path);
                let meta =
                    std::fs::symlink_metadata(&full).map_err(|e| ContextError::Read(full, e))?;
                if meta.is_dir() {
                    pending.push(path.clone());
                }
                if !ignored(&patterns, &path) {
                    entries.push(ContextEntry { path, meta });
                }
            }
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Context {
            root: root.to_path_buf(),
            entries,
        })
    }

    /// The entries a `COPY` source takes: those it matches and everything below them.
    fn selected(&self, source: &str) -> Vec<&ContextEntry> {
        let whole = source.trim_matches('/').is_empty() || source == ".";
        self.entries
            .iter()
            .filter(|e| whole || glob::matches_or_parent(source, &e.path))
            .collect()
    }

    /// Writes the tar of `source`'s files to `out`; returns their hash (E2B's scheme, for
    /// `COPY source destination`).
    pub fn copy_files(
        &self,
        source: &str,
        destination: &str,
        out: &Path,
    ) -> Result<String, ContextError> {
        let selected = self.selected(source);
        if selected.is_empty() {
            return Err(ContextError::NoMatch(source.to_owned()));
        }
        let mut hasher = Sha256::new();
        hasher.update(format!("COPY {source} {destination}").as_bytes());
        let file = std::fs::File::create(out).map_err(ContextError::Write)?;
        let mut tar = TarWriter::new(io::BufWriter::new(file));
        for entry in selected {
            let full = self.root.join(&entry.path);
            let meta = &entry.meta;
            let tar_meta = Meta {
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
                gid: meta.gid(),
                mtime: u64::try_from(meta.mtime()).unwrap_or(0),
            };
            hasher.update(entry.path.as_bytes());
            hasher.update(meta.mode().to_string().as_bytes());
            let read = |e| ContextError::Read(full.clone(), e);
            if meta.is_dir() {
                tar.dir(&entry.path, tar_meta, &[])
                    .map_err(ContextError::Write)?;
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&full).map_err(read)?;
                let target = target.to_string_lossy();
                hasher.update(meta.len().to_string().as_bytes());
                hasher.update(target.as_bytes());
                tar.symlink(&entry.path, &target, tar_meta)
                    .map_err(ContextError::Write)?;
            } else if meta.is_file() {
                hasher.update(meta.len().to_string().as_bytes());
                let mut content = std::fs::File::open(&full).map_err(read)?;
                let mut buffer = vec![0u8; 256 << 10];
                loop {
                    let n = io::Read::read(&mut content, &mut buffer).map_err(read)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buffer[..n]);
                }
                let content = std::fs::File::open(&full).map_err(read)?;
                tar.file(&entry.path, tar_meta, meta.len(), content, &[])
                    .map_err(ContextError::Write)?;
            }
        }
        tar.finish()
            .and_then(|mut w| io::Write::flush(&mut w))
            .map_err(ContextError::Write)?;
        Ok(crate::build_context::hex(&hasher.finalize()))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_dockerignore_excludes_with_negation_and_the_hash_ignores_times() {
        let dir = std::env::temp_dir().join(format!("airlock-context-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["app/node_modules/x", "app/src", "secrets"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for (path, text) in [
            ("app/src/main.py", "print(1)\n"),
            ("app/node_modules/x/big.js", "x"),
            ("app/keep.log", "keep"),
            ("app/drop.log", "drop"),
            ("secrets/key", "k"),
            (
                ".dockerignore",
                "# comment\nsecrets\n**/node_modules\n*.log\napp/*.log\n!app/keep.log\n",
            ),
        ] {
            std::fs::write(dir.join(path), text).unwrap();
        }
        let context = Context::walk(&dir).unwrap();
        let paths: Vec<&str> = context.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".dockerignore",
                "app",
                "app/keep.log",
                "app/src",
                "app/src/main.py"
            ]
        );
        let out = dir.join("out.tar");
        let first = context.copy_files("app", "/srv/", &out).unwrap();
        let count = airlock_image::tarball::check_tar(&out).unwrap();
        assert_eq!(count, 4, "app, keep.log, src, main.py");
        // Touching a file changes nothing the hash sees; changing its content does.
        std::fs::write(dir.join("app/src/main.py"), "print(1)\n").unwrap();
        let context = Context::walk(&dir).unwrap();
        assert_eq!(context.copy_files("app", "/srv/", &out).unwrap(), first);
        assert_ne!(context.copy_files("app", "/other/", &out).unwrap(), first);
        std::fs::write(dir.join("app/src/main.py"), "print(2)\n").unwrap();
        let context = Context::walk(&dir).unwrap();
        assert_ne!(context.copy_files("app", "/srv/", &out).unwrap(), first);
        assert!(matches!(
            context.copy_files("secrets", "/x", &out),
            Err(ContextError::NoMatch(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
