use airlock_api::SandboxConfig;
use airlock_policy::{HostFacts, compile};

use super::*;

use crate::backend::test_host as host;

fn boot() -> GuestSource {
    GuestSource::Boot {
        kernel: "/srv/vmlinux".into(),
        initrd: None,
        cmdline: guest::DEFAULT_CMDLINE.into(),
        cmdline_devices: false,
    }
}

#[test]
fn test_microvm_support_is_available_on_hardware_kvm_with_a_guest() {
    let hardware = KvmKind::Hardware { module: "kvm_amd" };
    let support = support(&hardware, Ok(&boot()), &host());
    assert_eq!(support.unavailable, None);
    assert_eq!(support.tier, Tier::Microvm);
}

#[test]
fn test_microvm_support_names_what_is_missing() {
    let hardware = KvmKind::Hardware { module: "kvm_amd" };
    let cases = [
        (
            support(
                &KvmKind::None {
                    reason: "/dev/kvm does not exist".into(),
                },
                Ok(&boot()),
                &host(),
            ),
            "/dev/kvm does not exist",
        ),
        (
            support(&KvmKind::Pvm, Ok(&boot()), &host()),
            "PVM-enabled guest kernel",
        ),
        (
            support(&hardware, Err("no guest is configured"), &host()),
            "no guest is configured",
        ),
        (
            support(
                &hardware,
                Ok(&boot()),
                &HostSupport {
                    user_namespaces: false,
                    ..host()
                },
            ),
            "user namespaces",
        ),
    ];
    for (support, reason) in cases {
        let unavailable = support.unavailable.unwrap_or_default();
        assert!(unavailable.contains(reason), "{unavailable}");
    }
}

#[test]
fn test_vmm_plan_shows_an_empty_root_without_masks_and_no_workload_cgroup() {
    let facts = HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec!["/var/lib/airlock".into()],
    };
    let mut config = SandboxConfig::new(vec!["true".into()]);
    config.tier = Tier::Microvm;
    config.resources.memory_bytes = Some(384 << 20);
    let mut plan = compile(&jail_config(&config), &facts).unwrap();
    assert_eq!(jail_config(&config).tier, Tier::Process);
    plan.isolate_workload_memory(crate::AGENT_RESERVE_BYTES);
    assert!(!plan.view.masks.is_empty());
    let vmm = vmm_plan(&plan, "/tmp/airlock-vmm-root".into(), None);
    assert_eq!(
        vmm.view.root,
        RootPlan::Host {
            path: "/tmp/airlock-vmm-root".into()
        }
    );
    assert!(vmm.view.masks.is_empty());
    assert_eq!(vmm.cgroup.workload_memory_bytes, None);
    // The whole sandbox: the guest's 384 MiB and the VMM's reserve.
    assert_eq!(
        vmm.cgroup.memory_bytes,
        Some((384 << 20) + crate::AGENT_RESERVE_BYTES)
    );
    // Everything else (identity, Landlock, seccomp, rlimits) is the process tier's.
    assert_eq!(vmm.seccomp, plan.seccomp);
    assert_eq!(vmm.landlock, plan.landlock);
    assert_eq!(vmm.identity, plan.identity);
    // With disks, the VMM may write its overlay disk, and only that file more.
    let source = GuestSource::Snapshot {
        dir: "/snap".into(),
    };
    let disks = disks::DiskPlan::new(&source, Some("/r.ext4".into()), Path::new("/sbx")).unwrap();
    let with_disks = vmm_plan(&plan, "/tmp/airlock-vmm-root".into(), Some(&disks));
    let mut expected = plan.landlock.clone();
    expected
        .write_files
        .push("/run/airlock/vm/overlay.img".into());
    assert_eq!(with_disks.landlock, expected);
}

#[test]
fn test_the_vmms_file_limit_holds_its_guests_memory_file() {
    let facts = HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec!["/var/lib/airlock".into()],
    };
    let fsize = |plan: &Plan| {
        plan.rlimits
            .iter()
            .find(|limit| limit.resource == airlock_policy::RlimitResource::Fsize)
            .map(|limit| (limit.soft, limit.hard))
    };
    // The defaults: a 1 GiB disk limit under a 2 GiB sandbox, whose guest's memory is larger.
    let mut config = SandboxConfig::new(vec!["true".into()]);
    config.tier = Tier::Microvm;
    let mut plan = compile(&jail_config(&config), &facts).unwrap();
    assert_eq!(fsize(&plan), Some((1 << 30, 1 << 30)));
    fit_file_limit_to_guest(&mut plan, 2 << 30);
    assert_eq!(fsize(&plan), Some((2 << 30, 2 << 30)));
    // A disk limit above the guest's memory stays as it is.
    fit_file_limit_to_guest(&mut plan, 256 << 20);
    assert_eq!(fsize(&plan), Some((2 << 30, 2 << 30)));
}

