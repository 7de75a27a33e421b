//! virtio-blk (virtio 1.2, section 5.2): one request queue over a raw disk file the VMM
//! opened before it confined itself (a read-only disk is opened `O_RDONLY`, so no bug of
//! this device can write it). Reads, writes, flushes and the device id; discard and
//! write-zeroes are not offered.
//!
//! Every descriptor is the guest's: [`request`] checks the chain's shape and the request's
//! bounds before a byte moves, offsets are computed with checked arithmetic, the disk is
//! never written past the capacity it had when opened, and one request moves at most
//! [`request::MAX_DATA_BYTES`] through a bounded buffer. A request the disk cannot serve
//! gets `VIRTIO_BLK_S_IOERR` or `VIRTIO_BLK_S_UNSUPP`; a chain that is no request, or a
//! descriptor outside guest memory, ends the VM ([`DeviceError`]). I/O is synchronous on
//! the vCPU thread, as Firecracker's default engine is.

pub mod request;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use super::DeviceError;
use request::{DiskShape, Header, Layout, Operation, SECTOR_BYTES, Segment};

pub const QUEUE_SIZE: u16 = 256;
/// Data descriptors per request the driver may use (two more carry the header and status).
pub const SEG_MAX: u32 = 126;
/// Bytes per data descriptor the driver may use.
pub const SIZE_MAX: u32 = 128 << 10;
/// The bounce buffer between guest memory and the disk file.
const CHUNK_BYTES: usize = 64 << 10;
/// `struct virtio_blk_config` up to `blk_size` (capacity, size_max, seg_max, geometry).
const CONFIG_BYTES: usize = 20;

/// Errors of this module (opening and attaching disks; the guest's requests never fail here).
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("opening the disk {path} failed")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the disk {path} is not a regular file of at least one 512-byte sector")]
    NotADisk { path: PathBuf },
    #[error(
        "`{0}` is not a disk argument (PATH[:ro][:id=SERIAL], a serial of 1 to 20 ASCII characters)"
    )]
    Argument(String),
    #[error(
        "the snapshot's disk {index} has {expected_sectors} sectors{}, the disk given {actual_sectors}{}",
        read_only_note(.expected_read_only),
        read_only_note(.actual_read_only)
    )]
    Mismatch {
        index: usize,
        expected_sectors: u64,
        expected_read_only: bool,
        actual_sectors: u64,
        actual_read_only: bool,
    },
    #[error("the snapshot has {expected} disks, {actual} were given")]
    Count { expected: usize, actual: usize },
}

fn read_only_note(read_only: &bool) -> &'static str {
    if *read_only { " (read-only)" } else { "" }
}

/// A disk as given on the command line: `PATH[:ro][:id=SERIAL]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub read_only: bool,
    /// What the guest's `GET_ID` returns (`/sys/block/vdX/serial`).
    pub serial: String,
}

impl DiskSpec {
    /// Parses `PATH[:ro][:id=SERIAL]` (options taken from the right, so a path may hold
    /// colons); `index` makes the default serial, `airlock-disk-N`.
    pub fn parse(text: &str, index: usize) -> Result<DiskSpec, BlockError> {
        let bad = || BlockError::Argument(text.to_owned());
        let mut path = text;
        let mut read_only = false;
        let mut serial = None;
        while let Some((head, option)) = path.rsplit_once(':') {
            match option {
                "ro" if !read_only => read_only = true,
                _ if option.starts_with("id=") && serial.is_none() => {
                    serial = Some(option["id=".len()..].to_owned());
                }
                _ => break,
            }
            path = head;
        }
        let serial = serial.unwrap_or_else(|| format!("airlock-disk-{index}"));
        let serial_ok = !serial.is_empty()
            && serial.len() <= request::ID_BYTES as usize
            && serial.bytes().all(|b| b.is_ascii_graphic());
        if path.is_empty() || !serial_ok {
            return Err(bad());
        }
        Ok(DiskSpec {
            path: PathBuf::from(path),
            read_only,
            serial,
        })
    }
}

/// An open disk file and its size as the guest sees it (whole sectors; a partial last
/// sector is not visible).
#[derive(Debug)]
pub struct Disk {
    file: File,
    read_only: bool,
    capacity_sectors: u64,
}

