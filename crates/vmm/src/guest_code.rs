//! Tiny freestanding guests, assembled here from bytes: 32-bit protected-mode code with flat
//! segments and paging off (the state [`crate::vcpu::set_boot_state`] gives). Tests, the
//! bench and the fuzz targets use them; nothing is downloaded or compiled for a guest.

/// Where the guests' code is loaded and where they start.
pub const CODE_ADDRESS: u64 = 0x1000;

/// An x86 (32-bit) instruction emitter for the handful of instructions the guests need.
#[derive(Debug, Default, Clone)]
pub struct Asm {
    pub code: Vec<u8>,
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }

    /// The current offset from the start of the code.
    pub fn here(&self) -> usize {
        self.code.len()
    }

    fn imm32(&mut self, value: u32) {
        self.code.extend_from_slice(&value.to_le_bytes());
    }

    /// `mov edx, imm32`
    pub fn mov_edx(&mut self, value: u32) -> &mut Self {
        self.code.push(0xba);
        self.imm32(value);
        self
    }

    /// `mov eax, imm32`
    pub fn mov_eax(&mut self, value: u32) -> &mut Self {
        self.code.push(0xb8);
        self.imm32(value);
        self
    }

    /// `mov al, imm8`
    pub fn mov_al(&mut self, value: u8) -> &mut Self {
        self.code.extend_from_slice(&[0xb0, value]);
        self
    }

    /// `out dx, al`
    pub fn out_dx_al(&mut self) -> &mut Self {
        self.code.push(0xee);
        self
    }

    /// `in al, dx`
    pub fn in_al_dx(&mut self) -> &mut Self {
        self.code.push(0xec);
        self
    }

    /// `out imm8, al`
    pub fn out_al(&mut self, port: u8) -> &mut Self {
        self.code.extend_from_slice(&[0xe6, port]);
        self
    }

    /// `mov dword [address], imm32`
    pub fn store32(&mut self, address: u32, value: u32) -> &mut Self {
        self.code.extend_from_slice(&[0xc7, 0x05]);
        self.imm32(address);
        self.imm32(value);
        self
    }

    /// `mov eax, dword [address]`
    pub fn load_eax(&mut self, address: u32) -> &mut Self {
        self.code.push(0xa1);
        self.imm32(address);
        self
    }

    /// `mov dword [address], eax`
    pub fn store_eax(&mut self, address: u32) -> &mut Self {
        self.code.push(0xa3);
        self.imm32(address);
        self
    }

    /// `mov al, byte [address]`
    pub fn load_al(&mut self, address: u32) -> &mut Self {
        self.code.push(0xa0);
        self.imm32(address);
        self
    }

    /// `inc dword [address]`
    pub fn inc32(&mut self, address: u32) -> &mut Self {
        self.code.extend_from_slice(&[0xff, 0x05]);
        self.imm32(address);
        self
    }

    /// `add dword [address], ebx`
    pub fn add_ebx_to(&mut self, address: u32) -> &mut Self {
        self.code.extend_from_slice(&[0x01, 0x1d]);
        self.imm32(address);
        self
    }

    /// `jmp` back to `target` (an offset from [`Asm::here`]).
    pub fn jmp_to(&mut self, target: usize) -> &mut Self {
        // rel32 from the end of this 5-byte instruction.
        let end = self.here() + 5;
        let rel = if target >= end {
            u32::try_from(target - end).unwrap_or(0)
        } else {
            u32::try_from(end - target).unwrap_or(0).wrapping_neg()
        };
        self.code.push(0xe9);
        self.imm32(rel);
        self
    }

    /// `hlt`
    pub fn hlt(&mut self) -> &mut Self {
        self.code.push(0xf4);
        self
    }

    /// Prints `text` on COM1, one `out` per byte.
    pub fn print(&mut self, text: &[u8]) -> &mut Self {
        self.mov_edx(0x3f8);
        for &byte in text {
            self.mov_al(byte).out_dx_al();
        }
        self
    }

    /// Asks the i8042 for a CPU reset: how every guest here ends.
    pub fn reset(&mut self) -> &mut Self {
        self.mov_al(0xfe).out_al(0x64);
        // Not reached; a halt keeps a broken reset from running into the following bytes.
        self.hlt()
    }

    pub fn finish(&self) -> Vec<u8> {
        self.code.clone()
    }
}

