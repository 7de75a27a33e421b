//! Network namespaces made ahead of time for the zygote's helpers.
//!
//! Making a network namespace is the costliest single step of a sandbox's start here (about
//! 0.5 ms in `copy_net_ns`), and with the view's template init waited for it. So a pooler, a
//! child of the zygote at the lowest CPU priority, makes them ahead: each one a fresh namespace
//! with its loopback up and a detached read-only sysfs that shows it (a sysfs shows the
//! network namespace of whoever mounts it, and the sandbox could not mount one in a namespace
//! it does not own). The zygote hands each pair to one helper, never to a second: it closes its
//! copies as it forks. The helper enters the namespace only to clone init into it, so the
//! namespace ends with the sandbox's last process.
//!
//! Such a namespace belongs to the host's user namespace, not the sandbox's, so the sandbox
//! holds no capability over it: it cannot change its interfaces, routes, firewall or network
//! sysctls. That is why only sandboxes that keep no capability at all get one (the process
//! tier; the container tier's root keeps `CAP_NET_BIND_SERVICE`, which counts against the
//! namespace's owner). When the pool is empty, the helper makes one the same way, so every
//! sandbox of a zygote has the same kind of namespace.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use airlock_policy::{Plan, RootPlan};

use crate::scm;
use crate::spec::AgentSpec;
use crate::sys::{self, Forked};

/// How many namespaces the pooler keeps made.
const STOCK: usize = 4;

/// How many sandboxes got a network namespace the host made, by where it came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostNetworks {
    /// Made ahead by the zygote's pooler.
    pub pooled: u64,
    /// Made by the sandbox's helper because the pool was empty.
    pub made_by_helper: u64,
}

/// One network namespace and the sysfs that shows it.
#[derive(Debug)]
pub(crate) struct Network {
    pub netns: OwnedFd,
    pub sysfs: OwnedFd,
}

/// Whether a sandbox may have a namespace the host owns: it keeps no capability, its view's
/// root is the host's (where sysfs is mounted), it runs no VMM, and the runtime is root.
pub fn eligible(plan: &Plan, agent: Option<&AgentSpec>) -> bool {
    let identity = &plan.identity;
    let keeps_capabilities = identity.root_file_caps && identity.uid == 0;
    identity.privileged_caller
        && !keeps_capabilities
        && matches!(plan.view.root, RootPlan::Host { .. })
        && agent.is_none_or(|agent| agent.vmm.is_none())
}

/// Makes a network namespace with its loopback up and a sysfs that shows it, then returns the
/// calling thread to the namespace it was in.
pub(crate) fn make() -> io::Result<Network> {
    let home = OwnedFd::from(File::open("/proc/thread-self/ns/net")?);
    sys::unshare(libc::CLONE_NEWNET)?;
    let made = (|| {
        sys::loopback_up()?;
        let netns = OwnedFd::from(File::open("/proc/thread-self/ns/net")?);
        let sysfs = crate::mountfs::sysfs().map_err(io::Error::other)?;
        Ok(Network { netns, sysfs })
    })();
    sys::setns(&home, libc::CLONE_NEWNET)?;
    made
}

/// The zygote's side of the pool: a socket to the pooler, which sends one namespace per credit.
#[derive(Debug)]
pub(crate) struct Pool {
    socket: OwnedFd,
    pooler: libc::pid_t,
}

impl Pool {
    /// Forks the pooler and gives it [`STOCK`] credits. `None` when this process cannot make a
    /// network namespace (not root): then every helper makes its own as before.
    pub(crate) fn start(close_in_pooler: &OwnedFd) -> Option<Pool> {
        if sys::geteuid() != 0 {
            return None;
        }
        let (ours, theirs) = sys::socketpair().ok()?;
        match sys::fork().ok()? {
            Forked::Child => {
                drop(ours);
                let _ = sys::close_one(close_in_pooler.as_raw_fd());
                sys::exit_now(pooler(theirs))
            }
            Forked::Parent(pooler) => {
                drop(theirs);
                let pool = Pool {
                    socket: ours,
                    pooler,
                };
                for _ in 0..STOCK {
                    pool.credit();
                }
                Some(pool)
            }
        }
    }

    /// A namespace made ahead, if one is ready. Its replacement waits for [`Pool::credit`].
    pub(crate) fn take(&self) -> Option<Network> {
        let (message, fds) = scm::try_recv_with_fds(&self.socket, 8).ok()??;
        let [netns, sysfs]: [OwnedFd; 2] = fds.try_into().ok()?;
        if message != b"n" {
            return None;
        }
        Some(Network { netns, sysfs })
    }

    /// Asks the pooler for one more namespace.
    pub(crate) fn credit(&self) {
        let _ = scm::send_with_fds(&self.socket, b"c", &[]);
    }

    /// In a helper forked from the zygote: closes the pool's socket and leaves the pooler be.
    pub(crate) fn leave(self) {
        let pool = std::mem::ManuallyDrop::new(self);
        let _ = sys::close_one(pool.socket.as_raw_fd());
    }
}

impl Drop for Pool {
    /// Ends the pooler and reaps it; namespaces still queued end with the socket.
    fn drop(&mut self) {
        let _ = sys::kill(self.pooler, libc::SIGKILL);
        let _ = sys::waitpid(self.pooler, 0);
    }
}

/// The pooler: one namespace per credit until the zygote is gone or a namespace cannot be
/// made (then the zygote finds the socket closed and its helpers make their own).
fn pooler(socket: OwnedFd) -> i32 {
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    // Behind every sandbox's own start: the pool refills in the CPU time nothing else wants.
    let _ = sys::set_nice(19);
    let mut credit = [0u8; 1];
    loop {
        match sys::recv(&socket, &mut credit) {
            Ok(1) => {}
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            _ => return 0,
        }
        let Ok(network) = make() else { return 1 };
        let fds = [network.netns.as_raw_fd(), network.sysfs.as_raw_fd()];
        if scm::send_with_fds(&socket, b"n", &fds).is_err() {
            return 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use airlock_api::SandboxConfig;
    use airlock_policy::{HostFacts, compile};

    use super::*;
    use crate::spec::VmmSpec;

    fn plan(caller_uid: u32) -> Plan {
        let host = HostFacts {
            caller_uid,
            caller_gid: caller_uid,
            state_dirs: vec![],
        };
        compile(&SandboxConfig::new(vec!["true".into()]), &host).unwrap()
    }

    fn agent(vmm: bool) -> AgentSpec {
        AgentSpec {
            binary: "/bin/true".into(),
            socket: "/run/agent.sock".into(),
            log: "/run/agent.log".into(),
            vmm: vmm.then(|| VmmSpec {
                mode: "linux".into(),
                files: vec![],
                disks: vec![],
                args: vec![],
            }),
        }
    }

    #[test]
    fn test_a_capless_process_tier_sandbox_of_a_root_runtime_is_eligible() {
        assert!(eligible(&plan(0), None));
        assert!(eligible(&plan(0), Some(&agent(false))));
    }

    #[test]
    fn test_sandboxes_that_need_their_own_namespace_are_not_eligible() {
        assert!(!eligible(&plan(1000), None), "an unprivileged runtime");
        assert!(!eligible(&plan(0), Some(&agent(true))), "a VMM");
        let mut image = plan(0);
        image.view.root = RootPlan::Overlay { layers: vec![] };
        assert!(!eligible(&image, None), "the container tier's root");
        let mut capable = plan(0);
        capable.identity.root_file_caps = true;
        capable.identity.uid = 0;
        assert!(!eligible(&capable, None), "a root that keeps capabilities");
    }
}
