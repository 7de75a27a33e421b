//! A view of binds only ([`RootPlan::Binds`](airlock_policy::RootPlan::Binds)): the root is
//! an empty tmpfs, and the only host paths in it are the binds the plan lists, each at its
//! guest path, read-only with the rest of the view. What a workload that needs a few known
//! files (the wasm tier's worker: its binary, the guest modules, the preopens) should see.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use airlock_api::ViewBind;
use airlock_policy::Mask;

use crate::sys;
use crate::view::{ViewError, step};

/// Mounts the empty root at `stage` and attaches `binds` in it, then the masks (a bind of a
/// home directory still hides its credentials).
pub fn stage_bind_root(stage: &Path, binds: &[ViewBind], masks: &[Mask]) -> Result<(), ViewError> {
    // Every source is opened first: the staging path is itself a host path (`/tmp`), and
    // whatever lies under it is hidden once the root's tmpfs is mounted there.
    let mut trees = Vec::with_capacity(binds.len());
    for bind in binds {
        let shown = || format!("binding {}", bind.host.display());
        let tree = step(shown, sys::open_tree_clone(None, &bind.host, true))?;
        let is_dir = step(shown, sys::fstat_is_dir(&tree))?;
        trees.push((bind, tree, is_dir));
    }
    crate::view::mount_stage(stage)?;
    for dir in crate::view::PROVIDED {
        crate::view::mkdir(&stage.join(dir), 0o755)?;
    }
    for (bind, tree, is_dir) in &trees {
        attach(stage, bind, tree, *is_dir)?;
    }
    // Airlock's own directories hold nothing of the host: a mask there (the host's `/run`)
    // has nothing to hide, and would cover the agent's mount point.
    let own = |mask: &&Mask| {
        let top = mask.path.trim_start_matches('/').split('/').next();
        top.is_some_and(|top| crate::view::PROVIDED.contains(&top))
    };
    let masks: Vec<Mask> = masks.iter().filter(|m| !own(m)).cloned().collect();
    crate::view::apply_masks(stage, &masks)
}

/// Makes the mount point (its parents are directories of the tmpfs: the compiler refuses a
/// bind inside another) and moves the bind onto it.
fn attach(stage: &Path, bind: &ViewBind, tree: &OwnedFd, is_dir: bool) -> Result<(), ViewError> {
    let relative = bind.guest.strip_prefix("/").unwrap_or(&bind.guest);
    let target = stage.join(relative);
    let shown = || format!("making the mount point {}", bind.guest.display());
    if let Some(parent) = target.parent() {
        step(
            shown,
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent),
        )?;
    }
    if is_dir {
        crate::view::mkdir(&target, 0o755)?;
    } else {
        step(shown, fs::write(&target, b""))?;
    }
    step(
        || {
            format!(
                "attaching {} at {}",
                bind.host.display(),
                bind.guest.display()
            )
        },
        sys::move_mount(tree, &target),
    )
}
