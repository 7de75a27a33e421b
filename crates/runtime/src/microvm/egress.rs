//! A microvm sandbox's network egress, as data: the guest has no network device, and its only
//! way out is the sandbox's egress proxy, started outside the sandbox as on the process tier
//! (`crate::egress`). The jail shows the proxy's directory in the VMM's view at `EGRESS_DIR`
//! (the plan's `egress`, as for a process sandbox); the VMM forwards the guest's connections
//! to host vsock port [`EGRESS_VSOCK_PORT`] to the proxy's socket there
//! (`--vsock-forward`); and the guest's agent, told at resume, relays `127.0.0.1:3128`
//! (`HTTP_PROXY`) to that port and holds the proxy's trust bundles where the sandbox's
//! environment points. Secrets stay on the host: the guest's environment has placeholders.

use std::collections::BTreeMap;
use std::path::PathBuf;

use airlock_jail::spec::VmmSpec;
use airlock_policy::{EGRESS_CA, EGRESS_DIR, EGRESS_SOCKET, EGRESS_TRUST_BUNDLE, EgressSetup};

/// The host vsock port (CID 2) the guest reaches the egress proxy on.
pub const EGRESS_VSOCK_PORT: u32 = 3128;

/// Why the guest's egress could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum EgressPlanError {
    #[error("reading the egress proxy's {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a `proxy`-mode microvm sandbox adds to the VMM and to the guest's resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPlan {
    /// The proxy's host directory (its socket and trust bundles).
    pub host_dir: PathBuf,
    /// The guest's loopback port its relay listens on (`HTTP_PROXY`).
    pub relay_port: u16,
    pub vsock_port: u32,
}

impl EgressPlan {
    /// From the plan's egress attachment; `None` without one (no network at all).
    pub fn new(setup: Option<&EgressSetup>) -> Option<EgressPlan> {
        setup.map(|setup| EgressPlan {
            host_dir: setup.host_dir.clone(),
            relay_port: setup.relay_port,
            vsock_port: EGRESS_VSOCK_PORT,
        })
    }

    /// The VMM's forward: the guest's port to the proxy's socket as the VMM's view shows it.
    pub fn add_to(&self, vmm: &mut VmmSpec) {
        vmm.args.extend([
            "--vsock-forward".to_owned(),
            format!("{}:{EGRESS_DIR}/{EGRESS_SOCKET}", self.vsock_port),
        ]);
    }

    /// The resume's `egress` object: the ports and the proxy's trust files.
    pub fn resume_value(&self) -> Result<serde_json::Value, EgressPlanError> {
        let mut files = BTreeMap::new();
        for name in [EGRESS_CA, EGRESS_TRUST_BUNDLE] {
            let path = self.host_dir.join(name);
            let text = std::fs::read_to_string(&path)
                .map_err(|source| EgressPlanError::Read { path, source })?;
            files.insert(name, text);
        }
        Ok(serde_json::json!({
            "relay_port": self.relay_port,
            "vsock_port": self.vsock_port,
            "files": files,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_egress_plan_forwards_the_guest_port_to_the_proxy_socket_in_the_view() {
        assert_eq!(EgressPlan::new(None), None);
        let setup = EgressSetup {
            host_dir: "/sbx/egress".into(),
            relay_port: 3128,
        };
        let plan = EgressPlan::new(Some(&setup)).unwrap();
        let mut vmm = VmmSpec {
            mode: "restore".into(),
            files: Vec::new(),
            disks: Vec::new(),
            args: vec!["--vsock-port".into(), "49983".into()],
        };
        plan.add_to(&mut vmm);
        assert_eq!(
            vmm.args,
            [
                "--vsock-port",
                "49983",
                "--vsock-forward",
                "3128:/run/airlock/egress/proxy.sock"
            ]
        );
    }

    #[test]
    fn test_egress_plan_resume_carries_the_ports_and_the_trust_files() {
        let dir = std::env::temp_dir().join(format!("airlock-vm-egress-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plan = EgressPlan {
            host_dir: dir.clone(),
            relay_port: 3128,
            vsock_port: EGRESS_VSOCK_PORT,
        };
        let err = plan.resume_value().unwrap_err().to_string();
        assert!(err.contains(EGRESS_CA), "{err}");
        std::fs::write(dir.join(EGRESS_CA), "CA").unwrap();
        std::fs::write(dir.join(EGRESS_TRUST_BUNDLE), "BUNDLE").unwrap();
        assert_eq!(
            plan.resume_value().unwrap(),
            serde_json::json!({
                "relay_port": 3128,
                "vsock_port": 3128,
                "files": {EGRESS_CA: "CA", EGRESS_TRUST_BUNDLE: "BUNDLE"},
            })
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
