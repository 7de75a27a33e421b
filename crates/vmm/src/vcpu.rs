//! One vCPU's architectural state: the boot state (32-bit protected mode, flat segments,
//! paging off: what the PVH entry expects), and save/restore for snapshots.

use kvm_bindings::{
    CpuId, Msrs, kvm_cpuid_entry2, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_segment, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

/// Errors of this module; each names the ioctl that failed.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("KVM_GET_SUPPORTED_CPUID failed")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    #[error("KVM_SET_CPUID2 failed")]
    SetCpuid(#[source] kvm_ioctls::Error),
    #[error("{0} failed")]
    Ioctl(&'static str, #[source] kvm_ioctls::Error),
    #[error("building the MSR list failed")]
    MsrList,
    #[error("KVM_SET_MSRS set {set} of {wanted} MSRs")]
    SetMsrs { set: usize, wanted: usize },
}

/// MSRs a snapshot carries (the SYSCALL/SYSENTER set, TSC, PAT, and what a Linux guest's
/// paravirtual clock, timers and interrupts use), filtered by what this host's KVM reports it
/// can save. Restored in this order: the TSC before its deadline (last).
const SNAPSHOT_MSRS: &[u32] = &[
    0x0000_0010, // IA32_TSC
    0x0000_003b, // IA32_TSC_ADJUST
    0x0000_0174, // IA32_SYSENTER_CS
    0x0000_0175, // IA32_SYSENTER_ESP
    0x0000_0176, // IA32_SYSENTER_EIP
    0x0000_01a0, // IA32_MISC_ENABLE
    0x0000_0277, // IA32_PAT
    0xc000_0081, // STAR
    0xc000_0082, // LSTAR
    0xc000_0083, // CSTAR
    0xc000_0084, // SYSCALL_MASK
    0xc000_0102, // KERNEL_GS_BASE
    0xc000_0103, // TSC_AUX
    0x4b56_4d00, // MSR_KVM_WALL_CLOCK_NEW
    0x4b56_4d01, // MSR_KVM_SYSTEM_TIME_NEW (kvmclock)
    0x4b56_4d02, // MSR_KVM_ASYNC_PF_EN
    0x4b56_4d03, // MSR_KVM_STEAL_TIME
    0x4b56_4d04, // MSR_KVM_PV_EOI_EN
    0x4b56_4d05, // MSR_KVM_POLL_CONTROL
    0x4b56_4d06, // MSR_KVM_ASYNC_PF_INT
    0x0000_06e0, // IA32_TSC_DEADLINE (the guest's next timer interrupt)
];

/// Everything of one vCPU a snapshot restores, in the order [`restore`] sets it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub sregs: kvm_sregs,
    /// `None` where KVM lacks KVM_CAP_XCRS.
    pub xcrs: Option<kvm_xcrs>,
    pub xsave: kvm_xsave,
    pub regs: kvm_regs,
    pub lapic: kvm_lapic_state,
    pub msrs: Vec<kvm_msr_entry>,
    pub vcpu_events: kvm_vcpu_events,
    pub mp_state: kvm_mp_state,
}

/// The host's CPUID for guests, with the APIC id of vCPU 0.
/// Leaf 1 also says "running under a hypervisor" (ECX bit 31), without which Linux looks
/// for no KVM leaves: no kvm-clock, no TSC frequency, no paravirtual features.
pub fn supported_cpuid(kvm: &Kvm) -> Result<CpuId, VcpuError> {
    let mut cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(VcpuError::SupportedCpuid)?;
    for entry in cpuid.as_mut_slice() {
        if entry.function == 1 {
            entry.ecx |= 1 << 31;
            entry.ebx &= 0x00ff_ffff; // initial APIC id 0
        }
    }
    Ok(cpuid)
}

fn flat_segment(selector: u16, type_: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Puts the vCPU at `entry` in 32-bit protected mode with flat code and data segments and
/// paging off, interrupts disabled; `rbx` is the PVH start-info pointer (0 for test guests).
pub fn set_boot_state(vcpu: &VcpuFd, cpuid: &CpuId, entry: u64, rbx: u64) -> Result<(), VcpuError> {
    vcpu.set_cpuid2(cpuid).map_err(VcpuError::SetCpuid)?;
    let mut sregs = vcpu
        .get_sregs()
        .map_err(|e| VcpuError::Ioctl("KVM_GET_SREGS", e))?;
    sregs.cs = flat_segment(0x08, 0xb);
    let data = flat_segment(0x10, 0x3);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment {
        limit: 0x67,
        type_: 0xb,
        s: 0,
        db: 0,
        g: 0,
        selector: 0x18,
        ..flat_segment(0x18, 0xb)
    };
    sregs.cr0 = 0x11; // PE | ET
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    vcpu.set_sregs(&sregs)
        .map_err(|e| VcpuError::Ioctl("KVM_SET_SREGS", e))?;
    let regs = kvm_regs {
        rip: entry,
        rbx,
        rflags: 0x2,
        ..Default::default()
    };
    vcpu.set_regs(&regs)
        .map_err(|e| VcpuError::Ioctl("KVM_SET_REGS", e))?;
    // LINT0 = ExtINT (the PIC), LINT1 = NMI, as the reference VMMs set them.
    let mut lapic = vcpu
        .get_lapic()
        .map_err(|e| VcpuError::Ioctl("KVM_GET_LAPIC", e))?;
    set_lapic_lvt(&mut lapic, 0x350, 0x700);
    set_lapic_lvt(&mut lapic, 0x360, 0x400);
    vcpu.set_lapic(&lapic)
        .map_err(|e| VcpuError::Ioctl("KVM_SET_LAPIC", e))?;
    Ok(())
}

fn set_lapic_lvt(lapic: &mut kvm_lapic_state, offset: usize, mode: u32) {
    let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[offset + i].cast_unsigned());
    let value = (u32::from_le_bytes(bytes) & !0x700) | mode;
    for (i, byte) in value.to_le_bytes().into_iter().enumerate() {
        lapic.regs[offset + i] = byte.cast_signed();
    }
}

/// What this host's KVM can save of a vCPU, found once per [`crate::vm::Vmm`].
#[derive(Debug, Clone)]
pub struct SaveSet {
    /// The MSRs of [`SNAPSHOT_MSRS`] KVM reports it can save.
    pub msr_indices: Vec<u32>,
    pub xcrs: bool,
}

impl SaveSet {
    pub fn probe(kvm: &Kvm) -> SaveSet {
        let saveable = kvm
            .get_msr_index_list()
            .map(|list| list.as_slice().to_vec())
            .unwrap_or_default();
        SaveSet {
            msr_indices: SNAPSHOT_MSRS
                .iter()
                .copied()
                .filter(|index| saveable.contains(index))
                .collect(),
            xcrs: kvm.check_extension(Cap::Xcrs),
        }
    }
}

/// Reads the vCPU's state; the vCPU must not be running and its last exit completed.
pub fn save(vcpu: &VcpuFd, save_set: &SaveSet) -> Result<VcpuState, VcpuError> {
    let msr_indices = &save_set.msr_indices;
    let io = |name| move |e| VcpuError::Ioctl(name, e);
    let cpuid = vcpu
        .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(io("KVM_GET_CPUID2"))?
        .as_slice()
        .to_vec();
    let entries: Vec<kvm_msr_entry> = msr_indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    let mut msrs = Msrs::from_entries(&entries).map_err(|_| VcpuError::MsrList)?;
    let read = vcpu.get_msrs(&mut msrs).map_err(io("KVM_GET_MSRS"))?;
    let xcrs = if save_set.xcrs {
        Some(vcpu.get_xcrs().map_err(io("KVM_GET_XCRS"))?)
    } else {
        None
    };
    Ok(VcpuState {
        cpuid,
        sregs: vcpu.get_sregs().map_err(io("KVM_GET_SREGS"))?,
        xcrs,
        xsave: vcpu.get_xsave().map_err(io("KVM_GET_XSAVE"))?,
        regs: vcpu.get_regs().map_err(io("KVM_GET_REGS"))?,
        lapic: vcpu.get_lapic().map_err(io("KVM_GET_LAPIC"))?,
        msrs: msrs.as_slice()[..read].to_vec(),
        vcpu_events: vcpu.get_vcpu_events().map_err(io("KVM_GET_VCPU_EVENTS"))?,
        mp_state: vcpu.get_mp_state().map_err(io("KVM_GET_MP_STATE"))?,
    })
}

/// Sets a saved state on a fresh vCPU, in the order that works (CPUID before XSAVE and MSRs,
/// the LAPIC after the registers, MP state last).
pub fn restore(vcpu: &VcpuFd, state: &VcpuState) -> Result<(), VcpuError> {
    let io = |name| move |e| VcpuError::Ioctl(name, e);
    let cpuid = CpuId::from_entries(&state.cpuid).map_err(|_| VcpuError::MsrList)?;
    vcpu.set_cpuid2(&cpuid).map_err(VcpuError::SetCpuid)?;
    vcpu.set_sregs(&state.sregs).map_err(io("KVM_SET_SREGS"))?;
    if let Some(xcrs) = &state.xcrs {
        vcpu.set_xcrs(xcrs).map_err(io("KVM_SET_XCRS"))?;
    }
    // SAFETY: `state.xsave` is a whole `kvm_xsave` (the legacy 4 KiB layout KVM_GET_XSAVE
    // returns), so KVM reads no more than the struct holds.
    unsafe { vcpu.set_xsave(&state.xsave) }.map_err(io("KVM_SET_XSAVE"))?;
    vcpu.set_regs(&state.regs).map_err(io("KVM_SET_REGS"))?;
    vcpu.set_lapic(&state.lapic).map_err(io("KVM_SET_LAPIC"))?;
    if !state.msrs.is_empty() {
        let msrs = Msrs::from_entries(&state.msrs).map_err(|_| VcpuError::MsrList)?;
        let set = vcpu.set_msrs(&msrs).map_err(io("KVM_SET_MSRS"))?;
        if set != state.msrs.len() {
            return Err(VcpuError::SetMsrs {
                set,
                wanted: state.msrs.len(),
            });
        }
    }
    vcpu.set_vcpu_events(&state.vcpu_events)
        .map_err(io("KVM_SET_VCPU_EVENTS"))?;
    vcpu.set_mp_state(state.mp_state)
        .map_err(io("KVM_SET_MP_STATE"))?;
    Ok(())
}
