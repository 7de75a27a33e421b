//! Filesystem attacks: writes that must not land, links and renames that try to leave the
//! view, special files, and the sizes of the writable filesystems.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::{Outcome, check, cstr, sys};

/// Opens `path` for writing without creating or truncating it, and closes it again: proves
/// that a write would be allowed without changing the file if it is.
pub fn open_write(path: &str) -> Outcome {
    std::fs::OpenOptions::new().write(true).open(path)?;
    Ok(String::new())
}

/// The permission bits and type of `path` (not following a final symlink), so that a mask
/// (a mode-000 node) can be told from the real file.
pub fn stat(path: &str) -> Outcome {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    let kind = match meta.mode() & libc::S_IFMT {
        libc::S_IFDIR => "dir",
        libc::S_IFREG => "file",
        libc::S_IFLNK => "symlink",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char",
        libc::S_IFBLK => "block",
        _ => "other",
    };
    Ok(format!("mode={:04o} type={kind}", meta.mode() & 0o7777))
}

/// Plants `link -> target`, then tries to open the link for writing.
pub fn symlink_write(target: &str, link: &str) -> Outcome {
    std::os::unix::fs::symlink(target, link)?;
    open_write(link)
}

/// Plants `link -> target`, then reads through it.
pub fn symlink_read(target: &str, link: &str) -> Outcome {
    std::os::unix::fs::symlink(target, link)?;
    crate::read_file(link)
}

/// A second name for `existing` at `new` (`link(2)`).
pub fn hard_link(existing: &str, new: &str) -> Outcome {
    std::fs::hard_link(existing, new)?;
    Ok(String::new())
}

pub fn rename(from: &str, to: &str) -> Outcome {
    std::fs::rename(from, to)?;
    Ok(String::new())
}

/// A character device node (1,3 is /dev/null's number) at `path`.
pub fn mknod_char(path: &str) -> Outcome {
    let c_path = cstr(path)?;
    // SAFETY: a valid NUL-terminated path, a mode and a device number.
    let ret = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    sys(|| check(ret.into()))
}

/// `truncate(path, 0)`: only ever aimed at fixture files the suite created.
pub fn truncate(path: &str) -> Outcome {
    let c_path = cstr(path)?;
    // SAFETY: a valid NUL-terminated path and a length.
    sys(|| check(unsafe { libc::truncate(c_path.as_ptr(), 0).into() }))
}

/// Sets a `user.` extended attribute on `path`.
pub fn set_xattr(path: &str) -> Outcome {
    let c_path = cstr(path)?;
    let value = b"probe";
    // SAFETY: valid NUL-terminated strings and a buffer with its length.
    let ret = unsafe {
        libc::setxattr(
            c_path.as_ptr(),
            c"user.airlock-probe".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    sys(|| check(ret.into()))
}

/// Creates a set-user-id file directly with `open(O_CREAT, 04755)`.
pub fn create_setuid(path: &str) -> Outcome {
    let c_path = cstr(path)?;
    // SAFETY: a valid NUL-terminated path, flags and a mode.
    let fd = check(unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o4755 as libc::c_uint,
        )
        .into()
    })?;
    // SAFETY: closing the descriptor we just opened.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(String::new())
}

