//! The microvm tier's guest and the VMM's part of the jail, as data: where a guest comes from
//! (the operator's settings), how much memory it gets, and what the jail holds and runs.

use std::ffi::OsString;
use std::path::PathBuf;

use airlock_jail::spec::{VMM_FILES_DIR, VmmSpec};

/// The guest kernel (an ELF vmlinux with the PVH entry note).
pub const ENV_KERNEL: &str = "AIRLOCK_MICROVM_KERNEL";
/// Its initramfs, whose init execs `airlock-agent --listen-vsock 49983` ([`AGENT_VSOCK_PORT`]).
pub const ENV_INITRD: &str = "AIRLOCK_MICROVM_INITRD";
/// The kernel command line, instead of [`DEFAULT_CMDLINE`].
pub const ENV_CMDLINE: &str = "AIRLOCK_MICROVM_CMDLINE";
/// Set to `1`: the VMM also declares its devices on the kernel command line
/// (`virtio_mmio.device=`), for a kernel without ACPI such as scripts/guest-kernel.sh's.
pub const ENV_CMDLINE_DEVICES: &str = "AIRLOCK_MICROVM_CMDLINE_DEVICES";
/// A snapshot directory (`airlock-vmm linux --snapshot`) of a booted guest whose agent serves:
/// sandboxes are then its copy-on-write forks, not fresh boots.
pub const ENV_SNAPSHOT: &str = "AIRLOCK_MICROVM_SNAPSHOT";
/// The `airlock-vmm` binary, instead of the one beside the helper.
pub const ENV_VMM_BIN: &str = "AIRLOCK_VMM_BIN";

/// The guest agent's vsock port (envd's port, as E2B's SDKs dial it).
pub const AGENT_VSOCK_PORT: u32 = 49983;
/// No PCI (devices are virtio-mmio, described in ACPI), `reboot=t` ends the VM on a reboot,
/// a quiet console (each byte is a VM exit).
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=t panic=-1 quiet mitigations=off pci=off";
/// A guest's memory when the sandbox has no memory limit, and the least it gets.
pub const DEFAULT_MEMORY_MIB: u64 = 512;
pub const MIN_MEMORY_MIB: u64 = 128;

/// Where a sandbox's guest comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestSource {
    /// Boot a kernel with an initramfs whose init is the agent.
    Boot {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
        /// The devices are declared on the command line too ([`ENV_CMDLINE_DEVICES`]).
        cmdline_devices: bool,
    },
    /// Restore a snapshot (memory mapped copy-on-write): a fork, reseeded at resume.
    Snapshot { dir: PathBuf },
}

impl GuestSource {
    /// From the operator's settings (`get` reads one environment variable); `Err` says what
    /// is missing.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<GuestSource, String> {
        if let Some(dir) = path_var(&get, ENV_SNAPSHOT) {
            return Ok(GuestSource::Snapshot { dir });
        }
        GuestSource::boot_from_vars(get)
    }

    /// The operator's kernel to boot, whether or not a snapshot is set too (a sandbox whose
    /// image is not the snapshot's boots).
    pub fn boot_from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<GuestSource, String> {
        let path = |name: &str| path_var(&get, name);
        let Some(kernel) = path(ENV_KERNEL) else {
            return Err(format!(
                "no guest is configured: set {ENV_KERNEL} (a vmlinux with the PVH entry) and {ENV_INITRD} (an initramfs whose init is `airlock-agent --listen-vsock {AGENT_VSOCK_PORT}`), or {ENV_SNAPSHOT}"
            ));
        };
        let cmdline = get(ENV_CMDLINE).filter(|v| !v.is_empty()).map_or_else(
            || DEFAULT_CMDLINE.to_owned(),
            |v| v.to_string_lossy().into_owned(),
        );
        let cmdline_devices = match get(ENV_CMDLINE_DEVICES) {
            None => false,
            Some(value) if value.is_empty() || value == "0" => false,
            Some(value) if value == "1" => true,
            Some(value) => {
                return Err(format!(
                    "{ENV_CMDLINE_DEVICES} is {value:?}: use 1 (the kernel has no ACPI) or 0"
                ));
            }
        };
        Ok(GuestSource::Boot {
            kernel,
            initrd: path(ENV_INITRD),
            cmdline,
            cmdline_devices,
        })
    }

    pub fn from_env() -> Result<GuestSource, String> {
        GuestSource::from_vars(|name| std::env::var_os(name))
    }

    /// The host paths the guest needs, which must exist when a sandbox starts.
    pub fn required_paths(&self) -> Vec<PathBuf> {
        match self {
            GuestSource::Boot { kernel, initrd, .. } => std::iter::once(kernel.clone())
                .chain(initrd.clone())
                .collect(),
            GuestSource::Snapshot { dir } => vec![dir.join("state.json"), dir.join("memory")],
        }
    }
}