/// A guest that prints `text` and resets.
pub fn hello(text: &[u8]) -> Vec<u8> {
    Asm::new().print(text).reset().finish()
}

/// Address of the counter of [`counter_loop`].
pub const COUNTER_ADDRESS: u32 = 0x6000;

/// A guest that forever adds RBX to the dword at [`COUNTER_ADDRESS`] and writes its low byte
/// to COM1 (one exit per iteration): a process "still counting" across a snapshot.
pub fn counter_loop() -> Vec<u8> {
    let mut asm = Asm::new();
    asm.mov_edx(0x3f8);
    let top = asm.here();
    asm.add_ebx_to(COUNTER_ADDRESS)
        .load_al(COUNTER_ADDRESS)
        .out_dx_al()
        .jmp_to(top);
    asm.finish()
}

/// The guest-physical layout of [`entropy_driver`]'s virtqueue.
pub mod queue_layout {
    pub const DESC_TABLE: u32 = 0x10000;
    pub const AVAIL_RING: u32 = 0x11000;
    pub const USED_RING: u32 = 0x12000;
    pub const BUFFER: u32 = 0x13000;
    pub const BUFFER_LEN: u32 = 64;
    pub const QUEUE_SIZE: u32 = 8;
}

/// The vsock tests' transmit queue (queue 1), beside [`queue_layout`]'s, which is their
/// receive queue (queue 0).
pub mod vsock_layout {
    pub const TX_DESC_TABLE: u32 = 0x14000;
    pub const TX_AVAIL_RING: u32 = 0x15000;
    pub const TX_USED_RING: u32 = 0x16000;
    /// The packets the host preloads for the guest to send.
    pub const TX_BUFFERS: u32 = 0x17000;
}

/// A virtio-vsock driver for a device whose receive (0) and transmit (1) queues the host
/// preloaded in guest memory ([`queue_layout`], [`vsock_layout`], `queue_size` entries each):
/// negotiates VIRTIO_F_VERSION_1, sets both up, notifies transmit then receive, acknowledges
/// the interrupt, prints "ok" and resets.
pub fn preloaded_vsock_driver(mmio_base: u32, queue_size: u32) -> Vec<u8> {
    use queue_layout::*;
    use vsock_layout::*;
    let reg = |offset: u32| mmio_base + offset;
    let mut asm = Asm::new();
    asm.store32(reg(0x70), 1)
        .store32(reg(0x70), 3)
        .store32(reg(0x24), 1)
        .store32(reg(0x20), 1)
        .store32(reg(0x70), 0xb);
    for (queue, table, avail, used) in [
        (0, DESC_TABLE, AVAIL_RING, USED_RING),
        (1, TX_DESC_TABLE, TX_AVAIL_RING, TX_USED_RING),
    ] {
        asm.store32(reg(0x30), queue)
            .store32(reg(0x38), queue_size)
            .store32(reg(0x80), table)
            .store32(reg(0x84), 0)
            .store32(reg(0x90), avail)
            .store32(reg(0x94), 0)
            .store32(reg(0xa0), used)
            .store32(reg(0xa4), 0)
            .store32(reg(0x44), 1);
    }
    asm.store32(reg(0x70), 0xf)
        .store32(reg(0x50), 1) // QueueNotify: transmit
        .store32(reg(0x50), 0) // QueueNotify: receive
        .load_eax(reg(0x60))
        .store_eax(reg(0x64))
        .print(b"ok")
        .reset();
    asm.finish()
}

