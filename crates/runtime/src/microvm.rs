//! What the microVM tier is on this host. Airlock's VMM (`airlock-vmm`) boots a Linux guest
//! whose init is the agent, serving envd over vsock, and snapshots and restores it (shown in
//! the nested rig, `scripts/microvm-nested.sh`), but no runtime path starts one for a
//! sandbox yet, so the tier is never offered; the probe says that, and what KVM the host has.

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
            "no runtime path starts the VMM's Linux guest for a sandbox yet, {host}"
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
                reason.contains("no runtime path starts the VMM's Linux guest"),
                "{reason}"
            );
            assert!(reason.contains(host), "{reason}");
        }
    }
}
