//! Runs the compiled program through a small BPF interpreter, so every rule is checked without
//! installing anything.

use airlock_policy::seccomp::default_rules;
use airlock_policy::{ArgCheck, SeccompRule, SyscallAction};

use super::*;

/// Past the last x86_64 syscall number.
const LAST_NUMBER: u32 = 512;

/// The syscalls the default rules name, each once.
fn ruled_syscalls() -> std::collections::BTreeSet<String> {
    default_rules()
        .into_iter()
        .map(|rule| rule.syscall)
        .collect()
}

struct Call {
    arch: u32,
    nr: u32,
    args: [u64; 6],
}

fn call(nr: libc::c_long, args: &[u64]) -> Call {
    let mut all = [0u64; 6];
    all[..args.len()].copy_from_slice(args);
    Call {
        arch: AUDIT_ARCH_X86_64,
        nr: nr as u32,
        args: all,
    }
}

fn run(program: &[Insn], call: &Call) -> u32 {
    run_counting(program, call).0
}

/// The program's answer, and how many instructions it ran to get there.
fn run_counting(program: &[Insn], call: &Call) -> (u32, usize) {
    let load = |offset: u32| -> u32 {
        match offset {
            0 => call.nr,
            4 => call.arch,
            o if o >= 16 && (o - 16) % 8 == 0 => call.args[((o - 16) / 8) as usize] as u32,
            o => panic!("unexpected load offset {o}"),
        }
    };
    let mut acc = 0u32;
    let mut pc = 0usize;
    let mut steps = 0;
    loop {
        let insn = program[pc];
        pc += 1;
        steps += 1;
        match insn.code {
            BPF_LD_W_ABS => acc = load(insn.k),
            BPF_ALU_AND_K => acc &= insn.k,
            BPF_JEQ_K => pc += usize::from(if acc == insn.k { insn.jt } else { insn.jf }),
            BPF_JGE_K => pc += usize::from(if acc >= insn.k { insn.jt } else { insn.jf }),
            BPF_JA => pc += insn.k as usize,
            BPF_RET_K => return (insn.k, steps),
            code => panic!("unexpected opcode {code:#x}"),
        }
    }
}

/// What `rules` mean, read straight from them: the first rule of the syscall whose checks all
/// hold decides, and a syscall no rule stops is allowed.
fn oracle(rules: &[SeccompRule], call: &Call) -> u32 {
    for rule in rules {
        if syscall_number(&rule.syscall) != Some(call.nr) {
            continue;
        }
        let holds = rule.checks.iter().all(|check| {
            let value = call.args[usize::from(check.arg)] as u32 & check.mask;
            (value == check.value) == check.equal
        });
        if holds {
            return ret_for(rule.action, None);
        }
    }
    RET_ALLOW
}

fn program() -> Vec<Insn> {
    compile(&default_rules()).unwrap()
}

const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;

#[test]
fn test_bpf_denies_listed_syscalls_and_allows_others() {
    let p = program();
    for nr in [
        libc::SYS_ptrace,
        libc::SYS_bpf,
        libc::SYS_mount,
        libc::SYS_setns,
        libc::SYS_keyctl,
        libc::SYS_io_uring_setup,
        libc::SYS_open_tree,
        libc::SYS_reboot,
    ] {
        assert_eq!(run(&p, &call(nr, &[])), EPERM, "syscall {nr}");
    }
    for nr in [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_execve,
        libc::SYS_getpid,
        libc::SYS_wait4,
    ] {
        assert_eq!(run(&p, &call(nr, &[])), RET_ALLOW, "syscall {nr}");
    }
    assert_eq!(run(&p, &call(libc::SYS_clone3, &[])), ENOSYS);
    assert_eq!(run(&p, &call(467, &[])), EPERM, "open_tree_attr");
}

#[test]
fn test_bpf_kills_foreign_abis() {
    let p = program();
    let i386 = Call {
        arch: 0x4000_0003,
        nr: 1,
        args: [0; 6],
    };
    assert_eq!(run(&p, &i386), RET_KILL_PROCESS);
    let x32 = Call {
        arch: AUDIT_ARCH_X86_64,
        nr: X32_SYSCALL_BIT | 1,
        args: [0; 6],
    };
    assert_eq!(run(&p, &x32), RET_KILL_PROCESS);
}

