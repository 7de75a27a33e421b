//! Shared test equipment: run `airlock` and `airlock-probe`, and prove that nothing outlived a
//! sandbox.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test equipment: failing loudly is the point"
)]
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod image;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Where cargo put the binaries.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_airlock"))
        .parent()
        .expect("bin dir")
        .to_path_buf()
}

pub fn airlock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// A scratch directory under /var/tmp, visible read-only inside sandboxes (their /tmp is
/// private), holding copies of the binaries. Removed on drop.
pub struct Scratch {
    pub dir: PathBuf,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Scratch {
    pub fn new() -> Scratch {
        let dir = PathBuf::from(format!(
            "/var/tmp/airlock-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).expect("scratch dir");
        set_mode(&dir, 0o755);
        for name in ["airlock", "airlock-jail", "airlock-probe"] {
            let source = bin_dir().join(name);
            assert!(
                source.is_file(),
                "{} is missing: run `cargo build --workspace` first",
                source.display()
            );
            let target = dir.join(name);
            if fs::hard_link(&source, &target).is_err() {
                fs::copy(&source, &target).expect("copy binary");
                set_mode(&target, 0o755);
            }
        }
        Scratch { dir }
    }

    pub fn probe(&self) -> String {
        self.dir.join("airlock-probe").display().to_string()
    }

    pub fn airlock(&self) -> PathBuf {
        self.dir.join("airlock")
    }

    /// A directory to pass as `--rootfs`, holding the (static) probe as `/bin/probe`.
    pub fn rootfs(&self, name: &str) -> PathBuf {
        let rootfs = self.workspace(name);
        fs::create_dir_all(rootfs.join("bin")).expect("rootfs bin");
        fs::copy(self.probe(), rootfs.join("bin/probe")).expect("copy probe");
        rootfs
    }

    /// A fresh subdirectory for use as a host workspace.
    pub fn workspace(&self, name: &str) -> PathBuf {
        let path = self.dir.join(name);
        fs::create_dir_all(&path).expect("workspace dir");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The result of one `airlock` invocation.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: Vec<u8>,
}

impl Run {
    /// The probe's one-line verdict.
    pub fn verdict(&self) -> &str {
        self.stdout.trim()
    }
}

/// Runs `airlock ARGS` to completion, then asserts that it left nothing behind.
pub fn airlock(args: &[&str]) -> Run {
    airlock_with_input(args, None)
}

pub fn airlock_with_input(args: &[&str], input: Option<&[u8]>) -> Run {
    let mut child = Command::new(airlock_bin())
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    let pid = child.id();
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        let data = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let output = child.wait_with_output().expect("wait airlock");
    assert_no_leftovers(pid);
    run_from(output)
}

pub fn run_from(output: Output) -> Run {
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        stdout_bytes: output.stdout,
    }
}

/// Runs the probe inside a sandbox with `sandbox_args` before `--`.
pub fn inside(scratch: &Scratch, sandbox_args: &[&str], probe_args: &[&str]) -> Run {
    let probe = scratch.probe();
    let mut args = vec!["run"];
    args.extend_from_slice(sandbox_args);
    args.push("--");
    args.push(&probe);
    args.extend_from_slice(probe_args);
    airlock(&args)
}

/// Runs the probe directly on the host: the control.
pub fn outside(scratch: &Scratch, probe_args: &[&str]) -> String {
    let output = Command::new(scratch.probe())
        .args(probe_args)
        .output()
        .expect("run probe");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Every process the host's /proc lists, with its /proc directory.
fn host_processes() -> impl Iterator<Item = (u32, PathBuf)> {
    fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, entry.path()))
        })
}

/// Host processes of `airlock-probe` whose command line contains `marker`. Only the probe
/// counts: `airlock`'s own command line carries the marker too, as an argument.
pub fn processes_with(marker: &str) -> Vec<u32> {
    host_processes()
        .filter(|(pid, dir)| {
            let cmdline = fs::read(dir.join("cmdline")).unwrap_or_default();
            let program = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            *pid != std::process::id()
                && program.ends_with(b"airlock-probe")
                && String::from_utf8_lossy(&cmdline).contains(marker)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Sandbox inits running as `uid` inside (under a root caller) that lost their helper and were
/// handed to the host's pid 1: what a sandbox ended without reaping its init leaves behind, if
/// only as a zombie. Tests pick distinct uids so that they see only their own. Each sandbox has
/// a host id range of its own (`SANDBOX_ID_BASE + slot * 65536`), so `uid` inside is any
/// host uid that is `uid` past a range's base.
pub fn orphaned_inits(uid: u32) -> Vec<u32> {
    const SANDBOX_ID_BASE: u32 = 0x7000_0000;
    let in_a_range = |owner: &str| {
        owner
            .parse::<u32>()
            .ok()
            .and_then(|owner| owner.checked_sub(SANDBOX_ID_BASE))
            .is_some_and(|offset| offset % 65_536 == uid)
    };
    host_processes()
        .filter(|(_, dir)| {
            let status = fs::read_to_string(dir.join("status")).unwrap_or_default();
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_owned())
                    .unwrap_or_default()
            };
            let owner = field("Uid:")
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            field("Name:") == "airlock-jail" && field("PPid:") == "1" && in_a_range(&owner)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Waits (boundedly) until `check` holds; returns whether it did. Not a timing assertion: the
/// bound only keeps a broken build from hanging the suite.
pub fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// cgroup directories that belong to the airlock process `pid`.
pub fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("airlock-{pid}-");
    let mut found = Vec::new();
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if !kind.is_dir() {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(entry.path());
            } else if depth < 4 {
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

/// Nothing of the sandbox run by airlock process `pid` remains: no cgroup, and no mount of
/// Airlock's anywhere the host can see.
pub fn assert_no_leftovers(pid: u32) {
    let cgroups = cgroups_of(pid);
    assert!(
        cgroups.is_empty(),
        "cgroups left behind by airlock {pid}: {cgroups:?}"
    );
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts
            .lines()
            .any(|l| l.contains(" - tmpfs airlock ") || l.contains("/workspace ")),
        "an Airlock mount leaked into the host mount namespace"
    );
}

/// Starts airlock without waiting, for signal tests.
pub fn spawn_airlock(args: &[&str]) -> Child {
    Command::new(airlock_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock")
}

pub fn unique_marker(tag: &str) -> String {
    format!(
        "airlock-marker-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
