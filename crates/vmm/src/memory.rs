//! Guest RAM: a memfd mapped `MAP_SHARED` for a VM that boots (its snapshot is the file
//! itself), or a snapshot file mapped `MAP_PRIVATE` for a fork (copy-on-write: a fork's
//! writes stay in its own anonymous pages, the file and its siblings never see them).

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("guest memory size {0} bytes is not a non-zero multiple of 4 KiB below 3 GiB")]
    BadSize(u64),
    #[error("creating the guest memory file failed")]
    CreateFile(#[source] std::io::Error),
    #[error("sizing the guest memory file failed")]
    SizeFile(#[source] std::io::Error),
    #[error("the snapshot memory file holds {actual} bytes, the snapshot says {expected}")]
    FileSize { expected: u64, actual: u64 },
    #[error("mapping guest memory failed")]
    Map(#[source] vm_memory::mmap::MmapRegionError),
    #[error("building the guest memory map failed")]
    Region(#[source] vm_memory::GuestRegionCollectionError),
}

/// The largest guest RAM: everything sits below the MMIO hole at 3 GiB.
pub const MAX_MEMORY_BYTES: u64 = 3 << 30;

/// Guest RAM at guest-physical 0, with the file behind it.
#[derive(Debug)]
pub struct GuestRam {
    pub memory: GuestMemoryMmap,
    /// The memfd or snapshot file the RAM maps.
    pub file: Arc<File>,
    pub size_bytes: u64,
    /// Host address of guest-physical 0 (for `KVM_SET_USER_MEMORY_REGION`).
    pub host_address: u64,
    /// Whether writes go to the file (`MAP_SHARED`) or stay private to this mapping.
    pub shared: bool,
}

fn check_size(size_bytes: u64) -> Result<usize, MemoryError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(4096) || size_bytes > MAX_MEMORY_BYTES {
        return Err(MemoryError::BadSize(size_bytes));
    }
    usize::try_from(size_bytes).map_err(|_| MemoryError::BadSize(size_bytes))
}

impl GuestRam {
    /// Fresh zeroed RAM in a memfd, mapped shared.
    pub fn new_shared(size_bytes: u64) -> Result<GuestRam, MemoryError> {
        let size = check_size(size_bytes)?;
        // SAFETY: the name is a NUL-terminated literal; the return value is checked.
        let fd = unsafe { libc::memfd_create(c"airlock-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(MemoryError::CreateFile(std::io::Error::last_os_error()));
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size_bytes).map_err(MemoryError::SizeFile)?;
        Self::map(Arc::new(file), size, libc::MAP_SHARED)
    }

    /// A copy-on-write view of `file` (a snapshot's memory), which is never written.
    pub fn new_private(file: Arc<File>, size_bytes: u64) -> Result<GuestRam, MemoryError> {
        let size = check_size(size_bytes)?;
        let actual = file.metadata().map_err(MemoryError::SizeFile)?.len();
        if actual != size_bytes {
            return Err(MemoryError::FileSize {
                expected: size_bytes,
                actual,
            });
        }
        Self::map(file, size, libc::MAP_PRIVATE)
    }

    fn map(file: Arc<File>, size: usize, sharing: i32) -> Result<GuestRam, MemoryError> {
        let region = MmapRegionBuilder::new(size)
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(sharing | libc::MAP_NORESERVE)
            .with_file_offset(FileOffset::from_arc(file.clone(), 0))
            .build()
            .map_err(MemoryError::Map)?;
        let host_address = region.as_ptr() as u64;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or(MemoryError::BadSize(size as u64))?;
        let memory = GuestMemoryMmap::from_regions(vec![region]).map_err(MemoryError::Region)?;
        Ok(GuestRam {
            memory,
            file,
            size_bytes: size as u64,
            host_address,
            shared: sharing == libc::MAP_SHARED,
        })
    }
}
