//! `live::sweep_abandoned` on this host's real cgroups: it removes a long-lived sandbox's
//! cgroups only when no task is in them or below them and they are old, in every hierarchy.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime};

use airlock_jail::cgroup::{self, Layout};
use airlock_jail::live::{CGROUP_PREFIX, sweep_abandoned};

/// Made with cgroup directories in every hierarchy Airlock uses (and a `workload` child), and
/// removed when dropped whatever the sweep did.
struct FakeSandbox {
    name: String,
    dirs: Vec<PathBuf>,
}

impl FakeSandbox {
    fn make(layout: &Layout, tag: &str) -> std::io::Result<FakeSandbox> {
        let name = format!("{CGROUP_PREFIX}sweeptest{}-{tag}", std::process::id());
        let dirs: Vec<PathBuf> = cgroup::parents(layout)
            .into_iter()
            .map(|parent| parent.join(&name))
            .collect();
        let sandbox = FakeSandbox { name, dirs };
        for dir in &sandbox.dirs {
            std::fs::create_dir_all(dir.join("workload"))?;
        }
        Ok(sandbox)
    }

    fn age(&self, by: Duration) -> std::io::Result<()> {
        let at = SystemTime::now() - by;
        for dir in self
            .dirs
            .iter()
            .flat_map(|d| [d.join("workload"), d.clone()])
        {
            File::open(&dir)?.set_modified(at)?;
        }
        Ok(())
    }

    fn exists(&self) -> bool {
        self.dirs.iter().any(|dir| dir.exists())
    }

    fn holds(&self, child: &Child) -> std::io::Result<()> {
        let dir = self.dirs.first().ok_or(std::io::ErrorKind::NotFound)?;
        std::fs::write(dir.join("workload/cgroup.procs"), child.id().to_string())
    }
}

impl Drop for FakeSandbox {
    fn drop(&mut self) {
        for dir in &self.dirs {
            for dir in [dir.join("workload"), dir.clone()] {
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
}

fn root_with_cgroups() -> Option<Layout> {
    let layout = Layout::detect().ok()?;
    let usable = is_root()
        && cgroup::parents(&layout)
            .iter()
            .all(|p| Path::new(p).is_dir());
    usable.then_some(layout)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    })
}

#[test]
fn test_sweep_removes_only_old_cgroups_without_tasks() {
    let Some(layout) = root_with_cgroups() else {
        eprintln!("skipped: needs root and cgroup hierarchies");
        return;
    };
    let abandoned = FakeSandbox::make(&layout, "abandoned").unwrap();
    abandoned.age(Duration::from_secs(600)).unwrap();
    let fresh = FakeSandbox::make(&layout, "fresh").unwrap();
    let busy = FakeSandbox::make(&layout, "busy").unwrap();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    busy.holds(&sleeper).unwrap();
    busy.age(Duration::from_secs(600)).unwrap();

    let removed = sweep_abandoned(&layout, Duration::from_secs(60));

    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        removed.contains(&abandoned.name),
        "{removed:?} lacks {}",
        abandoned.name
    );
    assert!(!abandoned.exists(), "the abandoned cgroup is still there");
    assert!(fresh.exists(), "a cgroup younger than the age was removed");
    assert!(busy.exists(), "a cgroup with a task below it was removed");
    assert!(!removed.contains(&fresh.name) && !removed.contains(&busy.name));
}
