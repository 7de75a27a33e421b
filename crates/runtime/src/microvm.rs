//! What the microVM tier is on this host. Airlock's VMM (`airlock-vmm`) runs freestanding
//! guests, snapshots and forks them, but cannot yet boot a Linux guest with the agent, so
//! the tier is never offered to sandboxes; the probe says that, and what KVM the host has.

use airlock_api::Tier;
use airlock_vmm::host::KvmKind;

use crate::backend::BackendSupport;

/// The tier's probe result for `kvm`.
pub fn support(kvm: &KvmKind) -> BackendSupport {
    let host = match kvm {
        KvmKind::None { reason } => format!("and this host has no KVM ({reason})"),
        KvmKind::Pvm => {
            "and this host's /dev/kvm is PVM, where a Linux guest needs a PVM-enabled guest kernel"
                .to_owned()
        }
        KvmKind::Hardware { module } => format!("(this host has hardware KVM, {module})"),
    };
    BackendSupport {
        tier: Tier::Microvm,
        unavailable: Some(format!(
            "the VMM boots only freestanding test guests so far, not a Linux guest with the agent, {host}"
        )),
        degraded: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_microvm_support_names_the_host_kvm_and_what_is_missing() {
        let none = support(&KvmKind::None {
            reason: "/dev/kvm does not exist".into(),
        });
        let pvm = support(&KvmKind::Pvm);
        let hardware = support(&KvmKind::Hardware { module: "kvm_amd" });
        for (support, host) in [
            (none, "/dev/kvm does not exist"),
            (pvm, "PVM-enabled guest kernel"),
            (hardware, "kvm_amd"),
        ] {
            let reason = support.unavailable.unwrap_or_default();
            assert!(
                reason.contains("not a Linux guest with the agent"),
                "{reason}"
            );
            assert!(reason.contains(host), "{reason}");
        }
    }
}
