//! Snapshots on disk: `state.json` (vCPU, interrupt controllers, PIT, clock and device
//! state) and `memory` (the guest's RAM, byte for byte, its zero pages left as holes).
//! Restoring maps `memory` `MAP_PRIVATE`, so any number of forks share its page cache and
//! none writes to it.
//!
//! A VMM under its allow-list cannot create files: [`SaveFiles`] are opened before it, and
//! [`save_to`] writes into them with positioned writes only; the caller (the runtime, on the
//! host) names them `memory` and `state.json` once the VMM has exited.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use kvm_bindings::{kvm_clock_data, kvm_irqchip, kvm_pit_state2};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use crate::devices::LegacyState;
use crate::vcpu::VcpuState;
use crate::virtio::TransportState;
use crate::vm::{Vm, VmError};

/// Bumped whenever [`VmState`] changes shape; a snapshot of another version is refused.
pub const FORMAT_VERSION: u32 = 1;

pub const STATE_FILE: &str = "state.json";
pub const MEMORY_FILE: &str = "memory";
/// The granularity of the holes in a memory file.
const PAGE_BYTES: usize = 4096;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("reading the VM's state failed")]
    Save(#[source] VmError),
    #[error("writing {path} failed")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("copying guest memory to {path} failed")]
    WriteMemory {
        path: String,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("reading {path} failed")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a snapshot state")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the snapshot has format version {found}, this VMM reads {FORMAT_VERSION}")]
    Version { found: u32 },
    #[error("reading guest memory at {address:#x} failed")]
    ReadMemory {
        address: u64,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
}

/// A VM's state without its memory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    pub format_version: u32,
    pub memory_bytes: u64,
    pub vcpu: VcpuState,
    /// PIC master, PIC slave, IOAPIC.
    pub irqchips: Vec<kvm_irqchip>,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
    pub legacy: LegacyState,
    pub virtio: Vec<TransportState>,
}

/// A snapshot read back: the state, and the memory file to map.
#[derive(Debug)]
pub struct Snapshot {
    pub state: VmState,
    pub memory: Arc<File>,
}

/// Writes a paused VM's snapshot into `dir` (created if missing). The state file is written
/// last and renamed into place, so a half-written snapshot is never read as whole.
pub fn save(vm: &mut Vm, dir: &Path) -> Result<(), SnapshotError> {
    let write_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| SnapshotError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    let memory_path = dir.join(MEMORY_FILE);
    File::create(&memory_path).map_err(write_err(&memory_path))?;
    let partial = dir.join("state.json.partial");
    File::create(&partial).map_err(write_err(&partial))?;
    let files = SaveFiles::open(&memory_path, &partial, vm.ram().size_bytes)?;
    save_to(vm, &files)?;
    let state_path = dir.join(STATE_FILE);
    std::fs::rename(&partial, &state_path).map_err(write_err(&state_path))?;
    Ok(())
}

/// A snapshot's memory and state files, opened (and the memory file sized, all holes) before
/// the VMM's allow-list, which allows no open.
#[derive(Debug)]
pub struct SaveFiles {
    /// This process's page map (see `read_guest_pages`), if it could be opened.
    pagemap: Option<File>,
    memory: File,
    memory_path: String,
    state: File,
    state_path: String,
}

impl SaveFiles {
    /// Opens two existing files for writing, emptied; `memory_bytes`: the guest's RAM.
    pub fn open(
        memory: &Path,
        state: &Path,
        memory_bytes: u64,
    ) -> Result<SaveFiles, SnapshotError> {
        let open = |path: &Path| {
            let err = |source| SnapshotError::Write {
                path: path.display().to_string(),
                source,
            };
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(err)?;
            file.set_len(0).map_err(err)?;
            Ok::<File, SnapshotError>(file)
        };
        let files = SaveFiles {
            pagemap: File::open("/proc/self/pagemap").ok(),
            memory: open(memory)?,
            memory_path: memory.display().to_string(),
            state: open(state)?,
            state_path: state.display().to_string(),
        };
        files
            .memory
            .set_len(memory_bytes)
            .map_err(|source| SnapshotError::Write {
                path: files.memory_path.clone(),
                source,
            })?;
        Ok(files)
    }
}

