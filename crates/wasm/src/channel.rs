//! Python's host calls (tools and `fetch`) without a host import: WASI preview 1 gives the
//! guest no way to call a function of the host, so the call travels on the instance's own
//! standard streams. The guest writes one frame on stdout with a single `write` (a marker,
//! one JSON line) and blocks reading one answer line from stdin; the host's stdout stream
//! takes the frame out of the output (the snippet's own text passes through to the capped
//! buffer) and the engine writes the answer into the stdin pipe it already holds.
//!
//! A snippet that writes the marker itself makes a host call, which it could make anyway:
//! the frame carries no authority the `tools`/`fetch` functions lack.

use std::sync::{Arc, Mutex, mpsc};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// An output buffer with a cap, emptied by [`CappedPipe::take`] (a kept instance's output is
/// its cell's only): writing past the cap traps, like wasmtime's `MemoryOutputPipe`.
#[derive(Debug, Clone)]
pub struct CappedPipe {
    capacity: usize,
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl CappedPipe {
    pub fn new(capacity: usize) -> CappedPipe {
        CappedPipe {
            capacity,
            buffer: Arc::default(),
        }
    }

    /// What was written since the last `take`.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.buffer.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if bytes.len() > self.capacity.saturating_sub(buffer.len()) {
            return Err(StreamError::Trap(wasmtime::format_err!(
                "write beyond capacity of the output buffer"
            )));
        }
        buffer.extend_from_slice(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let used = self.buffer.lock().unwrap_or_else(|e| e.into_inner()).len();
        match self.capacity.checked_sub(used) {
            Some(room) if room > 0 => Ok(room),
            _ => Err(StreamError::Closed),
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    /// Only WASI p3 uses this; nothing is written through it.
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}

/// Starts a host-call frame; it must begin one `write` of the guest (the prelude's
/// `os.write`), and ends at the first newline.
pub const FRAME_MARK: &[u8] = b"\x1d\x1dairlock-host-call\x1d";
/// The longest frame; a longer one is answered with an error.
const MAX_FRAME_BYTES: usize = 8 << 20;

/// What the engine hears from one running instance.
pub enum Heard<E> {
    /// A host-call frame (the JSON line, without marker and newline), or `Err` when it was
    /// too long.
    Call(Result<Vec<u8>, String>),
    /// The instance ended.
    Ended(E),
}

/// The instance's stdout: frames to the engine, everything else to the capped buffer.
pub struct Tap<E: Send + 'static> {
    output: CappedPipe,
    calls: mpsc::Sender<Heard<E>>,
    frame: Option<Vec<u8>>,
}

impl<E: Send + 'static> Clone for Tap<E> {
    fn clone(&self) -> Self {
        Tap {
            output: self.output.clone(),
            calls: self.calls.clone(),
            frame: None,
        }
    }
}

impl<E: Send + 'static> Tap<E> {
    pub fn new(output: CappedPipe, calls: mpsc::Sender<Heard<E>>) -> Tap<E> {
        Tap {
            output,
            calls,
            frame: None,
        }
    }

    /// Takes what belongs to a frame out of `bytes`; the rest is the snippet's output.
    fn split(&mut self, bytes: Bytes) -> Option<Bytes> {
        let mut frame = match self.frame.take() {
            Some(frame) => frame,
            None if bytes.starts_with(FRAME_MARK) => {
                let rest = bytes.slice(FRAME_MARK.len()..);
                self.frame = Some(Vec::new());
                return self.split(rest);
            }
            None => return Some(bytes),
        };
        match bytes.iter().position(|b| *b == b'\n') {
            Some(end) => {
                frame.extend_from_slice(&bytes[..end]);
                let heard = if frame.len() > MAX_FRAME_BYTES {
                    Err(format!("a host call longer than {MAX_FRAME_BYTES} bytes"))
                } else {
                    Ok(frame)
                };
                let _ = self.calls.send(Heard::Call(heard));
                let rest = bytes.slice(end + 1..);
                (!rest.is_empty()).then_some(rest)
            }
            None => {
                // Past the limit only the newline is still looked for.
                if frame.len() <= MAX_FRAME_BYTES {
                    frame.extend_from_slice(&bytes);
                }
                self.frame = Some(frame);
                None
            }
        }
    }
}

impl<E: Send + 'static> OutputStream for Tap<E> {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        match self.split(bytes) {
            Some(rest) => self.output.write(rest),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.output.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // The rest of a frame is taken even when the output buffer is full.
        match self.output.check_write() {
            Err(_) if self.frame.is_some() => Ok(4096),
            other => other,
        }
    }
}

#[wasmtime_wasi::async_trait]
impl<E: Send + 'static> Pollable for Tap<E> {
    async fn ready(&mut self) {}
}

impl<E: Send + 'static> IsTerminal for Tap<E> {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl<E: Send + 'static> StdoutStream for Tap<E> {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    /// Only WASI p3 uses this; the p1 guest writes through `p2_stream`.
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}
