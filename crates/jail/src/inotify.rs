//! A safe wrapper over inotify for the agent's directory watchers: an [`Inotify`] instance
//! (non-blocking, close-on-exec), watches, and a parser for the events read from it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::path::Path;

pub const CREATE: u32 = libc::IN_CREATE;
pub const MODIFY: u32 = libc::IN_MODIFY;
pub const CLOSE_WRITE: u32 = libc::IN_CLOSE_WRITE;
pub const DELETE: u32 = libc::IN_DELETE;
pub const DELETE_SELF: u32 = libc::IN_DELETE_SELF;
pub const MOVED_FROM: u32 = libc::IN_MOVED_FROM;
pub const MOVED_TO: u32 = libc::IN_MOVED_TO;
pub const MOVE_SELF: u32 = libc::IN_MOVE_SELF;
pub const ATTRIB: u32 = libc::IN_ATTRIB;
/// Set on events whose subject is a directory.
pub const ISDIR: u32 = libc::IN_ISDIR;
/// The watch was removed (explicitly, or because its directory went away).
pub const IGNORED: u32 = libc::IN_IGNORED;
/// The event queue overflowed; events were lost.
pub const Q_OVERFLOW: u32 = libc::IN_Q_OVERFLOW;
/// Do not follow a symlink given as the watched path.
pub const DONT_FOLLOW: u32 = libc::IN_DONT_FOLLOW;
/// Only watch the path if it is a directory.
pub const ONLYDIR: u32 = libc::IN_ONLYDIR;

/// One inotify instance. Read events from [`Inotify::file`] (it is non-blocking) and decode
/// them with [`parse_events`].
#[derive(Debug)]
pub struct Inotify {
    file: File,
}

/// One decoded event. `name` is empty for events about the watched directory itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub wd: i32,
    pub mask: u32,
    pub cookie: u32,
    pub name: Vec<u8>,
}

impl Inotify {
    pub fn new() -> io::Result<Inotify> {
        // SAFETY: inotify_init1 takes flags only and returns a new descriptor.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(Inotify { file })
    }

    /// The descriptor to read events from.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Consumes the instance, for wrapping its descriptor in an async reactor.
    pub fn into_file(self) -> File {
        self.file
    }

    /// Adds (or updates) a watch on `path`; returns its watch descriptor.
    pub fn add_watch(file: &File, path: &Path, mask: u32) -> io::Result<i32> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))?;
        // SAFETY: `file` is a live inotify descriptor and `path` a valid C string.
        let wd = unsafe { libc::inotify_add_watch(file.as_raw_fd(), path.as_ptr(), mask) };
        if wd == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// Removes a watch.
    pub fn rm_watch(file: &File, wd: i32) -> io::Result<()> {
        // SAFETY: integers only; an unknown wd fails with EINVAL.
        if unsafe { libc::inotify_rm_watch(file.as_raw_fd(), wd) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsFd for Inotify {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// A read buffer size that always fits at least one event with the longest name.
pub const READ_BUFFER_BYTES: usize = 16 + 256 + 4096;

/// Decodes the events in `buf` (as returned by one `read` of an inotify descriptor). A
/// truncated trailing event is ignored.
pub fn parse_events(buf: &[u8]) -> Vec<Event> {
    let word = |at: usize| -> Option<[u8; 4]> { buf.get(at..at + 4)?.try_into().ok() };
    let mut events = Vec::new();
    let mut at = 0;
    while let (Some(wd), Some(mask), Some(cookie), Some(len)) =
        (word(at), word(at + 4), word(at + 8), word(at + 12))
    {
        let len = u32::from_ne_bytes(len) as usize;
        let Some(raw_name) = buf.get(at + 16..at + 16 + len) else {
            break;
        };
        let end = raw_name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(raw_name.len());
        events.push(Event {
            wd: i32::from_ne_bytes(wd),
            mask: u32::from_ne_bytes(mask),
            cookie: u32::from_ne_bytes(cookie),
            name: raw_name[..end].to_vec(),
        });
        at += 16 + len;
    }
    events
}
