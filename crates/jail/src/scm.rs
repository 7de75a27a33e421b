//! Messages that carry descriptors over Unix sockets (`SCM_RIGHTS`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message may carry here.
pub const MAX_FDS: usize = 8;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Room for `n` descriptors in one `SCM_RIGHTS` header.
fn control_space(n: usize) -> usize {
    let bytes = (n * std::mem::size_of::<RawFd>()) as libc::c_uint;
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(bytes) as usize }
}

/// A message header over one buffer and, when `control` is not empty, a control buffer. The
/// header points into both, so it must not outlive them.
fn message_header(iov: &mut libc::iovec, control: &mut [u8]) -> libc::msghdr {
    // SAFETY: a zeroed msghdr is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    if !control.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        // `size_t` in glibc, `socklen_t` in musl; control buffers here are a few hundred bytes.
        msg.msg_controllen = control.len() as _;
    }
    msg
}

/// Sends `data` and the descriptors `fds` (at most [`MAX_FDS`]) in one message.
pub fn send_with_fds(socket: &OwnedFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = vec![
        0u8;
        if fds.is_empty() {
            0
        } else {
            control_space(fds.len())
        }
    ];
    let msg = message_header(&mut iov, &mut control);
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as libc::c_uint;
        // SAFETY: `control` is CMSG_SPACE bytes for `fds.len()` descriptors, so the first header
        // and its data fit; CMSG_FIRSTHDR is non-null because msg_controllen is large enough.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(bytes) as _;
            let data = libc::CMSG_DATA(header).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), *fd);
            }
        }
    }
    // SAFETY: `msg` describes `data` and `control`, both alive for the call.
    check(unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } as libc::c_long)
        .map(drop)
}

/// Receives one message of at most `max_data` bytes and the descriptors it carries (marked
/// close-on-exec). An empty message means the peer is gone. A message that carried more than
/// [`MAX_FDS`] descriptors is refused, and those that arrived are closed.
pub fn recv_with_fds(socket: &OwnedFd, max_data: usize) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    recv_with_fds_flags(socket, max_data, 0)
}

/// [`recv_with_fds`] without waiting: `None` when no message is queued.
pub fn try_recv_with_fds(
    socket: &OwnedFd,
    max_data: usize,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    match recv_with_fds_flags(socket, max_data, libc::MSG_DONTWAIT) {
        Ok(received) => Ok(Some(received)),
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(err) => Err(err),
    }
}

fn recv_with_fds_flags(
    socket: &OwnedFd,
    max_data: usize,
    flags: libc::c_int,
) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = vec![0u8; max_data];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut control = vec![0u8; control_space(MAX_FDS)];
    let mut msg = message_header(&mut iov, &mut control);
    // SAFETY: `msg` describes `data` and `control`, both alive for the call; MSG_CMSG_CLOEXEC
    // marks the received descriptors close-on-exec.
    let n =
        check(
            unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) }
                as libc::c_long,
        )?;
    let mut received = Vec::new();
    // SAFETY: the kernel filled `control` and set msg_controllen; CMSG_FIRSTHDR, CMSG_NXTHDR and
    // CMSG_DATA stay within it, and each SCM_RIGHTS header's length says how many descriptors
    // follow it. Each one is ours to own from here.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                // `size_t` in glibc, `socklen_t` in musl.
                let length: usize = (*header).cmsg_len as _;
                let payload = length - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    received.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a message carried more descriptors than allowed",
        ));
    }
    data.truncate(n as usize);
    Ok((data, received))
}

/// Sends `data` and, optionally, one descriptor.
pub fn send_with_fd(socket: &OwnedFd, data: &[u8], fd: Option<&OwnedFd>) -> io::Result<()> {
    match fd {
        Some(fd) => send_with_fds(socket, data, &[fd.as_raw_fd()]),
        None => send_with_fds(socket, data, &[]),
    }
}

/// Receives one message of at most 64 bytes and the first descriptor it carries, if any. An
/// empty message means the peer is gone.
pub fn recv_with_fd(socket: &OwnedFd) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let (data, fds) = recv_with_fds(socket, 64)?;
    Ok((data, fds.into_iter().next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_descriptors_cross_a_socketpair_in_order() {
        let (a, b) = crate::sys::socketpair().unwrap();
        let (r1, _w1) = crate::sys::pipe().unwrap();
        let (r2, _w2) = crate::sys::pipe().unwrap();
        send_with_fds(&a, b"two", &[r1.as_raw_fd(), r2.as_raw_fd()]).unwrap();
        let (data, fds) = recv_with_fds(&b, 16).unwrap();
        assert_eq!(data, b"two");
        assert_eq!(fds.len(), 2);
        let inode = |fd: RawFd| std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(inode(fds[0].as_raw_fd()).ino(), inode(r1.as_raw_fd()).ino());
        assert_eq!(inode(fds[1].as_raw_fd()).ino(), inode(r2.as_raw_fd()).ino());
    }

    #[test]
    fn test_too_many_descriptors_are_refused_on_send() {
        let (a, _b) = crate::sys::socketpair().unwrap();
        let (r, _w) = crate::sys::pipe().unwrap();
        let fds = vec![r.as_raw_fd(); MAX_FDS + 1];
        assert!(send_with_fds(&a, b"x", &fds).is_err());
    }

    #[test]
    fn test_trying_an_empty_queue_does_not_wait() {
        let (a, b) = crate::sys::socketpair().unwrap();
        assert!(try_recv_with_fds(&b, 16).unwrap().is_none());
        send_with_fds(&a, b"x", &[]).unwrap();
        let (data, fds) = try_recv_with_fds(&b, 16).unwrap().unwrap();
        assert_eq!((data.as_slice(), fds.len()), (b"x".as_slice(), 0));
    }

    #[test]
    fn test_an_empty_message_reads_as_the_peer_gone() {
        let (a, b) = crate::sys::socketpair().unwrap();
        drop(a);
        let (data, fds) = recv_with_fds(&b, 16).unwrap();
        assert!(data.is_empty() && fds.is_empty());
    }
}
