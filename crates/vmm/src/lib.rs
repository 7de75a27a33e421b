//! Airlock's small KVM virtual machine monitor, the base of the `microvm` tier.
//!
//! What exists: one vCPU set up in 32-bit protected mode (the PVH entry's state), guest RAM
//! in a memfd (so that a snapshot is that file and a fork maps it `MAP_PRIVATE`), the in-kernel
//! irqchip and PIT, an 8250 console, i8042 reset, a CMOS clock, and virtio-mmio with entropy,
//! vsock and block devices ([`virtio`]). [`snapshot`] saves and restores memory, vCPU and device state;
//! [`fork`] makes copy-on-write forks from one snapshot, optionally into pre-created
//! [`vm::VmShell`]s. [`host`] says what kind of `/dev/kvm` this host has. [`seccomp`] is the
//! VMM's own allow-list; the `airlock-vmm` binary (`main.rs`) runs one VM per process, under it.
//!
//! [`linux`] boots a Linux kernel through its PVH entry. The runtime's microvm backend
//! (`airlock_runtime`, `microvm/`) starts this binary inside the process tier's jail for a
//! sandbox; it needs hardware KVM, which `airlock probe` reports.
//!
//! Everything a guest writes (port and MMIO accesses, virtqueue descriptors) is untrusted: a
//! bad access ends that VM with a [`vm::VmError`], never a panic.

#![allow(
    unsafe_code,
    reason = "a VMM maps guest memory and registers it with KVM; each block says why it holds"
)]

pub mod devices;
pub mod fork;
pub mod fuzzing;
pub mod guest_code;
pub mod host;
pub mod linux;
pub mod memory;
pub mod pause;
pub mod seccomp;
pub mod shell_control;
pub mod snapshot;
pub mod vcpu;
pub mod virtio;
pub mod vm;