#[test]
fn test_bpf_user_namespaces_only_are_denied_to_clone_and_unshare() {
    let p = program();
    let newuser = libc::CLONE_NEWUSER as u64;
    assert_eq!(
        run(
            &p,
            &call(libc::SYS_clone, &[newuser | libc::SIGCHLD as u64])
        ),
        EPERM
    );
    assert_eq!(
        run(&p, &call(libc::SYS_clone, &[libc::SIGCHLD as u64])),
        RET_ALLOW
    );
    assert_eq!(run(&p, &call(libc::SYS_unshare, &[newuser])), EPERM);
    assert_eq!(
        run(&p, &call(libc::SYS_unshare, &[libc::CLONE_NEWNS as u64])),
        RET_ALLOW
    );
}

#[test]
fn test_bpf_socket_families() {
    let p = program();
    let socket = |domain: i32, ty: i32, proto: i32| {
        run(
            &p,
            &call(libc::SYS_socket, &[domain as u64, ty as u64, proto as u64]),
        )
    };
    assert_eq!(socket(libc::AF_INET, libc::SOCK_STREAM, 0), RET_ALLOW);
    assert_eq!(
        socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0),
        RET_ALLOW
    );
    assert_eq!(
        socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
        RET_ALLOW,
        "iproute2 opens route netlink as SOCK_RAW"
    );
    assert_eq!(
        socket(libc::AF_INET6, libc::SOCK_RAW, 58),
        EPERM,
        "raw ICMPv6"
    );
    assert_eq!(
        socket(libc::AF_INET, 10 /* SOCK_PACKET, deprecated */, 0),
        EPERM,
        "SOCK_PACKET"
    );
    let pair = |domain: i32| {
        run(
            &p,
            &call(
                libc::SYS_socketpair,
                &[domain as u64, libc::SOCK_STREAM as u64],
            ),
        )
    };
    assert_eq!(pair(libc::AF_UNIX), RET_ALLOW);
    assert_eq!(pair(libc::AF_VSOCK), EPERM);
    assert_eq!(
        socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_ROUTE),
        RET_ALLOW
    );
    assert_eq!(
        socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT),
        RET_ERRNO | libc::EPROTONOSUPPORT as u32,
        "libaudit's audit_open answered as by a kernel without audit"
    );
    assert_eq!(
        socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG),
        EPERM
    );
    assert_eq!(socket(libc::AF_PACKET, libc::SOCK_DGRAM, 0), EPERM);
    assert_eq!(socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0), EPERM);
    assert_eq!(
        socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, 1),
        EPERM
    );
    assert_eq!(
        socket(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
        RET_ALLOW,
        "ping sockets are not raw"
    );
}

#[test]
fn test_bpf_personality_only_default_or_query() {
    let p = program();
    let personality = |value: u64| run(&p, &call(libc::SYS_personality, &[value]));
    assert_eq!(personality(0), RET_ALLOW);
    assert_eq!(personality(0xffff_ffff), RET_ALLOW);
    assert_eq!(personality(0x0040_0000), EPERM, "READ_IMPLIES_EXEC");
}

#[test]
fn test_bpf_set_id_bits_and_terminal_injection() {
    let p = program();
    assert_eq!(run(&p, &call(libc::SYS_chmod, &[0, 0o4755])), EPERM);
    assert_eq!(run(&p, &call(libc::SYS_chmod, &[0, 0o2755])), EPERM);
    assert_eq!(run(&p, &call(libc::SYS_chmod, &[0, 0o755])), RET_ALLOW);
    assert_eq!(run(&p, &call(libc::SYS_fchmodat, &[0, 0, 0o4755])), EPERM);
    let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
    assert_eq!(
        run(&p, &call(libc::SYS_openat, &[0, 0, creat, 0o4755])),
        EPERM
    );
    assert_eq!(
        run(&p, &call(libc::SYS_openat, &[0, 0, creat, 0o644])),
        RET_ALLOW
    );
    assert_eq!(
        run(
            &p,
            &call(libc::SYS_openat, &[0, 0, libc::O_RDONLY as u64, 0o4755])
        ),
        RET_ALLOW
    );
    assert_eq!(run(&p, &call(libc::SYS_open, &[0, creat, 0o6755])), EPERM);
    assert_eq!(run(&p, &call(libc::SYS_ioctl, &[0, libc::TIOCSTI])), EPERM);
    assert_eq!(
        run(&p, &call(libc::SYS_ioctl, &[0, libc::TIOCGWINSZ])),
        RET_ALLOW
    );
}

