//! The reviewed seccomp deny-list of the process tier, as data.
//!
//! The filter is default-allow: the workload is an ordinary program and should see an ordinary
//! Linux, minus the parts of the kernel that exist to cross or weaken a sandbox boundary. Each
//! entry says why it is there. `airlock-jail` turns the list into BPF; it also adds, before every
//! rule, an architecture check that kills any process using a foreign syscall ABI (i386 through
//! `int 0x80`, or x32), which would otherwise bypass every number checked here.

use serde::{Deserialize, Serialize};

/// What the filter answers when a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyscallAction {
    /// Fail with `EPERM`, as the kernel does for a caller without the privilege.
    Eperm,
    /// Fail with `ENOSYS`, so that libc falls back to an older call we can inspect.
    Enosys,
    /// Fail with `EPROTONOSUPPORT`, as a kernel built without the protocol does, so that
    /// callers that can do without it carry on (libaudit's users, such as `groupadd`).
    Eprotonosupport,
}

/// How an argument is compared: `(arg & mask) == value` or `!=`. Only the low 32 bits of the
/// argument are compared: every argument checked here is an `int` or flag word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgCheck {
    pub arg: u8,
    pub mask: u32,
    pub value: u32,
    /// `true` for `==`, `false` for `!=`.
    pub equal: bool,
}

/// One rule: when `syscall` is called and every check holds, answer `action`. Rules for the same
/// syscall are tried in order; a call that matches none is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeccompRule {
    pub syscall: String,
    pub checks: Vec<ArgCheck>,
    pub action: SyscallAction,
    pub why: String,
}

const fn eq(arg: u8, mask: u32, value: u32) -> ArgCheck {
    ArgCheck {
        arg,
        mask,
        value,
        equal: true,
    }
}

const fn ne(arg: u8, mask: u32, value: u32) -> ArgCheck {
    ArgCheck {
        arg,
        mask,
        value,
        equal: false,
    }
}

const ALL: u32 = u32::MAX;
const CLONE_NEWUSER: u32 = 0x1000_0000;
const AF_NETLINK: u32 = 16;
const AF_PACKET: u32 = 17;
const AF_BLUETOOTH: u32 = 31;
const AF_VSOCK: u32 = 40;
const AF_XDP: u32 = 44;
const NETLINK_ROUTE: u32 = 0;
const NETLINK_AUDIT: u32 = 9;
const SOCK_TYPE_MASK: u32 = 0xf;
const SOCK_RAW: u32 = 3;
const SOCK_PACKET: u32 = 10;
const AF_UNIX: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541c;
const SET_ID_BITS: u32 = 0o6000;
const SET_UID_BIT: u32 = 0o4000;
const O_CREAT: u32 = 0o100;
const O_TMPFILE_BIT: u32 = 0o2000_0000;
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

/// Syscalls denied outright, grouped by the reason.
const DENIED: &[(&[&str], &str)] = &[
    (
        &["ptrace", "process_vm_readv", "process_vm_writev"],
        "reads and writes other processes' memory; the classic way to hijack a supervisor",
    ),
    (
        &["bpf", "perf_event_open", "userfaultfd"],
        "large kernel attack surface (verifier, PMU, fault handling races) that workloads rarely need",
    ),
    (
        &["io_uring_setup", "io_uring_enter", "io_uring_register"],
        "io_uring performs syscalls the filter never sees, and is a frequent source of kernel bugs",
    ),
    (
        &[
            "mount",
            "umount2",
            "pivot_root",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "open_tree_attr",
            "mount_setattr",
            "chroot",
        ],
        "the mount view is the filesystem boundary; no part of it may be changed from inside",
    ),
    (&["setns"], "joining another namespace leaves the sandbox"),
    (
        &["keyctl", "add_key", "request_key"],
        "kernel keyrings are not namespaced and hold other users' credentials",
    ),
    (
        &[
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
        ],
        "loading kernel code is a host takeover",
    ),
    (
        &["reboot", "swapon", "swapoff", "acct"],
        "host-wide administrative switches",
    ),
    (&["iopl", "ioperm"], "direct hardware port access"),
    (
        &["settimeofday", "clock_settime", "clock_adjtime", "adjtimex"],
        "the clock is shared with the host",
    ),
    (
        &["open_by_handle_at", "name_to_handle_at"],
        "file handles open host files bypassing the mount view (the 'shocker' escape)",
    ),
    (
        &["listmount", "statmount"],
        "enumerate mounts by id, including ones the view hides",
    ),
    (
        &["fanotify_init"],
        "filesystem-wide event monitoring reaches beyond the view",
    ),
];

/// The built-in profile of the process tier.
pub fn default_rules() -> Vec<SeccompRule> {
    rules_refusing(SET_ID_BITS)
}

/// The built-in profile of a container-tier sandbox of a root caller, whose ids are a private
/// range that owns nothing else on the host: set-group-id is allowed there, as the image's
/// packages need (`chmod 2775` of a group's directory in a post-install script), and
/// set-user-id stays refused.
pub fn image_root_rules() -> Vec<SeccompRule> {
    rules_refusing(SET_UID_BIT)
}

