//! A VM: its KVM file descriptors ([`VmShell`], which can be created ahead of need), its RAM,
//! its devices, and the run loop that dispatches the vCPU's exits to them.

use kvm_bindings::{
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_PIT_SPEAKER_DUMMY,
    kvm_irqchip, kvm_pit_config, kvm_userspace_memory_region,
};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::devices::{Console, IrqEvent, LegacyDevices};
use crate::memory::{GuestRam, MemoryError, Reservation};
use crate::snapshot::VmState;
use crate::vcpu::{self, SaveSet, VcpuError};
use crate::virtio::mmio::MmioAction;
use crate::virtio::vsock_host::VsockHost;
use crate::virtio::{self, Device, MmioTransport, TransportError};
use std::sync::{Arc, Mutex};

/// Errors of this module. Those marked as ending the VM leave it unusable; the host side
/// carries on.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("descriptor {0} is not /dev/kvm")]
    NotKvm(i32),
    #[error("opening /dev/kvm failed")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("{0} failed")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error("creating an interrupt eventfd failed")]
    EventFd(#[source] std::io::Error),
    #[error("guest memory")]
    Memory(#[source] MemoryError),
    #[error("restoring the serial port failed")]
    Serial(#[source] crate::devices::serial::SerialError),
    #[error("vCPU state")]
    Vcpu(#[source] VcpuError),
    #[error("loading guest code at {address:#x} failed")]
    Load {
        address: u64,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// Ends the VM: a device could not handle what the guest queued.
    #[error("the guest's virtio device failed; the VM is stopped")]
    Device(#[source] TransportError),
    /// Ends the VM.
    #[error("the vCPU exited with {0}, which this VMM does not handle; the VM is stopped")]
    UnexpectedExit(String),
    #[error("KVM_RUN failed; the VM is stopped")]
    Run(#[source] kvm_ioctls::Error),
    #[error("a fork's memory is a private mapping; snapshot it to disk to fork from it")]
    PrivateMemory,
    #[error("the VM was stopped by an earlier error")]
    Stopped,
    #[error("starting the vsock device's host side failed")]
    VsockHost(#[source] crate::virtio::vsock_host::VsockHostError),
    #[error("loading the Linux guest failed")]
    Linux(#[source] crate::linux::LinuxError),
    #[error("the shell has {actual} virtio interrupt lines, the VM needs {wanted}")]
    ShellDevices { wanted: usize, actual: usize },
    #[error("giving the restored VM its disks failed")]
    Disk(#[source] crate::virtio::block::BlockError),
}

/// Why [`Vm::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmExit {
    /// The guest asked for a CPU reset through the i8042 (Linux's `reboot=k`).
    Reset,
    /// Triple fault (Linux's `reboot=t`).
    Shutdown,
    /// The guest halted with no interrupt controller to wake it (only without an irqchip).
    Halted,
    /// The exit budget ran out; the vCPU is paused at an instruction boundary.
    Paused,
}

/// Set (by a signal handler, say) to pause the VM at the next exit: [`Vm::run`] then returns
/// [`VmExit::Paused`]. A signal interrupts KVM_RUN (EINTR) when it lands on the vCPU thread;
/// one that lands just before KVM_RUN waits for the guest's next exit, so senders repeat it.
pub static PAUSE_REQUESTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A KVM handle and what it can save, shared by the VMs of one process.
#[derive(Debug)]
pub struct Vmm {
    pub kvm: Kvm,
    pub save_set: SaveSet,
    pub cpuid: kvm_bindings::CpuId,
}

impl Vmm {
    pub fn new() -> Result<Vmm, VmError> {
        Self::with(Kvm::new().map_err(VmError::OpenKvm)?)
    }

    /// Uses `/dev/kvm` opened by someone else and inherited as descriptor `fd` (a jailed VMM
    /// sees no `/dev/kvm`, and its user could not open it). The descriptor must be this
    /// process's to own, as an inherited one is at start-up; it is checked to be the KVM
    /// device (character device 10:232, KVM API version 12).
    pub fn from_inherited_fd(fd: i32) -> Result<Vmm, VmError> {
        // SAFETY: fstat writes into a zeroed stat of the right type; the result is checked.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; an invalid descriptor makes fstat fail, which is checked.
        if unsafe { libc::fstat(fd, &mut stat) } != 0
            || stat.st_mode & libc::S_IFMT != libc::S_IFCHR
            || (libc::major(stat.st_rdev), libc::minor(stat.st_rdev)) != (10, 232)
        {
            return Err(VmError::NotKvm(fd));
        }
        // SAFETY: the descriptor is open (fstat succeeded), is the KVM device, and the caller
        // hands over its ownership (see above), so the Kvm handle may close it.
        let kvm = unsafe { <Kvm as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if kvm.get_api_version() != 12 {
            return Err(VmError::NotKvm(fd));
        }
        Self::with(kvm)
    }

    fn with(kvm: Kvm) -> Result<Vmm, VmError> {
        let save_set = SaveSet::probe(&kvm);
        let cpuid = vcpu::supported_cpuid(&kvm).map_err(VmError::Vcpu)?;
        Ok(Vmm {
            kvm,
            save_set,
            cpuid,
        })
    }
}

/// A VM's KVM objects before it has memory or state: the VM with its irqchip and PIT, one
/// vCPU, and the interrupt eventfds wired to GSIs. Creating these is most of a fork's cost,
/// so a pool keeps some ready ([`crate::fork`]).
#[derive(Debug)]
pub struct VmShell {
    vm: VmFd,
    vcpu: VcpuFd,
    serial_irq: EventFd,
    virtio_irqs: Vec<EventFd>,
    /// Last: unmapped only after the KVM objects are closed.
    reservation: Reservation,
}

const TSS_ADDRESS: usize = 0xfffb_d000;
const SERIAL_GSI: u32 = 4;

impl VmShell {
    /// A shell for a VM of `memory_bytes` of RAM with `virtio_devices` virtio-mmio devices.
    pub fn create(vmm: &Vmm, virtio_devices: usize, memory_bytes: u64) -> Result<VmShell, VmError> {
        let reservation = Reservation::new(memory_bytes).map_err(VmError::Memory)?;
        let vm = vmm
            .kvm
            .create_vm()
            .map_err(|e| VmError::Kvm("KVM_CREATE_VM", e))?;
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: reservation.size_bytes(),
            userspace_addr: reservation.host_address(),
            flags: 0,
        };
        // SAFETY: the region is the reservation's own address range, which the shell (and
        // then the Vm's GuestRam) keeps mapped until after the VM fd is closed (field order),
        // so KVM never sees an unmapped range. What is mapped there changes later
        // (memory.rs); KVM follows through its MMU notifier. The slot is set before the
        // irqchip exists, where the ioctl is cheap.
        unsafe { vm.set_user_memory_region(region) }
            .map_err(|e| VmError::Kvm("KVM_SET_USER_MEMORY_REGION", e))?;
        vm.set_tss_address(TSS_ADDRESS)
            .map_err(|e| VmError::Kvm("KVM_SET_TSS_ADDR", e))?;
        vm.create_irq_chip()
            .map_err(|e| VmError::Kvm("KVM_CREATE_IRQCHIP", e))?;
        vm.create_pit2(kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        })
        .map_err(|e| VmError::Kvm("KVM_CREATE_PIT2", e))?;
        let irq = |gsi| -> Result<EventFd, VmError> {
            let event = EventFd::new(EFD_NONBLOCK).map_err(VmError::EventFd)?;
            vm.register_irqfd(&event, gsi)
                .map_err(|e| VmError::Kvm("KVM_IRQFD", e))?;
            Ok(event)
        };
        let serial_irq = irq(SERIAL_GSI)?;
        let virtio_irqs = (0..virtio_devices)
            .map(|i| irq(virtio::FIRST_IRQ + i as u32))
            .collect::<Result<Vec<_>, _>>()?;
        let vcpu = vm
            .create_vcpu(0)
            .map_err(|e| VmError::Kvm("KVM_CREATE_VCPU", e))?;
        Ok(VmShell {
            vm,
            vcpu,
            serial_irq,
            virtio_irqs,
            reservation,
        })
    }

    pub fn memory_bytes(&self) -> u64 {
        self.reservation.size_bytes()
    }

    fn check_memory(&self, wanted: u64) -> Result<(), VmError> {
        if self.memory_bytes() == wanted {
            return Ok(());
        }
        Err(VmError::Memory(MemoryError::ShellSize {
            shell: self.memory_bytes(),
            wanted,
        }))
    }
}

/// A shell without its reservation (which has become the VM's RAM).
struct ShellParts {
    vm: VmFd,
    vcpu: VcpuFd,
    serial_irq: EventFd,
    virtio_irqs: Vec<EventFd>,
}

impl VmShell {
    fn split(self) -> (ShellParts, Reservation) {
        let VmShell {
            vm,
            vcpu,
            serial_irq,
            virtio_irqs,
            reservation,
        } = self;
        (
            ShellParts {
                vm,
                vcpu,
                serial_irq,
                virtio_irqs,
            },
            reservation,
        )
    }
}

/// What a freestanding VM boots with.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub memory_bytes: u64,
    /// Guest-physical address of the first instruction (32-bit protected mode).
    pub entry: u64,
    /// Code and data to place in RAM: (guest-physical address, bytes).
    pub image: Vec<(u64, Vec<u8>)>,
    /// Whether to attach a virtio-rng device (at [`virtio::MMIO_BASE`], GSI
    /// [`virtio::FIRST_IRQ`]).
    pub entropy_device: bool,
}

/// A running (or paused) VM.
#[derive(Debug)]
pub struct Vm {
    /// First: its thread is stopped and joined before the RAM it writes is unmapped.
    vsock_host: Option<VsockHost>,
    vm: VmFd,
    vcpu: VcpuFd,
    save_set: SaveSet,
    ram: GuestRam,
    legacy: LegacyDevices,
    /// Shared with the vsock host thread, which fills the vsock device's queues.
    virtio: Vec<Arc<Mutex<MmioTransport>>>,
    virtio_irqs: Vec<EventFd>,
    console: Console,
    /// The last exit was an I/O or MMIO exit KVM has not completed yet (it does so at the
    /// next KVM_RUN); state read before that would replay the instruction.
    exit_pending: bool,
    stopped: bool,
}

impl Vm {
    /// Builds a VM in `shell` with fresh RAM and `config`'s image, ready to run from its entry.
    pub fn boot(vmm: &Vmm, shell: VmShell, config: &VmConfig) -> Result<Vm, VmError> {
        let devices = if config.entropy_device {
            vec![Device::Rng(virtio::Rng::new())]
        } else {
            Vec::new()
        };
        Self::boot_with_devices(vmm, shell, config, devices)
    }

    /// [`Vm::boot`] with `devices` on virtio-mmio (window `i` at [`virtio::MMIO_BASE`] + `i` *
    /// [`virtio::MMIO_SIZE`], GSI [`virtio::FIRST_IRQ`] + `i`) instead of `config`'s entropy
    /// device: how the tests drive a block device from a freestanding guest.
    pub fn boot_with_devices(
        vmm: &Vmm,
        shell: VmShell,
        config: &VmConfig,
        devices: Vec<Device>,
    ) -> Result<Vm, VmError> {
        shell.check_memory(config.memory_bytes)?;
        let (shell, reservation) = shell.split();
        let ram = GuestRam::new_shared(reservation).map_err(VmError::Memory)?;
        for (address, bytes) in &config.image {
            ram.memory
                .write_slice(bytes, GuestAddress(*address))
                .map_err(|source| VmError::Load {
                    address: *address,
                    source,
                })?;
        }
        let virtio = devices.into_iter().map(MmioTransport::new).collect();
        let vm = Self::assemble(vmm, shell, ram, None, virtio)?;
        vcpu::set_boot_state(&vm.vcpu, &vmm.cpuid, config.entry, 0).map_err(VmError::Vcpu)?;
        Ok(vm)
    }

    /// Builds a VM in `shell` that boots a Linux kernel through its PVH entry, with `devices`
    /// on virtio-mmio (window `i` at [`virtio::MMIO_BASE`] + `i` * [`virtio::MMIO_SIZE`], GSI
    /// [`virtio::FIRST_IRQ`] + `i`; described in ACPI and, for kernels that read them, in the
    /// command line's `virtio_mmio.device=` entries the caller adds with
    /// [`virtio_cmdline_devices`]).
    pub fn boot_linux(
        vmm: &Vmm,
        shell: VmShell,
        boot: &crate::linux::LinuxBoot,
        devices: Vec<Device>,
    ) -> Result<Vm, VmError> {
        let memory_bytes = shell.memory_bytes();
        let (shell, reservation) = shell.split();
        let ram = GuestRam::new_shared(reservation).map_err(VmError::Memory)?;
        let windows = mmio_windows(devices.len());
        let entry = crate::linux::load(&ram.memory, memory_bytes, boot, &windows)
            .map_err(VmError::Linux)?;
        let virtio = devices.into_iter().map(MmioTransport::new).collect();
        let vm = Self::assemble(vmm, shell, ram, None, virtio)?;
        vcpu::set_boot_state(&vm.vcpu, &vmm.cpuid, entry.entry, entry.start_info)
            .map_err(VmError::Vcpu)?;
        Ok(vm)
    }

    /// Builds a VM in `shell` from a snapshot's state, its RAM a private (copy-on-write)
    /// mapping of the snapshot's `memory`: the fork path.
    pub fn restore(
        vmm: &Vmm,
        shell: VmShell,
        state: &VmState,
        memory: std::sync::Arc<std::fs::File>,
    ) -> Result<Vm, VmError> {
        shell.check_memory(state.memory_bytes)?;
        let (shell, reservation) = shell.split();
        let ram = GuestRam::new_private(reservation, memory).map_err(VmError::Memory)?;
        let virtio = state
            .virtio
            .iter()
            .map(MmioTransport::restore)
            .collect::<Result<Vec<_>, _>>()
            .map_err(VmError::Device)?;
        let vm = Self::assemble(vmm, shell, ram, Some(&state.legacy), virtio)?;
        vcpu::restore(&vm.vcpu, &state.vcpu).map_err(VmError::Vcpu)?;
        for chip in &state.irqchips {
            vm.vm
                .set_irqchip(chip)
                .map_err(|e| VmError::Kvm("KVM_SET_IRQCHIP", e))?;
        }
        vm.vm
            .set_pit2(&state.pit)
            .map_err(|e| VmError::Kvm("KVM_SET_PIT2", e))?;
        // KVM_SET_CLOCK accepts only the flags it documents; the saved ones say which
        // fields KVM_GET_CLOCK filled.
        let mut clock = state.clock;
        clock.flags = 0;
        vm.vm
            .set_clock(&clock)
            .map_err(|e| VmError::Kvm("KVM_SET_CLOCK", e))?;
        Ok(vm)
    }

    fn assemble(
        vmm: &Vmm,
        shell: ShellParts,
        ram: GuestRam,
        legacy: Option<&crate::devices::LegacyState>,
        virtio: Vec<MmioTransport>,
    ) -> Result<Vm, VmError> {
        if virtio.len() > shell.virtio_irqs.len() {
            return Err(VmError::ShellDevices {
                wanted: virtio.len(),
                actual: shell.virtio_irqs.len(),
            });
        }
        let console = Console::default();
        let serial_irq = IrqEvent(shell.serial_irq);
        let legacy = match legacy {
            None => LegacyDevices::new(serial_irq, console.clone()),
            Some(state) => LegacyDevices::restore(state, serial_irq, console.clone())
                .map_err(VmError::Serial)?,
        };
        Ok(Vm {
            vsock_host: None,
            vm: shell.vm,
            vcpu: shell.vcpu,
            save_set: vmm.save_set.clone(),
            ram,
            legacy,
            virtio: virtio
                .into_iter()
                .map(|t| Arc::new(Mutex::new(t)))
                .collect(),
            virtio_irqs: shell.virtio_irqs,
            console,
            exit_pending: false,
            stopped: false,
        })
    }

    /// The guest's console output so far.
    pub fn console(&self) -> &Console {
        &self.console
    }

    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    pub fn vcpu(&self) -> &VcpuFd {
        &self.vcpu
    }

    /// The virtio transports' state now.
    pub fn virtio_states(&self) -> Vec<virtio::TransportState> {
        self.virtio.iter().map(|t| lock(t).state()).collect()
    }

    /// Gives a restored VM's block devices their disks, in device order (the order of the
    /// `--disk` flags that booted it); each must have the size and mode the snapshot
    /// recorded, and every block device must get one.
    pub fn attach_disks(&mut self, disks: Vec<crate::virtio::block::Disk>) -> Result<(), VmError> {
        use crate::virtio::block::BlockError;
        let blocks: Vec<_> = self
            .virtio
            .iter()
            .filter(|t| matches!(lock(t).device(), Device::Block(_)))
            .cloned()
            .collect();
        if blocks.len() != disks.len() {
            return Err(VmError::Disk(BlockError::Count {
                expected: blocks.len(),
                actual: disks.len(),
            }));
        }
        for (index, (transport, disk)) in blocks.iter().zip(disks).enumerate() {
            if let Device::Block(block) = lock(transport).device_mut() {
                block.attach(disk, index).map_err(VmError::Disk)?;
            }
        }
        Ok(())
    }

    /// Starts the host side of the VM's vsock device (if it has one), accepting host
    /// connections on `listener` and the guest's to the ports of `forwards` (a restored VM
    /// gets both here too).
    pub fn start_vsock_host(
        &mut self,
        listener: Option<virtio::HostListener>,
        forwards: Vec<virtio::Forward>,
    ) -> Result<bool, VmError> {
        let Some(index) = self
            .virtio
            .iter()
            .position(|t| matches!(lock(t).device(), Device::Vsock(_)))
        else {
            return Ok(false);
        };
        let irq = self.virtio_irqs[index]
            .try_clone()
            .map_err(VmError::EventFd)?;
        let host = VsockHost::start(
            self.virtio[index].clone(),
            self.ram.memory.clone(),
            irq,
            listener,
            forwards,
        )
        .map_err(VmError::VsockHost)?;
        self.vsock_host = Some(host);
        Ok(true)
    }

    /// Runs the vCPU until the guest resets, shuts down or halts, or until `max_exits` exits
    /// to user space have been handled ([`VmExit::Paused`]).
    pub fn run(&mut self, max_exits: Option<u64>) -> Result<VmExit, VmError> {
        if self.stopped {
            return Err(VmError::Stopped);
        }
        let result = self.run_loop(max_exits);
        if result.is_err() {
            self.stopped = true;
        }
        result
    }

    fn run_loop(&mut self, max_exits: Option<u64>) -> Result<VmExit, VmError> {
        let mut exits: u64 = 0;
        loop {
            if max_exits.is_some_and(|max| exits >= max)
                || PAUSE_REQUESTED.swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                self.complete_pending_exit()?;
                return Ok(VmExit::Paused);
            }
            let exit = match self.vcpu.run() {
                Ok(exit) => exit,
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
                Err(e) => return Err(VmError::Run(e)),
            };
            exits += 1;
            self.exit_pending = false;
            match exit {
                VcpuExit::IoOut(port, data) => {
                    self.legacy.write(port, data);
                    self.exit_pending = true;
                    if self.legacy.reset.take() {
                        return Ok(VmExit::Reset);
                    }
                }
                VcpuExit::IoIn(port, data) => {
                    self.legacy.read(port, data);
                    self.exit_pending = true;
                }
                VcpuExit::MmioRead(address, data) => {
                    data.fill(0xff);
                    if let Some((index, offset)) = virtio_window(address, self.virtio.len()) {
                        lock(&self.virtio[index]).read(offset, data);
                    }
                    self.exit_pending = true;
                }
                VcpuExit::MmioWrite(address, data) => {
                    self.exit_pending = true;
                    if let Some((index, offset)) = virtio_window(address, self.virtio.len()) {
                        let action = lock(&self.virtio[index])
                            .write(offset, data, &self.ram.memory)
                            .map_err(VmError::Device)?;
                        if action == MmioAction::Interrupt {
                            // A full eventfd (the counter at its maximum) already signals.
                            let _ = self.virtio_irqs[index].write(1);
                        }
                    }
                }
                VcpuExit::Hlt => return Ok(VmExit::Halted),
                VcpuExit::Shutdown => return Ok(VmExit::Shutdown),
                other => return Err(VmError::UnexpectedExit(format!("{other:?}"))),
            }
        }
    }

    /// Lets KVM finish the instruction of the last I/O or MMIO exit without entering the
    /// guest (KVM_RUN with `immediate_exit` set), so that saved registers point past it.
    fn complete_pending_exit(&mut self) -> Result<(), VmError> {
        if !self.exit_pending {
            return Ok(());
        }
        self.vcpu.set_kvm_immediate_exit(1);
        let result = self.vcpu.run().map(|_| ());
        self.vcpu.set_kvm_immediate_exit(0);
        match result {
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(VmError::Run(e)),
            Ok(()) => {
                return Err(VmError::UnexpectedExit(
                    "an exit while completing I/O".into(),
                ));
            }
        }
        self.exit_pending = false;
        Ok(())
    }

    /// The VM's whole state but its memory; the vCPU must be paused ([`Vm::run`] returned).
    pub fn save_state(&mut self) -> Result<VmState, VmError> {
        if self.stopped {
            return Err(VmError::Stopped);
        }
        self.complete_pending_exit()?;
        let vcpu = vcpu::save(&self.vcpu, &self.save_set).map_err(VmError::Vcpu)?;
        let irqchips = [
            KVM_IRQCHIP_PIC_MASTER,
            KVM_IRQCHIP_PIC_SLAVE,
            KVM_IRQCHIP_IOAPIC,
        ]
        .into_iter()
        .map(|chip_id| {
            let mut chip = kvm_irqchip {
                chip_id,
                ..Default::default()
            };
            self.vm
                .get_irqchip(&mut chip)
                .map(|()| chip)
                .map_err(|e| VmError::Kvm("KVM_GET_IRQCHIP", e))
        })
        .collect::<Result<Vec<_>, _>>()?;
        Ok(VmState {
            format_version: crate::snapshot::FORMAT_VERSION,
            memory_bytes: self.ram.size_bytes,
            vcpu,
            irqchips,
            pit: self
                .vm
                .get_pit2()
                .map_err(|e| VmError::Kvm("KVM_GET_PIT2", e))?,
            clock: self
                .vm
                .get_clock()
                .map_err(|e| VmError::Kvm("KVM_GET_CLOCK", e))?,
            legacy: self.legacy.state(),
            virtio: self.virtio_states(),
        })
    }

    /// Puts `identity` in the vCPU's RBX before a fork's first run. The test guests read it;
    /// the Linux guest's agent will get its identity and access token over vsock instead.
    pub fn set_identity(&mut self, identity: u64) -> Result<(), VmError> {
        let mut regs = self
            .vcpu
            .get_regs()
            .map_err(|e| VmError::Kvm("KVM_GET_REGS", e))?;
        regs.rbx = identity;
        self.vcpu
            .set_regs(&regs)
            .map_err(|e| VmError::Kvm("KVM_SET_REGS", e))
    }

    /// Gives up the VM's KVM objects and keeps its RAM (a template's memory).
    pub fn into_ram(self) -> GuestRam {
        let Vm { vm, vcpu, ram, .. } = self;
        drop(vcpu);
        drop(vm);
        ram
    }
}

/// A transport's lock; a panic while it was held cannot leave it half-updated in a way the
/// guest could not also have caused, so a poisoned lock is used as it is.
fn lock(transport: &Mutex<MmioTransport>) -> std::sync::MutexGuard<'_, MmioTransport> {
    transport.lock().unwrap_or_else(|e| e.into_inner())
}

/// The virtio-mmio windows of `count` devices.
pub fn mmio_windows(count: usize) -> Vec<crate::linux::acpi::MmioDevice> {
    (0..count)
        .map(|i| crate::linux::acpi::MmioDevice {
            base: virtio::MMIO_BASE + i as u64 * virtio::MMIO_SIZE,
            size: virtio::MMIO_SIZE,
            gsi: virtio::FIRST_IRQ + i as u32,
        })
        .collect()
}

/// The `virtio_mmio.device=` command-line entries of `count` devices (for kernels built with
/// `VIRTIO_MMIO_CMDLINE_DEVICES`, which then need `acpi=off` to not see them twice).
pub fn virtio_cmdline_devices(count: usize) -> String {
    mmio_windows(count)
        .iter()
        .map(|w| {
            format!(
                "virtio_mmio.device={}K@{:#x}:{}",
                w.size / 1024,
                w.base,
                w.gsi
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which virtio device window, and the offset in it, `address` falls into.
fn virtio_window(address: u64, devices: usize) -> Option<(usize, u64)> {
    let offset = address.checked_sub(virtio::MMIO_BASE)?;
    let index = usize::try_from(offset / virtio::MMIO_SIZE).ok()?;
    (index < devices).then_some((index, offset % virtio::MMIO_SIZE))
}
