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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: failing loudly is the point")]

    use super::*;
    use vm_memory::{ByteValued, GuestMemoryMmap};

    const LOAD_AT: u64 = 0x100_0000;
    const ENTRY: u32 = 0x100_0008;

    /// A minimal ELF64 "kernel": one PT_LOAD of 16 bytes at 16 MiB and, when `pvh`, a PT_NOTE
    /// with the Xen PHYS32_ENTRY note.
    fn tiny_elf(pvh: bool) -> Vec<u8> {
        let mut elf = vec![0u8; 0x210];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2; // 64-bit
        elf[5] = 1; // little-endian
        elf[6] = 1;
        elf[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        elf[20..24].copy_from_slice(&1u32.to_le_bytes());
        elf[24..32].copy_from_slice(&LOAD_AT.to_le_bytes()); // e_entry
        elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[52..54].copy_from_slice(&64u16.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&2u16.to_le_bytes()); // e_phnum
        let phdr = |at: usize, elf: &mut Vec<u8>, kind: u32, offset: u64, paddr: u64, size: u64| {
            elf[at..at + 4].copy_from_slice(&kind.to_le_bytes());
            elf[at + 8..at + 16].copy_from_slice(&offset.to_le_bytes());
            elf[at + 16..at + 24].copy_from_slice(&paddr.to_le_bytes());
            elf[at + 24..at + 32].copy_from_slice(&paddr.to_le_bytes());
            elf[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
            elf[at + 40..at + 48].copy_from_slice(&(size.max(0x1000)).to_le_bytes());
        };
        phdr(64, &mut elf, 1, 0x200, LOAD_AT, 16);
        // A PT_NOTE with another note type when not `pvh`.
        phdr(120, &mut elf, 4, 0x180, 0, 20);
        let note_type: u32 = if pvh { 18 } else { 1 };
        elf[0x180..0x184].copy_from_slice(&4u32.to_le_bytes());
        elf[0x184..0x188].copy_from_slice(&4u32.to_le_bytes());
        elf[0x188..0x18c].copy_from_slice(&note_type.to_le_bytes());
        elf[0x18c..0x190].copy_from_slice(b"Xen\0");
        elf[0x190..0x194].copy_from_slice(&ENTRY.to_le_bytes());
        elf[0x200..0x210].copy_from_slice(b"kernel code here");
        elf
    }

    fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("airlock-linux-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn test_load_pvh_kernel_writes_start_info_memmap_cmdline_and_initrd() {
        let memory_bytes: u64 = 64 << 20;
        let memory =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), memory_bytes as usize)])
                .unwrap();
        let kernel = scratch("kernel", &tiny_elf(true));
        let initrd = scratch("initrd", &[7u8; 5000]);
        let boot = LinuxBoot {
            kernel: kernel.clone(),
            initrd: Some(initrd.clone()),
            cmdline: "console=ttyS0 quiet".into(),
        };
        let devices = [acpi::MmioDevice {
            base: 0xd000_0000,
            size: 0x1000,
            gsi: 5,
        }];
        let entry = load(&memory, memory_bytes, &boot, &devices).unwrap();
        assert_eq!(entry.entry, u64::from(ENTRY));
        let mut code = [0u8; 16];
        memory.read_slice(&mut code, GuestAddress(LOAD_AT)).unwrap();
        assert_eq!(&code, b"kernel code here");

        let info: hvm_start_info = memory.read_obj(GuestAddress(entry.start_info)).unwrap();
        assert_eq!((info.magic, info.version), (XEN_HVM_START_MAGIC, 1));
        assert_eq!(info.rsdp_paddr, acpi::RSDP_ADDRESS);
        let mut cmdline = vec![0u8; 20];
        memory
            .read_slice(&mut cmdline, GuestAddress(info.cmdline_paddr))
            .unwrap();
        assert_eq!(&cmdline, b"console=ttyS0 quiet\0");
        assert_eq!(info.memmap_entries, 3);
        let last: hvm_memmap_table_entry = memory
            .read_obj(GuestAddress(info.memmap_paddr + 2 * 24))
            .unwrap();
        assert_eq!(
            (last.addr, last.addr + last.size),
            (HIGH_MEMORY, memory_bytes)
        );
        assert_eq!(info.nr_modules, 1);
        let module: hvm_modlist_entry = memory.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!(module.size, 5000);
        assert_eq!(module.paddr % (2 << 20), 0);
        assert!(module.paddr + module.size <= memory_bytes);
        assert!(
            module.paddr >= LOAD_AT + 0x1000,
            "the initrd overlaps the kernel"
        );
        let mut rsdp = [0u8; 8];
        memory
            .read_slice(&mut rsdp, GuestAddress(acpi::RSDP_ADDRESS))
            .unwrap();
        assert_eq!(&rsdp, b"RSD PTR ");
        assert_eq!(info.as_slice().len(), 56);
        std::fs::remove_file(kernel).unwrap();
        std::fs::remove_file(initrd).unwrap();
    }

    #[test]
    fn test_cmdline_devices_match_the_acpi_windows() {
        assert_eq!(
            crate::vm::virtio_cmdline_devices(2),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
        let windows = crate::vm::mmio_windows(2);
        assert_eq!((windows[1].base, windows[1].gsi), (0xd000_1000, 6));
    }

    #[test]
    fn test_load_kernel_without_pvh_note_is_refused_by_name() {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap();
        let kernel = scratch("nopvh", &tiny_elf(false));
        let boot = LinuxBoot {
            kernel: kernel.clone(),
            initrd: None,
            cmdline: String::new(),
        };
        let err = load(&memory, 32 << 20, &boot, &[]).unwrap_err();
        assert!(matches!(err, LinuxError::NoPvhEntry(_)), "{err}");
        assert!(err.to_string().contains("PVH"), "{err}");
        std::fs::remove_file(kernel).unwrap();
    }

    #[test]
    fn test_load_initrd_larger_than_ram_is_refused() {
        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 32 << 20)]).unwrap();
        let kernel = scratch("big-initrd-kernel", &tiny_elf(true));
        let initrd = scratch("big-initrd", &vec![0u8; 17 << 20]);
        let boot = LinuxBoot {
            kernel: kernel.clone(),
            initrd: Some(initrd.clone()),
            cmdline: String::new(),
        };
        let err = load(&memory, 32 << 20, &boot, &[]).unwrap_err();
        assert!(matches!(err, LinuxError::InitrdTooLarge { .. }), "{err}");
        std::fs::remove_file(kernel).unwrap();
        std::fs::remove_file(initrd).unwrap();
    }
}
