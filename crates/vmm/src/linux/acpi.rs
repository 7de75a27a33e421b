//! The few ACPI tables a Linux guest needs to find the virtio-mmio devices when its kernel
//! cannot take them from the command line (Debian's has `VIRTIO_MMIO=m` without
//! `VIRTIO_MMIO_CMDLINE_DEVICES`): RSDP → XSDT → FADT (hardware-reduced, so no PM blocks),
//! MADT (one LAPIC, KVM's IOAPIC) and a DSDT with one `LNRO0005` device per virtio-mmio
//! window, which Linux's `virtio_mmio` driver matches. The same layout Firecracker emits.

/// Where the tables go: the BIOS read-only area, reserved in the guest's memory map.
pub const RSDP_ADDRESS: u64 = 0x000e_0000;
/// Everything below here: RSDP, then the tables, 8-byte aligned.
pub const TABLES_END: u64 = 0x000f_0000;

const LAPIC_ADDRESS: u32 = 0xfee0_0000;
const IOAPIC_ADDRESS: u32 = 0xfec0_0000;
/// FADT flag: hardware-reduced ACPI (no PM timer, SCI or legacy PIC expected).
const FADT_HW_REDUCED_ACPI: u32 = 1 << 20;
/// IAPC_BOOT_ARCH: no VGA, no MSI, ASPM not controllable.
const IAPC_BOOT_ARCH: u16 = (1 << 2) | (1 << 3) | (1 << 4);

/// One virtio-mmio window to describe.
#[derive(Debug, Clone, Copy)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    pub gsi: u32,
}

/// The tables' bytes, to be written at [`RSDP_ADDRESS`].
pub fn tables(devices: &[MmioDevice]) -> Vec<u8> {
    let rsdp_len = 36;
    let dsdt_at = RSDP_ADDRESS + rsdp_len;
    let dsdt = table(*b"DSDT", 2, &dsdt_body(devices));
    let fadt_at = align8(dsdt_at + dsdt.len() as u64);
    let fadt = table(*b"FACP", 6, &fadt_body(dsdt_at));
    let madt_at = align8(fadt_at + fadt.len() as u64);
    let madt = table(*b"APIC", 5, &madt_body());
    let xsdt_at = align8(madt_at + madt.len() as u64);
    let mut xsdt_body = Vec::new();
    xsdt_body.extend_from_slice(&fadt_at.to_le_bytes());
    xsdt_body.extend_from_slice(&madt_at.to_le_bytes());
    let xsdt = table(*b"XSDT", 1, &xsdt_body);

    let mut out = rsdp(xsdt_at);
    for (at, bytes) in [
        (dsdt_at, dsdt),
        (fadt_at, fadt),
        (madt_at, madt),
        (xsdt_at, xsdt),
    ] {
        out.resize((at - RSDP_ADDRESS) as usize, 0);
        out.extend_from_slice(&bytes);
    }
    out
}

fn align8(value: u64) -> u64 {
    value.div_ceil(8) * 8
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)))
}

fn rsdp(xsdt_at: u64) -> Vec<u8> {
    let mut rsdp = Vec::with_capacity(36);
    rsdp.extend_from_slice(b"RSD PTR ");
    rsdp.push(0); // checksum of the first 20 bytes
    rsdp.extend_from_slice(b"AIRLCK");
    rsdp.push(2); // revision: ACPI 2.0+, XSDT
    rsdp.extend_from_slice(&0u32.to_le_bytes()); // no RSDT
    rsdp.extend_from_slice(&36u32.to_le_bytes());
    rsdp.extend_from_slice(&xsdt_at.to_le_bytes());
    rsdp.extend_from_slice(&[0; 4]); // extended checksum, reserved
    rsdp[8] = checksum(&rsdp[..20]);
    rsdp[32] = checksum(&rsdp);
    rsdp
}

/// A table: the 36-byte system description header, then `body`, checksummed.
fn table(signature: [u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let length = 36 + body.len() as u32;
    let mut out = Vec::with_capacity(length as usize);
    out.extend_from_slice(&signature);
    out.extend_from_slice(&length.to_le_bytes());
    out.push(revision);
    out.push(0);
    out.extend_from_slice(b"AIRLCK");
    out.extend_from_slice(b"AIRLOCKV");
    out.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    out.extend_from_slice(b"ARLK");
    out.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    out.extend_from_slice(body);
    out[9] = checksum(&out);
    out
}

fn fadt_body(dsdt_at: u64) -> Vec<u8> {
    // The FADT is 276 bytes (ACPI 6); all PM blocks zero (hardware-reduced).
    let mut body = vec![0u8; 276 - 36];
    let at = |offset: usize| offset - 36;
    body[at(40)..at(44)].copy_from_slice(&(dsdt_at as u32).to_le_bytes());
    body[at(109)..at(111)].copy_from_slice(&IAPC_BOOT_ARCH.to_le_bytes());
    body[at(112)..at(116)].copy_from_slice(&FADT_HW_REDUCED_ACPI.to_le_bytes());
    body[at(131)] = 3; // FADT minor version (6.3)
    body[at(140)..at(148)].copy_from_slice(&dsdt_at.to_le_bytes());
    body[at(268)..at(276)].copy_from_slice(b"AIRLOCK\0");
    body
}

fn madt_body() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LAPIC_ADDRESS.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes()); // flags: no 8259 pair to mask
    body.extend_from_slice(&[0, 8, 0, 0]); // processor local APIC: UID 0, APIC id 0
    body.extend_from_slice(&1u32.to_le_bytes()); // enabled
    body.extend_from_slice(&[1, 12, 0, 0]); // I/O APIC id 0
    body.extend_from_slice(&IOAPIC_ADDRESS.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes()); // GSI base
    body
}

