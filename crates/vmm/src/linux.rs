//! Booting a Linux guest through its PVH entry: the ELF `vmlinux` loaded by linux-loader
//! (which finds the entry in the kernel's Xen ELF note), a `hvm_start_info` with the command
//! line, the memory map and the initrd as its one module, and the ACPI tables ([`acpi`]) that
//! describe the virtio-mmio devices to kernels that cannot read them from the command line.
//! The vCPU then starts in 32-bit protected mode at the entry with RBX pointing at the start
//! info ([`crate::vcpu::set_boot_state`]).

pub mod acpi;

use std::fs::File;
use std::path::{Path, PathBuf};

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{KernelLoader, load_cmdline};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    #[error("opening {path} failed")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading the kernel {path} failed")]
    LoadKernel {
        path: PathBuf,
        #[source]
        source: linux_loader::loader::Error,
    },
    #[error(
        "the kernel {0} has no PVH entry note (an ELF vmlinux built with CONFIG_PVH is needed)"
    )]
    NoPvhEntry(PathBuf),
    #[error("the kernel command line is invalid or longer than {max} bytes")]
    Cmdline {
        max: usize,
        #[source]
        source: linux_loader::cmdline::Error,
    },
    #[error("writing the command line failed")]
    WriteCmdline(#[source] linux_loader::loader::Error),
    #[error("the initrd {path} ({size_bytes} bytes) does not fit above the kernel in guest RAM")]
    InitrdTooLarge { path: PathBuf, size_bytes: u64 },
    #[error("reading the initrd {path} failed")]
    ReadInitrd {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing boot data into guest memory failed")]
    Write(#[source] vm_memory::GuestMemoryError),
    #[error("writing the PVH start info failed")]
    StartInfo(#[source] linux_loader::configurator::Error),
}

/// What a Linux guest boots with.
#[derive(Debug, Clone)]
pub struct LinuxBoot {
    /// An uncompressed ELF `vmlinux` with the PVH note.
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
}

/// Where the boot data sits in guest memory (all below 1 MiB, in the reserved or low area).
const START_INFO_ADDRESS: u64 = 0x6000;
const MODLIST_ADDRESS: u64 = 0x6800;
const MEMMAP_ADDRESS: u64 = 0x7000;
const CMDLINE_ADDRESS: u64 = 0x2_0000;
const CMDLINE_MAX_BYTES: usize = 4096;
const HIGH_MEMORY: u64 = 0x10_0000;
const EBDA_START: u64 = 0x9_fc00;
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;

/// Where the vCPU starts and what RBX holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootEntry {
    pub entry: u64,
    pub start_info: u64,
}

/// Loads the kernel, initrd, command line, start info and ACPI tables into `memory` (of
/// `memory_bytes`), describing `devices`.
pub fn load(
    memory: &GuestMemoryMmap,
    memory_bytes: u64,
    boot: &LinuxBoot,
    devices: &[acpi::MmioDevice],
) -> Result<BootEntry, LinuxError> {
    let mut kernel = open(&boot.kernel)?;
    let loaded = Elf::load(memory, None, &mut kernel, Some(GuestAddress(HIGH_MEMORY))).map_err(
        |source| LinuxError::LoadKernel {
            path: boot.kernel.clone(),
            source,
        },
    )?;
    let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
        return Err(LinuxError::NoPvhEntry(boot.kernel.clone()));
    };

    let mut cmdline = Cmdline::new(CMDLINE_MAX_BYTES).map_err(|source| LinuxError::Cmdline {
        max: CMDLINE_MAX_BYTES,
        source,
    })?;
    cmdline
        .insert_str(&boot.cmdline)
        .map_err(|source| LinuxError::Cmdline {
            max: CMDLINE_MAX_BYTES,
            source,
        })?;
    load_cmdline(memory, GuestAddress(CMDLINE_ADDRESS), &cmdline)
        .map_err(LinuxError::WriteCmdline)?;

    let tables = acpi::tables(devices);
    memory
        .write_slice(&tables, GuestAddress(acpi::RSDP_ADDRESS))
        .map_err(LinuxError::Write)?;

    let mut start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_ADDRESS,
        rsdp_paddr: acpi::RSDP_ADDRESS,
        memmap_paddr: MEMMAP_ADDRESS,
        memmap_entries: 3,
        ..Default::default()
    };
    let memmap = [
        hvm_memmap_table_entry {
            addr: 0,
            size: EBDA_START,
            type_: E820_RAM,
            reserved: 0,
        },
        hvm_memmap_table_entry {
            addr: EBDA_START,
            size: HIGH_MEMORY - EBDA_START,
            type_: E820_RESERVED,
            reserved: 0,
        },
        hvm_memmap_table_entry {
            addr: HIGH_MEMORY,
            size: memory_bytes - HIGH_MEMORY,
            type_: E820_RAM,
            reserved: 0,
        },
    ];
    let mut modules = Vec::new();
    if let Some(path) = &boot.initrd {
        let kernel_end = loaded.kernel_load.raw_value() + loaded.kernel_end;
        let (address, size) = load_initrd(memory, memory_bytes, kernel_end, path)?;
        modules.push(hvm_modlist_entry {
            paddr: address,
            size,
            ..Default::default()
        });
        start_info.nr_modules = 1;
        start_info.modlist_paddr = MODLIST_ADDRESS;
    }
    let mut params = BootParams::new(&start_info, GuestAddress(START_INFO_ADDRESS));
    params.set_sections(&memmap, GuestAddress(MEMMAP_ADDRESS));
    if !modules.is_empty() {
        params.set_modules(&modules, GuestAddress(MODLIST_ADDRESS));
    }
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, memory)
        .map_err(LinuxError::StartInfo)?;
    Ok(BootEntry {
        entry: entry.raw_value(),
        start_info: START_INFO_ADDRESS,
    })
}

fn open(path: &Path) -> Result<File, LinuxError> {
    File::open(path).map_err(|source| LinuxError::Open {
        path: path.to_path_buf(),
        source,
    })
}

/// Puts the initrd at the top of RAM, 2 MiB aligned (as QEMU and the reference VMM do).
fn load_initrd(
    memory: &GuestMemoryMmap,
    memory_bytes: u64,
    kernel_end: u64,
    path: &Path,
) -> Result<(u64, u64), LinuxError> {
    let bytes = std::fs::read(path).map_err(|source| LinuxError::ReadInitrd {
        path: path.to_path_buf(),
        source,
    })?;
    let size = bytes.len() as u64;
    let too_large = || LinuxError::InitrdTooLarge {
        path: path.to_path_buf(),
        size_bytes: size,
    };
    let address = memory_bytes
        .checked_sub(size)
        .map(|top| top & !((2 << 20) - 1))
        .filter(|&address| address >= kernel_end)
        .ok_or_else(too_large)?;
    memory
        .write_slice(&bytes, GuestAddress(address))
        .map_err(LinuxError::Write)?;
    Ok((address, size))
}