/// Writes `mib` MiB into `path`, ignoring SIGXFSZ so that the file-size limit shows as EFBIG.
/// Reports how much was written when the filesystem fills up.
pub fn fill(path: &str, mib: i64) -> Outcome {
    ignore_sigxfsz();
    let mut file = std::fs::File::create(path)?;
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..mib {
        if let Err(e) = file.write_all(&chunk) {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
    }
    let _ = std::fs::remove_file(path);
    Ok(format!("wrote {mib} MiB"))
}

/// One byte at offset `gib` GiB of a new file: a sparse file far above the size limit.
pub fn sparse(path: &str, gib: i64) -> Outcome {
    use std::os::unix::fs::FileExt;
    ignore_sigxfsz();
    let file = std::fs::File::create(path)?;
    let offset = u64::try_from(gib).unwrap_or(0) << 30;
    let result = file.write_at(b"x", offset);
    let _ = std::fs::remove_file(path);
    result?;
    Ok(String::new())
}

fn ignore_sigxfsz() {
    // SAFETY: setting a signal's disposition to "ignore" touches no memory of ours.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// Opens descriptors until the kernel refuses one; reports how many it got.
pub fn exhaust_descriptors() -> Outcome {
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => held.push(file),
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(0);
                return Ok(format!("opened {} errno {errno}", held.len()));
            }
        }
        if held.len() >= 2_000_000 {
            return Ok(format!("opened {}", held.len()));
        }
    }
}

/// For `seconds`, swaps `dir` (a directory) with a symlink to `target` and back, as fast as it
/// can (`renameat2(RENAME_EXCHANGE)`): races anything that resolves a path through `dir`.
pub fn rename_race(dir: &str, target: &str, seconds: i64) -> Outcome {
    let link = format!("{dir}.airlock-swap");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, &link)?;
    let (c_dir, c_link) = (cstr(dir)?, cstr(&link)?);
    println!("racing");
    io::stdout().flush()?;
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(seconds.max(0) as u64);
    let mut swaps = 0u64;
    while std::time::Instant::now() < deadline {
        // SAFETY: valid NUL-terminated paths relative to the working directory.
        check(unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                c_dir.as_ptr(),
                libc::AT_FDCWD,
                c_link.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        })?;
        swaps += 1;
    }
    // Leave the directory in place.
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
        // SAFETY: as above.
        let _ = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                c_dir.as_ptr(),
                libc::AT_FDCWD,
                c_link.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
    }
    Ok(format!("swaps {swaps}"))
}

/// For `seconds`, swaps a regular file at `path` with a FIFO (`renameat2(RENAME_EXCHANGE)`):
/// whoever checks the type and then opens the path may open the FIFO and block.
pub fn fifo_race(path: &str, seconds: i64) -> Outcome {
    let fifo = format!("{path}.airlock-fifo");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(&fifo);
    std::fs::write(path, b"data")?;
    let (c_path, c_fifo) = (cstr(path)?, cstr(&fifo)?);
    // SAFETY: a valid NUL-terminated path and a mode.
    check(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o666) }.into())?;
    println!("racing");
    io::stdout().flush()?;
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(seconds.max(0) as u64);
    let mut swaps = 0u64;
    while std::time::Instant::now() < deadline {
        // SAFETY: valid NUL-terminated paths relative to the working directory.
        check(unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                c_path.as_ptr(),
                libc::AT_FDCWD,
                c_fifo.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        })?;
        swaps += 1;
    }
    Ok(format!("swaps {swaps}"))
}

/// Counts the non-zero addresses in `/proc/kallsyms` (zero when the kernel hides them).
pub fn kallsyms() -> Outcome {
    let text = std::fs::read_to_string("/proc/kallsyms")?;
    let nonzero = text
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .next()
                .is_some_and(|addr| addr.chars().any(|c| c != '0'))
        })
        .count();
    Ok(format!("nonzero={nonzero}"))
}

/// Execs `path` with `args` (this process is replaced; the new image prints the verdict).
pub fn exec(path: &str, args: &[String]) -> Outcome {
    let program = cstr(path)?;
    let mut argv: Vec<CString> = vec![
        CString::new(
            Path::new(path)
                .file_name()
                .map_or(b"probe".as_slice(), |n| n.as_bytes()),
        )
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
    ];
    for arg in args {
        argv.push(cstr(arg)?);
    }
    let mut pointers: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    // SAFETY: a NUL-terminated path and a NULL-terminated array of NUL-terminated strings that
    // outlive the call; the environment is the current one.
    unsafe { libc::execv(program.as_ptr(), pointers.as_ptr()) };
    Err(io::Error::last_os_error())
}
