//! The virtio-blk device driven by a freestanding guest on this host's /dev/kvm (hardware KVM
//! or PVM): the host lays requests out in guest memory, the guest sets the device up through
//! its MMIO registers and notifies the queue, the device reads and writes a real disk file.
//! Without /dev/kvm each test prints why and returns; with it, everything must work.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::path::{Path, PathBuf};

use airlock_vmm::fork::Template;
use airlock_vmm::fuzzing::block::{Requests, header};
use airlock_vmm::guest_code::{self, CODE_ADDRESS, queue_layout};
use airlock_vmm::snapshot::{self, read_guest};
use airlock_vmm::virtio::block::{Block, Disk, DiskSpec};
use airlock_vmm::virtio::{Device, DeviceState, MMIO_BASE};
use airlock_vmm::vm::{Vm, VmConfig, VmError, VmExit, VmShell, Vmm};

const MEMORY_BYTES: u64 = 2 << 20;
const QUEUE_SIZE: u32 = 32;
const SECTORS: u64 = 16;
const HEADERS: u32 = 0x14000;
const STATUS: u32 = 0x15000;
const WRITE_DATA: u32 = 0x16000;
const READ_DATA: u32 = 0x17000;
const ID: u32 = 0x18000;
const SPARE: u32 = 0x19000;
const SECTOR: u64 = 5;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const T_DISCARD: u32 = 11;

fn vmm() -> Option<Vmm> {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm does not exist on this host");
        return None;
    }
    Some(Vmm::new().unwrap_or_else(|e| panic!("/dev/kvm exists but: {}", error_chain(&e))))
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A disk file removed on drop.
struct DiskFile(PathBuf);

impl DiskFile {
    /// `SECTORS` sectors, each filled with 0x11.
    fn new(name: &str) -> DiskFile {
        let path = std::env::temp_dir().join(format!(
            "airlock-vmm-block-{name}-{}.img",
            std::process::id()
        ));
        std::fs::write(&path, vec![0x11u8; (SECTORS * 512) as usize]).unwrap();
        DiskFile(path)
    }

    fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn written_pattern() -> Vec<u8> {
    (0..512)
        .map(|i| b"sector from the guest "[i % 22])
        .collect()
}

/// A request: its type, sector, and the descriptors after its header (address, length,
/// device-writable).
type Request = (u32, u64, Vec<(u32, u32, bool)>);

/// Boots the preloaded-queue driver with `chains` laid out in guest memory, on one block
/// device.
fn boot(vmm: &Vmm, block: Block, chains: &[Request]) -> Vm {
    use queue_layout::{AVAIL_RING, DESC_TABLE};
    let mut requests = Requests::new();
    let mut image = vec![(
        CODE_ADDRESS,
        guest_code::preloaded_queue_driver(MMIO_BASE as u32, QUEUE_SIZE),
    )];
    for (i, (type_, sector, rest)) in chains.iter().enumerate() {
        let at = HEADERS + 16 * i as u32;
        image.push((u64::from(at), header(*type_, *sector).to_vec()));
        let mut parts = vec![(at, 16, false)];
        parts.extend_from_slice(rest);
        requests.push(&parts);
    }
    image.push((u64::from(DESC_TABLE), requests.table()));
    image.push((u64::from(AVAIL_RING), requests.avail(QUEUE_SIZE)));
    image.push((u64::from(WRITE_DATA), written_pattern()));
    image.push((u64::from(STATUS), vec![0xff; 16]));
    let config = VmConfig {
        memory_bytes: MEMORY_BYTES,
        entry: CODE_ADDRESS,
        image,
        entropy_device: false,
    };
    let shell = VmShell::create(vmm, 1, MEMORY_BYTES).unwrap();
    Vm::boot_with_devices(vmm, shell, &config, vec![Device::Block(block)])
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)))
}

fn block(disk: &DiskFile, read_only: bool) -> Block {
    Block::open(&DiskSpec {
        path: disk.0.clone(),
        read_only,
        serial: "test-disk".into(),
    })
    .unwrap()
}

/// Write sector 5, read it back, get the id, flush, read past the end, discard.
fn the_requests() -> Vec<Request> {
    vec![
        (
            T_OUT,
            SECTOR,
            vec![(WRITE_DATA, 512, false), (STATUS, 1, true)],
        ),
        (
            T_IN,
            SECTOR,
            vec![(READ_DATA, 512, true), (STATUS + 1, 1, true)],
        ),
        (T_GET_ID, 0, vec![(ID, 20, true), (STATUS + 2, 1, true)]),
        (T_FLUSH, 0, vec![(STATUS + 3, 1, true)]),
        (
            T_IN,
            SECTORS,
            vec![(SPARE, 512, true), (STATUS + 4, 1, true)],
        ),
        (
            T_DISCARD,
            0,
            vec![(SPARE, 16, false), (STATUS + 5, 1, true)],
        ),
    ]
}

fn used_lengths(vm: &Vm, count: usize) -> Vec<u32> {
    let used = read_guest(vm, u64::from(queue_layout::USED_RING), 4 + 8 * count).unwrap();
    assert_eq!(
        usize::from(u16::from_le_bytes([used[2], used[3]])),
        count,
        "used index"
    );
    (0..count)
        .map(|i| u32::from_le_bytes(used[8 + 8 * i..12 + 8 * i].try_into().unwrap()))
        .collect()
}

