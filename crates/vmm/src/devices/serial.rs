//! COM1: vm-superio's 16550A, its output collected in a bounded [`Console`] buffer and its
//! interrupt raised through an eventfd registered as an irqfd on GSI 4.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

/// The console keeps at most this much guest output; later bytes are counted, not kept.
pub const CONSOLE_LIMIT_BYTES: usize = 1 << 20;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    #[error("the snapshot's serial receive buffer is larger than the FIFO")]
    Restore,
}

/// An interrupt line: an eventfd that KVM turns into an edge on its GSI.
#[derive(Debug)]
pub struct IrqEvent(pub EventFd);

impl Trigger for IrqEvent {
    type E = std::io::Error;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.write(1)
    }
}

/// Guest console output, shared with whoever reads it.
#[derive(Debug, Clone, Default)]
pub struct Console(Arc<Mutex<ConsoleBuffer>>);

#[derive(Debug, Default)]
struct ConsoleBuffer {
    bytes: Vec<u8>,
    dropped: u64,
    /// Also copy everything to the VMM's standard output (a Linux guest's console).
    echo: bool,
}

impl Console {
    /// What the guest has written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().map(|b| b.bytes.clone()).unwrap_or_default()
    }

    /// Copies the guest's output to this process's standard output from now on.
    pub fn echo_to_stdout(&self) {
        if let Ok(mut b) = self.0.lock() {
            b.echo = true;
        }
    }

    /// Bytes the guest wrote beyond [`CONSOLE_LIMIT_BYTES`].
    pub fn dropped(&self) -> u64 {
        self.0.lock().map(|b| b.dropped).unwrap_or_default()
    }
}

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            let room = CONSOLE_LIMIT_BYTES.saturating_sub(b.bytes.len());
            let kept = room.min(buf.len());
            b.bytes.extend_from_slice(&buf[..kept]);
            b.dropped += (buf.len() - kept) as u64;
            if b.echo {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(buf);
                let _ = out.flush();
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub type ConsoleSerial = Serial<IrqEvent, NoEvents, Console>;

pub fn new_serial(irq: IrqEvent, console: Console) -> ConsoleSerial {
    Serial::new(irq, console)
}

pub fn restore_serial(
    state: &SerialSnapshot,
    irq: IrqEvent,
    console: Console,
) -> Result<ConsoleSerial, SerialError> {
    Serial::from_state(&state.clone().into(), irq, NoEvents, console)
        .map_err(|_| SerialError::Restore)
}

/// vm-superio's [`SerialState`], in a form serde can write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialSnapshot {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl From<SerialState> for SerialSnapshot {
    fn from(s: SerialState) -> Self {
        SerialSnapshot {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl From<SerialSnapshot> for SerialState {
    fn from(s: SerialSnapshot) -> Self {
        SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}
