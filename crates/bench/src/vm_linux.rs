//! `airlock bench vm`'s Linux guest lines, on hardware KVM only (a stock Linux guest does not
//! boot on PVM): the operator's guest (`AIRLOCK_MICROVM_KERNEL`, `AIRLOCK_MICROVM_INITRD`,
//! `AIRLOCK_MICROVM_ROOT_DISK`, as the daemon takes it) as microvm-tier sandboxes of the
//! runtime, each with its VMM in the process tier's jail. Per run: create -> agent ready
//! (a boot), the sandbox paused to disk, then restore -> agent ready twice from that paused
//! VM: cold (the jail, the VMM's exec and its restore) and in a pre-created VM shell started
//! off the clock, as a warm pool of a microvm snapshot holds them. "Ready" is the agent
//! answering and taking the sandbox's environment, as the daemon waits for it.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_api::{SandboxConfig, Tier};
use airlock_runtime::microvm::guest::{ENV_SNAPSHOT, GuestSource};
use airlock_runtime::microvm::persist;
use airlock_runtime::{LiveSandbox, LiveSpec, Runtime, VolumeSource, error_chain};
use airlock_vmm::host::KvmKind;
use anyhow::Context;

/// Prints the Linux guest lines for `runs` runs, or why there are none on this host.
pub fn linux_guest(kind: &KvmKind, runs: usize) -> anyhow::Result<()> {
    if runs == 0 {
        return Ok(());
    }
    if !matches!(kind, KvmKind::Hardware { .. }) {
        println!(
            "Linux guest: not measured on this host, whose KVM is {}: these lines need hardware KVM",
            kind.describe()
        );
        return Ok(());
    }
    if let Err(why) = GuestSource::boot_from_vars(|name| std::env::var_os(name)) {
        println!("Linux guest: not measured: {why}");
        return Ok(());
    }
    if std::env::var_os(ENV_SNAPSHOT).is_some_and(|v| !v.is_empty()) {
        println!(
            "Linux guest: not measured: {ENV_SNAPSHOT} is set, so a create would fork it, not boot"
        );
        return Ok(());
    }
    let base = std::env::temp_dir().join(format!("airlock-bench-vm-linux-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&base)
        .with_context(|| format!("creating {}", base.display()))?;
    let measured = measure(&Runtime::new()?, &base, runs);
    let _ = std::fs::remove_dir_all(&base);
    measured
}

/// The three times of one run and the VMM's own restore time in the shell.
struct Run {
    boot: Duration,
    restore: Duration,
    shell: Duration,
    shell_vmm: Duration,
}

fn measure(runtime: &Runtime, base: &Path, runs: usize) -> anyhow::Result<()> {
    let mut samples = Vec::with_capacity(runs);
    for n in 0..runs {
        let mut live = Vec::new();
        let run = one_run(runtime, base, n, &mut live);
        // Whatever the run reached, its sandboxes end here.
        for record in &live {
            runtime.destroy(record);
        }
        samples.push(run?);
    }
    let mut boot: Vec<_> = samples.iter().map(|run| run.boot).collect();
    let mut restore: Vec<_> = samples.iter().map(|run| run.restore).collect();
    let mut shell: Vec<_> = samples.iter().map(|run| run.shell).collect();
    let mut shell_vmm: Vec<_> = samples.iter().map(|run| run.shell_vmm).collect();
    println!(
        "Linux guest (the operator's kernel and root disk, default resources, jailed VMM), {runs} runs of each:"
    );
    let boot_p50 = crate::vm::line("create -> agent ready (a boot)", &mut boot);
    let restore_p50 = crate::vm::line("restore a paused VM -> agent ready (cold)", &mut restore);
    let shell_p50 = crate::vm::line(
        "restore in a pre-created VM shell -> agent ready",
        &mut shell,
    );
    crate::vm::line(
        "  of which the VMM's restore, as it answered",
        &mut shell_vmm,
    );
    println!(
        "ratios of p50: cold restore {:.2}x of a boot, in a shell {:.2}x of a boot",
        restore_p50 / boot_p50,
        shell_p50 / boot_p50
    );
    Ok(())
}

/// One boot, its pause to disk, and the two restores of the paused VM; every sandbox started
/// is pushed to `live` as soon as it runs.
fn one_run(
    runtime: &Runtime,
    base: &Path,
    n: usize,
    live: &mut Vec<LiveSandbox>,
) -> anyhow::Result<Run> {
    let booted_dir = sandbox_dir(base, &format!("boot{n}"))?;
    let shell_dir = base.join(format!("shell{n}"));
    let started = Instant::now();
    let record = start(runtime, &spec(&format!("benchboot{n}"), &booted_dir, false))?;
    let boot = started.elapsed();
    live.push(record.clone());
    runtime
        .pause_vm(&record)
        .map_err(|e| anyhow::anyhow!("pausing the booted guest: {}", error_chain(&e)))?;
    runtime.stop(&record);
    // Stopped: its directory (the paused VM) is the restore's now.
    live.pop();
    persist::copy_vm(&booted_dir, &shell_dir)
        .map_err(|e| anyhow::anyhow!("copying the paused VM: {}", error_chain(&e)))?;

    let started = Instant::now();
    let restored = start(runtime, &spec(&format!("benchboot{n}"), &booted_dir, false))?;
    let restore = started.elapsed();
    live.push(restored);

    // The shell is started off the clock, as a pool's fill is; its restore is the claim.
    let mut pending = runtime
        .create_live(&spec(&format!("benchshell{n}"), &shell_dir, true))
        .map_err(|e| anyhow::anyhow!("starting a VM shell: {}", error_chain(&e)))?;
    let started = Instant::now();
    let shell_vmm = pending
        .restore_in_shell()
        .map_err(|e| anyhow::anyhow!("restoring in the VM shell: {}", error_chain(&e)))?;
    let shell = started.elapsed();
    live.push(
        pending
            .commit()
            .map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?,
    );
    Ok(Run {
        boot,
        restore,
        shell,
        shell_vmm,
    })
}

fn sandbox_dir(base: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let dir = base.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn spec(id: &str, dir: &Path, vm_shell: bool) -> LiveSpec {
    let mut config = SandboxConfig::new(Vec::new());
    config.tier = Tier::Microvm;
    LiveSpec {
        id: id.to_owned(),
        dir: dir.to_owned(),
        config,
        volume: VolumeSource::Empty,
        vm_shell,
    }
}

/// Starts a sandbox and returns once its agent serves (the guest took its environment).
fn start(runtime: &Runtime, spec: &LiveSpec) -> anyhow::Result<LiveSandbox> {
    let pending = runtime.create_live(spec).map_err(|e| {
        anyhow::anyhow!(
            "starting {}: {}; the end of its log:\n{}",
            spec.id,
            error_chain(&e),
            log_tail(&spec.dir)
        )
    })?;
    pending
        .commit()
        .map_err(|e| anyhow::anyhow!("committing {}: {}", spec.id, error_chain(&e)))
}

/// The last lines of a sandbox's agent log (its VMM's console and errors), which goes with
/// the bench's directory.
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
