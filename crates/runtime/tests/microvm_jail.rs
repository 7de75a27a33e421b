//! The microvm tier's jail on this host (root; needs /dev/kvm, which runs freestanding guests
//! even where it is PVM): the jail execs `airlock-vmm restore` of a snapshot of the VMM's
//! freestanding counter guest, exactly as `MicrovmTier` starts a Linux guest's VMM, and the
//! VMM is checked from outside: the arguments the jail gave it, its own allow-list stacked on
//! the jail's filter, namespaces of its own, a view holding only Airlock's mounts and the
//! snapshot, no `/dev/kvm` node, and the sandbox's cgroup. (A Linux guest, its agent and the
//! runtime's readiness wait are shown by the nested rig, `scripts/microvm-nested.sh`.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use airlock_api::SandboxConfig;
use airlock_jail::spec::AgentSpec;
use airlock_jail::{HostSupport, SpawnOptions};
use airlock_runtime::microvm::guest::{GuestSource, vmm_spec};
use airlock_runtime::microvm::{empty_root, vmm_plan};

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-microvm-jail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The sandbox's processes, from its cgroup.
fn procs(dirs: &[PathBuf]) -> Vec<u32> {
    airlock_jail::cgroup::SandboxCgroup::from_dirs(dirs)
        .pids()
        .into_iter()
        .map(|pid| u32::try_from(pid).unwrap())
        .collect()
}

fn filters(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("Seccomp_filters:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn list(path: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn test_microvm_jail_runs_the_vmm_in_a_view_of_only_its_snapshot_under_both_filters() {
    let vmm = bin_dir().join("airlock-vmm");
    assert!(
        vmm.is_file(),
        "{} is missing: run `cargo build --workspace` first",
        vmm.display()
    );
    assert!(Path::new("/dev/kvm").exists(), "this test needs /dev/kvm");
    let dir = scratch();
    let snapshot = dir.join("snapshot");
    let template = Command::new(&vmm)
        .args(["template", "--steps", "3", "--snapshot"])
        .arg(&snapshot)
        .output()
        .unwrap();
    assert!(template.status.success(), "{template:?}");
    // The snapshot's files are the user's; the VMM runs as another inside the jail.
    Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status()
        .unwrap();

    let host = HostSupport::probe();
    let facts = airlock_policy::HostFacts {
        caller_uid: host.caller_uid,
        caller_gid: host.caller_gid,
        state_dirs: vec![],
    };
    let mut config = SandboxConfig::new(vec!["/run/airlock/agent".into()]);
    config.resources.memory_bytes = Some(96 << 20);
    let plan = airlock_policy::compile(&config, &facts).unwrap();
    let plan = vmm_plan(&plan, empty_root().unwrap(), None);
    let options = SpawnOptions {
        helper: bin_dir().join("airlock-jail"),
        cgroups: host.cgroups.clone(),
        trace: false,
        evaluation: Default::default(),
        hold: None,
        stdio: None,
        zygote: None,
    };
    let agent = AgentSpec {
        binary: vmm.clone(),
        socket: dir.join("agent.sock"),
        log: dir.join("agent.log"),
        vmm: Some(vmm_spec(
            &GuestSource::Snapshot {
                dir: snapshot.clone(),
            },
            64,
        )),
    };
    let id = format!("mvmjail{}", std::process::id());
    let starting = airlock_jail::live::start(&plan, &options, &id, agent).unwrap();
    let dirs = starting.record().cgroup_dirs.clone();
    // The counter guest's console is raw bytes, not text.
    let log = || {
        String::from_utf8_lossy(&std::fs::read(dir.join("agent.log")).unwrap_or_default())
            .into_owned()
    };
    // The helper leaves the cgroup once init exists: the VMM is its one process. It has
    // restored the snapshot once its own allow-list is on (a hang guard, not a timing).
    let mut vmm_pid = None;
    for _ in 0..600 {
        if let [pid] = procs(&dirs)[..]
            && filters(pid) >= 2
        {
            vmm_pid = Some(pid);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = vmm_pid.unwrap_or_else(|| {
        panic!(
            "no VMM under its allow-list in {dirs:?} ({:?}); its log:\n{}",
            procs(&dirs),
            log()
        )
    });
    let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    assert_eq!(
        argv,
        [
            "airlock-vmm",
            "restore",
            "--kvm-fd",
            "5",
            "--vsock-listen-fd",
            "3",
            "--snapshot",
            "/run/airlock/vm/snapshot",
            "--vsock-port",
            "49983"
        ]
    );
    // The jail's deny-list, then the VMM's own allow-list: exactly two, on every thread.
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().file_name().to_string_lossy().parse().unwrap();
        assert_eq!(filters(task), 2, "thread {task} of the VMM");
    }
    for ns in ["mnt", "pid", "net", "user", "ipc", "uts"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        assert_ne!(ours, its, "the VMM shares this host's {ns} namespace");
    }
    let root = format!("/proc/{pid}/root");
    assert_eq!(
        list(&root),
        ["dev", "proc", "run", "sys", "tmp", "workspace"],
        "the VMM's view"
    );
    assert_eq!(list(&format!("{root}/run/airlock")), ["agent", "vm"]);
    assert_eq!(list(&format!("{root}/run/airlock/vm")), ["snapshot"]);
    assert_eq!(
        list(&format!("{root}/run/airlock/vm/snapshot")),
        list(snapshot.to_str().unwrap())
    );
    assert!(
        !list(&format!("{root}/dev")).contains(&"kvm".to_owned()),
        "/dev/kvm is in the view (the VMM gets a descriptor)"
    );
    // Read-only: the snapshot cannot be changed from inside.
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let snapshot_mount = mountinfo
        .lines()
        .find(|line| line.split(' ').nth(4) == Some("/run/airlock/vm/snapshot"))
        .unwrap_or_else(|| panic!("no snapshot mount in:\n{mountinfo}"));
    assert!(
        snapshot_mount.split(' ').nth(5).unwrap().starts_with("ro,"),
        "{snapshot_mount}"
    );
    let stderr = std::fs::read_link(format!("/proc/{pid}/fd/2")).unwrap();
    assert_eq!(stderr, dir.join("agent.log"), "the VMM's standard error");
    assert!(log().contains("restored"), "{}", log());

    // Not committed: dropping the handle ends the sandbox, VMM and cgroup.
    drop(starting);
    for _ in 0..600 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the VMM outlived its sandbox"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
