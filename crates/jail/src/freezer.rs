//! Freezing a sandbox's cgroup: every task stops where it is, keeping its memory, descriptors
//! and sockets, until the cgroup is thawed. The v1 freezer hierarchy or v2's core
//! `cgroup.freeze`, whichever holds the sandbox. Waits use short sleeps, never a busy poll:
//! a poller competing for the CPU slows every task's way into the freezer (measured here).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A cgroup that can be frozen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freezer {
    /// A directory of the v1 freezer hierarchy (`freezer.state`).
    V1(PathBuf),
    /// A v2 cgroup (`cgroup.freeze`, `cgroup.events`).
    V2(PathBuf),
}

/// How long a freeze may take before it is given up (and the cgroup thawed again).
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_FIRST: Duration = Duration::from_micros(200);
const POLL_MAX: Duration = Duration::from_millis(5);

impl Freezer {
    /// Freezes the cgroup and returns once every task is frozen. On timeout the cgroup is
    /// thawed again and the error is `TimedOut`.
    pub fn freeze(&self) -> io::Result<()> {
        match self {
            Freezer::V1(dir) => fs::write(dir.join("freezer.state"), "FROZEN")?,
            Freezer::V2(dir) => fs::write(dir.join("cgroup.freeze"), "1")?,
        }
        let deadline = Instant::now() + FREEZE_TIMEOUT;
        let mut pause = POLL_FIRST;
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.thaw();
                return Err(io::ErrorKind::TimedOut.into());
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Thaws the cgroup (a no-op when it is not frozen).
    pub fn thaw(&self) -> io::Result<()> {
        match self {
            Freezer::V1(dir) => fs::write(dir.join("freezer.state"), "THAWED"),
            Freezer::V2(dir) => fs::write(dir.join("cgroup.freeze"), "0"),
        }
    }

    /// Whether every task of the cgroup is frozen now.
    pub fn is_frozen(&self) -> io::Result<bool> {
        match self {
            Freezer::V1(dir) => {
                Ok(fs::read_to_string(dir.join("freezer.state"))?.trim() == "FROZEN")
            }
            Freezer::V2(dir) => Ok(v2_frozen(&fs::read_to_string(dir.join("cgroup.events"))?)),
        }
    }

    /// Whether a freeze was asked for (it may still be in progress).
    pub fn is_freezing(&self) -> io::Result<bool> {
        match self {
            Freezer::V1(dir) => {
                Ok(fs::read_to_string(dir.join("freezer.state"))?.trim() != "THAWED")
            }
            Freezer::V2(dir) => Ok(fs::read_to_string(dir.join("cgroup.freeze"))?.trim() == "1"),
        }
    }

    pub fn dir(&self) -> &Path {
        match self {
            Freezer::V1(dir) | Freezer::V2(dir) => dir,
        }
    }
}

/// `frozen 1` in a v2 `cgroup.events`.
fn v2_frozen(events: &str) -> bool {
    events
        .lines()
        .filter_map(|l| l.split_once(' '))
        .any(|(k, v)| k == "frozen" && v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_v2_frozen_reads_the_events_line() {
        assert!(v2_frozen("populated 1\nfrozen 1\n"));
        assert!(!v2_frozen("populated 1\nfrozen 0\n"));
        assert!(!v2_frozen(""));
    }

    #[test]
    fn test_v1_state_file_round_trip_on_a_fake_directory() {
        let dir = std::env::temp_dir().join(format!("airlock-freezer-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // A plain file does not move through FREEZING on its own: FROZEN is read back at once.
        let freezer = Freezer::V1(dir.clone());
        freezer.freeze().unwrap();
        assert!(freezer.is_frozen().unwrap());
        freezer.thaw().unwrap();
        assert!(!freezer.is_freezing().unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }
}
