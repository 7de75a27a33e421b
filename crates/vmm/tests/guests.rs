//! The VMM against small freestanding guests on this host's /dev/kvm (hardware KVM or PVM).
//! Without /dev/kvm each test prints why and returns; with it, everything must work.

use airlock_vmm::fork::{ShellPool, Template};
use airlock_vmm::guest_code::{self, CODE_ADDRESS, COUNTER_ADDRESS, queue_layout};
use airlock_vmm::snapshot::{self, read_guest};
use airlock_vmm::virtio::MMIO_BASE;
use airlock_vmm::vm::{Vm, VmConfig, VmError, VmExit, VmShell, Vmm};
use vm_memory::Bytes;

const MEMORY_BYTES: u64 = 2 << 20;

fn vmm() -> Option<Vmm> {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm does not exist on this host");
        return None;
    }
    Some(Vmm::new().unwrap_or_else(|e| panic!("/dev/kvm exists but: {}", error_chain(&e))))
}

fn boot(vmm: &Vmm, code: Vec<u8>, entropy_device: bool) -> Vm {
    let config = VmConfig {
        memory_bytes: MEMORY_BYTES,
        entry: CODE_ADDRESS,
        image: vec![(CODE_ADDRESS, code)],
        entropy_device,
    };
    let shell = VmShell::create(vmm, usize::from(entropy_device), MEMORY_BYTES)
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    Vm::boot(vmm, shell, &config).unwrap_or_else(|e| panic!("{}", error_chain(&e)))
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-vmm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn test_vm_hello_guest_prints_on_console_and_resets() {
    let Some(vmm) = vmm() else { return };
    let mut vm = boot(&vmm, guest_code::hello(b"hello from the guest\n"), false);
    assert_eq!(vm.run(Some(10_000)).unwrap(), VmExit::Reset);
    assert_eq!(vm.console().contents(), b"hello from the guest\n");
}

#[test]
fn test_vm_cmos_register_d_reads_battery_good() {
    let Some(vmm) = vmm() else { return };
    let mut vm = boot(&vmm, guest_code::cmos_reader(0x0d), false);
    assert_eq!(vm.run(Some(100)).unwrap(), VmExit::Reset);
    assert_eq!(vm.console().contents(), [0x80]);
}

#[test]
fn test_vm_vcpu_starts_in_flat_protected_mode_at_entry() {
    let Some(vmm) = vmm() else { return };
    let vm = boot(&vmm, guest_code::hello(b""), false);
    let regs = vm.vcpu().get_regs().unwrap();
    let sregs = vm.vcpu().get_sregs().unwrap();
    assert_eq!(regs.rip, CODE_ADDRESS);
    assert_eq!(sregs.cr0 & 1, 1, "protected mode");
    assert_eq!(
        (sregs.cs.db, sregs.cs.base, sregs.cs.limit),
        (1, 0, 0xffff_ffff)
    );
}

#[test]
fn test_vm_entropy_driver_gets_random_bytes_through_the_queue() {
    use queue_layout::*;
    let Some(vmm) = vmm() else { return };
    let code = guest_code::entropy_driver(MMIO_BASE as u32, BUFFER, BUFFER_LEN);
    let mut vm = boot(&vmm, code, true);
    assert_eq!(vm.run(Some(10_000)).unwrap(), VmExit::Reset);
    assert_eq!(vm.console().contents(), b"ok");
    let used = read_guest(&vm, u64::from(USED_RING), 12).unwrap();
    let used_idx = u16::from_le_bytes([used[2], used[3]]);
    let used_id = u32::from_le_bytes(used[4..8].try_into().unwrap());
    let used_len = u32::from_le_bytes(used[8..12].try_into().unwrap());
    assert_eq!((used_idx, used_id, used_len), (1, 0, BUFFER_LEN));
    let buffer = read_guest(&vm, u64::from(BUFFER), BUFFER_LEN as usize).unwrap();
    assert!(
        buffer.iter().filter(|&&b| b != 0).count() > 32,
        "{buffer:?}"
    );
    // The guest acknowledged the interrupt it was sent.
    assert_eq!(vm.virtio_states()[0].interrupt_status, 0);
}

#[test]
fn test_vm_descriptor_outside_memory_stops_that_vm_with_a_clear_error() {
    let Some(vmm) = vmm() else { return };
    let code = guest_code::entropy_driver(MMIO_BASE as u32, 0x7fff_0000, 64);
    let mut vm = boot(&vmm, code, true);
    let err = vm.run(Some(10_000)).unwrap_err();
    let chain = error_chain(&err);
    assert!(
        chain.contains("virtio-rng: handling queue 0 failed")
            && chain.contains("points outside guest memory"),
        "{chain}"
    );
    assert!(matches!(vm.run(None), Err(VmError::Stopped)));
    // The host side carries on: another VM runs.
    let mut other = boot(&vmm, guest_code::hello(b"still here"), false);
    assert_eq!(other.run(Some(1000)).unwrap(), VmExit::Reset);
}

/// A vsock packet header from the guest (CID 3, port 50000) to host port `port`.
fn vsock_packet(port: u32, op: u16, payload: &[u8]) -> Vec<u8> {
    let header = airlock_vmm::virtio::vsock::Header {
        src_cid: 3,
        dst_cid: 2,
        src_port: 50_000,
        dst_port: port,
        len: payload.len() as u32,
        type_: 1,
        op,
        buf_alloc: 65536,
        ..Default::default()
    };
    let mut packet = header.bytes().to_vec();
    packet.extend_from_slice(payload);
    packet
}

/// A descriptor table of `(address, len, writable)` entries, and an avail ring naming each.
fn preloaded_queue(buffers: &[(u32, u32, bool)]) -> (Vec<u8>, Vec<u8>) {
    let mut table = Vec::new();
    for (address, len, writable) in buffers {
        table.extend_from_slice(&u64::from(*address).to_le_bytes());
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&u16::from(*writable).wrapping_mul(2).to_le_bytes());
        table.extend_from_slice(&0u16.to_le_bytes());
    }
    let mut avail = vec![0, 0];
    avail.extend_from_slice(&(buffers.len() as u16).to_le_bytes());
    for i in 0..buffers.len() as u16 {
        avail.extend_from_slice(&i.to_le_bytes());
    }
    (table, avail)
}

