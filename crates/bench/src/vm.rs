//! `airlock bench vm`: the VMM's fork-ready time from a snapshot (Zeroboot's measure: from
//! creating the VM to the vCPU state restored, no guest instruction run) with and without
//! pre-created VM shells, beside a cold boot set-up of the same guest measured in the same
//! run, and host memory per idle fork as the change in system memory (MemTotal -
//! MemAvailable), not RSS; and the daemon's fork as the VMM process it runs, cold and from a
//! pre-created shell ([`crate::vm_process`]). A freestanding guest, so this runs on PVM and
//! hardware KVM alike.
//! Figures are printed, never asserted.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use airlock_vmm::fork::{ShellPool, Template};
use airlock_vmm::guest_code::{self, CODE_ADDRESS};
use airlock_vmm::vm::{Vm, VmConfig, VmExit, VmShell, Vmm};
use anyhow::Context;

use crate::api::used_bytes;
use crate::percentile;

const WARM_UP: usize = 20;

/// `airlock bench vm`'s settings.
pub struct VmArgs {
    /// Timed forks per contender.
    pub iterations: usize,
    /// Live idle forks for the memory figure.
    pub forks: usize,
    /// The freestanding guest's RAM.
    pub memory_mib: u64,
    /// Runs of the Linux guest lines ([`crate::vm_linux`]).
    pub linux_runs: usize,
    /// Those lines alone.
    pub only_linux: bool,
}

/// Runs the benchmark: the freestanding guest's lines (unless `only_linux`), then the Linux
/// guest's where this host can boot one.
pub fn vm(args: &VmArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.iterations >= 1, "--iterations must be at least 1");
    anyhow::ensure!(args.forks >= 1, "--forks must be at least 1");
    let kind = airlock_vmm::host::detect();
    anyhow::ensure!(kind.runs_guests(), "no usable KVM: {}", kind.describe());
    println!("kvm: {}", kind.describe());
    if !args.only_linux {
        freestanding(args.iterations, args.forks, args.memory_mib)?;
    }
    crate::vm_linux::linux_guest(&kind, args.linux_runs)?;
    Ok(ExitCode::SUCCESS)
}

/// The freestanding guest's lines: `iterations` timed forks per contender, `forks` live idle
/// forks for the memory figure, guest RAM of `memory_mib`.
fn freestanding(iterations: usize, forks: usize, memory_mib: u64) -> anyhow::Result<()> {
    let vmm = Vmm::new().context("opening /dev/kvm")?;
    let config = VmConfig {
        memory_bytes: memory_mib << 20,
        entry: CODE_ADDRESS,
        image: vec![(CODE_ADDRESS, guest_code::counter_loop())],
        entropy_device: true,
    };
    let template = template(&vmm, &config)?;
    println!(
        "guest: {memory_mib} MiB RAM, counter loop + virtio-rng, 1 vCPU; {iterations} runs per line after {WARM_UP} warm-up"
    );
    println!("{:<52} {:>9} {:>9}", "ms", "p50", "p95");

    let mut cold = time(iterations, || {
        let shell = VmShell::create(&vmm, 1, config.memory_bytes)?;
        Ok(Vm::boot(&vmm, shell, &config)?)
    })?;
    let cold_p50 = line("cold: create VM + fresh RAM + boot vCPU state", &mut cold);

    let mut plain = time(iterations, || Ok(template.fork(&vmm, None)?))?;
    let plain_p50 = line("fork-ready: create VM + restore (no shells)", &mut plain);

    let mut pool = ShellPool::for_template(&template);
    let mut pooled = Vec::with_capacity(iterations);
    let mut teardown = Vec::with_capacity(iterations);
    for i in 0..WARM_UP + iterations {
        pool.fill(&vmm, 1)?;
        let started = Instant::now();
        let fork = template.fork(&vmm, pool.take())?;
        let elapsed = started.elapsed();
        let started = Instant::now();
        drop(fork);
        if i >= WARM_UP {
            pooled.push(elapsed);
            teardown.push(started.elapsed());
        }
    }
    let pooled_p50 = line("fork-ready: restore into a pre-created shell", &mut pooled);
    line("teardown of a fork (close fds, unmap)", &mut teardown);
    let mut first_output = Vec::with_capacity(iterations);
    for i in 0..WARM_UP + iterations {
        pool.fill(&vmm, 1)?;
        let started = Instant::now();
        let mut fork = template.fork(&vmm, pool.take())?;
        anyhow::ensure!(fork.run(Some(1))? == VmExit::Paused, "a fork ended early");
        let elapsed = started.elapsed();
        anyhow::ensure!(
            !fork.console().contents().is_empty(),
            "a fork printed nothing"
        );
        if i >= WARM_UP {
            first_output.push(elapsed);
        }
    }
    line(
        "fork into a shell + run to its first console byte",
        &mut first_output,
    );
    println!(
        "ratios of p50: fork without shells {:.2}x of cold, with shells {:.2}x of cold; target <= 0.5 ms with shells: {}",
        plain_p50 / cold_p50,
        pooled_p50 / cold_p50,
        if pooled_p50 <= 0.5 { "met" } else { "missed" }
    );
    crate::vm_process::process_forks(iterations)?;
    memory(&vmm, &template, forks)
}

