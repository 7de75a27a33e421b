//! The legacy devices on port I/O: the 8250 console (COM1), the i8042 (only its CPU reset
//! command) and the CMOS clock. Every other port reads as 0xff and ignores writes, as on an
//! empty ISA bus.

pub mod cmos;
pub mod serial;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use vm_superio::{I8042Device, Trigger};

pub use cmos::Cmos;
pub use serial::{Console, ConsoleSerial, IrqEvent, SerialSnapshot};

const COM1: u16 = 0x3f8;
const I8042: u16 = 0x60;
const CMOS: u16 = 0x70;

/// Set by the i8042 when the guest asks for a CPU reset (what Linux's `reboot` does with
/// `reboot=k`); the run loop ends the VM.
#[derive(Debug, Clone, Default)]
pub struct ResetRequest(Arc<AtomicBool>);

impl ResetRequest {
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

impl Trigger for ResetRequest {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// The port-I/O devices of one VM.
#[derive(Debug)]
pub struct LegacyDevices {
    pub serial: ConsoleSerial,
    pub i8042: I8042Device<ResetRequest>,
    pub reset: ResetRequest,
    pub cmos: Cmos,
}

/// What a snapshot keeps of the legacy devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyState {
    pub serial: SerialSnapshot,
    pub cmos: cmos::CmosState,
}

impl LegacyDevices {
    pub fn new(serial_irq: IrqEvent, console: Console) -> LegacyDevices {
        let reset = ResetRequest::default();
        LegacyDevices {
            serial: serial::new_serial(serial_irq, console),
            i8042: I8042Device::new(reset.clone()),
            reset,
            cmos: Cmos::new(),
        }
    }

    pub fn restore(
        state: &LegacyState,
        serial_irq: IrqEvent,
        console: Console,
    ) -> Result<LegacyDevices, serial::SerialError> {
        let reset = ResetRequest::default();
        Ok(LegacyDevices {
            serial: serial::restore_serial(&state.serial, serial_irq, console)?,
            i8042: I8042Device::new(reset.clone()),
            reset,
            cmos: Cmos::restore(&state.cmos),
        })
    }

    pub fn state(&self) -> LegacyState {
        LegacyState {
            serial: SerialSnapshot::from(self.serial.state()),
            cmos: self.cmos.state(),
        }
    }

    /// A guest `in`: fills `data` (one to four bytes).
    pub fn read(&mut self, port: u16, data: &mut [u8]) {
        data.fill(0xff);
        let Some(first) = data.first_mut() else {
            return;
        };
        match port {
            COM1..=0x3ff => *first = self.serial.read((port - COM1) as u8),
            0x60 | 0x64 => *first = self.i8042.read((port - I8042) as u8),
            0x70 | 0x71 => *first = self.cmos.read(port - CMOS),
            _ => {}
        }
    }

    /// A guest `out`. Serial errors (the interrupt eventfd failing) are the host's, not the
    /// guest's, and are dropped: the byte is already in the console.
    pub fn write(&mut self, port: u16, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        match port {
            COM1..=0x3ff => {
                let _ = self.serial.write((port - COM1) as u8, value);
            }
            0x60 | 0x64 => {
                let _ = self.i8042.write((port - I8042) as u8, value);
            }
            0x70 | 0x71 => self.cmos.write(port - CMOS, value),
            _ => {}
        }
    }
}
