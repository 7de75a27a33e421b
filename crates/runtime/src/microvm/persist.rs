//! A microvm sandbox's VM on disk: pause to disk, resume, snapshots and forks, all as files
//! of a directory laid out as a sandbox's is:
//!
//! - `overlay.img`: the overlay disk ([`super::disks`]);
//! - `save-memory` and `save-state`: made empty (the VMM's user's, 0600) before each start
//!   and shown read-write in the VMM's view, where the jailed VMM opens them before its
//!   allow-list; SIGUSR1 makes it pause the guest, write its snapshot into them and exit;
//! - `paused/memory` and `paused/state.json`: the VM paused to disk, those two files named
//!   once the VMM has exited ([`finish_pause`]). A start of a sandbox whose directory has one
//!   restores it (memory mapped copy-on-write, the same overlay disk) instead of a boot, and
//!   the agent gets fresh entropy and the sandbox's environment ([`super::ready::resume`]).
//!
//! A snapshot is such a directory of its own, copied from a paused sandbox's ([`copy_vm`]),
//! and a fork a new sandbox's directory copied from it: the memory file hard-linked (forks
//! map it `MAP_PRIVATE` and none writes it: a later pause writes new files and renames them
//! over), the overlay disk copied with its holes. Deleting a directory deletes everything of
//! it; a memory file lives until its last link goes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_jail::spec::{VMM_FILES_DIR, VmmSpec};
use airlock_vmm::snapshot::{MEMORY_FILE, STATE_FILE};

use super::disks::OVERLAY_FILE;

/// The VM paused to disk, in a sandbox's (or snapshot's) directory.
pub const PAUSED_DIR: &str = "paused";
/// The files a jailed VMM writes its snapshot into (also their names in its view).
pub const SAVE_MEMORY: &str = "save-memory";
pub const SAVE_STATE: &str = "save-state";
/// The VMM's `argv[0]` (the jail execs it from the agent's path, so its `comm` is not this).
const VMM_ARGV0: &[u8] = b"airlock-vmm";
const POLL: Duration = Duration::from_millis(50);

/// Why a VM could not be paused to disk or copied.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{what} `{path}`")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox's VMM is not running")]
    NoVmm,
    #[error("the sandbox's VMM was started without snapshot files (started by an older Airlock?)")]
    NotPrepared,
    #[error("signalling the VMM to snapshot failed")]
    Signal(#[source] std::io::Error),
    #[error("the VMM did not end within {0:?} of the snapshot request")]
    Timeout(Duration),
    #[error("the VMM ended without writing a whole snapshot (its log: {log})")]
    Incomplete { log: String },
    #[error("`{0}` holds no VM paused to disk")]
    NotPaused(PathBuf),
    #[error("copying the overlay disk to `{path}`")]
    CopyDisk {
        path: PathBuf,
        #[source]
        source: airlock_vmm::snapshot::SnapshotError,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PersistError {
    let path = path.to_owned();
    move |source| PersistError::Io { what, path, source }
}

/// `dir/paused`.
pub fn paused_dir(dir: &Path) -> PathBuf {
    dir.join(PAUSED_DIR)
}

/// Whether `dir` holds a VM paused to disk (its state is named last, so it is whole).
pub fn is_paused(dir: &Path) -> bool {
    paused_dir(dir).join(STATE_FILE).is_file()
}

/// The snapshot files of a VMM about to start in sandbox directory `dir`: made empty and
/// given to `owner` (host uid and gid), mode 0600, then added to the VMM's view (read-write)
/// and arguments; returns their paths in the view, which Landlock must let it write.
pub fn prepare_save(
    dir: &Path,
    owner: (u32, u32),
    spec: &mut VmmSpec,
) -> Result<Vec<PathBuf>, PersistError> {
    let mut in_view = Vec::new();
    for (name, flag) in [(SAVE_MEMORY, "--save-memory"), (SAVE_STATE, "--save-state")] {
        let path = dir.join(name);
        std::fs::write(&path, b"").map_err(io("creating the snapshot file", &path))?;
        std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1))
            .map_err(io("handing the snapshot file to the VMM's user", &path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(io("restricting the snapshot file", &path))?;
        spec.disks.push((name.to_owned(), path));
        let shown = Path::new(VMM_FILES_DIR).join(name);
        spec.args
            .extend([flag.to_owned(), shown.display().to_string()]);
        in_view.push(shown);
    }
    Ok(in_view)
}

/// The VMM among `pids` (the sandbox's processes), as a pidfd: it checked the name after
/// opening, so a reused pid is never signalled.
fn find_vmm(pids: &[u32]) -> Option<std::os::fd::OwnedFd> {
    let is_vmm = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|argv| argv.split(|b| *b == 0).next() == Some(VMM_ARGV0))
    };
    pids.iter()
        .copied()
        .filter(|pid| is_vmm(*pid))
        .find_map(|pid| {
            let pidfd = airlock_jail::procctl::pidfd_open(libc_pid(pid)?).ok()?;
            is_vmm(pid).then_some(pidfd)
        })
}