#[test]
fn test_block_guest_writes_a_sector_and_reads_it_back_from_the_disk_file() {
    let Some(vmm) = vmm() else { return };
    let disk = DiskFile::new("rw");
    let mut vm = boot(&vmm, block(&disk, false), &the_requests());
    assert_eq!(vm.run(Some(10_000)).unwrap(), VmExit::Reset);
    assert_eq!(vm.console().contents(), b"ok");
    // OK for write, read, id and flush; IOERR past the end; UNSUPP for discard.
    assert_eq!(
        read_guest(&vm, u64::from(STATUS), 6).unwrap(),
        [0, 0, 0, 0, 1, 2]
    );
    assert_eq!(used_lengths(&vm, 6), [1, 513, 21, 1, 1, 1]);
    let contents = disk.contents();
    let at = (SECTOR * 512) as usize;
    assert_eq!(&contents[at..at + 512], &written_pattern()[..]);
    assert!(contents[..at].iter().all(|&b| b == 0x11));
    assert!(contents[at + 512..].iter().all(|&b| b == 0x11));
    assert_eq!(contents.len() as u64, SECTORS * 512, "the disk grew");
    assert_eq!(
        read_guest(&vm, u64::from(READ_DATA), 512).unwrap(),
        written_pattern()
    );
    assert_eq!(
        read_guest(&vm, u64::from(ID), 20).unwrap(),
        b"test-disk\0\0\0\0\0\0\0\0\0\0\0"
    );
    // The guest acknowledged the interrupt it was sent.
    assert_eq!(vm.virtio_states()[0].interrupt_status, 0);
}

#[test]
fn test_block_read_only_disk_refuses_the_guest_write_and_serves_reads() {
    let Some(vmm) = vmm() else { return };
    let disk = DiskFile::new("ro");
    let mut vm = boot(&vmm, block(&disk, true), &the_requests());
    assert_eq!(vm.run(Some(10_000)).unwrap(), VmExit::Reset);
    assert_eq!(vm.console().contents(), b"ok");
    // VIRTIO_BLK_S_IOERR for the write, nothing written; the read sees the old sector.
    assert_eq!(
        read_guest(&vm, u64::from(STATUS), 6).unwrap(),
        [1, 0, 0, 0, 1, 2]
    );
    assert!(disk.contents().iter().all(|&b| b == 0x11));
    assert_eq!(
        read_guest(&vm, u64::from(READ_DATA), 512).unwrap(),
        vec![0x11; 512]
    );
    // The snapshot state records the disk's shape, read-only included.
    assert_eq!(
        vm.virtio_states()[0].device,
        DeviceState::Block {
            capacity_sectors: SECTORS,
            read_only: true,
            serial: "test-disk".into()
        }
    );
}

#[test]
fn test_block_descriptor_outside_memory_stops_that_vm_with_a_clear_error() {
    let Some(vmm) = vmm() else { return };
    let disk = DiskFile::new("hostile");
    let requests = vec![(T_OUT, 0, vec![(0x7fff_0000, 512, false), (STATUS, 1, true)])];
    let mut vm = boot(&vmm, block(&disk, false), &requests);
    let chain = error_chain(&vm.run(Some(10_000)).unwrap_err());
    assert!(
        chain.contains("virtio-blk: handling queue 0 failed")
            && chain.contains("points outside guest memory"),
        "{chain}"
    );
    assert!(matches!(vm.run(None), Err(VmError::Stopped)));
    assert!(disk.contents().iter().all(|&b| b == 0x11));
    // The host side carries on: another VM runs.
    let mut other = boot(&vmm, block(&disk, false), &the_requests());
    assert_eq!(other.run(Some(10_000)).unwrap(), VmExit::Reset);
}

#[test]
fn test_block_chain_without_status_byte_stops_the_vm_naming_the_chain() {
    let Some(vmm) = vmm() else { return };
    let disk = DiskFile::new("nostatus");
    let requests = vec![(T_IN, 0, vec![(READ_DATA, 512, false)])];
    let mut vm = boot(&vmm, block(&disk, false), &requests);
    let chain = error_chain(&vm.run(Some(10_000)).unwrap_err());
    assert!(
        chain.contains("descriptor chain 0 is not a block request")
            && chain.contains("no device-writable byte"),
        "{chain}"
    );
}

#[test]
fn test_block_snapshot_keeps_the_device_and_restore_needs_the_same_disk() {
    let Some(vmm) = vmm() else { return };
    let disk = DiskFile::new("snap");
    let mut vm = boot(&vmm, block(&disk, false), &the_requests());
    assert_eq!(vm.run(Some(10_000)).unwrap(), VmExit::Reset);
    let dir = std::env::temp_dir().join(format!("airlock-vmm-block-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    snapshot::save(&mut vm, &dir).unwrap();
    let template = Template::from_snapshot(snapshot::load(&dir).unwrap());
    let before = vm.virtio_states()[0].clone();

    let mut restored = template.fork(&vmm, None).unwrap();
    assert_eq!(restored.virtio_states()[0], before);
    // A disk of another size, a read-only one, or none at all is refused by name.
    let short = DiskFile::new("short");
    std::fs::write(&short.0, vec![0u8; 512]).unwrap();
    let err = restored
        .attach_disks(vec![Disk::open(&short.0, false).unwrap()])
        .unwrap_err();
    assert!(
        error_chain(&err).contains("disk 0 has 16 sectors, the disk given 1"),
        "{}",
        error_chain(&err)
    );
    let err = restored
        .attach_disks(vec![Disk::open(&disk.0, true).unwrap()])
        .unwrap_err();
    assert!(
        error_chain(&err).contains("(read-only)"),
        "{}",
        error_chain(&err)
    );
    let err = restored.attach_disks(Vec::new()).unwrap_err();
    assert!(
        error_chain(&err).contains("the snapshot has 1 disks, 0 were given"),
        "{}",
        error_chain(&err)
    );
    restored
        .attach_disks(vec![Disk::open(&disk.0, false).unwrap()])
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
