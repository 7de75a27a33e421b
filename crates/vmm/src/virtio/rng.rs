//! virtio-rng: every writable buffer the guest queues is filled from the host's `getrandom`.
//! A fork restores this device with nothing carried over, so its entropy is its own.

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestMemoryMmap};

use super::DeviceError;

pub const QUEUE_SIZE: u16 = 256;
/// At most this much entropy per request: a guest cannot make one notification cost
/// gigabytes of work (virtio-rng lets the device return fewer bytes than asked).
pub const MAX_BYTES_PER_REQUEST: u32 = 64 * 1024;

#[derive(Debug, Default)]
pub struct Rng {
    served_bytes: u64,
}

impl Rng {
    pub fn new() -> Rng {
        Rng::default()
    }

    /// Total bytes given to the guest.
    pub fn served_bytes(&self) -> u64 {
        self.served_bytes
    }

    pub fn process(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut used_any = false;
        // Collect the heads first: the iterator borrows the queue, add_used needs it mutably.
        let chains: Vec<_> = queue
            .iter(memory)
            .map_err(DeviceError::AvailRing)?
            .collect();
        for chain in chains {
            let head = chain.head_index();
            let mut written: u32 = 0;
            let mut buffer = [0u8; 4096];
            for descriptor in chain.writable() {
                let mut offset: u32 = 0;
                while offset < descriptor.len() && written < MAX_BYTES_PER_REQUEST {
                    let want = (descriptor.len() - offset)
                        .min(MAX_BYTES_PER_REQUEST - written)
                        .min(buffer.len() as u32) as usize;
                    fill_random(&mut buffer[..want])?;
                    let address = descriptor
                        .addr()
                        .checked_add(u64::from(offset))
                        .ok_or(DeviceError::BadChain { head })?;
                    memory
                        .write_slice(&buffer[..want], address)
                        .map_err(|source| DeviceError::Descriptor { head, source })?;
                    offset += want as u32;
                    written += want as u32;
                }
            }
            queue
                .add_used(memory, head, written)
                .map_err(DeviceError::UsedRing)?;
            self.served_bytes += u64::from(written);
            used_any = true;
        }
        Ok(used_any)
    }
}

fn fill_random(buffer: &mut [u8]) -> Result<(), DeviceError> {
    let mut filled = 0;
    while filled < buffer.len() {
        let rest = &mut buffer[filled..];
        // SAFETY: the pointer and length describe `rest`, a live mutable slice the kernel
        // writes at most `rest.len()` bytes into; the return value is checked.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(DeviceError::Entropy(err));
        }
        filled += n as usize;
    }
    Ok(())
}
