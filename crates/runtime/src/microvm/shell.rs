//! Pre-created VM shells for a sandbox's own VM: a start on a directory holding a paused VM
//! (a fork's copy of a snapshot) can stop short of the restore. The jail, the VMM and its VM
//! are made (`airlock-vmm restore --shell`, see `airlock_vmm::shell_control`), and the sandbox
//! waits, using no guest memory, until [`GuestStart::restore_in_shell`] asks the VMM to
//! restore; the guest then runs from the snapshot as it was, not from a state that has aged
//! while the shell waited. A warm pool of a microvm snapshot holds such sandboxes.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use super::ready::{self, ReadyError};

/// Why a sandbox's VM shell could not be made or restored.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("only the microvm tier has VM shells")]
    NotMicrovm,
    #[error("a VM shell restores a paused VM, and `{0}` holds none")]
    NotPaused(PathBuf),
    #[error("reaching the VM shell's control connection failed")]
    Connect(#[source] std::io::Error),
    #[error("the VM shell did not restore")]
    Restore(#[source] std::io::Error),
    #[error("the restored guest's agent did not become ready")]
    Ready(#[from] ReadyError),
    #[error("the sandbox's VM shell has not been restored")]
    NotRestored,
}

/// What is left of a microvm sandbox's start once its VMM runs: the guest's agent answering
/// and taking the sandbox's environment and fresh entropy (a shell restores first).
#[derive(Debug, Clone)]
pub struct GuestStart {
    pub(crate) socket: PathBuf,
    pub(crate) helper_pid: i32,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) egress: Option<serde_json::Value>,
    pub(crate) limit: Duration,
}

impl GuestStart {
    /// Waits for the agent and resumes it ([`ready`]).
    pub fn finish(&self) -> Result<(), ReadyError> {
        ready::wait_for_agent(&self.socket, self.helper_pid, self.limit)?;
        ready::resume(&self.socket, &self.env, self.egress.as_ref())
    }

    /// Asks the shell's VMM to restore, then [`GuestStart::finish`]; returns how long the VMM
    /// took to restore (from the request to the vCPU state being in).
    pub fn restore_in_shell(&self) -> Result<Duration, ShellError> {
        let mut control = UnixStream::connect(&self.socket).map_err(ShellError::Connect)?;
        // The VMM answers at once; emulation is slow, so the guard is generous.
        control
            .set_read_timeout(Some(self.limit))
            .map_err(ShellError::Connect)?;
        let took = airlock_vmm::shell_control::request_restore(&mut control)
            .map_err(ShellError::Restore)?;
        drop(control);
        self.finish()?;
        Ok(took)
    }
}
