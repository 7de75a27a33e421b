//! The microvm tier's column, where the tier runs (hardware KVM and a configured guest; on
//! these machines only the nested rig's level-1 Linux, `scripts/microvm-nested.sh`): one
//! sandbox, a Linux guest of the jailed VMM, and the cases whose catalog entry has a
//! `microvm` block. `via: vmm` cases (`tier.microvm-vmm-*`) read the VMM's own confinement
//! from this host's `/proc` (its namespaces, its view, its seccomp filters, its cgroup's limits); the others
//! run the probe, uploaded through the agent, inside the guest: the guest-kernel cases
//! (`kern.*`) among them, where the guest's root meets the project's guest kernel with no
//! seccomp filter. Every other case is n/a with the reason: it runs `airlock run` in the
//! process tier's jail on the host, which this tier does not take (it runs long-lived guests
//! only).

use std::path::{Path, PathBuf};

use airlock_api::{SandboxConfig, Tier};
use airlock_runtime::{LiveSandbox, LiveSpec, Runtime, VolumeSource};
use anyhow::Context;

use super::catalog::{Case, Outcome, Pattern, Via};
use super::guest;
use super::report::CaseResult;
use super::runner::Verdict;

/// Where the probe is put in the guest.
const PROBE_IN_GUEST: &str = "/tmp/airlock-probe";
/// The sandbox's memory (at least a snapshot's guest memory: a fork keeps its snapshot's).
const MEMORY_BYTES: u64 = 512 << 20;
/// `via: vmm` cases are named by this and their check.
const VMM_CASE_PREFIX: &str = "tier.microvm-vmm-";
/// What the VMM's view may hold under `/run/airlock/vm` (`microvm::guest`, `microvm::disks`,
/// and the two files `microvm::persist` has it write a snapshot into).
const VMM_FILES: &[&str] = &[
    "kernel",
    "initrd",
    "snapshot",
    "root.ext4",
    "overlay.img",
    "save-memory",
    "save-state",
];

const NOT_ON_TIER: &str = "runs `airlock run` in the process tier's jail on the host; the microvm tier runs long-lived guests only";

