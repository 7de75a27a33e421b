//! What kind of KVM this host offers: hardware virtualization, PVM (Pagetable-based Virtual
//! Machine, which runs guests in ring 3 with shadow paging and needs a PVM-enabled guest
//! kernel for Linux), or none.

use std::path::Path;

/// The host's KVM, as far as the microVM tier cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmKind {
    /// `/dev/kvm` backed by VT-x or AMD-V (`kvm_intel` / `kvm_amd`).
    Hardware { module: &'static str },
    /// `/dev/kvm` backed by `kvm_pvm`: freestanding guests run; an ordinary Linux guest kernel
    /// does not boot (it needs `CONFIG_PVM_GUEST`).
    Pvm,
    /// No usable `/dev/kvm`, and why.
    None { reason: String },
}

impl KvmKind {
    pub fn describe(&self) -> String {
        match self {
            KvmKind::Hardware { module } => format!("hardware KVM ({module})"),
            KvmKind::Pvm => "PVM (kvm_pvm: a Linux guest needs a PVM-enabled guest kernel)".into(),
            KvmKind::None { reason } => format!("none ({reason})"),
        }
    }

    /// Whether `/dev/kvm` can run this crate's freestanding guests.
    pub fn runs_guests(&self) -> bool {
        !matches!(self, KvmKind::None { .. })
    }
}

/// Looks at `/dev/kvm` and the loaded KVM modules.
pub fn detect() -> KvmKind {
    detect_at(Path::new("/dev/kvm"), Path::new("/sys/module"))
}

/// [`detect`] against other paths (tests).
pub fn detect_at(dev_kvm: &Path, sys_module: &Path) -> KvmKind {
    if !dev_kvm.exists() {
        return KvmKind::None {
            reason: format!("{} does not exist", dev_kvm.display()),
        };
    }
    if let Err(err) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev_kvm)
    {
        return KvmKind::None {
            reason: format!("{} cannot be opened: {err}", dev_kvm.display()),
        };
    }
    if sys_module.join("kvm_pvm").exists() {
        return KvmKind::Pvm;
    }
    for module in ["kvm_intel", "kvm_amd"] {
        if sys_module.join(module).exists() {
            return KvmKind::Hardware { module };
        }
    }
    KvmKind::None {
        reason: format!(
            "{} exists but none of kvm_intel, kvm_amd, kvm_pvm is loaded",
            dev_kvm.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_detect_missing_device_says_so() {
        let dir = std::env::temp_dir();
        let kind = detect_at(&dir.join("airlock-no-such-kvm"), &dir);
        assert!(
            matches!(&kind, KvmKind::None { reason } if reason.contains("does not exist")),
            "{kind:?}"
        );
    }

    #[test]
    fn test_detect_names_the_loaded_kvm_module() {
        let dir = std::env::temp_dir().join(format!("airlock-kvm-kind-{}", std::process::id()));
        let modules = dir.join("module");
        std::fs::create_dir_all(&modules).unwrap();
        let device = dir.join("kvm");
        std::fs::write(&device, b"").unwrap();
        let none = detect_at(&device, &modules);
        assert!(
            matches!(&none, KvmKind::None { reason } if reason.contains("none of")),
            "{none:?}"
        );
        std::fs::create_dir(modules.join("kvm_amd")).unwrap();
        assert_eq!(
            detect_at(&device, &modules),
            KvmKind::Hardware { module: "kvm_amd" }
        );
        std::fs::create_dir(modules.join("kvm_pvm")).unwrap();
        assert_eq!(detect_at(&device, &modules), KvmKind::Pvm);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