/// A path setting; an empty value is none.
fn path_var(get: &impl Fn(&str) -> Option<OsString>, name: &str) -> Option<PathBuf> {
    get(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The guest's memory for a sandbox whose workload may use `memory_bytes` (its limit without
/// Airlock's reserve, which holds the VMM itself): whole MiB, at least [`MIN_MEMORY_MIB`].
pub fn guest_memory_mib(memory_bytes: Option<u64>) -> u64 {
    memory_bytes.map_or(DEFAULT_MEMORY_MIB, |bytes| {
        (bytes >> 20).max(MIN_MEMORY_MIB)
    })
}

/// What the jail holds and runs for one guest: the files it shows under `VMM_FILES_DIR`
/// and the VMM's arguments (the jail adds `/dev/kvm` and the agent socket's descriptors).
pub fn vmm_spec(source: &GuestSource, memory_mib: u64) -> VmmSpec {
    let inside = |name: &str| format!("{VMM_FILES_DIR}/{name}");
    let port = ["--vsock-port".to_owned(), AGENT_VSOCK_PORT.to_string()];
    match source {
        GuestSource::Boot {
            kernel,
            initrd,
            cmdline,
            cmdline_devices,
        } => {
            let mut files = vec![("kernel".to_owned(), kernel.clone())];
            let mut args = vec!["--kernel".to_owned(), inside("kernel")];
            if *cmdline_devices {
                args.push("--cmdline-devices".to_owned());
            }
            if let Some(initrd) = initrd {
                files.push(("initrd".to_owned(), initrd.clone()));
                args.extend(["--initrd".to_owned(), inside("initrd")]);
            }
            args.extend([
                "--cmdline".to_owned(),
                cmdline.clone(),
                "--memory-mib".to_owned(),
                memory_mib.to_string(),
            ]);
            args.extend(port);
            VmmSpec {
                mode: "linux".to_owned(),
                files,
                disks: Vec::new(),
                args,
            }
        }
        GuestSource::Snapshot { dir } => {
            let mut args = vec!["--snapshot".to_owned(), inside("snapshot")];
            args.extend(port);
            VmmSpec {
                mode: "restore".to_owned(),
                files: vec![("snapshot".to_owned(), dir.clone())],
                disks: Vec::new(),
                args,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn source(vars: &[(&str, &str)]) -> Result<GuestSource, String> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        GuestSource::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn test_guest_source_without_settings_says_what_to_set() {
        let err = source(&[]).unwrap_err();
        for name in [ENV_KERNEL, ENV_INITRD, ENV_SNAPSHOT, "49983"] {
            assert!(err.contains(name), "{err}");
        }
        // An empty value is no setting.
        assert!(source(&[(ENV_KERNEL, "")]).is_err());
    }

    #[test]
    fn test_guest_source_snapshot_wins_over_a_kernel() {
        let both = source(&[(ENV_KERNEL, "/k"), (ENV_SNAPSHOT, "/snap")]).unwrap();
        assert_eq!(
            both,
            GuestSource::Snapshot {
                dir: "/snap".into()
            }
        );
        assert_eq!(
            both.required_paths(),
            [
                PathBuf::from("/snap/state.json"),
                PathBuf::from("/snap/memory")
            ]
        );
        let boot = source(&[(ENV_KERNEL, "/k"), (ENV_CMDLINE, "console=ttyS0")]).unwrap();
        assert_eq!(
            boot,
            GuestSource::Boot {
                kernel: "/k".into(),
                initrd: None,
                cmdline: "console=ttyS0".into(),
                cmdline_devices: false,
            }
        );
    }

    #[test]
    fn test_guest_source_cmdline_devices_for_a_kernel_without_acpi() {
        let kernel = (ENV_KERNEL, "/k");
        let declared = source(&[kernel, (ENV_CMDLINE_DEVICES, "1")]).unwrap();
        let GuestSource::Boot {
            cmdline_devices, ..
        } = &declared
        else {
            panic!("{declared:?}");
        };
        assert!(cmdline_devices);
        let spec = vmm_spec(&declared, 256);
        assert_eq!(
            spec.args[..3],
            ["--kernel", "/run/airlock/vm/kernel", "--cmdline-devices"]
        );
        for off in ["0", ""] {
            let plain = source(&[kernel, (ENV_CMDLINE_DEVICES, off)]).unwrap();
            assert!(
                !vmm_spec(&plain, 256)
                    .args
                    .iter()
                    .any(|a| a == "--cmdline-devices")
            );
        }
        let err = source(&[kernel, (ENV_CMDLINE_DEVICES, "yes")]).unwrap_err();
        assert!(
            err.contains(ENV_CMDLINE_DEVICES) && err.contains("\"yes\""),
            "{err}"
        );
    }

    #[test]
    fn test_guest_memory_is_the_workload_limit_in_mib_with_a_floor() {
        assert_eq!(guest_memory_mib(None), DEFAULT_MEMORY_MIB);
        assert_eq!(guest_memory_mib(Some(384 << 20)), 384);
        assert_eq!(guest_memory_mib(Some((384 << 20) + 5)), 384);
        assert_eq!(guest_memory_mib(Some(1 << 20)), MIN_MEMORY_MIB);
    }

    #[test]
    fn test_vmm_spec_boot_shows_kernel_and_initrd_and_sends_connections_to_the_agent_port() {
        let spec = vmm_spec(
            &GuestSource::Boot {
                kernel: "/srv/vmlinux".into(),
                initrd: Some("/srv/initrd.cpio".into()),
                cmdline: DEFAULT_CMDLINE.into(),
                cmdline_devices: false,
            },
            384,
        );
        assert_eq!(spec.mode, "linux");
        assert_eq!(
            spec.files,
            [
                ("kernel".to_owned(), PathBuf::from("/srv/vmlinux")),
                ("initrd".to_owned(), PathBuf::from("/srv/initrd.cpio"))
            ]
        );
        assert_eq!(
            spec.args,
            [
                "--kernel",
                "/run/airlock/vm/kernel",
                "--initrd",
                "/run/airlock/vm/initrd",
                "--cmdline",
                DEFAULT_CMDLINE,
                "--memory-mib",
                "384",
                "--vsock-port",
                "49983"
            ]
        );
    }

    #[test]
    fn test_vmm_spec_snapshot_restores_the_directory_shown_read_only() {
        let spec = vmm_spec(
            &GuestSource::Snapshot {
                dir: "/snap".into(),
            },
            512,
        );
        assert_eq!(spec.mode, "restore");
        assert_eq!(
            spec.files,
            [("snapshot".to_owned(), PathBuf::from("/snap"))]
        );
        assert_eq!(
            spec.args,
            [
                "--snapshot",
                "/run/airlock/vm/snapshot",
                "--vsock-port",
                "49983"
            ]
        );
    }
}
