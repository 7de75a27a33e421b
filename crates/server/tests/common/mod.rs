//! Test equipment: a real `airlockd` process on a free loopback port with its own state
//! directory, an API key, and checks for what a sandbox leaves on the host.
//!
//! Needs root (cgroups, namespaces) and the sibling binaries built first:
//! `scripts/sandbox-binaries.sh` (they are found next to `airlockd`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]
#![allow(
    dead_code,
    reason = "each test binary uses a different part of this module"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use airlock_server::client::Client;

pub fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlockd"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The agent binary: `$AIRLOCK_AGENT_BIN` if the test runs with one, else the built one.
pub fn agent_bin() -> PathBuf {
    std::env::var_os("AIRLOCK_AGENT_BIN")
        .map_or_else(|| bin_dir().join("airlock-agent"), PathBuf::from)
}

/// Fails early, with the fix, when the sandbox binaries are missing.
pub fn require_binaries() {
    for path in [bin_dir().join("airlock-jail"), agent_bin()] {
        assert!(
            path.is_file(),
            "{} is missing: run `scripts/sandbox-binaries.sh` first",
            path.display()
        );
    }
}

/// A fresh state directory under /var/tmp (not /tmp, which sandboxes see as their own).
pub fn scratch_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(format!(
        "/var/tmp/airlockd-test-{tag}-{}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running daemon. Dropping it deletes its sandboxes, stops it and removes its state.
#[derive(Debug)]
pub struct TestDaemon {
    pub child: Option<Child>,
    pub addr: String,
    pub state_dir: PathBuf,
    pub key: String,
    pub extra: Vec<String>,
    /// Keep the state directory on drop (a test restarts a daemon on it).
    pub keep_state: bool,
}

impl TestDaemon {
    pub fn start(tag: &str, extra: &[&str]) -> TestDaemon {
        let state_dir = scratch_dir(tag);
        let key = create_key(&state_dir, "test");
        TestDaemon::start_in(&state_dir, &key, extra)
    }

    /// Starts a daemon on an existing state directory.
    pub fn start_in(state_dir: &Path, key: &str, extra: &[&str]) -> TestDaemon {
        let (child, addr) = spawn_daemon(state_dir, extra).unwrap_or_else(|e| panic!("{e}"));
        TestDaemon {
            child: Some(child),
            addr,
            state_dir: state_dir.to_owned(),
            key: key.to_owned(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            keep_state: false,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url(), Some(self.key.clone())).unwrap()
    }

    /// A client without an API key.
    pub fn anonymous(&self) -> Client {
        Client::new(&self.url(), None).unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// SIGTERM, then wait for the exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        child.wait().unwrap().success()
    }

    /// SIGTERM, and SIGKILL if the daemon has not exited within `grace`; then reap.
    pub fn stop_or_kill(&mut self, grace: std::time::Duration) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let give_up = std::time::Instant::now() + grace;
        while std::time::Instant::now() < give_up {
            if matches!(child.try_wait(), Ok(Some(_))) {
                self.child = None;
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.kill9();
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            // Sandboxes outlive the daemon: delete them through it before stopping it. A thread
            // of its own, since drop may run inside a test's async runtime.
            let client = self.client();
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    if let Ok(list) = client.list(&[], &Default::default()).await {
                        for sandbox in list {
                            let _ = client.delete(&sandbox.id).await;
                        }
                    }
                });
            })
            .join();
            // A graceful stop, so that warm-pool members (never listed) and fills in flight are
            // destroyed by the daemon; -9 only if it does not exit in time.
            self.stop_or_kill(std::time::Duration::from_secs(30));
        }
        if !self.keep_state {
            release_storage(&self.state_dir);
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }
}

/// Unmounts a state directory's disk scratch storage (a daemon killed with -9 leaves it
/// mounted, by design, for the next daemon). Its loop device detaches itself.
pub fn release_storage(state_dir: &Path) {
    let mount = state_dir.join("storage");
    if std::fs::metadata(&mount).is_ok() {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&mount)
            .stderr(Stdio::null())
            .status();
    }
}

/// For a test that stops its daemon on purpose (sandboxes outlive it by design): if the test
/// panics, a fresh daemon reconciles the state directory and deletes every sandbox, and the
/// directory is removed, so that a failure leaves nothing behind either.
#[derive(Debug)]
pub struct CleanupOnPanic {
    pub state_dir: PathBuf,
}

impl Drop for CleanupOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() && self.state_dir.exists() {
            // Deleting needs a key: make one for the cleanup (without panicking again).
            let key = Command::new(env!("CARGO_BIN_EXE_airlockd"))
                .args(["keys", "--state-dir"])
                .arg(&self.state_dir)
                .args(["create", "cleanup"])
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                .unwrap_or_default();
            if let Ok((child, addr)) = spawn_daemon(&self.state_dir, &[]) {
                drop(TestDaemon {
                    child: Some(child),
                    addr,
                    state_dir: self.state_dir.clone(),
                    key,
                    extra: Vec::new(),
                    keep_state: false,
                });
            }
            release_storage(&self.state_dir);
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }
}

