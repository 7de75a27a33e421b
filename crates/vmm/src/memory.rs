//! Guest RAM. A VM shell reserves the host address range of its RAM and registers it with
//! KVM once ([`Reservation`]); the RAM itself is then mapped over that range with
//! `MAP_FIXED`: a memfd `MAP_SHARED` for a VM that boots (its snapshot is the file itself),
//! or a snapshot's file `MAP_PRIVATE` for a fork (copy-on-write: a fork's writes stay in its
//! own anonymous pages; the file and its siblings never see them). KVM follows the new
//! mapping through its MMU notifier, so a fork needs no memory-slot ioctl, which costs
//! milliseconds once a VM has an irqchip (measured under PVM).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("guest memory size {0} bytes is not a non-zero multiple of 4 KiB below 3 GiB")]
    BadSize(u64),
    #[error("the VM shell holds {shell} bytes of RAM, the VM needs {wanted}")]
    ShellSize { shell: u64, wanted: u64 },
    #[error("creating the guest memory file failed")]
    CreateFile(#[source] std::io::Error),
    #[error("sizing the guest memory file failed")]
    SizeFile(#[source] std::io::Error),
    #[error("the snapshot memory file holds {actual} bytes, the snapshot says {expected}")]
    FileSize { expected: u64, actual: u64 },
    #[error("reserving host address space for guest memory failed")]
    Reserve(#[source] std::io::Error),
    #[error("mapping guest memory failed")]
    Map(#[source] std::io::Error),
    #[error("describing guest memory failed")]
    Region(#[source] vm_memory::mmap::MmapRegionError),
    #[error("building the guest memory map failed")]
    Collection(#[source] vm_memory::GuestRegionCollectionError),
}

/// The largest guest RAM: everything sits below the MMIO hole at 3 GiB.
pub const MAX_MEMORY_BYTES: u64 = 3 << 30;

/// A range of host address space owned by one VM, unmapped when dropped.
#[derive(Debug)]
pub struct Reservation {
    address: *mut libc::c_void,
    size: usize,
}

// SAFETY: the reservation is a plain address range; moving its owner between threads moves
// nothing the kernel tracks per thread.
unsafe impl Send for Reservation {}

impl Reservation {
    pub fn new(size_bytes: u64) -> Result<Reservation, MemoryError> {
        let size = check_size(size_bytes)?;
        // SAFETY: a new anonymous mapping at an address the kernel picks; no existing memory
        // is touched. The result is checked.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(MemoryError::Reserve(std::io::Error::last_os_error()));
        }
        Ok(Reservation { address, size })
    }

    pub fn host_address(&self) -> u64 {
        self.address as u64
    }

    pub fn size_bytes(&self) -> u64 {
        self.size as u64
    }

    /// Maps `file` over the whole range, shared or private.
    fn map(&self, file: &File, shared: bool) -> Result<(), MemoryError> {
        let sharing = if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        // SAFETY: MAP_FIXED replaces only this reservation's own range, which this process
        // reserved and which no Rust reference points into (guest memory is only reached
        // through vm-memory's volatile accessors, built after this call). The result is
        // checked.
        let mapped = unsafe {
            libc::mmap(
                self.address,
                self.size,
                libc::PROT_READ | libc::PROT_WRITE,
                sharing | libc::MAP_FIXED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(MemoryError::Map(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range is this reservation's own mapping; the owning VM's KVM file
        // descriptors are closed before it (field order in `Vm` and `VmShell`).
        unsafe { libc::munmap(self.address, self.size) };
    }
}

/// Guest RAM at guest-physical 0, with the file behind it.
#[derive(Debug)]
pub struct GuestRam {
    /// Declared before `reservation`: it only borrows the mapping.
    pub memory: GuestMemoryMmap,
    reservation: Reservation,
    /// The memfd or snapshot file the RAM maps.
    pub file: Arc<File>,
    pub size_bytes: u64,
    /// Whether writes go to the file (`MAP_SHARED`) or stay private to this mapping.
    pub shared: bool,
}

fn check_size(size_bytes: u64) -> Result<usize, MemoryError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(4096) || size_bytes > MAX_MEMORY_BYTES {
        return Err(MemoryError::BadSize(size_bytes));
    }
    usize::try_from(size_bytes).map_err(|_| MemoryError::BadSize(size_bytes))
}

/// A new memfd of `size_bytes`, zero-filled.
pub fn new_memfd(size_bytes: u64) -> Result<File, MemoryError> {
    // SAFETY: the name is a NUL-terminated literal; the return value is checked.
    let fd = unsafe { libc::memfd_create(c"airlock-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemoryError::CreateFile(std::io::Error::last_os_error()));
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size_bytes).map_err(MemoryError::SizeFile)?;
    Ok(file)
}

impl GuestRam {
    /// Fresh zeroed RAM in a memfd, mapped shared over `reservation`.
    pub fn new_shared(reservation: Reservation) -> Result<GuestRam, MemoryError> {
        let file = new_memfd(reservation.size_bytes())?;
        Self::over(reservation, Arc::new(file), true)
    }

    /// A copy-on-write view of `file` (a snapshot's memory, never written) over
    /// `reservation`.
    pub fn new_private(reservation: Reservation, file: Arc<File>) -> Result<GuestRam, MemoryError> {
        let actual = file.metadata().map_err(MemoryError::SizeFile)?.len();
        if actual != reservation.size_bytes() {
            return Err(MemoryError::FileSize {
                expected: reservation.size_bytes(),
                actual,
            });
        }
        Self::over(reservation, file, false)
    }

    fn over(
        reservation: Reservation,
        file: Arc<File>,
        shared: bool,
    ) -> Result<GuestRam, MemoryError> {
        reservation.map(&file, shared)?;
        let flags = if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        // SAFETY: the pointer is the reservation's page-aligned mapping of `size` bytes, just
        // mapped readable and writable; the region does not own it (vm-memory never unmaps a
        // raw region) and is dropped before the reservation (field order of GuestRam).
        let region = unsafe {
            MmapRegionBuilder::new(reservation.size)
                .with_raw_mmap_pointer(reservation.address.cast())
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(flags)
                .build()
        }
        .map_err(MemoryError::Region)?;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or(MemoryError::BadSize(reservation.size_bytes()))?;
        let memory =
            GuestMemoryMmap::from_regions(vec![region]).map_err(MemoryError::Collection)?;
        Ok(GuestRam {
            memory,
            size_bytes: reservation.size_bytes(),
            reservation,
            file,
            shared,
        })
    }

    pub fn host_address(&self) -> u64 {
        self.reservation.host_address()
    }
}