/// A virtio-mmio driver's set-up of queue 0 at the layout's addresses: status bits, version 1,
/// the queue's size and rings, ready, DRIVER_OK.
fn set_up_queue_0(asm: &mut Asm, mmio_base: u32, queue_size: u32) -> &mut Asm {
    use queue_layout::*;
    let reg = |offset: u32| mmio_base + offset;
    asm.store32(reg(0x70), 1) // ACKNOWLEDGE
        .store32(reg(0x70), 3) // | DRIVER
        .store32(reg(0x24), 1) // DriverFeaturesSel = 1
        .store32(reg(0x20), 1) // VIRTIO_F_VERSION_1 (bit 32)
        .store32(reg(0x70), 0xb) // | FEATURES_OK
        .store32(reg(0x30), 0) // QueueSel
        .store32(reg(0x38), queue_size)
        .store32(reg(0x80), DESC_TABLE)
        .store32(reg(0x84), 0)
        .store32(reg(0x90), AVAIL_RING)
        .store32(reg(0x94), 0)
        .store32(reg(0xa0), USED_RING)
        .store32(reg(0xa4), 0)
        .store32(reg(0x44), 1) // QueueReady
        .store32(reg(0x70), 0xf) // | DRIVER_OK
}

/// A virtio-rng driver: negotiates VIRTIO_F_VERSION_1, sets up queue 0 at
/// [`queue_layout`], queues one writable buffer of `buffer_len` bytes at `buffer_address`,
/// notifies, acknowledges the interrupt, prints "ok" and resets. A `buffer_address` outside
/// RAM is a hostile descriptor.
pub fn entropy_driver(mmio_base: u32, buffer_address: u32, buffer_len: u32) -> Vec<u8> {
    use queue_layout::*;
    let reg = |offset: u32| mmio_base + offset;
    let mut asm = Asm::new();
    set_up_queue_0(&mut asm, mmio_base, QUEUE_SIZE)
        // Descriptor 0: addr, len, flags = VIRTQ_DESC_F_WRITE, next = 0.
        .store32(DESC_TABLE, buffer_address)
        .store32(DESC_TABLE + 4, 0)
        .store32(DESC_TABLE + 8, buffer_len)
        .store32(DESC_TABLE + 12, 2)
        // Avail ring: ring[0] = 0, then flags = 0, idx = 1.
        .store32(AVAIL_RING + 4, 0)
        .store32(AVAIL_RING, 1 << 16)
        .store32(reg(0x50), 0) // QueueNotify
        .load_eax(reg(0x60)) // InterruptStatus
        .store_eax(reg(0x64)) // InterruptACK
        .print(b"ok")
        .reset();
    asm.finish()
}

/// Reads CMOS register `index` and prints its value as one raw byte, then resets.
pub fn cmos_reader(index: u8) -> Vec<u8> {
    let mut asm = Asm::new();
    asm.mov_al(index)
        .out_al(0x70)
        .mov_edx(0x71)
        .in_al_dx()
        .mov_edx(0x3f8)
        .out_dx_al()
        .reset();
    asm.finish()
}

/// A virtio driver for a device whose queue 0 the host preloaded in guest memory (descriptor
/// table, avail ring and buffers at [`queue_layout`]'s addresses, `queue_size` entries):
/// negotiates VIRTIO_F_VERSION_1, sets the queue up, notifies it once, acknowledges the
/// interrupt, prints "ok" and resets. The block device tests lay their requests out this way.
pub fn preloaded_queue_driver(mmio_base: u32, queue_size: u32) -> Vec<u8> {
    let reg = |offset: u32| mmio_base + offset;
    let mut asm = Asm::new();
    set_up_queue_0(&mut asm, mmio_base, queue_size)
        .store32(reg(0x50), 0) // QueueNotify
        .load_eax(reg(0x60)) // InterruptStatus
        .store_eax(reg(0x64)) // InterruptACK
        .print(b"ok")
        .reset();
    asm.finish()
}
