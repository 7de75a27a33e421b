use super::*;

const HYBRID_MOUNTINFO: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
33 30 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 30 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
36 30 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 30 0:37 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
";

const HYBRID_OWN: &str = "\
8:pids:/
4:memory:/process_api/abc
1:cpu:/
0::/
";

#[test]
fn test_layout_hybrid_prefers_v1_controllers() {
    let layout = parse_layout(HYBRID_MOUNTINFO, HYBRID_OWN, |_| "hugetlb\n".into());
    assert_eq!(
        layout.memory,
        Some(Home::V1 {
            own_dir: "/sys/fs/cgroup/memory/process_api/abc".into()
        })
    );
    assert_eq!(
        layout.pids,
        Some(Home::V1 {
            own_dir: "/sys/fs/cgroup/pids".into()
        })
    );
    assert_eq!(
        layout.cpu,
        Some(Home::V1 {
            own_dir: "/sys/fs/cgroup/cpu".into()
        })
    );
    assert_eq!(
        layout.freezer,
        Some(Home::V1 {
            own_dir: "/sys/fs/cgroup/freezer".into()
        })
    );
    assert_eq!(layout.describe(), "v1");
    // Without a v1 freezer, the v2 hierarchy freezes: it is core code, listed or not.
    let no_v1_freezer: String = HYBRID_MOUNTINFO
        .lines()
        .filter(|l| !l.contains("freezer"))
        .map(|l| format!("{l}\n"))
        .collect();
    let layout = parse_layout(&no_v1_freezer, HYBRID_OWN, |_| "hugetlb\n".into());
    assert!(matches!(layout.freezer, Some(Home::V2 { .. })));
}

#[test]
fn test_layout_pure_v2() {
    let mountinfo = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
    let layout = parse_layout(mountinfo, "0::/user.slice\n", |mount| {
        assert_eq!(mount, Path::new("/sys/fs/cgroup"));
        "cpuset cpu io memory pids\n".into()
    });
    let v2 = Some(Home::V2 {
        mount: "/sys/fs/cgroup".into(),
        own_dir: "/sys/fs/cgroup/user.slice".into(),
    });
    assert_eq!(layout.memory, v2);
    assert_eq!(layout.pids, v2);
    assert_eq!(layout.cpu, v2);
    assert_eq!(layout.describe(), "v2");
}

#[test]
fn test_layout_mixed_v1_and_v2_is_hybrid() {
    let mountinfo = "\
25 1 0:22 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
26 1 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
    let layout = parse_layout(mountinfo, "4:memory:/\n0::/\n", |_| "pids cpu\n".into());
    assert!(matches!(layout.memory, Some(Home::V1 { .. })));
    assert!(matches!(layout.pids, Some(Home::V2 { .. })));
    assert_eq!(layout.describe(), "hybrid");
}

#[test]
fn test_layout_comounted_cpu_cpuacct() {
    let mountinfo = "26 1 0:23 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
    let layout = parse_layout(mountinfo, "3:cpu,cpuacct:/x\n", |_| String::new());
    assert_eq!(
        layout.cpu,
        Some(Home::V1 {
            own_dir: "/sys/fs/cgroup/cpu,cpuacct/x".into()
        })
    );
    assert_eq!(layout.memory, None);
}

#[test]
fn test_mountinfo_escapes_are_decoded() {
    assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
    assert_eq!(unescape_mountinfo("/plain"), "/plain");
}

#[test]
fn test_owner_pid_from_name() {
    assert_eq!(owner_pid("airlock-1234-7"), Some(1234));
    assert_eq!(owner_pid("other-1234"), None);
    assert_eq!(owner_pid("airlock-x-1"), None);
}