/// The column: every case of `cases` (the catalog's, before `on_tier`), in order.
pub fn column(cases: &[&Case], probe: &Path) -> anyhow::Result<Vec<CaseResult>> {
    let runtime = Runtime::new()?;
    let dir = std::env::temp_dir().join(format!("airlock-seceval-microvm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let mut config = SandboxConfig::new(Vec::new());
    config.tier = Tier::Microvm;
    config.resources.memory_bytes = Some(MEMORY_BYTES);
    let spec = LiveSpec {
        id: format!("secevalvm{}", std::process::id()),
        dir: dir.clone(),
        config,
        volume: VolumeSource::Empty,
        vm_shell: false,
    };
    let record = runtime
        .create_live(&spec)
        .and_then(airlock_runtime::Pending::commit)
        .map_err(|e| anyhow::anyhow!(airlock_runtime::error_chain(&e)))
        .context("starting the microvm sandbox")?;
    let results = evaluate_all(&record, cases, probe);
    runtime.destroy(&record);
    let _ = std::fs::remove_dir_all(&dir);
    results
}

fn evaluate_all(
    record: &LiveSandbox,
    cases: &[&Case],
    probe: &Path,
) -> anyhow::Result<Vec<CaseResult>> {
    let in_guest = cases
        .iter()
        .any(|c| c.microvm.is_some() && c.via != Via::Vmm);
    if in_guest {
        let binary =
            std::fs::read(probe).with_context(|| format!("reading {}", probe.display()))?;
        guest::upload(&record.socket, PROBE_IN_GUEST, &binary)?;
        let chmod = ["-c".to_owned(), format!("chmod 0755 {PROBE_IN_GUEST}")];
        guest::run(&record.socket, "/bin/sh", &chmod)?;
    }
    let mut results = Vec::new();
    for original in cases {
        let case = original.on_tier(Tier::Microvm);
        let verdict = if original.microvm.is_none() {
            Verdict::NotApplicable {
                reason: NOT_ON_TIER.to_owned(),
            }
        } else if let Some(reason) = &case.na {
            Verdict::NotApplicable {
                reason: reason.clone(),
            }
        } else {
            let outcome = if case.via == Via::Vmm {
                vmm_check(record, case.id.trim_start_matches(VMM_CASE_PREFIX))
            } else {
                guest::run(&record.socket, PROBE_IN_GUEST, &case.probe)
                    .map(|run| Outcome::from_probe(&run.stdout, run.exit_code, run.signal))
            };
            match outcome {
                Ok(outcome) => verdict(&case, &outcome)?,
                Err(err) => Verdict::WrongLayer {
                    detail: format!("could not run: {}", crate::one_line(&err)),
                },
            }
        };
        results.push(CaseResult::new(&case, verdict, None, Vec::new()));
    }
    Ok(results)
}

/// The verdict of one outcome against the case's expectation (no proof runs: nothing of the
/// VMM's confinement can be taken away from outside it).
fn verdict(case: &Case, outcome: &Outcome) -> anyhow::Result<Verdict> {
    let expected = Pattern::parse(&case.expect.outcome).map_err(anyhow::Error::msg)?;
    let through = if expected.is_refusal() {
        outcome.is_ok()
    } else {
        outcome.is_ok() && !expected.matches(outcome)
    };
    Ok(if through {
        match &case.known_gap {
            Some(reason) => Verdict::KnownGap {
                outcome: outcome.to_string(),
                reason: reason.clone(),
            },
            None => Verdict::Allowed {
                outcome: outcome.to_string(),
            },
        }
    } else if expected.matches(outcome) {
        Verdict::Blocked {
            by: case.expect.layers.join("+"),
        }
    } else {
        Verdict::WrongLayer {
            detail: format!("{outcome} instead of {}", case.expect.outcome),
        }
    })
}

fn argv0(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .next()
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .unwrap_or_default()
}

/// The sandbox's VMM, among its cgroup's processes.
fn vmm_pid(record: &LiveSandbox) -> anyhow::Result<u32> {
    record
        .pids()
        .into_iter()
        .find(|pid| argv0(*pid) == "airlock-vmm")
        .context("no airlock-vmm in the sandbox's cgroup")
}

fn names(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// One host-side check of the VMM's confinement, as the probe would answer it: `ok <word>`
/// when it holds (the catalog expects the word), `ok <what was found>` when it does not.
fn vmm_check(record: &LiveSandbox, check: &str) -> anyhow::Result<Outcome> {
    let pid = vmm_pid(record)?;
    let detail = match check {
        "namespaces" => {
            let mut shared = Vec::new();
            for ns in ["mnt", "pid", "net", "user", "ipc", "uts"] {
                let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"))?;
                let its = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))?;
                if ours == its {
                    shared.push(ns);
                }
            }
            if shared.is_empty() {
                "own".to_owned()
            } else {
                format!("shares {}", shared.join(","))
            }
        }
        "view" => {
            let root = PathBuf::from(format!("/proc/{pid}/root"));
            let top = names(&root)?;
            let files = names(&root.join("run/airlock/vm"))?;
            let kvm = root.join("dev/kvm").exists();
            let extra: Vec<&String> = top
                .iter()
                .filter(|n| {
                    !["dev", "proc", "run", "sys", "tmp", "workspace"].contains(&n.as_str())
                })
                .chain(files.iter().filter(|n| !VMM_FILES.contains(&n.as_str())))
                .collect();
            if extra.is_empty() && !kvm {
                "only-airlock".to_owned()
            } else {
                format!("also {extra:?} (/dev/kvm: {kvm})")
            }
        }
        "seccomp" => {
            let mut unfiltered = Vec::new();
            for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
                let status = std::fs::read_to_string(task?.path().join("status"))?;
                let field = |name: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .unwrap_or_default()
                        .trim()
                        .to_owned()
                };
                let filters: u32 = field("Seccomp_filters:").parse().unwrap_or(0);
                // The jail's deny-list, then the VMM's own allow-list.
                if field("Seccomp:") != "2" || filters < 2 {
                    unfiltered.push(format!("{} ({filters} filters)", field("Name:")));
                }
            }
            if unfiltered.is_empty() {
                "filtered".to_owned()
            } else {
                format!("unfiltered {}", unfiltered.join(", "))
            }
        }
        "cgroup" => {
            let read = |names: &[&str]| {
                record.cgroup_dirs.iter().find_map(|dir| {
                    names
                        .iter()
                        .find_map(|name| std::fs::read_to_string(dir.join(name)).ok())
                })
            };
            let memory = read(&["memory.max", "memory.limit_in_bytes"]).unwrap_or_default();
            let pids = read(&["pids.max"]).unwrap_or_default();
            let want = MEMORY_BYTES + airlock_runtime::AGENT_RESERVE_BYTES;
            if memory.trim() == want.to_string() && !pids.trim().is_empty() && pids.trim() != "max"
            {
                "bounded".to_owned()
            } else {
                format!("memory {} pids {}", memory.trim(), pids.trim())
            }
        }
        other => anyhow::bail!("no host-side check `{other}`"),
    };
    Ok(Outcome::Ok(detail))
}