/// Boots the guest, lets it count a few times, and keeps it as the template.
fn template(vmm: &Vmm, config: &VmConfig) -> anyhow::Result<Template> {
    let mut vm = Vm::boot(vmm, VmShell::create(vmm, 1, config.memory_bytes)?, config)?;
    vm.set_identity(1)?;
    let exit = vm.run(Some(16))?;
    anyhow::ensure!(exit == VmExit::Paused, "the template guest ended: {exit:?}");
    Ok(Template::from_vm(vm)?)
}

fn time(
    iterations: usize,
    mut make: impl FnMut() -> anyhow::Result<Vm>,
) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(iterations);
    for i in 0..WARM_UP + iterations {
        let started = Instant::now();
        let vm = make()?;
        let elapsed = started.elapsed();
        drop(vm);
        if i >= WARM_UP {
            times.push(elapsed);
        }
    }
    Ok(times)
}

pub(crate) fn line(name: &str, times: &mut [Duration]) -> f64 {
    times.sort();
    let (p50, p95) = (percentile(times, 50), percentile(times, 95));
    println!("{name:<52} {p50:>9.3} {p95:>9.3}");
    p50
}

fn rss_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .context("VmRSS missing from /proc/self/status")
}

/// `forks` live forks, each run until it has counted three more times (so it has written
/// its own copy of one page), then held paused; three rounds, the median printed.
fn memory(vmm: &Vmm, template: &Template, forks: usize) -> anyhow::Result<()> {
    let mib = f64::from(1u32 << 20);
    let mut system = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(300));
        let (before, rss_before) = (used_bytes()?, rss_bytes()?);
        let mut live = Vec::with_capacity(forks);
        for _ in 0..forks {
            let mut fork = template.fork(vmm, None)?;
            anyhow::ensure!(fork.run(Some(3))? == VmExit::Paused, "a fork ended early");
            live.push(fork);
        }
        std::thread::sleep(Duration::from_millis(300));
        let (after, rss_after) = (used_bytes()?, rss_bytes()?);
        system.push(after.saturating_sub(before) as f64 / forks as f64 / mib);
        rss.push(rss_after.saturating_sub(rss_before) as f64 / forks as f64 / mib);
        drop(live);
    }
    system.sort_by(f64::total_cmp);
    rss.sort_by(f64::total_cmp);
    let (per, per_rss) = (system[1], rss[1]);
    println!(
        "host memory per idle fork ({forks} live, median of 3 rounds): {per:.3} MiB of system memory (MemTotal - MemAvailable; rounds {:.3} / {:.3} / {:.3}), {per_rss:.3} MiB of VMM RSS; target <= 1 MiB: {}",
        system[0],
        system[1],
        system[2],
        if per <= 1.0 { "met" } else { "missed" }
    );
    println!(
        "(system memory counts KVM's kernel-side state per VM and vCPU, which RSS does not; other work on the host adds noise)"
    );
    Ok(())
}