#[test]
fn test_vm_vsock_guest_connects_to_a_forwarded_host_port_and_is_reset_on_another() {
    use airlock_vmm::guest_code::vsock_layout::*;
    use airlock_vmm::virtio::{Device, Forward, Vsock};
    use queue_layout::*;
    let Some(vmm) = vmm() else { return };
    let dir = scratch("vsock-forward");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // The guest sends: a request to the forwarded port 3128, "GET /" on it, a request to 8080.
    let packets = [
        vsock_packet(3128, 1, b""),
        vsock_packet(3128, 5, b"GET /"),
        vsock_packet(8080, 1, b""),
    ];
    let mut tx = Vec::new();
    let mut image = vec![(
        CODE_ADDRESS,
        guest_code::preloaded_vsock_driver(MMIO_BASE as u32, 8),
    )];
    for (i, packet) in packets.iter().enumerate() {
        let at = TX_BUFFERS + 0x100 * i as u32;
        image.push((u64::from(at), packet.clone()));
        tx.push((at, packet.len() as u32, false));
    }
    let (tx_table, tx_avail) = preloaded_queue(&tx);
    let rx: Vec<_> = (0..4).map(|i| (BUFFER + 0x1000 * i, 4096, true)).collect();
    let (rx_table, rx_avail) = preloaded_queue(&rx);
    image.extend([
        (u64::from(TX_DESC_TABLE), tx_table),
        (u64::from(TX_AVAIL_RING), tx_avail),
        (u64::from(DESC_TABLE), rx_table),
        (u64::from(AVAIL_RING), rx_avail),
    ]);
    let config = VmConfig {
        memory_bytes: MEMORY_BYTES,
        entry: CODE_ADDRESS,
        image,
        entropy_device: false,
    };
    let mut vsock = Vsock::new(3, None);
    vsock.set_forwards(vec![Forward {
        port: 3128,
        path: path.clone(),
    }]);
    let shell = VmShell::create(&vmm, 1, MEMORY_BYTES).unwrap();
    let mut vm = Vm::boot_with_devices(&vmm, shell, &config, vec![Device::Vsock(vsock)])
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(vm.run(Some(100_000)).unwrap(), VmExit::Reset);
    assert_eq!(vm.console().contents(), b"ok");
    // The VMM connected to the forward and passed the guest's bytes on.
    listener.set_nonblocking(true).unwrap();
    let (mut proxy, _) = listener
        .accept()
        .expect("the VMM connected to the forward during the run");
    proxy.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut proxy, &mut got);
    assert_eq!(got, b"GET /");
    // The guest got the forwarded port's RESPONSE and the other port's reset, in order.
    let used = read_guest(&vm, u64::from(USED_RING), 4).unwrap();
    let used_idx = u16::from_le_bytes([used[2], used[3]]);
    let replies: Vec<(u16, u32)> = (0..u32::from(used_idx))
        .map(|i| {
            let header = read_guest(&vm, u64::from(BUFFER + 0x1000 * i), 44).unwrap();
            let parsed = airlock_vmm::virtio::vsock::Header::parse(&header.try_into().unwrap());
            (parsed.op, parsed.src_port)
        })
        .collect();
    assert_eq!(replies[..2], [(2, 3128), (3, 8080)], "{replies:?}");
    std::fs::remove_dir_all(&dir).unwrap();
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

/// The counter's low byte sequence the guest printed.
fn printed(vm: &Vm) -> Vec<u8> {
    vm.console().contents()
}

