//! A read-only template of the process tier's root, made once by a long-lived runtime and
//! cloned by each sandbox's init in one `open_tree` instead of staged entry by entry.
//!
//! The template is the tree `view::fill_host_root` builds (a small tmpfs holding a recursive
//! bind of each top-level entry of the rootfs, Airlock's mount points and the masks), made
//! read-only and private, as a detached mount that belongs to no namespace. Init clones it into
//! its own mount namespace. What the clones share with each other is what every view already
//! shares, the host's files, read-only, plus the template's own tmpfs: read-only, and owned by
//! host root, which no sandbox maps.
//!
//! A template shows the host as it was when it was built, so it is used only while fresh: no
//! mount of the runtime's namespace changed since (the mount table's poll event), and no
//! directory that the masks and the root's entries were read from changed (its inode, mtime and
//! ctime). A secret created after the build is therefore masked exactly as without a template.
//! A build whose inputs changed while it ran is thrown away.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use airlock_policy::{Mask, RootPlan};

use crate::mountfs;
use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};
use crate::view::{self, ViewError};

/// Templates kept per runtime: one per distinct rootfs, masks and mount points in use.
const KEPT: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("building the view's template")]
    View(#[from] ViewError),
    #[error("mounting the template's root")]
    MountFs(#[from] mountfs::MountFsError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("the host changed while the template was built")]
    Changed,
}

fn io_error(what: &str) -> impl FnOnce(io::Error) -> TemplateError + '_ {
    move |source| TemplateError::Io {
        what: what.to_owned(),
        source,
    }
}

/// What a template is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateKey {
    pub rootfs: PathBuf,
    pub masks: Vec<Mask>,
    /// The agent's mount point at `AGENT_PATH`.
    pub agent: bool,
    /// The egress directory's mount point at `EGRESS_DIR`.
    pub egress: bool,
}

/// What a build read from the host: the root's entries, and each path the masks expand to with
/// what is there (`None`: nothing init could reach; else whether it is a directory).
#[derive(Debug, PartialEq, Eq)]
struct Inputs {
    entries: Vec<(OsString, u32)>,
    masked: Vec<(PathBuf, Option<bool>)>,
}

impl Inputs {
    fn read(rootfs: &OwnedFd, masks: &[Mask]) -> Result<Inputs, TemplateError> {
        let listed = fs::read_dir(format!("/proc/self/fd/{}", rootfs.as_raw_fd()))
            .map_err(io_error("listing the rootfs"))?;
        let mut entries = Vec::new();
        for entry in listed {
            let entry = entry.map_err(io_error("listing the rootfs"))?;
            let kind = entry.file_type().map_err(io_error("listing the rootfs"))?;
            let code = u32::from(kind.is_dir()) | u32::from(kind.is_symlink()) << 1;
            entries.push((entry.file_name(), code));
        }
        entries.sort();
        let mut listings = HashMap::new();
        let mut masked = Vec::new();
        for mask in masks {
            for path in view::expand(rootfs, &mask.path, &mut listings) {
                if under_provided(&path) {
                    continue;
                }
                let found = match sys::open_in_root(rootfs, &path) {
                    Ok(target) => Some(
                        sys::fstat_is_dir(&target).map_err(io_error("inspecting a masked path"))?,
                    ),
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES)
                        ) =>
                    {
                        None
                    }
                    Err(e) => return Err(io_error("inspecting a masked path")(e)),
                };
                masked.push((path, found));
            }
        }
        Ok(Inputs { entries, masked })
    }

    /// The directories whose change could change these inputs: the root and every parent of a
    /// masked path.
    fn directories(&self) -> BTreeSet<PathBuf> {
        let mut dirs = BTreeSet::from([PathBuf::new()]);
        for (path, _) in &self.masked {
            dirs.extend(path.ancestors().skip(1).map(Path::to_path_buf));
        }
        dirs
    }
}

