//! Copy-on-write forks: a [`Template`] is a snapshot's state and memory file; each fork maps
//! the file `MAP_PRIVATE` into a new VM and restores the state. A [`ShellPool`] keeps VM
//! shells (VM, irqchip, PIT, vCPU, irqfds) created ahead, which takes most of the cost off a
//! fork.
//!
//! Forks start from identical memory. What must differ (entropy, identity, tokens) is given
//! to each after the restore: its virtio-rng serves fresh host entropy, and the host can set
//! registers or memory before the first run ([`Vm::set_identity`]).

use std::collections::VecDeque;
use std::fs::File;
use std::sync::Arc;

use crate::snapshot::{Snapshot, VmState};
use crate::vm::{Vm, VmError, VmShell, Vmm};

/// A snapshot ready to fork from.
#[derive(Debug)]
pub struct Template {
    pub state: VmState,
    pub memory: Arc<File>,
}

impl Template {
    pub fn from_snapshot(snapshot: Snapshot) -> Template {
        Template {
            state: snapshot.state,
            memory: snapshot.memory,
        }
    }

    /// Pauses `vm` for good and makes it a template without copying its memory: a booted
    /// VM's RAM is a shared memfd, which from now on nothing writes.
    pub fn from_vm(mut vm: Vm) -> Result<Template, VmError> {
        let state = vm.save_state()?;
        let ram = vm.into_ram();
        if !ram.shared {
            // A fork's own writes live in its private pages, not in its file.
            return Err(VmError::PrivateMemory);
        }
        Ok(Template {
            state,
            memory: ram.file,
        })
    }

    /// The number of virtio devices a shell for this template needs.
    pub fn virtio_devices(&self) -> usize {
        self.state.virtio.len()
    }

    /// A fork in `shell` (or a new shell when `None`): memory mapped copy-on-write, vCPU,
    /// interrupt controller and device state restored. Nothing has run in it yet.
    pub fn fork(&self, vmm: &Vmm, shell: Option<VmShell>) -> Result<Vm, VmError> {
        let shell = match shell {
            Some(shell) => shell,
            None => VmShell::create(vmm, self.virtio_devices(), self.state.memory_bytes)?,
        };
        Vm::restore(vmm, shell, &self.state, self.memory.clone())
    }
}

/// VM shells created ahead of need, for one template's shape (RAM size, device count).
#[derive(Debug)]
pub struct ShellPool {
    virtio_devices: usize,
    memory_bytes: u64,
    shells: VecDeque<VmShell>,
}

impl ShellPool {
    pub fn for_template(template: &Template) -> ShellPool {
        ShellPool {
            virtio_devices: template.virtio_devices(),
            memory_bytes: template.state.memory_bytes,
            shells: VecDeque::new(),
        }
    }

    /// Tops the pool up to `count` shells.
    pub fn fill(&mut self, vmm: &Vmm, count: usize) -> Result<(), VmError> {
        while self.shells.len() < count {
            self.shells.push_back(VmShell::create(
                vmm,
                self.virtio_devices,
                self.memory_bytes,
            )?);
        }
        Ok(())
    }

    pub fn take(&mut self) -> Option<VmShell> {
        self.shells.pop_front()
    }

    pub fn len(&self) -> usize {
        self.shells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shells.is_empty()
    }
}