/// The built-in profile, with `set_id_bits` the mode bits that chmod, creat, mknod and a
/// creating open may not set.
fn rules_refusing(set_id_bits: u32) -> Vec<SeccompRule> {
    let mut rules = Vec::new();
    for (syscalls, why) in DENIED {
        for syscall in *syscalls {
            rules.push(rule(syscall, &[], SyscallAction::Eperm, why));
        }
    }
    let nested_userns = "a nested user namespace hands back every capability inside it, reopening the kernel surface the sandbox closed";
    rules.push(rule(
        "unshare",
        &[ne(0, CLONE_NEWUSER, 0)],
        SyscallAction::Eperm,
        nested_userns,
    ));
    rules.push(rule(
        "clone",
        &[ne(0, CLONE_NEWUSER, 0)],
        SyscallAction::Eperm,
        nested_userns,
    ));
    rules.push(rule(
        "clone3",
        &[],
        SyscallAction::Enosys,
        "its flags live in memory that seccomp cannot read; ENOSYS makes libc fall back to clone, whose flags are checked",
    ));
    rules.push(rule(
        "openat2",
        &[],
        SyscallAction::Enosys,
        "its mode lives in memory that seccomp cannot read; ENOSYS makes callers fall back to openat",
    ));
    rules.push(rule(
        "personality",
        &[ne(0, ALL, 0), ne(0, ALL, PERSONALITY_QUERY)],
        SyscallAction::Eperm,
        "non-default personalities such as READ_IMPLIES_EXEC weaken memory protections",
    ));
    let raw = "raw IP sockets forge packets";
    let sockets: [(&[ArgCheck], &str); 8] = [
        (
            &[eq(0, ALL, AF_PACKET)],
            "raw link-layer access sniffs and forges traffic",
        ),
        (
            &[eq(0, ALL, AF_VSOCK)],
            "reaches hypervisor and host services directly",
        ),
        (&[eq(0, ALL, AF_XDP)], "kernel-bypass packet I/O"),
        (
            &[eq(0, ALL, AF_BLUETOOTH)],
            "hardware stack with a long bug history",
        ),
        (
            &[eq(0, ALL, AF_NETLINK), ne(2, ALL, NETLINK_ROUTE)],
            "netlink families other than route (audit, netfilter, sock_diag) expose or change host state",
        ),
        (&[eq(0, ALL, AF_INET), eq(1, SOCK_TYPE_MASK, SOCK_RAW)], raw),
        (
            &[eq(0, ALL, AF_INET6), eq(1, SOCK_TYPE_MASK, SOCK_RAW)],
            raw,
        ),
        (
            &[eq(1, SOCK_TYPE_MASK, SOCK_PACKET)],
            "the obsolete SOCK_PACKET type is link-layer access under another name",
        ),
    ];
    // Before the netlink rule below: rules for one syscall are tried in order.
    rules.push(rule(
        "socket",
        &[eq(0, ALL, AF_NETLINK), eq(2, ALL, NETLINK_AUDIT)],
        SyscallAction::Eprotonosupport,
        "the audit netlink reads and writes the host's audit trail; answered as by a kernel without audit, which shadow's tools (groupadd, useradd) accept where EPERM aborts them",
    ));
    for (checks, why) in sockets {
        rules.push(rule("socket", checks, SyscallAction::Eperm, why));
    }
    rules.push(rule(
        "socketpair",
        &[ne(0, ALL, AF_UNIX)],
        SyscallAction::Eperm,
        "only Unix socket pairs exist; other families would only reach their kernel code",
    ));
    for request in [TIOCSTI, TIOCLINUX] {
        rules.push(rule(
            "ioctl",
            &[eq(1, ALL, request)],
            SyscallAction::Eperm,
            "injects keystrokes into a terminal shared with the host",
        ));
    }
    let set_id = "a set-id file in a host workspace would run with its owner's rights on the host";
    for (syscall, mode_arg) in [
        ("chmod", 1),
        ("fchmod", 1),
        ("fchmodat", 2),
        ("fchmodat2", 2),
        ("creat", 1),
        ("mknod", 1),
        ("mknodat", 2),
    ] {
        rules.push(rule(
            syscall,
            &[ne(mode_arg, set_id_bits, 0)],
            SyscallAction::Eperm,
            set_id,
        ));
    }
    for (syscall, flags_arg) in [("open", 1), ("openat", 2)] {
        for create in [O_CREAT, O_TMPFILE_BIT] {
            rules.push(rule(
                syscall,
                &[ne(flags_arg, create, 0), ne(flags_arg + 1, set_id_bits, 0)],
                SyscallAction::Eperm,
                set_id,
            ));
        }
    }
    rules
}

fn rule(syscall: &str, checks: &[ArgCheck], action: SyscallAction, why: &str) -> SeccompRule {
    SeccompRule {
        syscall: syscall.to_owned(),
        checks: checks.to_vec(),
        action,
        why: why.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_default_rules_cover_the_required_surface() {
        let rules = default_rules();
        let names: Vec<&str> = rules.iter().map(|r| r.syscall.as_str()).collect();
        for required in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "mount",
            "umount2",
            "pivot_root",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "setns",
            "unshare",
            "clone",
            "clone3",
            "keyctl",
            "add_key",
            "request_key",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "iopl",
            "ioperm",
            "settimeofday",
            "clock_settime",
            "adjtimex",
            "personality",
            "socket",
        ] {
            assert!(
                names.contains(&required),
                "{required} is missing from the deny-list"
            );
        }
    }

    #[test]
    fn test_every_rule_says_why() {
        for rule in default_rules() {
            assert!(rule.why.len() > 10, "{} has no reason", rule.syscall);
            assert!(
                rule.checks.iter().all(|c| c.arg < 6),
                "{} checks a bad arg",
                rule.syscall
            );
        }
    }

    #[test]
    fn test_clone3_answers_enosys() {
        let rules = default_rules();
        let clone3 = rules
            .iter()
            .find(|r| r.syscall == "clone3")
            .map(|r| r.action);
        assert_eq!(clone3, Some(SyscallAction::Enosys));
    }
}
