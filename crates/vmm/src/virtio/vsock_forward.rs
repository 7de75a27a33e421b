//! Guest-initiated vsock connections: the guest connects to the host (CID 2) on a port the
//! VMM was given a forward for (`--vsock-forward PORT:PATH`, Firecracker's `<uds>_PORT`
//! model with the path named per port), and the VMM connects to that Unix socket and carries
//! the stream. Any other port gets a reset. The microvm tier forwards one port, the egress
//! proxy's: the guest's only way out.
//!
//! The connect happens on the vCPU thread, from a guest packet, so it never blocks: the socket
//! is non-blocking, and a proxy whose backlog is full refuses (`EAGAIN`) like an unforwarded
//! port. The socket is created with exactly the flags the VMM's allow-list admits
//! ([`SOCKET_TYPE`]), which is why this does not use std's `UnixStream::connect`.

use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The ports a forward may name: below the range the device hands out to host-initiated
/// connections (their host port is the connection's key too).
pub const MAX_FORWARD_PORT: u32 = (1 << 30) - 1;
/// `socket(2)`'s type for a forward's connection, the only one the allow-list lets through.
pub const SOCKET_TYPE: i32 = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
/// `sun_path`'s size, the terminating NUL included.
const SUN_PATH_BYTES: usize = 108;

/// Errors of this module.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("`{0}` is not PORT:SOCKET_PATH")]
    Syntax(String),
    #[error("`{0}` is not a host port from 1 to {MAX_FORWARD_PORT}")]
    Port(String),
    #[error("the forward's socket `{0}` must be an absolute path shorter than 108 bytes")]
    Path(String),
    #[error("port {0} is forwarded twice")]
    Duplicate(u32),
}

/// One forward: guest connections to host port `port` go to the Unix socket at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub port: u32,
    pub path: PathBuf,
}

impl Forward {
    /// Parses `PORT:SOCKET_PATH`.
    pub fn parse(text: &str) -> Result<Forward, ForwardError> {
        let (port, path) = text
            .split_once(':')
            .ok_or_else(|| ForwardError::Syntax(text.to_owned()))?;
        let port = port
            .parse::<u32>()
            .ok()
            .filter(|p| (1..=MAX_FORWARD_PORT).contains(p))
            .ok_or_else(|| ForwardError::Port(port.to_owned()))?;
        if !path.starts_with('/') || path.len() >= SUN_PATH_BYTES || path.contains('\0') {
            return Err(ForwardError::Path(path.to_owned()));
        }
        Ok(Forward {
            port,
            path: path.into(),
        })
    }

    /// Checks a set of forwards names each port once.
    pub fn check_unique(forwards: &[Forward]) -> Result<(), ForwardError> {
        for (i, forward) in forwards.iter().enumerate() {
            if forwards[..i].iter().any(|f| f.port == forward.port) {
                return Err(ForwardError::Duplicate(forward.port));
            }
        }
        Ok(())
    }
}

/// Connects a non-blocking Unix stream socket to `path` (see the module docs).
pub fn connect(path: &Path) -> std::io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= SUN_PATH_BYTES {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: socket(2) with integer arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, SOCKET_TYPE, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket this function owns; the stream closes it from now on.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: an all-zero sockaddr_un is valid (an empty path), filled in below.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (slot, byte) in address.sun_path.iter_mut().zip(bytes) {
        *slot = libc::c_char::from_ne_bytes([*byte]);
    }
    // SAFETY: `address` is a live sockaddr_un whose size is passed; its path is NUL-terminated
    // (shorter than sun_path, checked above, the rest zero). The result is checked.
    let rc = unsafe {
        libc::connect(
            fd,
            (&raw const address).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_forward_parse_takes_a_port_and_an_absolute_short_path() {
        assert_eq!(
            Forward::parse("3128:/run/airlock/egress/proxy.sock"),
            Ok(Forward {
                port: 3128,
                path: "/run/airlock/egress/proxy.sock".into()
            })
        );
        assert!(matches!(
            Forward::parse("3128"),
            Err(ForwardError::Syntax(_))
        ));
        for port in ["0", "x", "1073741824", "-1"] {
            assert!(
                matches!(
                    Forward::parse(&format!("{port}:/s")),
                    Err(ForwardError::Port(_))
                ),
                "{port}"
            );
        }
        let long = format!("1:/{}", "a".repeat(107));
        for bad in ["1:relative", long.as_str()] {
            assert!(
                matches!(Forward::parse(bad), Err(ForwardError::Path(_))),
                "{bad}"
            );
        }
        let twice = [
            Forward::parse("1:/a").unwrap(),
            Forward::parse("1:/b").unwrap(),
        ];
        assert_eq!(
            Forward::check_unique(&twice),
            Err(ForwardError::Duplicate(1))
        );
    }

    #[test]
    fn test_forward_connect_reaches_a_listener_and_fails_without_one() {
        let dir = std::env::temp_dir().join(format!("airlock-fwd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("proxy.sock");
        assert!(connect(&path).is_err(), "nothing listens yet");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let stream = connect(&path).unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        // Non-blocking, as the vCPU thread needs it.
        let mut byte = [0u8; 1];
        let err = std::io::Read::read(&mut &stream, &mut byte).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
