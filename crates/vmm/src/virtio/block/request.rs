//! A virtio-blk request as the guest laid it out, checked before any byte moves (virtio 1.2,
//! 5.2.6). Pure functions of the descriptors and the 16-byte header, so every rule is unit
//! tested without guest memory or a disk.
//!
//! The layout is taken as two byte streams, as VIRTIO_F_VERSION_1 requires of a device (no
//! assumption on how the driver splits a request into descriptors): the device-readable
//! descriptors (the header, then a write's data) and, after them, the device-writable ones
//! (a read's data or the id, then the status byte, the last writable byte). A chain that
//! does not have that shape is a broken driver or a hostile one, and ends the VM
//! ([`ChainError`]); a well-shaped request the disk cannot serve (out of range, a write to a
//! read-only disk, an unknown type) gets an error status and the VM carries on.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};

/// `struct virtio_blk_outhdr`: type (le32), reserved (le32), sector (le64).
pub const HEADER_BYTES: u64 = 16;
pub const SECTOR_BYTES: u64 = 512;
/// The largest read or write this device serves; bigger ones get `VIRTIO_BLK_S_IOERR`. The
/// device offers `seg_max` × `size_max` of exactly this, so a driver keeping to its features
/// never asks for more, and one request costs the host bounded work.
pub const MAX_DATA_BYTES: u64 = super::SEG_MAX as u64 * super::SIZE_MAX as u64;
pub const STATUS_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
pub const STATUS_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;
pub const ID_BYTES: u64 = VIRTIO_BLK_ID_BYTES as u64;

/// One descriptor of a chain, as the device sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub address: u64,
    pub len: u32,
    /// Device-writable (`VIRTQ_DESC_F_WRITE`).
    pub writable: bool,
}

/// Why a chain is not a block request at all (the VM is stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("a device-readable descriptor follows a device-writable one")]
    ReadableAfterWritable,
    #[error("its readable part has {0} bytes, fewer than the 16-byte request header")]
    NoHeader(u64),
    #[error("it has no device-writable byte for the status")]
    NoStatus,
}

/// A chain split into its readable and writable streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub segments: Vec<Segment>,
    pub readable_bytes: u64,
    pub writable_bytes: u64,
}

impl Layout {
    /// Checks the chain's shape. Sums cannot overflow: a chain has at most a queue's worth
    /// (≤ 32768) of descriptors of at most 4 GiB each.
    pub fn of(segments: Vec<Segment>) -> Result<Layout, ChainError> {
        let mut readable_bytes = 0u64;
        let mut writable_bytes = 0u64;
        for segment in &segments {
            if segment.writable {
                writable_bytes += u64::from(segment.len);
            } else if writable_bytes > 0 {
                return Err(ChainError::ReadableAfterWritable);
            } else {
                readable_bytes += u64::from(segment.len);
            }
        }
        if readable_bytes < HEADER_BYTES {
            return Err(ChainError::NoHeader(readable_bytes));
        }
        if writable_bytes == 0 {
            return Err(ChainError::NoStatus);
        }
        Ok(Layout {
            segments,
            readable_bytes,
            writable_bytes,
        })
    }

    /// Bytes after the header: what a write carries.
    pub fn out_data_bytes(&self) -> u64 {
        self.readable_bytes - HEADER_BYTES
    }

    /// Writable bytes before the status byte: room for a read's data or the id.
    pub fn in_data_bytes(&self) -> u64 {
        self.writable_bytes - 1
    }

    /// The guest ranges holding `len` bytes of the readable (`writable == false`) or writable
    /// stream from byte `offset` on, in order. The caller checked the range lies in the
    /// stream; `None` when an address overflows.
    pub fn ranges(&self, writable: bool, offset: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        let mut skip = offset;
        let mut left = len;
        for segment in self.segments.iter().filter(|s| s.writable == writable) {
            if left == 0 {
                break;
            }
            let size = u64::from(segment.len);
            if skip >= size {
                skip -= size;
                continue;
            }
            let take = (size - skip).min(left);
            out.push((segment.address.checked_add(skip)?, take));
            left -= take;
            skip = 0;
        }
        (left == 0).then_some(out)
    }
}

/// The request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub type_: u32,
    pub sector: u64,
}

impl Header {
    pub fn parse(bytes: &[u8; HEADER_BYTES as usize]) -> Header {
        let [t0, t1, t2, t3, _, _, _, _, s @ ..] = *bytes;
        Header {
            type_: u32::from_le_bytes([t0, t1, t2, t3]),
            sector: u64::from_le_bytes(s),
        }
    }
}

/// What the disk looks like to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskShape {
    pub capacity_sectors: u64,
    pub read_only: bool,
    /// A restored device whose disk file has not been given back yet serves nothing.
    pub attached: bool,
}

