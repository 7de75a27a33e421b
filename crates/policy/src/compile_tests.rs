use airlock_api::{Compat, UserSpec};

use super::*;

fn root_host() -> HostFacts {
    HostFacts {
        caller_uid: 0,
        caller_gid: 0,
        state_dirs: vec!["/var/lib/airlock".into()],
    }
}

fn user_host() -> HostFacts {
    HostFacts {
        caller_uid: 1000,
        caller_gid: 100,
        state_dirs: vec![],
    }
}

fn config() -> SandboxConfig {
    SandboxConfig::new(vec!["/bin/true".into()])
}

#[test]
fn test_compile_root_caller_maps_uid0_to_unprivileged_range() {
    let plan = compile(&config(), &root_host()).unwrap();
    assert_eq!(
        plan.identity.uid_map,
        vec![IdMap {
            inside: 0,
            outside: SANDBOX_ID_BASE,
            count: SANDBOX_ID_COUNT
        }]
    );
    assert_eq!(plan.identity.gid_map, plan.identity.uid_map);
    assert!(plan.identity.privileged_caller);
    assert_ne!(plan.identity.uid_map[0].outside, 0);
}

#[test]
fn test_compile_unprivileged_caller_maps_only_its_own_ids() {
    let mut config = config();
    config.user = UserSpec {
        uid: 1000,
        gid: 1000,
    };
    let plan = compile(&config, &user_host()).unwrap();
    assert_eq!(
        plan.identity.uid_map,
        vec![IdMap {
            inside: 1000,
            outside: 1000,
            count: 1
        }]
    );
    assert_eq!(
        plan.identity.gid_map,
        vec![IdMap {
            inside: 1000,
            outside: 100,
            count: 1
        }]
    );
    assert!(!plan.identity.privileged_caller);
}

#[test]
fn test_compile_host_workspace_is_idmapped_only_for_root() {
    let mut config = config();
    config.workspace = WorkspaceSource::Host {
        path: "/src/project".into(),
    };
    let root = compile(&config, &root_host()).unwrap();
    let user = compile(&config, &user_host()).unwrap();
    assert_eq!(
        root.view.workspace,
        WorkspacePlan::Host {
            path: "/src/project".into(),
            idmap: true
        }
    );
    assert_eq!(
        user.view.workspace,
        WorkspacePlan::Host {
            path: "/src/project".into(),
            idmap: false
        }
    );
}

#[test]
fn test_compile_masks_credentials_runtime_dirs_and_state() {
    let plan = compile(&config(), &root_host()).unwrap();
    let masked: Vec<(&str, MaskKind)> = plan
        .view
        .masks
        .iter()
        .map(|m| (m.path.as_str(), m.kind))
        .collect();
    for path in [
        "/root/.ssh",
        "/home/*/.ssh",
        "/home/*/.aws",
        "/root/.config/gh",
        "/home/*/.docker",
        "/home/*/.netrc",
        "/root/.kube",
        "/root/.gnupg",
        "/etc/shadow",
        "/etc/sudoers",
        "/etc/sudoers.d",
        "/var/lib/airlock",
    ] {
        assert!(
            masked.contains(&(path, MaskKind::Secret)),
            "{path} is not masked"
        );
    }
    assert!(masked.contains(&("/run", MaskKind::Empty)));
    assert!(masked.contains(&("/var/run", MaskKind::Empty)));
}

#[test]
fn test_compile_writes_only_in_workspace_tmp_and_devices() {
    let plan = compile(&config(), &root_host()).unwrap();
    assert_eq!(plan.landlock.read, vec![PathBuf::from("/")]);
    assert_eq!(
        plan.landlock.write_trees,
        ["/workspace", "/tmp", "/dev/shm", "/dev/pts"]
            .map(PathBuf::from)
            .to_vec()
    );
    assert!(
        plan.landlock
            .write_files
            .contains(&PathBuf::from("/dev/null"))
    );
    assert!(
        plan.landlock
            .write_files
            .contains(&PathBuf::from("/dev/tty"))
    );
}