/// AML: one `Device (Vnnn)` per window with `_HID "LNRO0005"`, `_UID` and a `_CRS` of its
/// registers and its edge-triggered interrupt.
fn dsdt_body(devices: &[MmioDevice]) -> Vec<u8> {
    let mut aml = Vec::new();
    for (index, device) in devices.iter().enumerate() {
        let mut resources = Vec::new();
        // Memory32Fixed (read-write, base, length).
        resources.extend_from_slice(&[0x86, 9, 0, 1]);
        resources.extend_from_slice(&(device.base as u32).to_le_bytes());
        resources.extend_from_slice(&(device.size as u32).to_le_bytes());
        // Extended interrupt: consumer, edge, active high, exclusive; one GSI.
        resources.extend_from_slice(&[0x89, 6, 0, 0x03, 1]);
        resources.extend_from_slice(&device.gsi.to_le_bytes());
        resources.extend_from_slice(&[0x79, 0]); // end tag
        let mut buffer = vec![0x0a, resources.len() as u8]; // BufferSize as a ByteConst
        buffer.extend_from_slice(&resources);
        let mut body = Vec::new();
        body.extend_from_slice(format!("V{index:03}").as_bytes());
        body.extend_from_slice(&[0x08]);
        body.extend_from_slice(b"_HID");
        body.push(0x0d);
        body.extend_from_slice(b"LNRO0005\0");
        body.extend_from_slice(&[0x08]);
        body.extend_from_slice(b"_UID");
        body.push(0x0a);
        body.push(index as u8);
        body.extend_from_slice(&[0x08]);
        body.extend_from_slice(b"_CRS");
        body.push(0x11);
        body.extend_from_slice(&package_length(buffer.len()));
        body.extend_from_slice(&buffer);
        aml.extend_from_slice(&[0x5b, 0x82]); // DeviceOp
        aml.extend_from_slice(&package_length(body.len()));
        aml.extend_from_slice(&body);
    }
    aml.extend_from_slice(&com1());
    // Wrap in Scope (\_SB_).
    let mut scope_body = b"\\_SB_".to_vec();
    scope_body.extend_from_slice(&aml);
    let mut out = vec![0x10]; // ScopeOp
    out.extend_from_slice(&package_length(scope_body.len()));
    out.extend_from_slice(&scope_body);
    out
}

/// COM1 as a PNP0501 device (I/O 0x3f8, IRQ 4): a hardware-reduced guest sets up no legacy
/// interrupts by itself, so the 8250 driver finds its interrupt here.
fn com1() -> Vec<u8> {
    let resources = [
        0x47, 0x01, 0xf8, 0x03, 0xf8, 0x03, 0x01, 0x08, // IO (Decode16, 0x3f8, 0x3f8, 1, 8)
        0x22, 0x10, 0x00, // IRQNoFlags () {4}
        0x79, 0x00, // end tag
    ];
    let mut buffer = vec![0x0a, resources.len() as u8];
    buffer.extend_from_slice(&resources);
    let mut body = b"COM1".to_vec();
    body.push(0x08);
    body.extend_from_slice(b"_HID");
    body.push(0x0c); // DWordConst: EisaId ("PNP0501")
    body.extend_from_slice(&0x0105_d041u32.to_le_bytes());
    body.push(0x08);
    body.extend_from_slice(b"_UID");
    body.push(0x00); // ZeroOp
    body.push(0x08);
    body.extend_from_slice(b"_CRS");
    body.push(0x11);
    body.extend_from_slice(&package_length(buffer.len()));
    body.extend_from_slice(&buffer);
    let mut out = vec![0x5b, 0x82];
    out.extend_from_slice(&package_length(body.len()));
    out.extend_from_slice(&body);
    out
}

/// AML PkgLength for `content` bytes following it (the encoding counts its own bytes).
fn package_length(content: usize) -> Vec<u8> {
    if content + 1 < 0x40 {
        return vec![(content + 1) as u8];
    }
    if content + 2 < 0x1000 {
        let length = content + 2;
        return vec![0x40 | (length & 0xf) as u8, (length >> 4) as u8];
    }
    let length = content + 3;
    vec![
        0x80 | (length & 0xf) as u8,
        (length >> 4) as u8,
        (length >> 12) as u8,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_tables_checksums_sum_to_zero() {
        let bytes = tables(&[MmioDevice {
            base: 0xd000_0000,
            size: 0x1000,
            gsi: 5,
        }]);
        let sum = |b: &[u8]| b.iter().fold(0u8, |s, x| s.wrapping_add(*x));
        assert_eq!(sum(&bytes[..20]), 0);
        assert_eq!(sum(&bytes[..36]), 0);
        let xsdt_at = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
        let xsdt = (xsdt_at - RSDP_ADDRESS) as usize;
        assert_eq!(&bytes[xsdt..xsdt + 4], b"XSDT");
        let length = u32::from_le_bytes(bytes[xsdt + 4..xsdt + 8].try_into().unwrap()) as usize;
        assert_eq!(sum(&bytes[xsdt..xsdt + length]), 0);
        for entry in bytes[xsdt + 36..xsdt + length].chunks(8) {
            let at = (u64::from_le_bytes(entry.try_into().unwrap()) - RSDP_ADDRESS) as usize;
            let length = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            assert_eq!(sum(&bytes[at..at + length]), 0, "{:?}", &bytes[at..at + 4]);
        }
        assert!(RSDP_ADDRESS + (bytes.len() as u64) < TABLES_END);
    }

    #[test]
    fn test_package_length_two_byte_form_counts_itself() {
        assert_eq!(package_length(10), vec![11]);
        // 100 bytes of content + 2 length bytes = 102 = 0x66.
        assert_eq!(package_length(100), vec![0x46, 0x06]);
    }
}