/// Writes a paused VM's snapshot into `files` with positioned writes and `fdatasync` alone
/// (what the allow-list has): the memory's non-zero pages, then the state. Returns the
/// memory bytes written.
pub fn save_to(vm: &mut Vm, files: &SaveFiles) -> Result<u64, SnapshotError> {
    let state = vm.save_state().map_err(SnapshotError::Save)?;
    let ram = vm.ram();
    let read = |chunk: &mut [u8], at: u64| read_guest_pages(ram, files.pagemap.as_ref(), chunk, at);
    let written =
        write_sparse(read, state.memory_bytes, &files.memory).map_err(|err| match err {
            SnapshotError::Write { source, .. } => SnapshotError::Write {
                path: files.memory_path.clone(),
                source,
            },
            other => other,
        })?;
    let write_err = |source| SnapshotError::Write {
        path: files.state_path.clone(),
        source,
    };
    files.memory.sync_data().map_err(write_err)?;
    let json = serde_json::to_vec(&state).map_err(|source| SnapshotError::Parse {
        path: files.state_path.clone(),
        source,
    })?;
    files.state.write_all_at(&json, 0).map_err(write_err)?;
    files.state.sync_data().map_err(write_err)?;
    Ok(written)
}

/// Copies `len` bytes of guest memory, as `read` fills each chunk at its guest address, into
/// `file` (sized, all holes), skipping the pages that are all zeros, so a guest's untouched
/// memory costs the host no disk. Returns the bytes written.
fn write_sparse(
    mut read: impl FnMut(&mut [u8], u64) -> Result<(), SnapshotError>,
    len: u64,
    file: &File,
) -> Result<u64, SnapshotError> {
    let write_err = |source| SnapshotError::Write {
        path: String::new(),
        source,
    };
    let mut buffer = vec![0u8; 1 << 20];
    let mut written = 0u64;
    let mut at = 0u64;
    while at < len {
        let n = usize::try_from(len - at).map_or(buffer.len(), |n| n.min(buffer.len()));
        let chunk = &mut buffer[..n];
        read(chunk, at)?;
        // Runs of non-zero pages, each one positioned write.
        let mut page = 0;
        while page < n {
            let zero = |p: usize| chunk[p..(p + PAGE_BYTES).min(n)].iter().all(|b| *b == 0);
            if zero(page) {
                page += PAGE_BYTES;
                continue;
            }
            let start = page;
            while page < n && !zero(page) {
                page += PAGE_BYTES;
            }
            let end = page.min(n);
            file.write_all_at(&chunk[start..end], at + start as u64)
                .map_err(write_err)?;
            written += (end - start) as u64;
        }
        at += n as u64;
    }
    Ok(written)
}

/// `/proc/self/pagemap` bits: the page is mapped, swapped out, or a file (or shared) page.
const PAGE_PRESENT: u64 = 1 << 63;
const PAGE_SWAPPED: u64 = 1 << 62;
const PAGE_FILE: u64 = 1 << 61;