#[test]
fn test_compile_limits_follow_resources() {
    let mut config = config();
    config.resources.memory_bytes = Some(512 << 20);
    config.resources.pids_max = Some(64);
    config.resources.cpu_milli = Some(1_500);
    config.resources.disk_bytes = 100 << 20;
    let plan = compile(&config, &root_host()).unwrap();
    assert_eq!(
        plan.cgroup,
        CgroupLimits {
            memory_bytes: Some(512 << 20),
            workload_memory_bytes: None,
            freezable: false,
            pids_max: Some(64 + AIRLOCK_PROCESSES),
            cpu_quota_us: Some(150_000),
            cpu_period_us: 100_000,
        }
    );
    assert!(plan.rlimits.contains(&Rlimit {
        resource: RlimitResource::Core,
        soft: 0,
        hard: 0
    }));
    assert!(plan.rlimits.contains(&Rlimit {
        resource: RlimitResource::Fsize,
        soft: 100 << 20,
        hard: 100 << 20
    }));
    assert_eq!(
        plan.view.scratch,
        ScratchPlan::Memory {
            size_bytes: 100 << 20
        }
    );
}

#[test]
fn test_plan_disk_scratch_leaves_memory_to_the_workload() {
    let mut config = config();
    config.resources.memory_bytes = Some(512 << 20);
    config.resources.disk_bytes = 100 << 20;
    let mut plan = compile(&config, &root_host()).unwrap();
    plan.use_disk_scratch("/var/lib/airlock/storage/abc".into());
    plan.isolate_workload_memory(64 << 20);
    assert_eq!(plan.cgroup.workload_memory_bytes, Some(512 << 20));
    assert_eq!(plan.cgroup.memory_bytes, Some((512 + 64) << 20));
    assert_eq!(
        plan.view.scratch,
        ScratchPlan::Disk {
            host_dir: "/var/lib/airlock/storage/abc".into()
        }
    );
}

#[test]
fn test_compile_memory_scratch_leaves_the_workload_half_its_memory() {
    let mut config = config();
    config.resources.memory_bytes = Some(512 << 20);
    config.resources.disk_bytes = 1 << 30;
    let plan = compile(&config, &root_host()).unwrap();
    assert_eq!(
        plan.view.scratch,
        ScratchPlan::Memory {
            size_bytes: 256 << 20
        }
    );
    assert_eq!(plan.cgroup.memory_bytes, Some(512 << 20));
    config.resources.memory_bytes = None;
    let unlimited = compile(&config, &root_host()).unwrap();
    assert_eq!(
        unlimited.view.scratch,
        ScratchPlan::Memory {
            size_bytes: 1 << 30
        }
    );
    let mut isolated = unlimited;
    isolated.isolate_workload_memory(64 << 20);
    assert_eq!(isolated.cgroup.workload_memory_bytes, None);
}

#[test]
fn test_compile_environment_is_not_inherited_and_caller_wins() {
    let mut config = config();
    config.env = vec![
        ("HOME".into(), "/workspace".into()),
        ("A".into(), "b".into()),
    ];
    let plan = compile(&config, &root_host()).unwrap();
    let env = plan.process.env;
    assert!(env.contains(&("HOME".into(), "/workspace".into())));
    assert!(env.contains(&("A".into(), "b".into())));
    assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
    assert_eq!(env.len(), 4);
}