/// A request that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Disk bytes `offset_bytes..offset_bytes + len_bytes` into the writable stream.
    Read {
        offset_bytes: u64,
        len_bytes: u64,
    },
    /// The readable stream after the header onto the disk at `offset_bytes`.
    Write {
        offset_bytes: u64,
        len_bytes: u64,
    },
    Flush,
    /// The serial into the first `len_bytes` writable bytes (at most 20).
    GetId {
        len_bytes: u64,
    },
}

/// The rules of 5.2.6: data in whole sectors, inside the disk, at most [`MAX_DATA_BYTES`];
/// no write to a read-only disk (`VIRTIO_BLK_S_IOERR`, nothing written); any other type,
/// discard and write-zeroes included, is `VIRTIO_BLK_S_UNSUPP`. `Err` is the status to give.
pub fn check(header: Header, layout: &Layout, disk: DiskShape) -> Result<Operation, u8> {
    let range = |len_bytes: u64| -> Result<u64, u8> {
        let offset_bytes = header
            .sector
            .checked_mul(SECTOR_BYTES)
            .ok_or(STATUS_IOERR)?;
        let end = offset_bytes.checked_add(len_bytes).ok_or(STATUS_IOERR)?;
        let capacity = disk.capacity_sectors.saturating_mul(SECTOR_BYTES);
        if !len_bytes.is_multiple_of(SECTOR_BYTES) || len_bytes > MAX_DATA_BYTES || end > capacity {
            return Err(STATUS_IOERR);
        }
        Ok(offset_bytes)
    };
    match header.type_ {
        _ if !disk.attached => Err(STATUS_IOERR),
        VIRTIO_BLK_T_IN => {
            let len_bytes = layout.in_data_bytes();
            let offset_bytes = range(len_bytes)?;
            Ok(Operation::Read {
                offset_bytes,
                len_bytes,
            })
        }
        VIRTIO_BLK_T_OUT if disk.read_only => Err(STATUS_IOERR),
        VIRTIO_BLK_T_OUT => {
            let len_bytes = layout.out_data_bytes();
            let offset_bytes = range(len_bytes)?;
            Ok(Operation::Write {
                offset_bytes,
                len_bytes,
            })
        }
        VIRTIO_BLK_T_FLUSH => Ok(Operation::Flush),
        VIRTIO_BLK_T_GET_ID => Ok(Operation::GetId {
            len_bytes: layout.in_data_bytes().min(ID_BYTES),
        }),
        _ => Err(STATUS_UNSUPP),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: failing loudly is the point")]

    use super::*;

    const DISK: DiskShape = DiskShape {
        capacity_sectors: 64,
        read_only: false,
        attached: true,
    };

    fn readable(address: u64, len: u32) -> Segment {
        Segment {
            address,
            len,
            writable: false,
        }
    }

    fn writable(address: u64, len: u32) -> Segment {
        Segment {
            address,
            len,
            writable: true,
        }
    }

    /// Header, `data` bytes of data in the direction of `type_`, status.
    fn request(type_: u32, data: u32) -> Layout {
        let mut segments = vec![readable(0x1000, 16)];
        if type_ == VIRTIO_BLK_T_OUT {
            segments.push(readable(0x2000, data));
        } else if data > 0 {
            segments.push(writable(0x2000, data));
        }
        segments.push(writable(0x3000, 1));
        Layout::of(segments).unwrap()
    }

    fn header(type_: u32, sector: u64) -> Header {
        Header { type_, sector }
    }

    #[test]
    fn test_header_parse_reads_little_endian_type_and_sector() {
        let mut bytes = [0u8; 16];
        bytes[0] = 1;
        bytes[4] = 0xff; // reserved: ignored
        bytes[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(Header::parse(&bytes), header(1, 0x0102_0304_0506_0708));
    }

    #[test]
    fn test_layout_readable_after_writable_is_a_bad_chain() {
        let segments = vec![readable(0, 16), writable(16, 1), readable(32, 512)];
        assert_eq!(Layout::of(segments), Err(ChainError::ReadableAfterWritable));
    }

    #[test]
    fn test_layout_short_header_or_no_status_is_a_bad_chain() {
        assert_eq!(
            Layout::of(vec![readable(0, 15), writable(16, 1)]),
            Err(ChainError::NoHeader(15))
        );
        assert_eq!(
            Layout::of(vec![readable(0, 528)]),
            Err(ChainError::NoStatus)
        );
        assert_eq!(Layout::of(vec![]), Err(ChainError::NoHeader(0)));
    }

    #[test]
    fn test_layout_header_split_over_descriptors_is_accepted() {
        let layout = Layout::of(vec![
            readable(0x100, 4),
            readable(0x200, 12),
            readable(0x300, 512),
            writable(0x400, 1),
        ])
        .unwrap();
        assert_eq!(layout.out_data_bytes(), 512);
        assert_eq!(
            layout.ranges(false, 0, 16),
            Some(vec![(0x100, 4), (0x200, 12)])
        );
        assert_eq!(layout.ranges(false, 16, 512), Some(vec![(0x300, 512)]));
    }

    #[test]
    fn test_layout_ranges_span_segments_and_refuse_overflow() {
        let layout = Layout::of(vec![
            readable(0, 16),
            writable(0x1000, 300),
            writable(0x2000, 213),
        ])
        .unwrap();
        assert_eq!(
            layout.ranges(true, 0, 512),
            Some(vec![(0x1000, 300), (0x2000, 212)])
        );
        assert_eq!(layout.ranges(true, 512, 1), Some(vec![(0x2000 + 212, 1)]));
        assert_eq!(layout.ranges(true, 512, 2), None, "past the stream");
        let wraps = Layout::of(vec![readable(0, 16), writable(u64::MAX, 2)]).unwrap();
        assert_eq!(wraps.ranges(true, 1, 1), None);
    }

    #[test]
    fn test_check_read_and_write_inside_the_disk_pass() {
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_IN, 2),
                &request(VIRTIO_BLK_T_IN, 1024),
                DISK
            ),
            Ok(Operation::Read {
                offset_bytes: 1024,
                len_bytes: 1024
            })
        );
        // The last sector, exactly.
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_OUT, 63),
                &request(VIRTIO_BLK_T_OUT, 512),
                DISK
            ),
            Ok(Operation::Write {
                offset_bytes: 63 * 512,
                len_bytes: 512
            })
        );
    }

    #[test]
    fn test_check_past_the_end_or_overflowing_sector_is_ioerr() {
        for sector in [64, 63 + 1, u64::MAX, u64::MAX / 512, u64::MAX / 512 - 1] {
            for type_ in [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT] {
                assert_eq!(
                    check(header(type_, sector), &request(type_, 512), DISK),
                    Err(STATUS_IOERR),
                    "type {type_} sector {sector}"
                );
            }
        }
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_IN, 63),
                &request(VIRTIO_BLK_T_IN, 1024),
                DISK
            ),
            Err(STATUS_IOERR),
            "runs over the end"
        );
    }

    #[test]
    fn test_check_partial_sector_or_oversized_data_is_ioerr() {
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_IN, 0),
                &request(VIRTIO_BLK_T_IN, 100),
                DISK
            ),
            Err(STATUS_IOERR)
        );
        let big = DiskShape {
            capacity_sectors: u64::MAX / 512,
            ..DISK
        };
        let too_much = u32::try_from(MAX_DATA_BYTES + 512).unwrap();
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_OUT, 0),
                &request(VIRTIO_BLK_T_OUT, too_much),
                big
            ),
            Err(STATUS_IOERR)
        );
    }

    #[test]
    fn test_check_write_to_read_only_disk_is_ioerr_read_and_flush_pass() {
        let read_only = DiskShape {
            read_only: true,
            ..DISK
        };
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_OUT, 0),
                &request(VIRTIO_BLK_T_OUT, 512),
                read_only
            ),
            Err(STATUS_IOERR)
        );
        assert!(
            check(
                header(VIRTIO_BLK_T_IN, 0),
                &request(VIRTIO_BLK_T_IN, 512),
                read_only
            )
            .is_ok()
        );
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_FLUSH, 0),
                &request(VIRTIO_BLK_T_FLUSH, 0),
                read_only
            ),
            Ok(Operation::Flush)
        );
    }

    #[test]
    fn test_check_unknown_discard_and_write_zeroes_are_unsupported() {
        // 11 is DISCARD, 13 WRITE_ZEROES, 14 SECURE_ERASE: not offered.
        for type_ in [2, 3, 11, 13, 14, u32::MAX] {
            assert_eq!(
                check(header(type_, 0), &request(VIRTIO_BLK_T_IN, 512), DISK),
                Err(STATUS_UNSUPP),
                "type {type_}"
            );
        }
    }

    #[test]
    fn test_check_get_id_fills_at_most_twenty_bytes() {
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_GET_ID, 0),
                &request(VIRTIO_BLK_T_GET_ID, 512),
                DISK
            ),
            Ok(Operation::GetId { len_bytes: 20 })
        );
        assert_eq!(
            check(
                header(VIRTIO_BLK_T_GET_ID, 0),
                &request(VIRTIO_BLK_T_GET_ID, 8),
                DISK
            ),
            Ok(Operation::GetId { len_bytes: 8 })
        );
    }

    #[test]
    fn test_check_detached_disk_serves_nothing() {
        let detached = DiskShape {
            attached: false,
            ..DISK
        };
        for type_ in [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID] {
            assert_eq!(
                check(header(type_, 0), &request(type_, 512), detached),
                Err(STATUS_IOERR)
            );
        }
    }
}
