//! The kernel's random pool, for a microVM guest resumed from a snapshot: every fork of one
//! snapshot starts with the same CRNG state, so the agent mixes in entropy from the host and
//! makes the kernel reseed its CRNG at once (`RNDADDENTROPY`, credited, then
//! `RNDRESEEDCRNG`; both need CAP_SYS_ADMIN, which a guest's init has).

use std::io;
use std::os::fd::AsRawFd;

use crate::sys;

/// `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: u32 = 0x4008_5203;
/// `_IO('R', 0x07)`.
const RNDRESEEDCRNG: u32 = 0x5207;
/// At most this much entropy per call (the kernel takes any size; this bounds the buffer).
pub const MAX_ENTROPY_BYTES: usize = 4096;

/// Mixes `entropy` into the kernel's input pool, credited at 8 bits a byte, then reseeds the
/// CRNG from it, so that what getrandom returns next depends on `entropy`.
pub fn add_and_reseed(entropy: &[u8]) -> io::Result<()> {
    if entropy.is_empty() || entropy.len() > MAX_ENTROPY_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("entropy must be 1 to {MAX_ENTROPY_BYTES} bytes"),
        ));
    }
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/random")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + entropy.len());
    // Both fit: the length is at most MAX_ENTROPY_BYTES (checked above).
    let bytes = i32::try_from(entropy.len()).unwrap_or(i32::MAX);
    info.extend_from_slice(&bytes.saturating_mul(8).to_ne_bytes());
    info.extend_from_slice(&bytes.to_ne_bytes());
    info.extend_from_slice(entropy);
    info.resize(8 + entropy.len().div_ceil(4) * 4, 0);
    // SAFETY: `info` is a rand_pool_info whose buf_size matches the bytes that follow the
    // header (padded to whole u32s, as the kernel reads them); the kernel only reads it. The
    // descriptor is open for the call; the result is checked.
    if unsafe {
        libc::ioctl(
            random.as_raw_fd(),
            sys::ioctl_request(RNDADDENTROPY),
            info.as_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(random.as_raw_fd(), sys::ioctl_request(RNDRESEEDCRNG)) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_add_and_reseed_refuses_empty_and_oversized_entropy() {
        for size in [0, MAX_ENTROPY_BYTES + 1] {
            let err = add_and_reseed(&vec![1u8; size]).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{size}");
        }
    }
}