#[test]
fn test_bpf_rejects_unknown_syscall_names() {
    let rules = vec![SeccompRule {
        syscall: "frobnicate".into(),
        checks: vec![],
        action: SyscallAction::Eperm,
        why: "test".into(),
    }];
    assert!(
        matches!(compile(&rules), Err(SeccompError::UnknownSyscall(name)) if name == "frobnicate")
    );
}

#[test]
fn test_a_program_crosses_the_spec_as_words_unchanged() {
    let program = program();
    let words: Vec<u64> = program.iter().map(|insn| insn.to_word()).collect();
    let back: Vec<Insn> = words.iter().map(|&word| Insn::from_word(word)).collect();
    assert_eq!(back, program);
    // Every field keeps its own bits, at their extremes too.
    let extreme = Insn {
        code: 0xfffe,
        jt: 0xfd,
        jf: 0x01,
        k: 0xffff_fffc,
    };
    assert_eq!(extreme.to_word(), 0xffff_fffc_01fd_fffe);
    assert_eq!(Insn::from_word(extreme.to_word()), extreme);
}

#[test]
fn test_an_empty_program_is_refused_before_the_kernel_sees_it() {
    // A spec that arrived without its program must not leave init without a filter.
    assert!(matches!(install(&[]), Err(SeccompError::Empty)));
}

#[test]
fn test_bpf_every_default_rule_names_a_known_syscall() {
    for rule in default_rules() {
        assert!(syscall_number(&rule.syscall).is_some(), "{}", rule.syscall);
    }
}

#[test]
fn test_a_tagged_program_answers_eperm_rules_with_the_tag_and_keeps_the_rest() {
    let tag = 133u16;
    let tagged = compile_tagged(&default_rules(), Some(tag)).unwrap();
    let tagged_errno = RET_ERRNO | u32::from(tag);
    assert_eq!(run(&tagged, &call(libc::SYS_ptrace, &[])), tagged_errno);
    assert_eq!(run(&tagged, &call(libc::SYS_mount, &[])), tagged_errno);
    assert_eq!(run(&tagged, &call(libc::SYS_clone3, &[])), ENOSYS);
    assert_eq!(run(&tagged, &call(libc::SYS_getpid, &[])), RET_ALLOW);
    assert_eq!(compile_tagged(&default_rules(), None).unwrap(), program());
}

#[test]
fn test_allow_list_allows_its_syscalls_and_refuses_the_rest() {
    let rules = vec![SeccompRule {
        syscall: "clone".to_owned(),
        checks: vec![ArgCheck {
            arg: 0,
            mask: 0x0001_0000,
            value: 0,
            equal: true,
        }],
        action: SyscallAction::Eperm,
        why: "threads only".to_owned(),
    }];
    let program = compile_allow_list(&["read", "write", "futex"], &rules, SyscallAction::Eperm)
        .unwrap_or_else(|e| panic!("{e}"));
    let eperm = RET_ERRNO | libc::EPERM as u32;
    for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_futex] {
        assert_eq!(run(&program, &call(nr, &[])), RET_ALLOW, "{nr}");
    }
    for nr in [
        libc::SYS_execve,
        libc::SYS_ptrace,
        libc::SYS_openat,
        libc::SYS_mount,
    ] {
        assert_eq!(run(&program, &call(nr, &[])), eperm, "{nr}");
    }
    // A syscall with rules: refused when they match, allowed when they do not.
    assert_eq!(run(&program, &call(libc::SYS_clone, &[0])), eperm);
    assert_eq!(
        run(&program, &call(libc::SYS_clone, &[0x0001_0000])),
        RET_ALLOW
    );
    let foreign = Call {
        arch: 0x4000_0003,
        nr: libc::SYS_read as u32,
        args: [0; 6],
    };
    assert_eq!(run(&program, &foreign), RET_KILL_PROCESS);
    let enosys =
        compile_allow_list(&["read"], &[], SyscallAction::Enosys).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        run(&enosys, &call(libc::SYS_write, &[])),
        RET_ERRNO | libc::ENOSYS as u32
    );
    assert!(compile_allow_list(&["no_such_call"], &[], SyscallAction::Eperm).is_err());
}