impl Disk {
    pub fn open(path: &Path, read_only: bool) -> Result<Disk, BlockError> {
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|source| BlockError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        Disk::from_file(file, read_only).ok_or_else(|| BlockError::NotADisk {
            path: path.to_path_buf(),
        })
    }

    /// A disk on an open file (the fuzzer's memfd); `None` unless it is a regular file of at
    /// least one sector.
    pub fn from_file(file: File, read_only: bool) -> Option<Disk> {
        let metadata = file.metadata().ok()?;
        let capacity_sectors = metadata.len() / SECTOR_BYTES;
        (metadata.is_file() && capacity_sectors > 0).then_some(Disk {
            file,
            read_only,
            capacity_sectors,
        })
    }

    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

/// The block device. After a restore it has the snapshot's shape but no file until
/// [`Block::attach`] (the VMM reopens its disks, as the vsock device rebinds its socket).
#[derive(Debug)]
pub struct Block {
    disk: Option<Disk>,
    read_only: bool,
    capacity_sectors: u64,
    serial: String,
}

impl Block {
    pub fn new(disk: Disk, serial: String) -> Block {
        Block {
            read_only: disk.read_only,
            capacity_sectors: disk.capacity_sectors,
            disk: Some(disk),
            serial,
        }
    }

    /// Opens `spec`'s file.
    pub fn open(spec: &DiskSpec) -> Result<Block, BlockError> {
        Ok(Block::new(
            Disk::open(&spec.path, spec.read_only)?,
            spec.serial.clone(),
        ))
    }

    /// A restored device, without its file.
    pub fn restored(capacity_sectors: u64, read_only: bool, serial: String) -> Block {
        Block {
            disk: None,
            read_only,
            capacity_sectors,
            serial,
        }
    }

    /// Gives a restored device its disk, which must have the snapshot's size and mode (a
    /// writable disk behind a guest that remembers a read-only one, or a shorter one, would
    /// break what the guest's page cache holds).
    pub fn attach(&mut self, disk: Disk, index: usize) -> Result<(), BlockError> {
        if disk.capacity_sectors != self.capacity_sectors || disk.read_only != self.read_only {
            return Err(BlockError::Mismatch {
                index,
                expected_sectors: self.capacity_sectors,
                expected_read_only: self.read_only,
                actual_sectors: disk.capacity_sectors,
                actual_read_only: disk.read_only,
            });
        }
        self.disk = Some(disk);
        Ok(())
    }

    pub fn attached(&self) -> bool {
        self.disk.is_some()
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }

    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Offered features: segment limits, flush, and read-only when it is.
    pub fn features(&self) -> u64 {
        let mut features =
            1 << VIRTIO_BLK_F_SIZE_MAX | 1 << VIRTIO_BLK_F_SEG_MAX | 1 << VIRTIO_BLK_F_FLUSH;
        if self.read_only {
            features |= 1 << VIRTIO_BLK_F_RO;
        }
        features
    }

    /// Configuration space: capacity (le64, sectors), size_max, seg_max (le32), geometry 0.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; CONFIG_BYTES];
        config[0..8].copy_from_slice(&self.capacity_sectors.to_le_bytes());
        config[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        for (i, byte) in data.iter_mut().enumerate() {
            let at = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .saturating_add(i);
            *byte = config.get(at).copied().unwrap_or(0);
        }
    }

    fn shape(&self) -> DiskShape {
        DiskShape {
            capacity_sectors: self.capacity_sectors,
            read_only: self.read_only,
            attached: self.disk.is_some(),
        }
    }

    /// Serves every request the guest made available; `Ok(true)` when any was used.
    pub fn process(
        &mut self,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        // Collect the heads first: the iterator borrows the queue, add_used needs it mutably.
        let chains: Vec<_> = queue
            .iter(memory)
            .map_err(DeviceError::AvailRing)?
            .collect();
        let used = !chains.is_empty();
        let mut buffer = vec![0u8; CHUNK_BYTES];
        for chain in chains {
            let head = chain.head_index();
            let segments = chain
                .map(|d| Segment {
                    address: d.addr().0,
                    len: d.len(),
                    writable: d.is_write_only(),
                })
                .collect();
            let layout = Layout::of(segments)
                .map_err(|problem| DeviceError::BlockChain { head, problem })?;
            let written = self
                .serve(&layout, memory, &mut buffer)
                .map_err(|source| DeviceError::Descriptor { head, source })?;
            queue
                .add_used(memory, head, written)
                .map_err(DeviceError::UsedRing)?;
        }
        Ok(used)
    }