fn libc_pid(pid: u32) -> Option<i32> {
    i32::try_from(pid).ok()
}

/// Pauses a running VM to disk: SIGUSR1 to the VMM among `pids`, which writes its snapshot
/// and exits; then [`finish_pause`]. `limit` guards against a hang (emulation is slow);
/// `log` reads the VMM's log for the error.
pub fn pause_to_disk(
    dir: &Path,
    pids: &[u32],
    limit: Duration,
    log: impl Fn() -> String,
) -> Result<(), PersistError> {
    if !dir.join(SAVE_STATE).is_file() || !dir.join(SAVE_MEMORY).is_file() {
        return Err(PersistError::NotPrepared);
    }
    let vmm = find_vmm(pids).ok_or(PersistError::NoVmm)?;
    // The VM it restored from (if any) goes first: a pause that fails half-way must leave no
    // older VM to resume over the newer overlay disk. The running VMM keeps its mapping.
    let paused = paused_dir(dir);
    match std::fs::remove_dir_all(&paused) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io("removing the earlier paused VM", &paused)(e));
        }
        _ => {}
    }
    airlock_jail::procctl::pidfd_send_signal(&vmm, airlock_vmm::pause::SNAPSHOT_SIGNAL)
        .map_err(PersistError::Signal)?;
    let deadline = Instant::now() + limit;
    loop {
        if airlock_jail::procctl::pidfd_exited(&vmm, POLL.as_millis() as i32)
            .map_err(PersistError::Signal)?
        {
            break;
        }
        if Instant::now() >= deadline {
            return Err(PersistError::Timeout(limit));
        }
    }
    finish_pause(dir).map_err(|err| match err {
        PersistError::Incomplete { .. } => PersistError::Incomplete { log: log() },
        other => other,
    })
}

/// Names a VMM's written snapshot `paused/` (replacing an earlier one): the state is read
/// back first, so a VMM that died half-way leaves no paused VM. The files become read-only
/// to everyone: forks of other users map them, and nothing writes them again.
pub fn finish_pause(dir: &Path) -> Result<(), PersistError> {
    let (memory, state) = (dir.join(SAVE_MEMORY), dir.join(SAVE_STATE));
    let json = std::fs::read(&state).map_err(io("reading the VM's state", &state))?;
    // The VMM reads the whole state back at restore; here its version and size suffice.
    let parsed = serde_json::from_slice::<serde_json::Value>(&json).ok();
    let field = |name: &str| parsed.as_ref().and_then(|v| v[name].as_u64());
    let memory_len = std::fs::metadata(&memory).map(|m| m.len()).ok();
    let version = u64::from(airlock_vmm::snapshot::FORMAT_VERSION);
    if field("format_version") != Some(version) || field("memory_bytes") != memory_len {
        return Err(PersistError::Incomplete { log: String::new() });
    }
    let (paused, next) = (paused_dir(dir), dir.join("paused.next"));
    let _ = std::fs::remove_dir_all(&next);
    std::fs::create_dir(&next).map_err(io("creating", &next))?;
    // Read by the VMMs of other users (forks in other id ranges), whatever the umask.
    std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755))
        .map_err(io("opening to the VMMs", &next))?;
    for (from, name) in [(&memory, MEMORY_FILE), (&state, STATE_FILE)] {
        std::fs::set_permissions(from, std::fs::Permissions::from_mode(0o444))
            .map_err(io("making read-only", from))?;
        std::fs::rename(from, next.join(name)).map_err(io("naming", from))?;
    }
    let _ = std::fs::remove_dir_all(&paused);
    std::fs::rename(&next, &paused).map_err(io("naming", &paused))
}

