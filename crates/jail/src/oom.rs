//! Notification of the OOM killer's work in a sandbox: a descriptor that becomes readable when
//! the workload's memory cgroup reaches its limit, so that the daemon records each OOM kill as
//! it happens instead of polling. v1 has `cgroup.event_control` with an eventfd on
//! `memory.oom_control` (it also fires for an OOM in an ancestor, and when the cgroup goes);
//! v2 changes `memory.events`, which inotify sees.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::cgroup::parse_oom_kills;
use crate::inotify::{self, Inotify};

/// A memory cgroup's OOM notifications. Poll [`OomWatch::as_fd`] for readability, then
/// [`OomWatch::drain`] it and read [`OomWatch::kills`].
#[derive(Debug)]
pub struct OomWatch {
    fd: File,
    counters: PathBuf,
}

impl OomWatch {
    /// Watches the memory cgroup at `dir` (v1 or v2).
    pub fn open(dir: &Path) -> io::Result<OomWatch> {
        let events = dir.join("memory.events");
        if events.exists() {
            let inotify = Inotify::new()?;
            Inotify::add_watch(inotify.file(), &events, inotify::MODIFY)?;
            return Ok(OomWatch {
                fd: inotify.into_file(),
                counters: events,
            });
        }
        let counters = dir.join("memory.oom_control");
        // SAFETY: eventfd takes integers only and returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let control = File::open(&counters)?;
        // The kernel keeps the registration until the eventfd is closed or the cgroup goes;
        // the control file itself may be closed right away.
        File::options()
            .write(true)
            .open(dir.join("cgroup.event_control"))?
            .write_all(format!("{} {}", eventfd.as_raw_fd(), control.as_raw_fd()).as_bytes())?;
        Ok(OomWatch {
            fd: File::from(eventfd),
            counters,
        })
    }

    /// Consumes pending notifications, so that the descriptor waits for the next one.
    pub fn drain(&self) {
        let mut buf = [0u8; inotify::READ_BUFFER_BYTES];
        while matches!((&self.fd).read(&mut buf), Ok(n) if n > 0) {}
    }

    /// How many processes the OOM killer has ended in the cgroup; 0 once it is gone.
    pub fn kills(&self) -> u64 {
        parse_oom_kills(&std::fs::read_to_string(&self.counters).unwrap_or_default())
    }
}

impl AsRawFd for OomWatch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for OomWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