#[test]
fn test_compile_rejects_bad_input_by_name() {
    let mut empty = config();
    empty.command.clear();
    assert_eq!(
        compile(&empty, &root_host()),
        Err(CompileError::EmptyCommand)
    );
    empty.command = vec![String::new(), "arg".into()];
    assert_eq!(
        compile(&empty, &root_host()),
        Err(CompileError::EmptyCommand)
    );

    let mut bad_env = config();
    bad_env.env = vec![("A=B".into(), "c".into())];
    assert_eq!(
        compile(&bad_env, &root_host()),
        Err(CompileError::BadEnvName("A=B".into()))
    );

    let mut relative = config();
    relative.cwd = "work".into();
    assert_eq!(
        compile(&relative, &root_host()),
        Err(CompileError::RelativePath {
            what: "--cwd",
            path: "work".into()
        })
    );

    let mut nul = config();
    nul.command = vec!["a\0b".into()];
    assert!(matches!(
        compile(&nul, &root_host()),
        Err(CompileError::NulByte { .. })
    ));

    let mut pids = config();
    pids.resources.pids_max = Some(PIDS_LIMIT);
    assert_eq!(
        compile(&pids, &root_host()),
        Err(CompileError::TooLarge {
            what: "--pids",
            max: PIDS_LIMIT - AIRLOCK_PROCESSES,
            value: PIDS_LIMIT
        })
    );

    let mut tier = config();
    tier.tier = Tier::Microvm;
    assert_eq!(
        compile(&tier, &root_host()),
        Err(CompileError::UnsupportedTier("microvm"))
    );
}

#[test]
fn test_compile_plan_round_trips_through_json() {
    let mut config = config();
    config.compat = Compat::BestEffort;
    let plan = compile(&config, &root_host()).unwrap();
    let json = serde_json::to_vec(&plan).unwrap();
    let back: Plan = serde_json::from_slice(&json).unwrap();
    assert_eq!(back, plan);
}

fn bind(host: &str, guest: &str) -> airlock_api::ViewBind {
    airlock_api::ViewBind {
        host: host.into(),
        guest: guest.into(),
    }
}

#[test]
fn test_compile_root_binds_become_a_binds_root_that_still_masks_secrets() {
    let mut config = config();
    let binds = vec![
        bind("/usr/lib/airlock/airlock-wasm", "/opt/airlock/airlock-wasm"),
        bind("/data/reference", "/data/reference"),
    ];
    config.root_binds = Some(binds.clone());
    let plan = compile(&config, &root_host()).unwrap();
    assert_eq!(plan.view.root, RootPlan::Binds { binds });
    // A bind of a home or of the state directory is masked as on the host view.
    assert!(plan.view.masks.iter().any(|m| m.path == "/var/lib/airlock"));
    assert_eq!(plan.landlock, process_landlock());
}

#[test]
fn test_compile_root_binds_refuse_the_root_provided_dirs_nesting_and_dots() {
    for (binds, wanted) in [
        (vec![bind("/srv", "/")], "replace the root"),
        (vec![bind("/srv", "/tmp/srv")], "mounts that directory"),
        (
            vec![bind("/srv", "/run/airlock/x")],
            "mounts that directory",
        ),
        (vec![bind("/srv", "/opt/../etc")], "`..`"),
        (vec![bind("/srv/../etc", "/opt/x")], "`..`"),
        (
            vec![bind("/srv", "/opt/a"), bind("/etc", "/opt/a/b")],
            "inside another bind",
        ),
        (
            vec![bind("/srv", "/opt/a"), bind("/etc", "/opt/a")],
            "inside another bind",
        ),
    ] {
        let mut config = config();
        config.root_binds = Some(binds);
        let err = compile(&config, &root_host()).unwrap_err().to_string();
        assert!(err.contains(wanted), "{wanted}: {err}");
    }
    let mut config = config();
    config.root_binds = Some(vec![bind("srv", "/opt/srv")]);
    assert!(matches!(
        compile(&config, &root_host()),
        Err(CompileError::RelativePath { .. })
    ));
    config.root_binds = Some(Vec::new());
    config.rootfs = Some("/srv/root".into());
    assert_eq!(
        compile(&config, &root_host()),
        Err(CompileError::RootfsWithBinds)
    );
}
