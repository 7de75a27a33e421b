//! Virtio over MMIO: the transport ([`mmio`]) and the devices behind it. Devices are a closed
//! enum ([`Device`]): entropy ([`rng`]), vsock ([`vsock`], whose host side
//! [`vsock_host`] serves on its own thread) and block ([`block`], a raw disk file).

pub mod block;
pub mod mmio;
pub mod rng;
pub mod vsock;
pub mod vsock_forward;
pub mod vsock_host;

use serde::{Deserialize, Serialize};
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

pub use block::Block;
pub use mmio::{MmioTransport, TransportError, TransportState};
pub use rng::Rng;
pub use vsock::{HostListener, Vsock};
pub use vsock_forward::Forward;

/// Where the first virtio-mmio device sits; each further one 4 KiB higher.
pub const MMIO_BASE: u64 = 0xd000_0000;
/// Size of one device's register window.
pub const MMIO_SIZE: u64 = 0x1000;
/// The first virtio device's interrupt (GSI); each further one is the next GSI.
pub const FIRST_IRQ: u32 = 5;

/// A device's failure while handling a queue the guest filled.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("reading the available ring failed")]
    AvailRing(#[source] virtio_queue::Error),
    #[error("writing the used ring failed")]
    UsedRing(#[source] virtio_queue::Error),
    #[error("descriptor {head} points outside guest memory")]
    Descriptor {
        head: u16,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("a descriptor chain is empty or loops")]
    BadChain { head: u16 },
    #[error("descriptor chain {head} is not a block request")]
    BlockChain {
        head: u16,
        #[source]
        problem: block::request::ChainError,
    },
    #[error("the entropy source failed")]
    Entropy(#[source] std::io::Error),
}

/// The devices this VMM emulates.
#[derive(Debug)]
#[non_exhaustive]
pub enum Device {
    Rng(Rng),
    Vsock(Vsock),
    Block(Block),
}

/// What a snapshot keeps of a device besides its transport.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DeviceState {
    Rng,
    /// Connections do not survive a snapshot; the guest gets a transport reset.
    Vsock {
        guest_cid: u64,
    },
    /// The disk's file is not part of the state: the VMM opens it again and
    /// [`Block::attach`]es it, which checks it has this shape.
    Block {
        capacity_sectors: u64,
        read_only: bool,
        serial: String,
    },
}

impl Device {
    pub fn name(&self) -> &'static str {
        match self {
            Device::Rng(_) => "virtio-rng",
            Device::Vsock(_) => "virtio-vsock",
            Device::Block(_) => "virtio-blk",
        }
    }

    /// The virtio device type (virtio spec 5).
    pub fn device_type(&self) -> u32 {
        match self {
            Device::Rng(_) => virtio_bindings::virtio_ids::VIRTIO_ID_RNG,
            Device::Vsock(_) => virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK,
            Device::Block(_) => virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK,
        }
    }

    /// Feature bits offered (besides VIRTIO_F_VERSION_1, which the transport adds).
    pub fn features(&self) -> u64 {
        match self {
            Device::Block(block) => block.features(),
            _ => 0,
        }
    }

    pub fn queue_max_sizes(&self) -> &'static [u16] {
        match self {
            Device::Rng(_) => &[rng::QUEUE_SIZE],
            Device::Vsock(_) => &[vsock::QUEUE_SIZE; 3],
            Device::Block(_) => &[block::QUEUE_SIZE],
        }
    }

    /// Device configuration space reads: the vsock device's is its guest CID (le64), the
    /// block device's its capacity and limits; the entropy device has none.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Device::Block(block) = self {
            block.read_config(offset, data);
        }
        if let Device::Vsock(vsock) = self {
            let config = vsock.guest_cid().to_le_bytes();
            for (i, byte) in data.iter_mut().enumerate() {
                let at = offset as usize + i;
                *byte = config.get(at).copied().unwrap_or(0);
            }
        }
    }

    /// Handles queue `index` after the guest notified it; `Ok(true)` when buffers were used
    /// and the guest should be interrupted.
    pub fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        memory: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        match self {
            Device::Rng(rng) => match index {
                0 => rng.process(queue, memory),
                _ => Ok(false),
            },
            Device::Vsock(vsock) => match index {
                vsock::RX_QUEUE => vsock.process_rx(queue, memory),
                vsock::TX_QUEUE => vsock.process_tx(queue, memory),
                vsock::EVENT_QUEUE => vsock.event_notified(queue, memory),
                _ => Ok(false),
            },
            Device::Block(block) => match index {
                0 => block.process(queue, memory),
                _ => Ok(false),
            },
        }
    }

    pub fn state(&self) -> DeviceState {
        match self {
            Device::Rng(_) => DeviceState::Rng,
            Device::Vsock(vsock) => DeviceState::Vsock {
                guest_cid: vsock.guest_cid(),
            },
            Device::Block(block) => DeviceState::Block {
                capacity_sectors: block.capacity_sectors(),
                read_only: block.read_only(),
                serial: block.serial().to_owned(),
            },
        }
    }

    pub fn restore(state: &DeviceState) -> Device {
        match state {
            DeviceState::Rng => Device::Rng(Rng::new()),
            DeviceState::Vsock { guest_cid } => Device::Vsock(Vsock::restored(*guest_cid)),
            DeviceState::Block {
                capacity_sectors,
                read_only,
                serial,
            } => Device::Block(Block::restored(
                *capacity_sectors,
                *read_only,
                serial.clone(),
            )),
        }
    }
}
