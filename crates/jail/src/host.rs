//! What this host supports, for `airlock probe` and for choosing a backend.

use std::fs;

use crate::cgroup::Layout;
use crate::landlock;

/// The confinement features of this kernel, as seen by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSupport {
    pub landlock_abi: Option<u32>,
    pub user_namespaces: bool,
    pub seccomp_filter: bool,
    pub cgroups: Layout,
    pub caller_is_root: bool,
    /// The effective uid and gid of this process on the host.
    pub caller_uid: u32,
    pub caller_gid: u32,
    /// Why overlayfs cannot take image layers as descriptors here (the container tier's
    /// root), or `None` when it can.
    pub overlay_unavailable: Option<String>,
}

impl HostSupport {
    pub fn probe() -> HostSupport {
        let max_userns = fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let seccomp_filter = fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Seccomp_filters:")))
            .unwrap_or(false);
        HostSupport {
            landlock_abi: landlock::abi_version(),
            user_namespaces: max_userns > 0,
            seccomp_filter,
            cgroups: Layout::detect().unwrap_or_default(),
            caller_is_root: crate::sys::geteuid() == 0,
            caller_uid: crate::sys::geteuid(),
            caller_gid: crate::sys::getegid(),
            overlay_unavailable: crate::mountfs::overlay_takes_layer_fds().err(),
        }
    }
}

/// The caller's effective uid (the image store keeps an image's file owners only as root).
pub fn effective_uid() -> u32 {
    crate::sys::geteuid()
}