    /// One request: its status in the last writable byte; returns the bytes written into
    /// the guest's buffers (data and status), the used element's length.
    fn serve(
        &mut self,
        layout: &Layout,
        memory: &GuestMemoryMmap,
        buffer: &mut [u8],
    ) -> Result<u32, GuestMemoryError> {
        let mut header = [0u8; request::HEADER_BYTES as usize];
        copy_from_guest(memory, layout, 0, &mut header)?;
        let (status, data_written) =
            match request::check(Header::parse(&header), layout, self.shape()) {
                Err(status) => (status, 0),
                Ok(operation) => self.perform(operation, layout, memory, buffer)?,
            };
        let at = layout.in_data_bytes();
        copy_to_guest(memory, layout, at, &[status])?;
        // At most MAX_DATA_BYTES (or 20) plus the status: fits.
        Ok(u32::try_from(data_written + 1).unwrap_or(u32::MAX))
    }

    /// Moves the data of a checked request; returns (status, data bytes written to the guest).
    /// A host I/O error is the guest's `VIRTIO_BLK_S_IOERR`; guest memory errors end the VM.
    fn perform(
        &mut self,
        operation: Operation,
        layout: &Layout,
        memory: &GuestMemoryMmap,
        buffer: &mut [u8],
    ) -> Result<(u8, u64), GuestMemoryError> {
        const OK: u8 = 0;
        let Some(disk) = &self.disk else {
            return Ok((request::STATUS_IOERR, 0));
        };
        match operation {
            Operation::Read {
                offset_bytes,
                len_bytes,
            } => {
                let mut done = 0u64;
                while done < len_bytes {
                    let n = chunk(len_bytes - done, buffer.len());
                    if disk
                        .file
                        .read_exact_at(&mut buffer[..n], offset_bytes + done)
                        .is_err()
                    {
                        return Ok((request::STATUS_IOERR, done));
                    }
                    copy_to_guest(memory, layout, done, &buffer[..n])?;
                    done += n as u64;
                }
                Ok((OK, done))
            }
            Operation::Write {
                offset_bytes,
                len_bytes,
            } => {
                let mut done = 0u64;
                while done < len_bytes {
                    let n = chunk(len_bytes - done, buffer.len());
                    copy_from_guest(
                        memory,
                        layout,
                        request::HEADER_BYTES + done,
                        &mut buffer[..n],
                    )?;
                    if disk
                        .file
                        .write_all_at(&buffer[..n], offset_bytes + done)
                        .is_err()
                    {
                        return Ok((request::STATUS_IOERR, 0));
                    }
                    done += n as u64;
                }
                Ok((OK, 0))
            }
            Operation::Flush => {
                if !disk.read_only && disk.file.sync_data().is_err() {
                    return Ok((request::STATUS_IOERR, 0));
                }
                Ok((OK, 0))
            }
            Operation::GetId { len_bytes } => {
                // NUL-padded; a 20-byte serial has no terminator (5.2.6).
                let mut id = [0u8; request::ID_BYTES as usize];
                let serial = self.serial.as_bytes();
                let n = serial.len().min(id.len());
                id[..n].copy_from_slice(&serial[..n]);
                let len = usize::try_from(len_bytes).unwrap_or(0).min(id.len());
                copy_to_guest(memory, layout, 0, &id[..len])?;
                Ok((OK, len as u64))
            }
        }
    }
}

fn chunk(left: u64, buffer: usize) -> usize {
    usize::try_from(left).map_or(buffer, |left| left.min(buffer))
}

fn overflow(layout: &Layout) -> GuestMemoryError {
    let first = layout.segments.first().map_or(0, |s| s.address);
    GuestMemoryError::InvalidGuestAddress(GuestAddress(first))
}

/// Reads `out.len()` bytes of the chain's readable stream from `offset`.
fn copy_from_guest(
    memory: &GuestMemoryMmap,
    layout: &Layout,
    offset: u64,
    out: &mut [u8],
) -> Result<(), GuestMemoryError> {
    let ranges = layout
        .ranges(false, offset, out.len() as u64)
        .ok_or_else(|| overflow(layout))?;
    let mut at = 0usize;
    for (address, len) in ranges {
        let len = len as usize;
        memory.read_slice(&mut out[at..at + len], GuestAddress(address))?;
        at += len;
    }
    Ok(())
}

/// Writes `bytes` into the chain's writable stream from `offset`.
fn copy_to_guest(
    memory: &GuestMemoryMmap,
    layout: &Layout,
    offset: u64,
    bytes: &[u8],
) -> Result<(), GuestMemoryError> {
    let ranges = layout
        .ranges(true, offset, bytes.len() as u64)
        .ok_or_else(|| overflow(layout))?;
    let mut at = 0usize;
    for (address, len) in ranges {
        let len = len as usize;
        memory.write_slice(&bytes[at..at + len], GuestAddress(address))?;
        at += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: failing loudly is the point")]

    use super::*;

    #[test]
    fn test_disk_spec_parses_read_only_and_serial_from_the_right() {
        assert_eq!(
            DiskSpec::parse("/a/b.ext4", 0).unwrap(),
            DiskSpec {
                path: "/a/b.ext4".into(),
                read_only: false,
                serial: "airlock-disk-0".into()
            }
        );
        assert_eq!(
            DiskSpec::parse("/x:y/root.ext4:ro:id=rootfs", 1).unwrap(),
            DiskSpec {
                path: "/x:y/root.ext4".into(),
                read_only: true,
                serial: "rootfs".into()
            }
        );
        assert_eq!(
            DiskSpec::parse("d.img:id=overlay:ro", 2).unwrap().serial,
            "overlay"
        );
    }

    #[test]
    fn test_disk_spec_bad_serial_or_empty_path_is_refused_by_name() {
        for text in [
            "",
            ":ro",
            "d.img:id=",
            "d.img:id=twenty-one-characters",
            "d.img:id=with space",
        ] {
            let err = DiskSpec::parse(text, 0).unwrap_err();
            assert!(
                err.to_string().contains("not a disk argument"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn test_block_config_space_reads_capacity_and_limits() {
        let block = Block::restored(0x1_0000_0002, true, "s".into());
        let mut capacity = [0u8; 8];
        block.read_config(0, &mut capacity);
        assert_eq!(u64::from_le_bytes(capacity), 0x1_0000_0002);
        let mut high = [0u8; 4];
        block.read_config(4, &mut high);
        assert_eq!(u32::from_le_bytes(high), 1);
        let mut seg_max = [0u8; 4];
        block.read_config(12, &mut seg_max);
        assert_eq!(u32::from_le_bytes(seg_max), SEG_MAX);
        let mut beyond = [0xffu8; 4];
        block.read_config(u64::MAX, &mut beyond);
        assert_eq!(beyond, [0; 4]);
        assert_ne!(block.features() & 1 << VIRTIO_BLK_F_RO, 0);
    }

    #[test]
    fn test_block_transport_offers_its_id_features_and_capacity() {
        let transport = crate::virtio::MmioTransport::new(crate::virtio::Device::Block(
            Block::restored(8, true, "s".into()),
        ));
        let read32 = |offset| {
            let mut value = [0u8; 4];
            transport.read(offset, &mut value);
            u32::from_le_bytes(value)
        };
        assert_eq!(read32(0x008), 2, "VIRTIO_ID_BLOCK");
        // SIZE_MAX, SEG_MAX, RO, FLUSH in the low word; VERSION_1 in the high one.
        assert_eq!(read32(0x010), 1 << 1 | 1 << 2 | 1 << 5 | 1 << 9);
        assert_eq!(read32(0x100), 8, "capacity in sectors");
        assert_eq!(read32(0x10c), SEG_MAX);
    }

    #[test]
    fn test_block_attach_refuses_a_disk_of_another_shape() {
        let path =
            std::env::temp_dir().join(format!("airlock-block-attach-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let mut block = Block::restored(16, false, "s".into());
        let err = block
            .attach(Disk::open(&path, true).unwrap(), 0)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("16 sectors, the disk given 8 (read-only)"),
            "{err}"
        );
        let mut block = Block::restored(8, true, "s".into());
        block.attach(Disk::open(&path, true).unwrap(), 0).unwrap();
        assert!(block.attached());
        std::fs::remove_file(path).unwrap();
    }
}
