//! `airlock bench vm`'s process lines: a daemon's fork as the `airlock-vmm` process it runs,
//! on the freestanding counter guest's snapshot written by that binary. Cold, the fork is a
//! fresh `airlock-vmm restore` (exec, open `/dev/kvm`, read the snapshot, make the VM,
//! restore); from a pre-created shell (`restore --shell`, started off the clock as a warm
//! pool's member is) it is the owner's `restore` request. Both are timed to the guest's first
//! console byte, in the same run. The daemon's cold fork also starts the VMM's jail, which a
//! shell member has done before the claim, so the daemon gains more than these lines show.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

const WARM_UP: usize = 5;
/// Process starts are slower than in-process forks: fewer runs keep the bench short.
const MOST_RUNS: usize = 50;

/// Prints the process lines for `iterations` runs (at most [`MOST_RUNS`]).
pub fn process_forks(iterations: usize) -> anyhow::Result<()> {
    let binary = airlock_runtime::microvm::find_vmm(&std::env::current_exe()?);
    anyhow::ensure!(
        binary.is_file(),
        "no airlock-vmm at {} (set AIRLOCK_VMM_BIN)",
        binary.display()
    );
    let dir = std::env::temp_dir().join(format!("airlock-bench-vm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let measured = measure(&binary, &dir, iterations.min(MOST_RUNS));
    let _ = std::fs::remove_dir_all(&dir);
    measured
}

fn measure(binary: &Path, dir: &Path, runs: usize) -> anyhow::Result<()> {
    let snapshot = dir.join("template");
    let made = Command::new(binary)
        .args(["template", "--snapshot"])
        .arg(&snapshot)
        .args(["--steps", "5"])
        .output()?;
    anyhow::ensure!(
        made.status.success(),
        "airlock-vmm template: {}",
        String::from_utf8_lossy(&made.stderr).trim()
    );
    let mut cold = Vec::with_capacity(runs);
    let mut shell = Vec::with_capacity(runs);
    let mut restore = Vec::with_capacity(runs);
    for i in 0..WARM_UP + runs {
        let cold_time = cold_fork(binary, &snapshot)?;
        let (shell_time, restore_time) = shell_fork(binary, &snapshot, &dir.join("shell.sock"))?;
        if i >= WARM_UP {
            cold.push(cold_time);
            shell.push(shell_time);
            restore.push(restore_time);
        }
    }
    println!("the daemon's fork as a process (airlock-vmm, unjailed here), {runs} runs of each:");
    let cold_p50 = crate::vm::line(
        "fork: exec airlock-vmm restore -> first console byte",
        &mut cold,
    );
    let shell_p50 = crate::vm::line(
        "fork: request to a pre-created shell -> first byte",
        &mut shell,
    );
    crate::vm::line("  of which the VMM's restore, as it answered", &mut restore);
    println!(
        "ratio of p50: a fork from a pre-created shell {:.2}x of a cold fork process",
        shell_p50 / cold_p50
    );
    Ok(())
}

/// A guest's first console byte on `child`'s standard output.
fn first_byte(child: &mut Child) -> anyhow::Result<()> {
    let mut byte = [0u8; 1];
    child
        .stdout
        .as_mut()
        .context("no stdout")?
        .read_exact(&mut byte)
        .context("the VMM printed nothing")
}

fn end(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn cold_fork(binary: &Path, snapshot: &Path) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args(["restore", "--snapshot"])
        .arg(snapshot)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let printed = first_byte(&mut child);
    let took = started.elapsed();
    end(child);
    printed.map(|()| took)
}

fn shell_fork(
    binary: &Path,
    snapshot: &Path,
    socket: &Path,
) -> anyhow::Result<(Duration, Duration)> {
    let mut child = Command::new(binary)
        .args(["restore", "--shell", "--snapshot"])
        .arg(snapshot)
        .arg("--vsock-socket")
        .arg(socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Off the clock: the shell is made (its socket bound before this line).
    let mut stderr = BufReader::new(child.stderr.take().context("no stderr")?);
    let mut line = String::new();
    stderr.read_line(&mut line)?;
    if !line.starts_with("airlock-vmm: shell ready") {
        end(child);
        anyhow::bail!("the shell did not start: {}", line.trim());
    }
    // Drained so that the VMM's later lines never block on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let started = Instant::now();
    let asked = std::os::unix::net::UnixStream::connect(socket)
        .and_then(|mut control| airlock_vmm::shell_control::request_restore(&mut control));
    let restored = asked.map_err(anyhow::Error::from).and_then(|restore| {
        first_byte(&mut child)?;
        Ok((started.elapsed(), restore))
    });
    end(child);
    restored
}