/// Whether `path` is under a top-level entry Airlock provides (`/tmp`, `/run`, ...): the view
/// shows Airlock's own there, never the rootfs's, so no change of the rootfs there matters (a
/// state directory under the host's `/tmp`, whose every new entry would otherwise make the
/// template stale).
fn under_provided(path: &Path) -> bool {
    path.components()
        .next()
        .and_then(|first| first.as_os_str().to_str())
        .is_some_and(|first| view::PROVIDED.contains(&first))
}

/// A directory as a build saw it.
#[derive(Debug)]
struct Stamp {
    dir: File,
    seen: (u64, i64, i64, i64, i64),
}

impl Stamp {
    fn of(file: &File) -> io::Result<(u64, i64, i64, i64, i64)> {
        let meta = file.metadata()?;
        Ok((
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
        ))
    }
}

/// A built template.
#[derive(Debug)]
pub struct ViewTemplate {
    key: TemplateKey,
    root: OwnedFd,
    stamps: Vec<Stamp>,
    mount_table: OwnedFd,
    stale: AtomicBool,
}

impl ViewTemplate {
    pub fn build(key: TemplateKey) -> Result<ViewTemplate, TemplateError> {
        // Opened first: a mount made from here on marks the template stale.
        let mount_table = File::open("/proc/self/mountinfo")
            .map_err(io_error("opening the mount table"))?
            .into();
        let rootfs = sys::open_path(&key.rootfs).map_err(io_error(&format!(
            "opening rootfs {}",
            key.rootfs.display()
        )))?;
        let before = Inputs::read(&rootfs, &key.masks)?;
        let root = mountfs::stage_tmpfs()?;
        let stage = PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
        let mut points = Vec::new();
        if key.agent {
            points.push((crate::spec::AGENT_PATH, false));
        }
        if key.egress {
            points.push((airlock_policy::EGRESS_DIR, true));
        }
        // Made where init would make them: after the masks (`/run` is one).
        view::fill_host_root(&stage, &rootfs, &key.masks, || {
            points
                .iter()
                .try_for_each(|(point, is_dir)| make_mount_point(&stage, point, *is_dir))
        })?;
        sys::make_private(&root).map_err(io_error("making the template private"))?;
        sys::mount_setattr(
            &root,
            true,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            None,
        )
        .map_err(io_error("making the template read-only"))?;
        let mut stamps = Vec::new();
        for dir in before.directories() {
            // A missing directory needs no stamp: creating it changes its parent's.
            let Ok(opened) = sys::open_in_root(&rootfs, &dir) else {
                continue;
            };
            let dir = File::from(opened);
            let seen = Stamp::of(&dir).map_err(io_error("reading a directory's times"))?;
            stamps.push(Stamp { dir, seen });
        }
        // Read again after the stamps: a change before them shows here, one after them in them.
        let after = Inputs::read(&rootfs, &key.masks)?;
        if before != after
            || sys::poll_priority(&mount_table).map_err(io_error("polling the mount table"))?
        {
            return Err(TemplateError::Changed);
        }
        Ok(ViewTemplate {
            key,
            root,
            stamps,
            mount_table,
            stale: AtomicBool::new(false),
        })
    }

    /// The detached root init clones.
    pub fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// Whether the host still looks as the build saw it (once stale, always stale).
    pub fn is_fresh(&self) -> bool {
        if self.stale.load(Ordering::Relaxed) {
            return false;
        }
        let fresh = matches!(sys::poll_priority(&self.mount_table), Ok(false))
            && self
                .stamps
                .iter()
                .all(|stamp| Stamp::of(&stamp.dir).is_ok_and(|seen| seen == stamp.seen));
        if !fresh {
            self.stale.store(true, Ordering::Relaxed);
        }
        fresh
    }
}

/// An empty directory or file at `point`, with its parents.
fn make_mount_point(stage: &Path, point: &str, is_dir: bool) -> Result<(), ViewError> {
    let target = stage.join(point.trim_start_matches('/'));
    let dir = if is_dir {
        Some(target.as_path())
    } else {
        target.parent()
    };
    if let Some(dir) = dir {
        view::mkdir_all(dir)?;
    }
    if is_dir {
        return Ok(());
    }
    view::step(|| format!("creating {point}"), fs::write(&target, b""))
}

