//! An image's files read without mounting it: a path is looked up through its unpacked layer
//! directories, topmost first, as overlayfs merges them (whiteouts hide, opaque directories
//! hide what lies below them, a directory hides a lower non-directory), and symlinks are
//! followed inside the image, never on the host. A template build resolves `COPY`
//! destinations (`/bin` may be a link to `usr/bin`), `WORKDIR`s and user names with it.
//!
//! Every host path this builds joins single components below a directory that `lstat`
//! showed to be a real directory of that layer, and layers are never written once unpacked,
//! so no host symlink is ever followed.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

/// The most symlinks one lookup follows (Linux's own limit).
const MAX_HOPS: usize = 40;

/// What a path is in the merged image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Missing,
    /// A directory (the topmost layer's copy).
    Dir(PathBuf),
    /// A regular file, at this host path.
    File(PathBuf),
    Symlink(String),
    /// A device node, FIFO or socket.
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("`{0}`: more than {MAX_HOPS} symbolic links")]
    Loop(String),
    #[error("`{path}` is not a directory in the image")]
    NotDirectory { path: String },
}

/// An image's layer directories, topmost first.
#[derive(Debug, Clone)]
pub struct LayerStack {
    layers: Vec<PathBuf>,
}

fn is_whiteout(meta: &std::fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

fn is_opaque(path: &std::path::Path) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(path)
        .ok()
        .and_then(|dir| {
            airlock_jail::beneath::get_xattr(
                std::os::fd::AsFd::as_fd(&dir),
                "trusted.overlay.opaque",
            )
            .ok()
            .flatten()
        })
        .is_some_and(|value| value.first() == Some(&b'y'))
}

/// `/a/./b/` as `["a", "b"]`; `..` is kept for the resolver.
fn components(path: &str) -> impl DoubleEndedIterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".")
}

impl LayerStack {
    /// `layers` lowest first, as [`airlock_api::ImageRootfs::layers`] lists them.
    pub fn new(layers: &[PathBuf]) -> LayerStack {
        LayerStack {
            layers: layers.iter().rev().cloned().collect(),
        }
    }

    /// `components`, whose parents are all directories in the merged image, looked up
    /// without following a symlink at the end.
    fn lookup(&self, components: &[&str]) -> Found {
        let Some((last, parents)) = components.split_last() else {
            return self
                .layers
                .first()
                .map_or(Found::Missing, |top| Found::Dir(top.clone()));
        };
        'layers: for layer in &self.layers {
            let mut dir = layer.clone();
            let mut opaque = false;
            for parent in parents {
                dir.push(parent);
                match std::fs::symlink_metadata(&dir) {
                    Ok(meta) if meta.is_dir() => opaque |= is_opaque(&dir),
                    // A whiteout or a non-directory here hides the path in every lower layer.
                    Ok(_) => return Found::Missing,
                    Err(_) if opaque => return Found::Missing,
                    Err(_) => continue 'layers,
                }
            }
            dir.push(last);
            match std::fs::symlink_metadata(&dir) {
                Ok(meta) if is_whiteout(&meta) => return Found::Missing,
                Ok(meta) if meta.is_dir() => return Found::Dir(dir),
                Ok(meta) if meta.is_file() => return Found::File(dir),
                Ok(meta) if meta.file_type().is_symlink() => {
                    return std::fs::read_link(&dir)
                        .map_or(Found::Other, |t| Found::Symlink(t.to_string_lossy().into()));
                }
                Ok(_) => return Found::Other,
                Err(_) if opaque => return Found::Missing,
                Err(_) => {}
            }
        }
        Found::Missing
    }

    /// Resolves `path` (absolute, or relative to `/`) inside the image, following symlinks
    /// in every component (and the last one's too with `follow_last`). Returns the resolved
    /// absolute path and what is there; a missing component leaves the rest unresolved.
    pub fn resolve(&self, path: &str, follow_last: bool) -> Result<(String, Found), StackError> {
        let mut pending: Vec<String> = components(path).rev().map(str::to_owned).collect();
        let mut done: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(component) = pending.pop() {
            if component == ".." {
                done.pop();
                continue;
            }
            let mut candidate: Vec<&str> = done.iter().map(String::as_str).collect();
            candidate.push(&component);
            let found = self.lookup(&candidate);
            let last = pending.is_empty();
            match found {
                Found::Symlink(target) if !last || follow_last => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(StackError::Loop(path.to_owned()));
                    }
                    if target.starts_with('/') {
                        done.clear();
                    }
                    pending.extend(components(&target).rev().map(str::to_owned));
                }
                Found::Dir(_) => done.push(component),
                Found::Missing => {
                    done.push(component);
                    done.extend(pending.drain(..).rev());
                    return Ok((format!("/{}", done.join("/")), Found::Missing));
                }
                other if last => {
                    done.push(component);
                    return Ok((format!("/{}", done.join("/")), other));
                }
                _ => {
                    return Err(StackError::NotDirectory {
                        path: format!("/{}", candidate.join("/")),
                    });
                }
            }
        }
        let found = self.lookup(&done.iter().map(String::as_str).collect::<Vec<_>>());
        Ok((format!("/{}", done.join("/")), found))
    }

    /// The content of the regular file at `path` (symlinks followed inside the image), at
    /// most `max_bytes`; `None` when there is none.
    pub fn read_file(&self, path: &str, max_bytes: u64) -> Option<Vec<u8>> {
        let (_, Found::File(host)) = self.resolve(path, true).ok()? else {
            return None;
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(host)
            .ok()?;
        let mut bytes = Vec::new();
        file.take(max_bytes).read_to_end(&mut bytes).ok()?;
        Some(bytes)
    }

    /// Resolves a user spec (`name[:group]` or `uid[:gid]`) against the image's
    /// `/etc/passwd` and `/etc/group`.
    pub fn user(
        &self,
        spec: &str,
    ) -> Result<airlock_policy::image_user::ResolvedUser, airlock_policy::image_user::UserLookupError>
    {
        let max = airlock_policy::image_user::MAX_FILE_BYTES;
        let text = |path| {
            self.read_file(path, max)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        airlock_policy::image_user::resolve(
            Some(spec),
            (0, 0),
            text("/etc/passwd").as_deref(),
            text("/etc/group").as_deref(),
        )
    }
}
