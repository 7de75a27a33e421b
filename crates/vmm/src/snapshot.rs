//! Snapshots on disk: `state.json` (vCPU, interrupt controllers, PIT, clock and device
//! state) and `memory` (the guest's RAM, byte for byte). Restoring maps `memory`
//! `MAP_PRIVATE`, so any number of forks share its page cache and none writes to it.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use kvm_bindings::{kvm_clock_data, kvm_irqchip, kvm_pit_state2};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use crate::devices::LegacyState;
use crate::vcpu::VcpuState;
use crate::virtio::TransportState;
use crate::vm::{Vm, VmError};

/// Bumped whenever [`VmState`] changes shape; a snapshot of another version is refused.
pub const FORMAT_VERSION: u32 = 1;

const STATE_FILE: &str = "state.json";
const MEMORY_FILE: &str = "memory";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("reading the VM's state failed")]
    Save(#[source] VmError),
    #[error("writing {path} failed")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("copying guest memory to {path} failed")]
    WriteMemory {
        path: String,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("reading {path} failed")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a snapshot state")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the snapshot has format version {found}, this VMM reads {FORMAT_VERSION}")]
    Version { found: u32 },
}

/// A VM's state without its memory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    pub format_version: u32,
    pub memory_bytes: u64,
    pub vcpu: VcpuState,
    /// PIC master, PIC slave, IOAPIC.
    pub irqchips: Vec<kvm_irqchip>,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
    pub legacy: LegacyState,
    pub virtio: Vec<TransportState>,
}

/// A snapshot read back: the state, and the memory file to map.
#[derive(Debug)]
pub struct Snapshot {
    pub state: VmState,
    pub memory: Arc<File>,
}

/// Writes a paused VM's snapshot into `dir` (created if missing). The state file is written
/// last and renamed into place, so a half-written snapshot is never read as whole.
pub fn save(vm: &mut Vm, dir: &Path) -> Result<(), SnapshotError> {
    let state = vm.save_state().map_err(SnapshotError::Save)?;
    let write_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| SnapshotError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    let memory_path = dir.join(MEMORY_FILE);
    let mut memory = File::create(&memory_path).map_err(write_err(&memory_path))?;
    let size = usize::try_from(state.memory_bytes).unwrap_or(usize::MAX);
    vm.ram()
        .memory
        .write_all_volatile_to(GuestAddress(0), &mut memory, size)
        .map_err(|source| SnapshotError::WriteMemory {
            path: memory_path.display().to_string(),
            source,
        })?;
    memory.sync_all().map_err(write_err(&memory_path))?;
    let state_path = dir.join(STATE_FILE);
    let partial = dir.join("state.json.partial");
    let json = serde_json::to_vec(&state).map_err(|source| SnapshotError::Parse {
        path: partial.display().to_string(),
        source,
    })?;
    let mut file = File::create(&partial).map_err(write_err(&partial))?;
    file.write_all(&json).map_err(write_err(&partial))?;
    file.sync_all().map_err(write_err(&partial))?;
    std::fs::rename(&partial, &state_path).map_err(write_err(&state_path))?;
    Ok(())
}

/// Reads the snapshot in `dir`.
pub fn load(dir: &Path) -> Result<Snapshot, SnapshotError> {
    let state_path = dir.join(STATE_FILE);
    let read_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| SnapshotError::Read { path, source }
    };
    let json = std::fs::read(&state_path).map_err(read_err(&state_path))?;
    let state: VmState = serde_json::from_slice(&json).map_err(|source| SnapshotError::Parse {
        path: state_path.display().to_string(),
        source,
    })?;
    if state.format_version != FORMAT_VERSION {
        return Err(SnapshotError::Version {
            found: state.format_version,
        });
    }
    let memory_path = dir.join(MEMORY_FILE);
    let memory = File::open(&memory_path).map_err(read_err(&memory_path))?;
    Ok(Snapshot {
        state,
        memory: Arc::new(memory),
    })
}

/// Reads `len` bytes of guest memory at `address` (tests and tools).
pub fn read_guest(
    vm: &Vm,
    address: u64,
    len: usize,
) -> Result<Vec<u8>, vm_memory::GuestMemoryError> {
    let mut buffer = vec![0u8; len];
    vm.ram()
        .memory
        .read_slice(&mut buffer, GuestAddress(address))?;
    Ok(buffer)
}
