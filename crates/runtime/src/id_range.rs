//! A range of 65536 host ids per live sandbox (root callers only): uid 0 of a sandbox is
//! `SANDBOX_ID_BASE + slot * 65536` on the host, and no two live sandboxes share a slot, so
//! their workloads never share a host uid (or gid).
//!
//! A slot is taken by an exclusive `flock` on its file in `/run/airlock/id-ranges`. The lock
//! belongs to an open file, not to a process: the runtime takes it, and the sandbox's helper
//! inherits it (`SpawnOptions::hold`) and keeps it until the sandbox has ended. So the slot
//! stays taken for exactly as long as the sandbox lives, whether the `airlock run` or the
//! daemon that started it is still there, restarted or killed with -9; concurrent processes
//! never take the same slot; and nothing stale is ever left to clean up (`/run` is a tmpfs,
//! and a dead holder's lock goes with it).

use std::fs::{File, TryLockError};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_policy::{SANDBOX_ID_BASE, SANDBOX_ID_COUNT};

/// Where the slots' lock files are.
pub const ID_RANGE_DIR: &str = "/run/airlock/id-ranges";
/// How many sandboxes can hold a range at once: ids up to `0xB000_0000`, far below the
/// kernel's invalid `-1`.
pub const SLOTS: u32 = 16_384;

/// Why no id range could be taken.
#[derive(Debug, thiserror::Error)]
pub enum IdRangeError {
    #[error("creating the id range directory {path}")]
    Directory {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("locking the id range file {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("all {SLOTS} host id ranges are taken by live sandboxes")]
    Exhausted,
}

/// One sandbox's range of host ids, held while this value (or the helper's copy of its
/// lock) lives.
#[derive(Debug, Clone)]
pub struct IdRange {
    slot: u32,
    lock: Arc<OwnedFd>,
}

impl IdRange {
    /// The host id of the sandbox's uid 0 (and gid 0).
    pub fn base(&self) -> u32 {
        base_of(self.slot)
    }

    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The lock, for the helper to hold (`SpawnOptions::hold`).
    pub fn lock(&self) -> Arc<OwnedFd> {
        self.lock.clone()
    }

    /// Takes a free range in [`ID_RANGE_DIR`].
    pub fn allocate() -> Result<IdRange, IdRangeError> {
        IdRange::allocate_in(Path::new(ID_RANGE_DIR))
    }

    /// Takes a free range whose lock files live in `dir`. The search starts at a slot picked
    /// from the clock and the pid, so that concurrent callers rarely try the same slots.
    pub fn allocate_in(dir: &Path) -> Result<IdRange, IdRangeError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| IdRangeError::Directory {
                path: dir.to_path_buf(),
                source,
            })?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = (nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % SLOTS;
        for offset in 0..SLOTS {
            let slot = (start + offset) % SLOTS;
            if let Some(lock) = try_slot(dir, slot)? {
                return Ok(IdRange {
                    slot,
                    lock: Arc::new(lock),
                });
            }
        }
        Err(IdRangeError::Exhausted)
    }

    /// Whether the range that starts at `base` is held by someone (a live sandbox), looking
    /// in `dir`. For a daemon that re-adopts a sandbox: its record names its range, and the
    /// range's lock shows that it is still taken.
    pub fn is_held_in(dir: &Path, base: u32) -> bool {
        let Some(slot) = slot_of(base) else {
            return false;
        };
        matches!(try_slot(dir, slot), Ok(None))
    }
}

/// The first host id of `slot`.
pub fn base_of(slot: u32) -> u32 {
    SANDBOX_ID_BASE + slot * SANDBOX_ID_COUNT
}

fn slot_of(base: u32) -> Option<u32> {
    let offset = base.checked_sub(SANDBOX_ID_BASE)?;
    (offset % SANDBOX_ID_COUNT == 0 && offset / SANDBOX_ID_COUNT < SLOTS)
        .then_some(offset / SANDBOX_ID_COUNT)
}

/// The slot's lock if it was free, `None` if someone holds it.
fn try_slot(dir: &Path, slot: u32) -> Result<Option<OwnedFd>, IdRangeError> {
    let path = dir.join(slot.to_string());
    let lock_error = |source| IdRangeError::Lock {
        path: path.clone(),
        source,
    };
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(lock_error)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(OwnedFd::from(file))),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(source)) => Err(lock_error(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "airlock-id-range-test-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn test_id_ranges_held_at_once_never_overlap() {
        let dir = dir("overlap");
        let ranges: Vec<IdRange> = (0..64)
            .map(|_| IdRange::allocate_in(&dir).unwrap())
            .collect();
        let mut bases: Vec<u32> = ranges.iter().map(IdRange::base).collect();
        bases.sort_unstable();
        bases.dedup();
        assert_eq!(bases.len(), 64, "each live range is its own");
        for base in &bases {
            assert!(*base >= SANDBOX_ID_BASE);
            assert_eq!((base - SANDBOX_ID_BASE) % SANDBOX_ID_COUNT, 0);
            assert!(IdRange::is_held_in(&dir, *base));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_id_range_is_free_again_once_every_holder_is_gone() {
        let dir = dir("release");
        let range = IdRange::allocate_in(&dir).unwrap();
        let base = range.base();
        let held_elsewhere = range.lock();
        drop(range);
        assert!(
            IdRange::is_held_in(&dir, base),
            "a copy of the lock (the helper's) keeps the range taken"
        );
        drop(held_elsewhere);
        assert!(!IdRange::is_held_in(&dir, base));
        assert!(
            !IdRange::is_held_in(&dir, SANDBOX_ID_BASE + 7),
            "not a range's base"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_id_range_slots_map_to_disjoint_bases() {
        assert_eq!(base_of(0), SANDBOX_ID_BASE);
        assert_eq!(base_of(1) - base_of(0), SANDBOX_ID_COUNT);
        assert_eq!(slot_of(base_of(SLOTS - 1)), Some(SLOTS - 1));
        assert_eq!(slot_of(base_of(SLOTS - 1) + SANDBOX_ID_COUNT), None);
        assert!(u64::from(base_of(SLOTS - 1)) + u64::from(SANDBOX_ID_COUNT) < u64::from(u32::MAX));
    }
}