/// Copies the VM paused in directory `from` into directory `to` (created, 0700): its
/// `paused/` (the memory hard-linked when both are on one filesystem, else copied) and its
/// overlay disk (holes kept). Made under `to.partial` and renamed, so `to` is whole or
/// absent. A snapshot, and a fork from one.
pub fn copy_vm(from: &Path, to: &Path) -> Result<(), PersistError> {
    if !is_paused(from) {
        return Err(PersistError::NotPaused(from.to_owned()));
    }
    let partial = to.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    let made = copy_into(from, &partial);
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
        return made;
    }
    std::fs::rename(&partial, to).map_err(io("naming", to))
}

fn copy_into(from: &Path, to: &Path) -> Result<(), PersistError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(to)
        .map_err(io("creating", to))?;
    let (paused_from, paused_to) = (paused_dir(from), paused_dir(to));
    std::fs::create_dir(&paused_to).map_err(io("creating", &paused_to))?;
    std::fs::set_permissions(&paused_to, std::fs::Permissions::from_mode(0o755))
        .map_err(io("opening to the VMMs", &paused_to))?;
    let memory = paused_to.join(MEMORY_FILE);
    if std::fs::hard_link(paused_from.join(MEMORY_FILE), &memory).is_err() {
        std::fs::copy(paused_from.join(MEMORY_FILE), &memory)
            .map_err(io("copying the VM's memory to", &memory))?;
    }
    let state = paused_to.join(STATE_FILE);
    std::fs::copy(paused_from.join(STATE_FILE), &state)
        .map_err(io("copying the VM's state to", &state))?;
    let overlay = from.join(OVERLAY_FILE);
    if overlay.is_file() {
        let copy = to.join(OVERLAY_FILE);
        airlock_vmm::snapshot::copy_disk(&overlay, &copy)
            .map_err(|source| PersistError::CopyDisk { path: copy, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("airlock-persist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn state_json(memory_bytes: u64) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "format_version": airlock_vmm::snapshot::FORMAT_VERSION,
            "memory_bytes": memory_bytes,
        }))
        .unwrap()
    }

    fn spec() -> VmmSpec {
        VmmSpec {
            mode: "restore".into(),
            files: Vec::new(),
            disks: Vec::new(),
            args: Vec::new(),
        }
    }

    #[test]
    fn test_prepare_save_makes_empty_private_files_shown_read_write_to_the_vmm() {
        let dir = scratch("prepare");
        std::fs::write(dir.join(SAVE_STATE), b"stale").unwrap();
        let mut vmm = spec();
        let owner = (
            std::fs::metadata(&dir).unwrap().uid(),
            std::fs::metadata(&dir).unwrap().gid(),
        );
        let in_view = prepare_save(&dir, owner, &mut vmm).unwrap();
        assert_eq!(
            in_view,
            [
                PathBuf::from("/run/airlock/vm/save-memory"),
                PathBuf::from("/run/airlock/vm/save-state")
            ]
        );
        assert_eq!(
            vmm.args,
            [
                "--save-memory",
                "/run/airlock/vm/save-memory",
                "--save-state",
                "/run/airlock/vm/save-state"
            ]
        );
        assert_eq!(vmm.disks[1], (SAVE_STATE.to_owned(), dir.join(SAVE_STATE)));
        for name in [SAVE_MEMORY, SAVE_STATE] {
            let meta = std::fs::metadata(dir.join(name)).unwrap();
            assert_eq!((meta.len(), meta.mode() & 0o777), (0, 0o600), "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_finish_pause_refuses_a_half_written_snapshot_and_names_a_whole_one() {
        let dir = scratch("finish");
        std::fs::write(dir.join(SAVE_MEMORY), b"").unwrap();
        std::fs::write(dir.join(SAVE_STATE), b"").unwrap();
        // The VMM died before writing its state.
        let err = finish_pause(&dir).unwrap_err();
        assert!(matches!(err, PersistError::Incomplete { .. }), "{err}");
        assert!(!is_paused(&dir));
        // Its state written, but the memory file short.
        std::fs::write(dir.join(SAVE_STATE), state_json(8192)).unwrap();
        std::fs::write(dir.join(SAVE_MEMORY), [7u8; 4096]).unwrap();
        assert!(finish_pause(&dir).is_err());
        assert!(!is_paused(&dir));
        std::fs::write(dir.join(SAVE_MEMORY), [7u8; 8192]).unwrap();
        finish_pause(&dir).unwrap();
        assert!(is_paused(&dir));
        let memory = paused_dir(&dir).join(MEMORY_FILE);
        assert_eq!(std::fs::read(&memory).unwrap(), [7u8; 8192]);
        assert_eq!(std::fs::metadata(&memory).unwrap().mode() & 0o777, 0o444);
        assert!(!dir.join(SAVE_MEMORY).exists() && !dir.join(SAVE_STATE).exists());
        // A second pause replaces the first.
        std::fs::write(dir.join(SAVE_MEMORY), [9u8; 8192]).unwrap();
        std::fs::write(dir.join(SAVE_STATE), state_json(8192)).unwrap();
        finish_pause(&dir).unwrap();
        assert_eq!(std::fs::read(&memory).unwrap(), [9u8; 8192]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_copy_vm_links_the_memory_copies_the_overlay_and_leaves_nothing_half_made() {
        let base = scratch("copy");
        let (sandbox, snapshot, fork) = (base.join("a"), base.join("snap"), base.join("b"));
        std::fs::create_dir(&sandbox).unwrap();
        let err = copy_vm(&sandbox, &snapshot).unwrap_err();
        assert!(matches!(err, PersistError::NotPaused(_)), "{err}");
        assert!(!snapshot.exists() && !snapshot.with_extension("partial").exists());
        std::fs::write(sandbox.join(SAVE_MEMORY), [1u8; 8192]).unwrap();
        std::fs::write(sandbox.join(SAVE_STATE), state_json(8192)).unwrap();
        finish_pause(&sandbox).unwrap();
        let overlay = std::fs::File::create(sandbox.join(OVERLAY_FILE)).unwrap();
        overlay.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&overlay, b"upper", 1 << 20).unwrap();
        copy_vm(&sandbox, &snapshot).unwrap();
        copy_vm(&snapshot, &fork).unwrap();
        let inode = |dir: &Path| {
            std::fs::metadata(paused_dir(dir).join(MEMORY_FILE))
                .unwrap()
                .ino()
        };
        assert_eq!(inode(&sandbox), inode(&fork));
        assert_eq!(
            std::fs::read(fork.join(OVERLAY_FILE)).unwrap(),
            std::fs::read(sandbox.join(OVERLAY_FILE)).unwrap()
        );
        assert!(std::fs::metadata(fork.join(OVERLAY_FILE)).unwrap().blocks() * 512 < 1 << 20);
        // The fork's own writes are not its source's.
        std::os::unix::fs::FileExt::write_all_at(
            &std::fs::OpenOptions::new()
                .write(true)
                .open(fork.join(OVERLAY_FILE))
                .unwrap(),
            b"fork!",
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            &std::fs::read(sandbox.join(OVERLAY_FILE)).unwrap()[1 << 20..(1 << 20) + 5],
            b"upper"
        );
        // Deleting the source and the snapshot leaves the fork whole.
        std::fs::remove_dir_all(&sandbox).unwrap();
        std::fs::remove_dir_all(&snapshot).unwrap();
        assert!(is_paused(&fork));
        assert_eq!(
            std::fs::read(paused_dir(&fork).join(MEMORY_FILE)).unwrap(),
            [1u8; 8192]
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn test_pause_to_disk_refuses_a_vmm_started_without_snapshot_files() {
        let dir = scratch("unprepared");
        let err = pause_to_disk(&dir, &[], Duration::from_secs(1), String::new).unwrap_err();
        assert!(matches!(err, PersistError::NotPrepared), "{err}");
        std::fs::write(dir.join(SAVE_MEMORY), b"").unwrap();
        std::fs::write(dir.join(SAVE_STATE), b"").unwrap();
        let me = std::process::id();
        let err = pause_to_disk(&dir, &[me], Duration::from_secs(1), String::new).unwrap_err();
        assert!(matches!(err, PersistError::NoVmm), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