fn counter(vm: &Vm) -> u32 {
    let bytes = read_guest(vm, u64::from(COUNTER_ADDRESS), 4)
        .unwrap_or_else(|e| panic!("reading the counter: {e}"));
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

#[test]
fn test_snapshot_round_trip_through_disk_resumes_counting() {
    let Some(vmm) = vmm() else { return };
    let mut vm = boot(&vmm, guest_code::counter_loop(), true);
    vm.set_identity(1).unwrap();
    assert_eq!(vm.run(Some(10)).unwrap(), VmExit::Paused);
    assert_eq!(printed(&vm), (1..=10).collect::<Vec<u8>>());
    let dir = scratch("roundtrip");
    snapshot::save(&mut vm, &dir).unwrap();
    drop(vm);

    let snap = snapshot::load(&dir).unwrap();
    assert_eq!(snap.state.virtio.len(), 1);
    let template = Template::from_snapshot(snap);
    let mut restored = template.fork(&vmm, None).unwrap();
    assert_eq!(counter(&restored), 10);
    assert_eq!(restored.run(Some(5)).unwrap(), VmExit::Paused);
    assert_eq!(printed(&restored), (11..=15).collect::<Vec<u8>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_snapshot_with_other_format_version_is_refused() {
    let Some(vmm) = vmm() else { return };
    let mut vm = boot(&vmm, guest_code::counter_loop(), false);
    assert_eq!(vm.run(Some(3)).unwrap(), VmExit::Paused);
    let dir = scratch("version");
    snapshot::save(&mut vm, &dir).unwrap();
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen("\"format_version\":1", "\"format_version\":99", 1),
    )
    .unwrap();
    let err = snapshot::load(&dir).unwrap_err();
    assert!(err.to_string().contains("format version 99"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_forks_diverge_without_touching_the_snapshot_or_each_other() {
    let Some(vmm) = vmm() else { return };
    let mut vm = boot(&vmm, guest_code::counter_loop(), false);
    vm.set_identity(1).unwrap();
    assert_eq!(vm.run(Some(4)).unwrap(), VmExit::Paused);
    let template = Template::from_vm(vm).unwrap();

    let mut pool = ShellPool::for_template(&template);
    pool.fill(&vmm, 2).unwrap();
    let mut a = template.fork(&vmm, pool.take()).unwrap();
    let mut b = template.fork(&vmm, pool.take()).unwrap();
    // Each fork gets its own identity: the step it counts by.
    a.set_identity(1).unwrap();
    b.set_identity(100).unwrap();
    assert_eq!(a.run(Some(3)).unwrap(), VmExit::Paused);
    assert_eq!(b.run(Some(3)).unwrap(), VmExit::Paused);
    assert_eq!((counter(&a), counter(&b)), (7, 304));
    assert_eq!(printed(&a), [5, 6, 7]);
    assert_eq!(printed(&b), [104, 204, (304 % 256) as u8]);

    // The template's memory is unchanged, so a third fork starts where the snapshot was.
    let mut template_counter = [0u8; 4];
    template
        .memory
        .as_ref()
        .try_clone()
        .map(|f| {
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut template_counter, u64::from(COUNTER_ADDRESS))
        })
        .unwrap()
        .unwrap();
    assert_eq!(u32::from_le_bytes(template_counter), 4);
    let c = template.fork(&vmm, None).unwrap();
    assert_eq!(counter(&c), 4);
    // Writes from the host into one fork's RAM stay in that fork.
    a.ram()
        .memory
        .write_slice(&[0xaa; 4], vm_memory::GuestAddress(0x8000))
        .unwrap();
    assert_eq!(read_guest(&b, 0x8000, 4).unwrap(), [0; 4]);
    assert_eq!(read_guest(&c, 0x8000, 4).unwrap(), [0; 4]);
}

#[test]
fn test_snapshot_keeps_device_state_of_console_and_virtio_queue() {
    use queue_layout::*;
    let Some(vmm) = vmm() else { return };
    // The serial scratch register and the driven virtio queue are state a restore must keep.
    let mut code = guest_code::Asm::new();
    code.mov_edx(0x3ff).mov_al(0x5a).out_dx_al();
    let mut code = code.finish();
    code.extend(guest_code::entropy_driver(
        MMIO_BASE as u32,
        BUFFER,
        BUFFER_LEN,
    ));
    let mut vm = boot(&vmm, code, true);
    assert_eq!(vm.run(Some(10_000)).unwrap(), VmExit::Reset);
    let before = vm.save_state().unwrap();
    let dir = scratch("devices");
    snapshot::save(&mut vm, &dir).unwrap();
    let restored = Template::from_snapshot(snapshot::load(&dir).unwrap())
        .fork(&vmm, None)
        .unwrap();
    let transport = restored.virtio_states()[0].clone();
    assert_eq!(transport, before.virtio[0]);
    assert_eq!(
        (
            transport.status,
            transport.queues[0].next_used,
            transport.queues[0].desc_table
        ),
        (0xf, 1, u64::from(DESC_TABLE))
    );
    let mut after = restored;
    let legacy = after.save_state().unwrap().legacy;
    assert_eq!(legacy, before.legacy);
    assert_eq!(legacy.serial.scratch, 0x5a);
    std::fs::remove_dir_all(&dir).unwrap();
}