#[test]
fn test_microvm_check_refuses_what_a_guest_cannot_have_yet() {
    let mut config = SandboxConfig::new(Vec::new());
    config.tier = Tier::Microvm;
    config.workspace = WorkspaceSource::Host {
        path: "/tmp".into(),
    };
    let err = MicrovmTier.check(&config).unwrap_err().to_string();
    assert!(err.contains("host workspace"), "{err}");
    // A syscall rule would need a filter in the guest: refused, naming the rule.
    let mut config = SandboxConfig::new(Vec::new());
    config.tier = Tier::Microvm;
    let policy = airlock_policy::Policy::from_yaml(
        "p",
        "version: 1\nprocess:\n  syscalls:\n    deny_extra: [ptrace]\n",
    )
    .unwrap();
    config.policy = Some(Box::new(policy.document().clone()));
    let err = MicrovmTier.check(&config).unwrap_err().to_string();
    assert!(
        err.contains("`ptrace`") && err.contains("no seccomp filter"),
        "{err}"
    );
    // A host directory as the root is refused too.
    let mut config = SandboxConfig::new(Vec::new());
    config.tier = Tier::Microvm;
    config.rootfs = Some("/srv/root".into());
    let err = MicrovmTier.check(&config).unwrap_err().to_string();
    assert!(err.contains("rootfs"), "{err}");
}

fn with_network(mode: &str) -> SandboxConfig {
    let yaml = format!("version: 1\nnetwork:\n  mode: {mode}\n");
    let policy = airlock_policy::Policy::from_yaml("test.yaml", &yaml).unwrap();
    let mut config = SandboxConfig::new(Vec::new());
    config.tier = Tier::Microvm;
    config.policy = Some(Box::new(policy.document().clone()));
    config
}

#[test]
fn test_microvm_check_refuses_full_network_and_lets_proxy_through() {
    let err = MicrovmTier
        .check(&with_network("full"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("network: full") && err.contains("proxy"),
        "{err}"
    );
    // Egress through the proxy passes the network check (and stops, here, at the guest).
    if std::env::var_os(guest::ENV_KERNEL).is_none()
        && std::env::var_os(guest::ENV_SNAPSHOT).is_none()
    {
        let err = MicrovmTier
            .check(&with_network("proxy"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no guest is configured"), "{err}");
    }
}

#[test]
fn test_find_vmm_is_beside_the_helper() {
    if std::env::var_os(guest::ENV_VMM_BIN).is_none() {
        assert_eq!(
            find_vmm(Path::new("/opt/airlock/airlock-jail")),
            PathBuf::from("/opt/airlock/airlock-vmm")
        );
    }
}

#[test]
fn test_one_shot_runs_are_refused_with_the_reason() {
    let facts = HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec![],
    };
    let plan = compile(&SandboxConfig::new(vec!["true".into()]), &facts).unwrap();
    let options = SpawnOptions {
        helper: "/nonexistent/airlock-jail".into(),
        cgroups: host().cgroups,
        trace: false,
        evaluation: airlock_jail::spec::Evaluation::default(),
        hold: None,
        stdio: None,
        zygote: None,
    };
    let err = MicrovmTier.start(&plan, &options).unwrap_err().to_string();
    assert!(err.contains("long-lived sandboxes only"), "{err}");
}

#[test]
fn test_a_sandbox_directory_holding_a_paused_vm_restores_it_instead_of_the_operators_guest() {
    let dir = std::env::temp_dir().join(format!("airlock-guest-for-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("paused")).unwrap();
    let disk = Some(PathBuf::from("/images/root.ext4"));
    let operator = || {
        Ok((
            GuestSource::Snapshot {
                dir: "/operator/snapshot".into(),
            },
            None,
        ))
    };
    // Half-made (no state): not a paused VM.
    std::fs::write(dir.join("paused/memory"), b"").unwrap();
    let (guest, root, own) = guest_for(&dir, disk.clone(), operator).unwrap();
    assert!(!own);
    assert_eq!(root, None);
    assert_eq!(
        guest,
        GuestSource::Snapshot {
            dir: "/operator/snapshot".into()
        }
    );
    std::fs::write(dir.join("paused/state.json"), b"{}").unwrap();
    let (guest, root, own) =
        guest_for(&dir, disk.clone(), || Err("no operator guest".to_owned())).unwrap();
    assert!(own);
    assert_eq!(root, disk);
    assert_eq!(
        guest,
        GuestSource::Snapshot {
            dir: dir.join("paused")
        }
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