/// Reads guest memory without filling the holes of the file behind it. Through the mapping,
/// every page of a hole read would be allocated (on tmpfs, unreclaimable memory charged to
/// the VMM's cgroup: a restored 512 MiB guest's pause died so in the rig's tmpfs). So only
/// the RAM's own pages (a fork's copy-on-write ones, found in the pagemap) are read through
/// the mapping; everything else is the file's and read from it, a hole as zeros. Shared RAM
/// is its file. Without a pagemap, the mapping is read.
fn read_guest_pages(
    ram: &crate::memory::GuestRam,
    pagemap: Option<&File>,
    chunk: &mut [u8],
    at: u64,
) -> Result<(), SnapshotError> {
    let from_file = |chunk: &mut [u8], at: u64| {
        ram.file
            .read_exact_at(chunk, at)
            .map_err(|source| SnapshotError::Read {
                path: "guest memory's file".to_owned(),
                source,
            })
    };
    let from_mapping = |chunk: &mut [u8], at: u64| {
        ram.memory
            .read_slice(chunk, GuestAddress(at))
            .map_err(|source| SnapshotError::ReadMemory {
                address: at,
                source,
            })
    };
    if ram.shared {
        return from_file(chunk, at);
    }
    let Some(pagemap) = pagemap else {
        return from_mapping(chunk, at);
    };
    let pages = chunk.len().div_ceil(PAGE_BYTES);
    let mut entries = vec![0u8; pages * 8];
    let first = (ram.host_address() + at) / PAGE_BYTES as u64;
    if pagemap.read_exact_at(&mut entries, first * 8).is_err() {
        return from_mapping(chunk, at);
    }
    let own = |page: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&entries[page * 8..page * 8 + 8]);
        let entry = u64::from_le_bytes(bytes);
        entry & (PAGE_PRESENT | PAGE_SWAPPED) != 0 && entry & PAGE_FILE == 0
    };
    let mut page = 0;
    while page < pages {
        let kind = own(page);
        let start = page;
        while page < pages && own(page) == kind {
            page += 1;
        }
        let (from, to) = (start * PAGE_BYTES, (page * PAGE_BYTES).min(chunk.len()));
        let offset = at + from as u64;
        if kind {
            from_mapping(&mut chunk[from..to], offset)?;
        } else {
            from_file(&mut chunk[from..to], offset)?;
        }
    }
    Ok(())
}

/// Reads the snapshot in `dir`.
pub fn load(dir: &Path) -> Result<Snapshot, SnapshotError> {
    let state_path = dir.join(STATE_FILE);
    let read_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| SnapshotError::Read { path, source }
    };
    let json = std::fs::read(&state_path).map_err(read_err(&state_path))?;
    let state: VmState = serde_json::from_slice(&json).map_err(|source| SnapshotError::Parse {
        path: state_path.display().to_string(),
        source,
    })?;
    if state.format_version != FORMAT_VERSION {
        return Err(SnapshotError::Version {
            found: state.format_version,
        });
    }
    let memory_path = dir.join(MEMORY_FILE);
    let memory = File::open(&memory_path).map_err(read_err(&memory_path))?;
    Ok(Snapshot {
        state,
        memory: Arc::new(memory),
    })
}

/// Reads `len` bytes of guest memory at `address` (tests and tools).
pub fn read_guest(
    vm: &Vm,
    address: u64,
    len: usize,
) -> Result<Vec<u8>, vm_memory::GuestMemoryError> {
    let mut buffer = vec![0u8; len];
    vm.ram()
        .memory
        .read_slice(&mut buffer, GuestAddress(address))?;
    Ok(buffer)
}

