//! Which controller and cgroup version a sandbox's cgroup directory belongs to, remembered per
//! parent directory. Every sandbox cgroup under one parent is in the same hierarchy, so the
//! files that tell them apart are looked at once per parent instead of at every claim and
//! destroy (about twenty path walks through a cgroup filesystem per sandbox).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::cgroup::Controller;

/// What a hierarchy's cgroup directories show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind {
    pub controller: Controller,
    /// A cgroup v2 directory (`cgroup.controllers`).
    pub v2: bool,
    /// It has the memory controller's files (`memory.stat`).
    pub memory: bool,
}

/// Parents seen so far; a handful in practice (one per mounted hierarchy and owner).
static KINDS: Mutex<Vec<(PathBuf, Kind)>> = Mutex::new(Vec::new());
const KEPT: usize = 32;

/// The kind of `dir`, a cgroup directory that is not a hierarchy's root.
pub(crate) fn of(dir: &Path) -> Kind {
    let Some(parent) = dir.parent() else {
        return probe(dir);
    };
    let mut kinds = KINDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, kind)) = kinds.iter().find(|(seen, _)| seen == parent) {
        return *kind;
    }
    let kind = probe(dir);
    if kinds.len() >= KEPT {
        kinds.remove(0);
    }
    kinds.push((parent.to_path_buf(), kind));
    kind
}

fn probe(dir: &Path) -> Kind {
    let controller = if dir.join("freezer.state").exists() {
        Controller::Freezer
    } else if dir.join("pids.max").exists() {
        Controller::Pids
    } else if dir.join("cpu.max").exists() || dir.join("cpu.cfs_quota_us").exists() {
        Controller::Cpu
    } else {
        Controller::Memory
    };
    Kind {
        controller,
        v2: dir.join("cgroup.controllers").exists(),
        memory: dir.join("memory.stat").exists(),
    }
}
