//! The virtio-mmio transport (virtio 1.2, section 4.2.2, version 2 "modern" registers).
//!
//! The guest drives every register; nothing it writes is trusted. Register accesses of the
//! wrong width or to unknown offsets are ignored (reads give 0), as a device would. A queue
//! the guest set up wrongly, or a descriptor that points outside its memory, is an error
//! that ends the VM ([`TransportError`]), never a panic.

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestMemoryMmap;

use super::{Device, DeviceError, DeviceState};

const MAGIC: u32 = 0x7472_6976; // "virt"
const VERSION: u32 = 2;
const VENDOR: u32 = 0x4c52_4941; // "AIRL"

const REG_MAGIC: u64 = 0x000;
const REG_VERSION: u64 = 0x004;
const REG_DEVICE_ID: u64 = 0x008;
const REG_VENDOR_ID: u64 = 0x00c;
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM_MAX: u64 = 0x034;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
const REG_QUEUE_NOTIFY: u64 = 0x050;
const REG_INTERRUPT_STATUS: u64 = 0x060;
const REG_INTERRUPT_ACK: u64 = 0x064;
const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LOW: u64 = 0x080;
const REG_QUEUE_DESC_HIGH: u64 = 0x084;
const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
const REG_QUEUE_AVAIL_HIGH: u64 = 0x094;
const REG_QUEUE_USED_LOW: u64 = 0x0a0;
const REG_QUEUE_USED_HIGH: u64 = 0x0a4;
const REG_CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG_SPACE: u64 = 0x100;

/// InterruptStatus bit: the device used buffers.
pub const INTERRUPT_USED_BUFFER: u32 = 1;

/// Errors that end the VM.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{device}: queue {queue} was notified but its addresses or size are invalid")]
    InvalidQueue { device: &'static str, queue: usize },
    #[error("{device}: handling queue {queue} failed")]
    Device {
        device: &'static str,
        queue: usize,
        #[source]
        source: DeviceError,
    },
    #[error("the snapshot's queue {queue} is invalid")]
    RestoreQueue {
        queue: usize,
        #[source]
        source: virtio_queue::Error,
    },
    #[error("the snapshot has {actual} queues, the device {expected}")]
    RestoreQueueCount { expected: usize, actual: usize },
}

/// What a write asks the VM to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmioAction {
    None,
    /// Raise the device's interrupt.
    Interrupt,
}

/// One device behind its register window.
#[derive(Debug)]
pub struct MmioTransport {
    device: Device,
    queues: Vec<Queue>,
    queue_select: u32,
    device_features_select: u32,
    driver_features_select: u32,
    driver_features: u64,
    status: u32,
    interrupt_status: u32,
    config_generation: u32,
}

/// A queue's state in a form serde can write (virtio-queue's [`QueueState`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSnapshot {
    pub max_size: u16,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx_enabled: bool,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
}

/// What a snapshot keeps of a transport and its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportState {
    pub device: DeviceState,
    pub queues: Vec<QueueSnapshot>,
    pub queue_select: u32,
    pub device_features_select: u32,
    pub driver_features_select: u32,
    pub driver_features: u64,
    pub status: u32,
    pub interrupt_status: u32,
    pub config_generation: u32,
}

fn new_queues(device: &Device) -> Vec<Queue> {
    device
        .queue_max_sizes()
        .iter()
        .filter_map(|&max| Queue::new(max).ok())
        .collect()
}