/// A directory standing in for a cgroup mount: the files the code writes are plain files here,
/// so what it writes can be read back without root.
fn fake_mount(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("airlock-cgroup-test-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn limits() -> CgroupLimits {
    CgroupLimits {
        memory_bytes: Some(64 << 20),
        workload_memory_bytes: None,
        freezable: false,
        pids_max: Some(33),
        cpu_quota_us: Some(150_000),
        cpu_period_us: 100_000,
    }
}

#[test]
fn test_create_writes_v2_limits_and_enables_only_v2_controllers() {
    let mount = fake_mount("v2");
    let v2 = |_: ()| {
        Some(Home::V2 {
            mount: mount.clone(),
            own_dir: mount.join("user.slice"),
        })
    };
    let layout = Layout {
        memory: v2(()),
        pids: v2(()),
        cpu: None,
        freezer: None,
    };
    let no_cpu = CgroupLimits {
        cpu_quota_us: None,
        ..limits()
    };
    let cgroup = SandboxCgroup::create(&layout, "airlock-1-0", &no_cpu).unwrap();
    let dir = mount.join("airlock/airlock-1-0");
    let read = |file: &str| fs::read_to_string(dir.join(file)).unwrap();
    assert_eq!(read("memory.max"), (64u64 << 20).to_string());
    assert_eq!(read("memory.swap.max"), "0");
    assert_eq!(read("pids.max"), "33");
    assert_eq!(
        fs::read_to_string(mount.join("cgroup.subtree_control")).unwrap(),
        "+memory +pids"
    );
    assert_eq!(cgroup.join_files(), vec![dir.join("cgroup.procs")]);
    assert_eq!(
        cgroup.leave_files(),
        [mount.join("user.slice/cgroup.procs")]
    );
    fs::remove_dir_all(&mount).unwrap();
}

#[test]
fn test_create_writes_v1_limits_per_hierarchy() {
    let mount = fake_mount("v1");
    for name in ["memory", "pids", "cpu"] {
        fs::create_dir_all(mount.join(name)).unwrap();
    }
    let v1 = |name: &str| {
        Some(Home::V1 {
            own_dir: mount.join(name),
        })
    };
    let layout = Layout {
        memory: v1("memory"),
        pids: v1("pids"),
        cpu: v1("cpu"),
        freezer: None,
    };
    fs::create_dir_all(mount.join("memory/airlock-1-0")).unwrap();
    let created = SandboxCgroup::create(&layout, "airlock-1-0", &limits());
    assert!(
        matches!(created, Err(CgroupError::Create { .. })),
        "an existing cgroup is never reused"
    );
    fs::remove_dir_all(mount.join("memory/airlock-1-0")).unwrap();

    let cgroup = SandboxCgroup::create(&layout, "airlock-1-1", &limits()).unwrap();
    let read = |path: &str| fs::read_to_string(mount.join(path)).unwrap();
    assert_eq!(
        read("memory/airlock-1-1/memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    assert_eq!(read("pids/airlock-1-1/pids.max"), "33");
    assert_eq!(read("cpu/airlock-1-1/cpu.cfs_period_us"), "100000");
    assert_eq!(read("cpu/airlock-1-1/cpu.cfs_quota_us"), "150000");
    assert_eq!(cgroup.join_files().len(), 3);
    assert!(cgroup.join_files().iter().all(|f| f.ends_with("tasks")));
    assert_eq!(cgroup.leave_files().len(), 3);
    fs::remove_dir_all(&mount).unwrap();
}

#[test]
fn test_create_gives_the_workload_its_own_v1_memory_cgroup() {
    let mount = fake_mount("v1-workload");
    for name in ["memory", "pids"] {
        fs::create_dir_all(mount.join(name)).unwrap();
    }
    let v1 = |name: &str| {
        Some(Home::V1 {
            own_dir: mount.join(name),
        })
    };
    let layout = Layout {
        memory: v1("memory"),
        pids: v1("pids"),
        cpu: None,
        freezer: None,
    };
    let split = CgroupLimits {
        memory_bytes: Some(96 << 20),
        workload_memory_bytes: Some(64 << 20),
        cpu_quota_us: None,
        ..limits()
    };
    let cgroup = SandboxCgroup::create(&layout, "airlock-sbx-1", &split).unwrap();
    let read = |path: &str| fs::read_to_string(mount.join(path)).unwrap();
    assert_eq!(
        read("memory/airlock-sbx-1/memory.limit_in_bytes"),
        (96u64 << 20).to_string()
    );
    assert_eq!(
        read("memory/airlock-sbx-1/workload/memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    // The agent joins the sandbox's own cgroup; the workload's processes move themselves.
    assert!(
        cgroup
            .join_files()
            .contains(&mount.join("memory/airlock-sbx-1/tasks"))
    );
    let workload = cgroup.workload_files().unwrap();
    assert_eq!(
        workload.procs,
        mount.join("memory/airlock-sbx-1/workload/cgroup.procs")
    );
    assert_eq!(
        workload.oom_events,
        mount.join("memory/airlock-sbx-1/workload/memory.oom_control")
    );
    fs::write(
        mount.join("memory/airlock-sbx-1/workload/memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
    )
    .unwrap();
    assert_eq!(cgroup.workload_oom_kills(), 2);
    fs::remove_dir_all(&mount).unwrap();
}

#[test]
fn test_create_puts_the_agent_in_a_v2_leaf_beside_the_workload() {
    let mount = fake_mount("v2-workload");
    let v2 = || {
        Some(Home::V2 {
            mount: mount.clone(),
            own_dir: mount.join("user.slice"),
        })
    };
    let layout = Layout {
        memory: v2(),
        pids: v2(),
        cpu: None,
        freezer: None,
    };
    let split = CgroupLimits {
        memory_bytes: Some(96 << 20),
        workload_memory_bytes: Some(64 << 20),
        cpu_quota_us: None,
        ..limits()
    };
    let cgroup = SandboxCgroup::create(&layout, "airlock-sbx-2", &split).unwrap();
    let dir = mount.join("airlock/airlock-sbx-2");
    let read = |file: &str| fs::read_to_string(dir.join(file)).unwrap();
    assert_eq!(read("memory.max"), (96u64 << 20).to_string());
    assert_eq!(read("workload/memory.max"), (64u64 << 20).to_string());
    assert_eq!(read("cgroup.subtree_control"), "+memory");
    // A v2 cgroup with children holds no processes: the agent has a leaf of its own.
    assert_eq!(cgroup.join_files(), vec![dir.join("agent/cgroup.procs")]);
    assert_eq!(
        cgroup.workload_files().unwrap().oom_events,
        dir.join("workload/memory.oom_control"),
        "memory.events does not exist in the fake mount, so the v1 name is chosen"
    );
    fs::remove_dir_all(&mount).unwrap();
}

#[test]
fn test_parse_oom_kills_reads_both_versions() {
    assert_eq!(
        parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
        3
    );
    assert_eq!(
        parse_oom_kills("low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n"),
        1
    );
    assert_eq!(parse_oom_kills(""), 0);
}