/// Copies a disk file keeping its holes (`SEEK_DATA`/`SEEK_HOLE`), so a sparse overlay disk
/// stays sparse; returns the data bytes copied. A writable disk as a snapshotted guest left
/// it (the VMM exits after the snapshot) is that snapshot's disk, its unwritten pages being in
/// the memory file: each fork gets its own copy.
pub fn copy_disk(from: &Path, to: &Path) -> Result<u64, SnapshotError> {
    let read_err = |source| SnapshotError::Read {
        path: from.display().to_string(),
        source,
    };
    let write_err = |source| SnapshotError::Write {
        path: to.display().to_string(),
        source,
    };
    let source = File::open(from).map_err(read_err)?;
    let len = source.metadata().map_err(read_err)?.len();
    let target = File::create(to).map_err(write_err)?;
    target.set_len(len).map_err(write_err)?;
    let seek = |offset: u64, whence: libc::c_int| -> Result<Option<u64>, SnapshotError> {
        let offset = libc::off_t::try_from(offset).unwrap_or(libc::off_t::MAX);
        // SAFETY: lseek on the descriptor `source` owns; no memory is passed; checked below.
        let at = unsafe { libc::lseek(source.as_raw_fd(), offset, whence) };
        if at < 0 {
            let err = std::io::Error::last_os_error();
            // ENXIO: no data at or after `offset`.
            if err.raw_os_error() == Some(libc::ENXIO) {
                return Ok(None);
            }
            return Err(read_err(err));
        }
        Ok(u64::try_from(at).ok())
    };
    let mut buffer = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    let mut offset = 0u64;
    while offset < len {
        let Some(data) = seek(offset, libc::SEEK_DATA)? else {
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut at = data;
        while at < hole {
            let n = usize::try_from(hole - at).map_or(buffer.len(), |n| n.min(buffer.len()));
            source
                .read_exact_at(&mut buffer[..n], at)
                .map_err(read_err)?;
            target.write_all_at(&buffer[..n], at).map_err(write_err)?;
            at += n as u64;
            copied += n as u64;
        }
        offset = hole.max(data + 1);
    }
    target.sync_all().map_err(write_err)?;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: failing loudly is the point")]

    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn test_write_sparse_keeps_every_byte_and_leaves_zero_pages_as_holes() {
        let len = 64u64 << 20;
        let memory =
            vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len as usize)])
                .unwrap();
        memory.write_slice(b"boot", GuestAddress(0x1000)).unwrap();
        memory.write_slice(b"heap", GuestAddress(40 << 20)).unwrap();
        memory.write_slice(b"last", GuestAddress(len - 4)).unwrap();
        let dir = std::env::temp_dir().join(format!("airlock-sparse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (path, state) = (dir.join("memory"), dir.join("state"));
        File::create(&path).unwrap();
        File::create(&state).unwrap();
        let files = SaveFiles::open(&path, &state, len).unwrap();
        let read = |chunk: &mut [u8], at: u64| {
            memory.read_slice(chunk, GuestAddress(at)).unwrap();
            Ok(())
        };
        let written = write_sparse(read, len, &files.memory).unwrap();
        assert_eq!(written, 3 * PAGE_BYTES as u64);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        assert_eq!(&bytes[0x1000..0x1004], b"boot");
        assert_eq!(&bytes[40 << 20..(40 << 20) + 4], b"heap");
        assert_eq!(&bytes[bytes.len() - 4..], b"last");
        assert_eq!(bytes.iter().filter(|b| **b != 0).count(), 12);
        let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_reading_a_forks_memory_reads_its_own_pages_and_fills_no_hole_of_the_file() {
        use crate::memory::{GuestRam, Reservation};
        // tmpfs, where a hole read through a mapping would be allocated.
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("SKIPPED: no /dev/shm");
            return;
        }
        let path = shm.join(format!("airlock-pages-{}", std::process::id()));
        let len = 8u64 << 20;
        let file = File::create(&path).unwrap();
        file.set_len(len).unwrap();
        file.write_all_at(b"from the file", 4096).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let ram = GuestRam::new_private(Reservation::new(len).unwrap(), file).unwrap();
        // The fork's own write: a copy-on-write page of the mapping, not the file's.
        ram.memory
            .write_slice(b"the fork's own", GuestAddress(3 * 4096))
            .unwrap();
        let blocks = || std::fs::metadata(&path).unwrap().blocks();
        let before = blocks();
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let mut read = vec![0u8; len as usize];
        read_guest_pages(&ram, Some(&pagemap), &mut read, 0).unwrap();
        assert_eq!(&read[4096..4096 + 13], b"from the file");
        assert_eq!(&read[3 * 4096..3 * 4096 + 14], b"the fork's own");
        assert_eq!(read.iter().filter(|b| **b != 0).count(), 13 + 14);
        assert_eq!(blocks(), before, "reading filled holes of the file");
        // The control: the same read through the mapping fills them.
        ram.memory.read_slice(&mut read, GuestAddress(0)).unwrap();
        assert!(blocks() > before, "the control read filled no hole");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn test_copy_disk_keeps_content_and_holes() {
        let dir = std::env::temp_dir().join(format!("airlock-copy-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (from, to) = (dir.join("from.img"), dir.join("to.img"));
        let file = File::create(&from).unwrap();
        file.set_len(64 << 20).unwrap();
        file.write_all_at(b"first sector", 0).unwrap();
        file.write_all_at(b"far away", 40 << 20).unwrap();
        drop(file);
        let copied = copy_disk(&from, &to).unwrap();
        assert!(std::fs::read(&from).unwrap() == std::fs::read(&to).unwrap());
        assert!(copied < 1 << 20, "{copied} bytes copied");
        let meta = std::fs::metadata(&to).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(
            meta.blocks() * 512 < 2 << 20,
            "{} bytes allocated",
            meta.blocks() * 512
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