impl MmioTransport {
    pub fn new(device: Device) -> MmioTransport {
        let queues = new_queues(&device);
        MmioTransport {
            device,
            queues,
            queue_select: 0,
            device_features_select: 0,
            driver_features_select: 0,
            driver_features: 0,
            status: 0,
            interrupt_status: 0,
            config_generation: 0,
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    pub fn status(&self) -> u32 {
        self.status
    }

    fn device_features(&self) -> u64 {
        self.device.features() | 1 << VIRTIO_F_VERSION_1
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        // Queue registers are only writable before the driver says it is ready.
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            return None;
        }
        self.queues.get_mut(self.queue_select as usize)
    }

    /// A guest read of `data.len()` bytes at `offset` into the window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE {
            self.device.read_config(offset - CONFIG_SPACE, data);
            return;
        }
        let value = if data.len() == 4 {
            self.register(offset)
        } else {
            0
        };
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = value.to_le_bytes().get(i).copied().unwrap_or(0);
        }
    }

    fn register(&self, offset: u64) -> u32 {
        let queue = self.queues.get(self.queue_select as usize);
        match offset {
            REG_MAGIC => MAGIC,
            REG_VERSION => VERSION,
            REG_DEVICE_ID => self.device.device_type(),
            REG_VENDOR_ID => VENDOR,
            REG_DEVICE_FEATURES => match self.device_features_select {
                0 => self.device_features() as u32,
                1 => (self.device_features() >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => queue.map_or(0, |q| u32::from(q.max_size())),
            REG_QUEUE_READY => queue.map_or(0, |q| u32::from(q.ready())),
            REG_INTERRUPT_STATUS => self.interrupt_status,
            REG_STATUS => self.status,
            REG_CONFIG_GENERATION => self.config_generation,
            _ => 0,
        }
    }

    /// A guest write at `offset`. `memory` is the guest's RAM, for queue notifications.
    pub fn write(
        &mut self,
        offset: u64,
        data: &[u8],
        memory: &GuestMemoryMmap,
    ) -> Result<MmioAction, TransportError> {
        // The entropy device has no writable configuration; other widths are ignored.
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return Ok(MmioAction::None);
        };
        let value = u32::from_le_bytes(bytes);
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_select = value,
            REG_DRIVER_FEATURES_SEL => self.driver_features_select = value,
            REG_DRIVER_FEATURES if self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0 => {
                let offered = self.device_features();
                match self.driver_features_select {
                    0 => {
                        self.driver_features = (self.driver_features & !0xffff_ffff)
                            | (u64::from(value) & offered & 0xffff_ffff)
                    }
                    1 => {
                        self.driver_features = (self.driver_features & 0xffff_ffff)
                            | (u64::from(value) << 32 & offered)
                    }
                    _ => {}
                }
            }
            REG_QUEUE_SEL => self.queue_select = value,
            REG_QUEUE_NUM => {
                if let Some(queue) = self.selected_queue() {
                    queue.set_size(value as u16);
                }
            }
            REG_QUEUE_READY => {
                if let Some(queue) = self.selected_queue() {
                    queue.set_ready(value == 1);
                }
            }
            REG_QUEUE_DESC_LOW | REG_QUEUE_DESC_HIGH => {
                let (low, high) = halves(offset == REG_QUEUE_DESC_LOW, value);
                if let Some(queue) = self.selected_queue() {
                    queue.set_desc_table_address(low, high);
                }
            }
            REG_QUEUE_AVAIL_LOW | REG_QUEUE_AVAIL_HIGH => {
                let (low, high) = halves(offset == REG_QUEUE_AVAIL_LOW, value);
                if let Some(queue) = self.selected_queue() {
                    queue.set_avail_ring_address(low, high);
                }
            }
            REG_QUEUE_USED_LOW | REG_QUEUE_USED_HIGH => {
                let (low, high) = halves(offset == REG_QUEUE_USED_LOW, value);
                if let Some(queue) = self.selected_queue() {
                    queue.set_used_ring_address(low, high);
                }
            }
            REG_QUEUE_NOTIFY => return self.notify(value as usize, memory),
            REG_INTERRUPT_ACK => self.interrupt_status &= !value,
            REG_STATUS => self.set_status(value),
            _ => {}
        }
        Ok(MmioAction::None)
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // FEATURES_OK only sticks when the driver accepted VIRTIO_F_VERSION_1 (this is a
        // modern-only device); bits are only ever added, as the spec requires of drivers.
        let mut value = value & 0xff;
        if value & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.driver_features & (1 << VIRTIO_F_VERSION_1) == 0
        {
            value &= !VIRTIO_CONFIG_S_FEATURES_OK;
        }
        self.status |= value;
    }

    fn reset(&mut self) {
        self.queues = new_queues(&self.device);
        self.queue_select = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt_status = 0;
    }

    fn notify(
        &mut self,
        index: usize,
        memory: &GuestMemoryMmap,
    ) -> Result<MmioAction, TransportError> {
        let device_name = self.device.name();
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK == 0
            || self.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0
        {
            return Ok(MmioAction::None);
        }
        let Some(queue) = self.queues.get_mut(index) else {
            return Ok(MmioAction::None);
        };
        if !queue.ready() {
            return Ok(MmioAction::None);
        }
        if !queue.is_valid(memory) {
            self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
            return Err(TransportError::InvalidQueue {
                device: device_name,
                queue: index,
            });
        }
        let mut used = match self.device.process_queue(index, queue, memory) {
            Ok(used) => used,
            Err(source) => {
                self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
                return Err(TransportError::Device {
                    device: device_name,
                    queue: index,
                    source,
                });
            }
        };
        // What the guest sent may have queued replies (vsock).
        used |= self.service(memory)?;
        if used {
            self.interrupt_status |= INTERRUPT_USED_BUFFER;
            return Ok(MmioAction::Interrupt);
        }
        Ok(MmioAction::None)
    }

    pub fn device_mut(&mut self) -> &mut Device {
        &mut self.device
    }

    /// Lets a device with input of its own (the vsock device's host sockets) fill the queues
    /// the guest reads; `Ok(true)` when buffers were used and the guest should be interrupted
    /// (the interrupt status is already set). Ends the VM on a bad descriptor, as a
    /// notification does.
    pub fn service(&mut self, memory: &GuestMemoryMmap) -> Result<bool, TransportError> {
        let Device::Vsock(vsock) = &mut self.device else {
            return Ok(false);
        };
        if self.status & VIRTIO_CONFIG_S_DRIVER_OK == 0
            || self.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0
        {
            return Ok(false);
        }
        vsock.service_host();
        let mut used = false;
        for index in [super::vsock::RX_QUEUE, super::vsock::EVENT_QUEUE] {
            let Some(queue) = self.queues.get_mut(index) else {
                continue;
            };
            if !queue.ready() || !queue.is_valid(memory) {
                continue;
            }
            let result = match index {
                super::vsock::RX_QUEUE => vsock.process_rx(queue, memory),
                _ => vsock.process_event(queue, memory),
            };
            match result {
                Ok(u) => used |= u,
                Err(source) => {
                    self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
                    return Err(TransportError::Device {
                        device: "virtio-vsock",
                        queue: index,
                        source,
                    });
                }
            }
        }
        if used {
            self.interrupt_status |= INTERRUPT_USED_BUFFER;
        }
        Ok(used)
    }

    pub fn state(&self) -> TransportState {
        TransportState {
            device: self.device.state(),
            queues: self
                .queues
                .iter()
                .map(|q| {
                    let s = q.state();
                    QueueSnapshot {
                        max_size: s.max_size,
                        next_avail: s.next_avail,
                        next_used: s.next_used,
                        event_idx_enabled: s.event_idx_enabled,
                        size: s.size,
                        ready: s.ready,
                        desc_table: s.desc_table,
                        avail_ring: s.avail_ring,
                        used_ring: s.used_ring,
                    }
                })
                .collect(),
            queue_select: self.queue_select,
            device_features_select: self.device_features_select,
            driver_features_select: self.driver_features_select,
            driver_features: self.driver_features,
            status: self.status,
            interrupt_status: self.interrupt_status,
            config_generation: self.config_generation,
        }
    }

    pub fn restore(state: &TransportState) -> Result<MmioTransport, TransportError> {
        let device = Device::restore(&state.device);
        let expected = device.queue_max_sizes().len();
        if state.queues.len() != expected {
            return Err(TransportError::RestoreQueueCount {
                expected,
                actual: state.queues.len(),
            });
        }
        let queues = state
            .queues
            .iter()
            .enumerate()
            .map(|(index, q)| {
                Queue::try_from(QueueState {
                    max_size: q.max_size,
                    next_avail: q.next_avail,
                    next_used: q.next_used,
                    event_idx_enabled: q.event_idx_enabled,
                    size: q.size,
                    ready: q.ready,
                    desc_table: q.desc_table,
                    avail_ring: q.avail_ring,
                    used_ring: q.used_ring,
                })
                .map_err(|source| TransportError::RestoreQueue {
                    queue: index,
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MmioTransport {
            device,
            queues,
            queue_select: state.queue_select,
            device_features_select: state.device_features_select,
            driver_features_select: state.driver_features_select,
            driver_features: state.driver_features,
            status: state.status,
            interrupt_status: state.interrupt_status,
            config_generation: state.config_generation,
        })
    }
}

/// The (low, high) arguments of virtio-queue's address setters for one 32-bit write.
fn halves(low: bool, value: u32) -> (Option<u32>, Option<u32>) {
    if low {
        (Some(value), None)
    } else {
        (None, Some(value))
    }
}