/// The disk scratch image of a test daemon: small, since several run at once and each
/// reserves its image's space on the host's disk.
pub const TEST_STORAGE_SIZE: &str = "2GiB";

/// Starts airlockd and waits for its "listening on" line.
pub fn spawn_daemon(state_dir: &Path, extra: &[&str]) -> Result<(Child, String), String> {
    let dir = bin_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlockd"))
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--state-dir")
        .arg(state_dir)
        .args(
            (!extra.contains(&"--storage-size"))
                .then_some(["--storage-size", TEST_STORAGE_SIZE])
                .into_iter()
                .flatten(),
        )
        .args(extra)
        .env("AIRLOCK_JAIL_BIN", dir.join("airlock-jail"))
        .env("AIRLOCK_AGENT_BIN", agent_bin())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start airlockd: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let Some(addr) = line.trim().strip_prefix("airlockd listening on http://") else {
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        return Err(format!(
            "airlockd did not start: {line:?}; stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    };
    Ok((child, addr.to_owned()))
}

/// Creates an API key with `airlockd keys create` (the store needs no daemon).
pub fn create_key(state_dir: &Path, name: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_airlockd"))
        .args(["keys", "--state-dir"])
        .arg(state_dir)
        .args(["create", name])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// The cgroup directories named after a sandbox (`airlock-sbx-<owner>-<id>`), anywhere in the
/// first levels of every hierarchy.
pub fn sandbox_cgroups(id: &str) -> Vec<PathBuf> {
    let suffix = format!("-{id}");
    cgroups_named(|name| name.starts_with("airlock-sbx-") && name.ends_with(&suffix))
}

/// The long-lived sandbox cgroups of the daemon on `state_dir` (`airlock-sbx-<owner>-<id>`,
/// the owner tag being the first 12 hex digits of the SHA-256 of its canonical path).
pub fn owner_cgroups(state_dir: &Path) -> Vec<PathBuf> {
    use sha2::Digest;
    let canonical = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.to_string_lossy().as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let prefix = format!("airlock-sbx-{}-", &hex[..12]);
    cgroups_named(|name| name.starts_with(&prefix))
}

fn cgroups_named(wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if wanted(&name) {
                found.push(entry.path());
            } else if depth < 4 {
                dirs.push((entry.path(), depth + 1));
            }
        }
    }
    found
}

/// `(pid, start ticks)` of a live, non-zombie process.
pub fn process_alive(pid: i32, start_ticks: Option<u64>) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(after) = stat.rsplit_once(") ").map(|(_, rest)| rest) else {
        return false;
    };
    let fields: Vec<&str> = after.split(' ').collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return false;
    }
    match start_ticks {
        Some(ticks) => fields.get(19).and_then(|t| t.parse::<u64>().ok()) == Some(ticks),
        None => true,
    }
}

/// The live record (helper pid, start ticks) stored for each sandbox, read from the store.
pub fn stored_helpers(state_dir: &Path) -> Vec<(String, Option<(i32, u64)>)> {
    let store = airlock_server::store::Store::open(&state_dir.join("airlock.db")).unwrap();
    store
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .map(|row| {
            let helper = row.live.and_then(|json| {
                let record: airlock_runtime::LiveSandbox = serde_json::from_str(&json).ok()?;
                Some((record.helper_pid, record.helper_start_ticks))
            });
            (row.id, helper)
        })
        .collect()
}

/// Children of `parent` as `(pid, start ticks)`.
pub fn children_of(parent: u32) -> Vec<(i32, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, after)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = after.split(' ').collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent)
            && let Some(ticks) = fields.get(19).and_then(|t| t.parse::<u64>().ok())
        {
            out.push((pid, ticks));
        }
    }
    out
}

/// Asserts that nothing of sandbox `id` is left: no cgroup, no directory, no helper.
pub fn assert_sandbox_gone(state_dir: &Path, id: &str, helper: Option<(i32, u64)>) {
    assert_eq!(
        sandbox_cgroups(id),
        Vec::<PathBuf>::new(),
        "cgroup of {id} left"
    );
    let dir = state_dir.join("sandboxes").join(id);
    assert!(!dir.exists(), "directory {} left", dir.display());
    if let Some((pid, ticks)) = helper {
        assert!(
            !process_alive(pid, Some(ticks)),
            "helper {pid} of {id} still runs"
        );
    }
}

/// Polls `check` until it holds, for at most `limit` (generous: the machine is noisy).
pub async fn eventually<F, Fut>(limit: std::time::Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    check().await
}
