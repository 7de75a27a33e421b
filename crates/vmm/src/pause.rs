//! Pausing a running VM from outside: SIGUSR1 sets [`crate::vm::PAUSE_REQUESTED`] and, when it
//! lands on the vCPU thread, interrupts KVM_RUN, so [`crate::vm::Vm::run`] returns
//! [`crate::vm::VmExit::Paused`] (how `airlock-vmm linux --snapshot DIR` is told to snapshot).

use std::sync::atomic::Ordering;

/// The signal that makes a VMM given somewhere to save pause and snapshot its guest.
pub const SNAPSHOT_SIGNAL: libc::c_int = libc::SIGUSR1;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("installing the SIGUSR1 handler failed")]
    Handler(#[source] vmm_sys_util::errno::Error),
    #[error("changing the thread's signal mask failed")]
    Mask(#[source] std::io::Error),
}

extern "C" fn request_pause(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    crate::vm::PAUSE_REQUESTED.store(true, Ordering::SeqCst);
}

/// Makes SIGUSR1 request a pause (no SA_RESTART, so KVM_RUN returns EINTR).
pub fn install_sigusr1() -> Result<(), PauseError> {
    vmm_sys_util::signal::register_signal_handler(libc::SIGUSR1, request_pause)
        .map_err(PauseError::Handler)
}

fn set_mask(how: libc::c_int) -> Result<(), PauseError> {
    let mask = vmm_sys_util::signal::create_sigset(&[libc::SIGUSR1])
        .map_err(|e| PauseError::Mask(std::io::Error::from_raw_os_error(e.errno())))?;
    // SAFETY: pthread_sigmask reads `mask`, an initialised sigset, and changes only the
    // calling thread's mask; a null old-set pointer is allowed. The result is checked.
    let result = unsafe { libc::pthread_sigmask(how, &mask, std::ptr::null_mut()) };
    if result != 0 {
        return Err(PauseError::Mask(std::io::Error::from_raw_os_error(result)));
    }
    Ok(())
}

/// Runs `start` (which spawns threads) with SIGUSR1 blocked, so that the threads it starts
/// inherit the block and the signal goes to the calling (vCPU) thread.
pub fn spawn_without_sigusr1<T>(start: impl FnOnce() -> T) -> Result<T, PauseError> {
    set_mask(libc::SIG_BLOCK)?;
    let result = start();
    set_mask(libc::SIG_UNBLOCK)?;
    Ok(result)
}
