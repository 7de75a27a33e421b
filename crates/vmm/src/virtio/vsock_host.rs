//! The vsock device's host side on its own thread: it waits (poll(2)) on the device's Unix
//! listener and connection sockets and on a wake-up eventfd the vCPU thread writes after the
//! guest's packets changed what to wait for, then lets the device move bytes
//! ([`MmioTransport::service`]) and raises the device's interrupt when it filled buffers.
//! The guest never blocks this thread, and this thread never blocks the vCPU for longer than
//! one non-blocking pass over the sockets (both take the transport's lock).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::{Device, MmioTransport, TransportError};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum VsockHostError {
    #[error("the device is not a vsock device")]
    NotVsock,
    #[error("creating the wake-up eventfd failed")]
    EventFd(#[source] std::io::Error),
    #[error("starting the vsock host thread failed")]
    Spawn(#[source] std::io::Error),
    #[error("descriptor {0} is not a listening socket")]
    NotListening(i32),
}

/// Takes over inherited descriptor `fd`, which must be a listening socket (the jail binds the
/// microvm tier's agent socket on the host and hands it over).
pub fn inherited_listener(fd: i32) -> Result<std::os::unix::net::UnixListener, VsockHostError> {
    let mut accepting: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one c_int into `accepting` and its size into `len`, both live
    // locals of the sizes given; a descriptor that is no socket makes it fail (checked).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&raw mut accepting).cast(),
            &raw mut len,
        )
    };
    if rc != 0 || accepting == 0 {
        return Err(VsockHostError::NotListening(fd));
    }
    // SAFETY: the descriptor is open and a listening socket (checked above), and the caller
    // hands it to this process for the listener alone, which now owns and closes it.
    Ok(unsafe { <std::os::unix::net::UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// The running host thread; stopped and joined when dropped.
#[derive(Debug)]
pub struct VsockHost {
    stop: Arc<AtomicBool>,
    wake: EventFd,
    thread: Option<JoinHandle<Result<(), TransportError>>>,
}

impl VsockHost {
    /// Starts serving `transport`'s vsock device; `irq` is the device's interrupt line,
    /// `forwards` the host ports the guest may connect to.
    pub fn start(
        transport: Arc<Mutex<MmioTransport>>,
        memory: GuestMemoryMmap,
        irq: EventFd,
        listener: Option<super::HostListener>,
        forwards: Vec<super::Forward>,
    ) -> Result<VsockHost, VsockHostError> {
        let wake = EventFd::new(EFD_NONBLOCK).map_err(VsockHostError::EventFd)?;
        {
            let mut guard = transport.lock().unwrap_or_else(|e| e.into_inner());
            let Device::Vsock(vsock) = guard.device_mut() else {
                return Err(VsockHostError::NotVsock);
            };
            if let Some(host) = &listener {
                host.listener
                    .set_nonblocking(true)
                    .map_err(VsockHostError::EventFd)?;
            }
            vsock.attach(listener, wake.try_clone().map_err(VsockHostError::EventFd)?);
            vsock.set_forwards(forwards);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread_wake = wake.try_clone().map_err(VsockHostError::EventFd)?;
        // The thread says it has started before this returns: its start-up syscalls (rseq,
        // robust list, name) then happen before the caller installs the allow-list on it.
        let (started, running) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("vsock-host".into())
            .spawn(move || {
                let _ = started.send(());
                serve(&transport, &memory, &irq, &thread_wake, &thread_stop)
            })
            .map_err(VsockHostError::Spawn)?;
        let _ = running.recv();
        Ok(VsockHost {
            stop,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for VsockHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(
    transport: &Mutex<MmioTransport>,
    memory: &GuestMemoryMmap,
    irq: &EventFd,
    wake: &EventFd,
    stop: &AtomicBool,
) -> Result<(), TransportError> {
    while !stop.load(Ordering::SeqCst) {
        let set = {
            let mut guard = transport.lock().unwrap_or_else(|e| e.into_inner());
            if guard.service(memory)? {
                // A full eventfd (the counter at its maximum) already signals.
                let _ = irq.write(1);
            }
            match guard.device_mut() {
                Device::Vsock(vsock) => vsock.poll_set(),
                _ => Vec::new(),
            }
        };
        let mut fds: Vec<libc::pollfd> = set
            .into_iter()
            .map(|(fd, events)| libc::pollfd {
                fd,
                events,
                revents: 0,
            })
            .collect();
        fds.push(libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: `fds` is a live, correctly sized array of pollfd the kernel writes the
        // `revents` of; the descriptors stay open while the device owns them (a closed one
        // only makes poll report POLLNVAL, which the next pass drops). The result is checked.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if ready < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                // Nothing to poll with; a hot loop would be worse than stopping serving.
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        let _ = wake.read();
    }
    Ok(())
}