/// A runtime's templates, built on first use and rebuilt when stale.
#[derive(Debug, Default)]
pub struct ViewTemplates {
    kept: Mutex<Vec<Arc<ViewTemplate>>>,
    builds: AtomicU64,
    /// Set when a build failed for a reason other than a change of the host (say, no
    /// privilege to mount): views are then staged as without templates.
    unavailable: AtomicBool,
}

impl ViewTemplates {
    /// A fresh template for `key`, built now if there is none; `None` when none can be built
    /// (the view is then staged in the sandbox, as without templates).
    pub fn get(&self, key: &TemplateKey) -> Option<Arc<ViewTemplate>> {
        if self.unavailable.load(Ordering::Relaxed) {
            return None;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = kept.iter().position(|template| template.key == *key) {
            if kept[index].is_fresh() {
                return Some(Arc::clone(&kept[index]));
            }
            kept.remove(index);
        }
        match ViewTemplate::build(key.clone()) {
            Ok(template) => {
                self.builds.fetch_add(1, Ordering::Relaxed);
                let template = Arc::new(template);
                if kept.len() >= KEPT {
                    kept.remove(0);
                }
                kept.push(Arc::clone(&template));
                Some(template)
            }
            Err(TemplateError::Changed) => None,
            Err(_) => {
                self.unavailable.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// The template for a sandbox of `plan`, when its view can be one: the process tier's root
    /// (a host directory), without the microvm tier's files, which need mount points of their
    /// own.
    pub fn for_plan(
        &self,
        plan: &airlock_policy::Plan,
        agent: Option<&crate::spec::AgentSpec>,
    ) -> Option<Arc<ViewTemplate>> {
        let RootPlan::Host { path } = &plan.view.root else {
            return None;
        };
        if agent.is_some_and(|agent| agent.vmm.is_some()) {
            return None;
        }
        self.get(&TemplateKey {
            rootfs: path.clone(),
            masks: plan.view.masks.clone(),
            agent: agent.is_some(),
            egress: plan.egress.is_some(),
        })
    }

    /// How many templates were built so far.
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }
}

/// Init's side: a clone of the template, attached at the staging path.
pub(crate) fn attach(stage: &Path, template: &OwnedFd) -> Result<(), ViewError> {
    let tree = view::step(
        || "cloning the view's template".into(),
        sys::clone_tree(template),
    )?;
    view::step(
        || "attaching the view's template".into(),
        sys::move_mount(&tree, stage),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_policy::MaskKind;

    #[test]
    fn test_inputs_skip_paths_under_airlocks_own_entries_and_stamp_the_parents_of_the_rest() {
        let root =
            std::env::temp_dir().join(format!("airlock-template-inputs-{}", std::process::id()));
        fs::create_dir_all(root.join("tmp/state")).unwrap();
        fs::create_dir_all(root.join("home/a/.ssh")).unwrap();
        fs::create_dir_all(root.join("home/b")).unwrap();
        let masks: Vec<Mask> = ["/tmp/state", "/home/*/.ssh", "/etc/shadow"]
            .into_iter()
            .map(|path| Mask {
                path: path.to_owned(),
                kind: MaskKind::Secret,
            })
            .collect();
        let rootfs = sys::open_path(&root).unwrap();
        let inputs = Inputs::read(&rootfs, &masks).unwrap();
        let mut masked = inputs.masked.clone();
        masked.sort();
        assert_eq!(
            masked,
            vec![
                (PathBuf::from("etc/shadow"), None),
                (PathBuf::from("home/a/.ssh"), Some(true)),
                (PathBuf::from("home/b/.ssh"), None),
            ],
            "the state directory under /tmp is Airlock's /tmp in the view, not the rootfs's"
        );
        let dirs: Vec<PathBuf> = inputs.directories().into_iter().collect();
        assert_eq!(
            dirs,
            ["", "etc", "home", "home/a", "home/b"]
                .map(PathBuf::from)
                .to_vec(),
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