#[test]
fn test_bpf_search_answers_as_the_rules_say_for_every_syscall_and_argument() {
    let rules = default_rules();
    let p = program();
    // Every value any check compares with, its neighbours, and values with every bit set.
    let mut values: Vec<u64> = vec![0, 1, u64::from(u32::MAX), u64::MAX];
    for rule in &rules {
        for check in &rule.checks {
            for value in [check.value, check.value | !check.mask, check.mask] {
                values.extend([value, value.wrapping_add(1), value.wrapping_sub(1)].map(u64::from));
            }
        }
    }
    values.sort_unstable();
    values.dedup();
    for nr in 0..=LAST_NUMBER {
        for arg in 0..6 {
            for &value in &values {
                let mut args = [0u64; 6];
                args[arg] = value;
                let call = call(nr.into(), &args);
                assert_eq!(
                    run(&p, &call),
                    oracle(&rules, &call),
                    "nr {nr}, arg {arg} = {value:#x}"
                );
            }
        }
    }
}

#[test]
fn test_bpf_reaches_any_syscall_in_a_few_compares() {
    // A search, not a row: the kernel runs the filter for every syscall number at install time,
    // so the number of instructions on each path is what a sandbox's start pays.
    let p = program();
    let blocks = ruled_syscalls().len();
    assert!(blocks > 40, "{blocks} syscalls have rules");
    let longest = (0..=LAST_NUMBER)
        .map(|nr| run_counting(&p, &call(nr.into(), &[])).1)
        .max()
        .unwrap_or(0);
    // The header (6), a compare and a jump per level (2 x 4 levels), a leaf's compares and the
    // longest block a zero argument runs through.
    assert!(
        longest <= 40,
        "the longest path runs {longest} instructions"
    );
    let in_a_row = default_rules().len() * 2;
    assert!(
        longest * 3 < in_a_row,
        "{longest} against a row's {in_a_row}"
    );
}

#[test]
fn test_bpf_far_halves_are_reached_through_long_jumps() {
    // Many syscalls with long blocks: no search node may need a jump wider than eight bits.
    let rules: Vec<SeccompRule> = ruled_syscalls()
        .into_iter()
        .map(|syscall| SeccompRule {
            syscall,
            checks: (0..6)
                .map(|arg| ArgCheck {
                    arg,
                    mask: u32::MAX,
                    value: 7,
                    equal: true,
                })
                .collect(),
            action: SyscallAction::Eperm,
            why: "test".to_owned(),
        })
        .collect();
    let p = compile(&rules).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.len() > 2 * 256, "{} instructions", p.len());
    for nr in 0..=LAST_NUMBER {
        for args in [[7u64; 6], [0; 6]] {
            let call = call(nr.into(), &args);
            assert_eq!(run(&p, &call), oracle(&rules, &call), "nr {nr}");
        }
    }
}

#[test]
fn test_bpf_refuses_a_program_longer_than_the_kernel_takes() {
    // 40 syscalls with 50 checks each: about 4,000 instructions of blocks and the search.
    let names = ruled_syscalls();
    assert!(names.len() >= 40, "{} syscalls", names.len());
    let checks = |value| ArgCheck {
        arg: 0,
        mask: u32::MAX,
        value,
        equal: true,
    };
    let rules: Vec<SeccompRule> = names
        .into_iter()
        .take(40)
        .flat_map(|syscall| {
            (0..50).map(move |value| SeccompRule {
                syscall: syscall.clone(),
                checks: vec![checks(value)],
                action: SyscallAction::Eperm,
                why: "test".to_owned(),
            })
        })
        .collect();
    match compile(&rules) {
        Err(SeccompError::TooLong(instructions)) => assert!(instructions > 4096),
        other => panic!("expected TooLong, got {:?}", other.map(|p| p.len())),
    }
}
