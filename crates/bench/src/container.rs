//! `airlock bench start --tier container`: the full create → `/bin/true` → teardown cycle of a
//! container-tier sandbox, interleaved in one run with the process tier's, with `crun run` of
//! an OCI bundle over the same rootfs and with `podman run --rm` of the same image.
//!
//! The image is a busybox-static rootfs made here (one layer), unless `--image` names one.
//! crun 1.8 and podman 4.3 need two workarounds on this kind of host (the research notes'
//! §3c): rlimits no higher than the hard limits (`--ulimit`), and no cgroup2 controllers in a
//! hybrid layout, so the whole benchmark runs in a private mount namespace (`unshare -m`)
//! where the cgroup2 mount is unmounted; every contender, Airlock's included, runs there.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_api::{ImageRootfs, SandboxConfig};
use airlock_runtime::Runtime;
use anyhow::{Context, bail};

use crate::{percentile, spawn_wait};

/// Set once the benchmark runs in its private mount namespace.
const PRIVATE_NS: &str = "AIRLOCK_BENCH_PRIVATE_NS";
const PODMAN_IMAGE: &str = "localhost/airlock-bench:latest";

/// A scratch directory removed on drop (and the podman storage in it, cleared first).
struct BenchDir {
    path: PathBuf,
    podman: bool,
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        if self.podman {
            let _ = podman(&self.path)
                .args(["rmi", "-f", PODMAN_IMAGE])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn which(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// podman with its storage, run state and events in `dir`, so the host's are never touched.
fn podman(dir: &Path) -> Command {
    let mut command = Command::new("podman");
    command
        .arg("--root")
        .arg(dir.join("podman/root"))
        .arg("--runroot")
        .arg(dir.join("podman/run"))
        .args([
            "--storage-driver",
            "overlay",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
        ]);
    command
}

/// A one-layer busybox image in `dir/rootfs`: the static binary and a link per applet.
fn busybox_rootfs(dir: &Path) -> anyhow::Result<ImageRootfs> {
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .context("busybox is missing (apt-get install busybox-static), or pass --image")?;
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "etc", "tmp", "proc", "dev", "sys"] {
        std::fs::create_dir_all(rootfs.join(sub))?;
    }
    std::fs::copy(busybox, rootfs.join("bin/busybox"))?;
    let list = Command::new(busybox).arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
        }
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    Ok(ImageRootfs {
        digest: "sha256:bench-busybox".into(),
        layers: vec![rootfs],
        config: airlock_api::ImageConfig {
            env: vec!["PATH=/bin".into()],
            ..airlock_api::ImageConfig::default()
        },
    })
}

/// An OCI bundle whose root is `rootfs`, read-only, as the research notes measured crun:
/// `/bin/true`, no terminal, no cgroup resources and no /sys/fs/cgroup mount.
fn crun_bundle(dir: &Path, rootfs: &Path) -> anyhow::Result<PathBuf> {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle)?;
    let status = Command::new("crun")
        .arg("spec")
        .current_dir(&bundle)
        .status()
        .context("crun spec")?;
    anyhow::ensure!(status.success(), "crun spec failed");
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    spec["process"]["args"] = serde_json::json!(["/bin/true"]);
    spec["process"]["terminal"] = serde_json::json!(false);
    spec["root"] = serde_json::json!({"path": rootfs, "readonly": true});
    if let Some(linux) = spec["linux"].as_object_mut() {
        linux.remove("resources");
    }
    if let Some(mounts) = spec["mounts"].as_array_mut() {
        mounts.retain(|m| m["destination"] != "/sys/fs/cgroup");
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(bundle)
}

pub fn start(
    iterations: usize,
    image: Option<String>,
    resolve_image: crate::ImageResolver<'_>,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(iterations >= 10, "--iterations must be at least 10");
    let peers = which("crun") || which("podman");
    if peers && std::env::var_os(PRIVATE_NS).is_none() {
        // Again, in a private mount namespace where the hybrid cgroup2 mount can go (§3c).
        let exe = std::env::current_exe()?;
        let status = Command::new("unshare")
            .args(["-m", "--propagation", "private"])
            .arg(exe)
            .args(std::env::args_os().skip(1))
            .env(PRIVATE_NS, "1")
            .status()
            .context("unshare -m (util-linux)")?;
        return Ok(ExitCode::from(
            u8::try_from(status.code().unwrap_or(1)).unwrap_or(1),
        ));
    }
    if peers {
        // Only this namespace's view; the host keeps its mount.
        let _ = Command::new("umount")
            .arg("/sys/fs/cgroup/unified")
            .stderr(Stdio::null())
            .status();
    }
    let path = std::env::temp_dir().join(format!("airlock-bench-container-{}", std::process::id()));
    std::fs::create_dir_all(&path)?;
    let mut dir = BenchDir {
        path: path.clone(),
        podman: false,
    };
    let image = match image {
        Some(reference) => resolve_image(&reference)?,
        None => busybox_rootfs(&path)?,
    };
    let one_layer = image.layers.len() == 1;
    let runtime = Runtime::new()?;
    let process = SandboxConfig::new(vec!["/bin/true".into()]);
    let container = SandboxConfig::for_image(image.clone(), &["/bin/true".into()]);
    let run = |config: &SandboxConfig| -> anyhow::Result<()> {
        let outcome = runtime.run(config, None, |_| {})?;
        anyhow::ensure!(
            outcome.exit_code() == 0,
            "airlock sandbox failed: {:?}",
            outcome.ending
        );
        Ok(())
    };
    type Contender<'a> = (
        String,
        Box<dyn FnMut() -> anyhow::Result<()> + 'a>,
        Vec<Duration>,
    );
    let mut contenders: Vec<Contender<'_>> = vec![
        (
            "airlock container tier".into(),
            Box::new(|| run(&container)),
            Vec::new(),
        ),
        (
            "airlock process tier".into(),
            Box::new(|| run(&process)),
            Vec::new(),
        ),
    ];
    let mut skipped = Vec::new();
    if which("crun") && one_layer {
        let bundle = crun_bundle(&path, &image.layers[0])?;
        let state = path.join("crun-state");
        let mut n = 0u64;
        contenders.push((
            "crun run (bundle, same rootfs)".into(),
            Box::new(move || {
                n += 1;
                let status = Command::new("crun")
                    .arg("--root")
                    .arg(&state)
                    .args(["--cgroup-manager=disabled", "run", "--bundle"])
                    .arg(&bundle)
                    .arg(format!("airlock-bench-{}-{n}", std::process::id()))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .status()?;
                anyhow::ensure!(status.success(), "crun run failed: {status}");
                Ok(())
            }),
            Vec::new(),
        ));
    } else {
        skipped.push(if one_layer {
            "crun is not installed (apt-get install crun)"
        } else {
            "crun needs a one-layer image's rootfs"
        });
    }
    if which("podman") && one_layer {
        dir.podman = true;
        import_into_podman(&path, &image.layers[0])?;
        let storage = path.clone();
        contenders.push((
            "podman run --rm (same image)".into(),
            Box::new(move || {
                let status = podman(&storage)
                    .args([
                        "run",
                        "--rm",
                        "--network",
                        "none",
                        "--cgroups=disabled",
                        "--ulimit",
                        "nofile=4096:4096",
                        "--ulimit",
                        "nproc=4096:4096",
                        PODMAN_IMAGE,
                        "/bin/true",
                    ])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()?;
                anyhow::ensure!(status.success(), "podman run failed: {status}");
                Ok(())
            }),
            Vec::new(),
        ));
    } else {
        skipped.push(if one_layer {
            "podman is not installed (apt-get install podman)"
        } else {
            "podman needs a one-layer image's rootfs"
        });
    }
    contenders.push((
        "fork+exec+wait /bin/true".into(),
        Box::new(|| spawn_wait("/bin/true", &[])),
        Vec::new(),
    ));
    for round in 0..iterations + 5 {
        // Interleaved, so that machine noise hits every contender alike.
        for (_, step, times) in &mut contenders {
            let started = Instant::now();
            step()?;
            if round >= 5 {
                times.push(started.elapsed());
            }
        }
    }
    println!(
        "{iterations} iterations each, interleaved, after 5 warm-up runs; image {} ({} layer(s))",
        image.digest,
        image.layers.len()
    );
    println!(
        "{:<32} {:>9} {:>9} {:>9}",
        "contender", "p50 ms", "p95 ms", "p99 ms"
    );
    let mut p50s = Vec::new();
    for (name, _, times) in &mut contenders {
        times.sort();
        let (p50, p95, p99) = (
            percentile(times, 50),
            percentile(times, 95),
            percentile(times, 99),
        );
        println!("{name:<32} {p50:>9.3} {p95:>9.3} {p99:>9.3}");
        p50s.push((name.clone(), p50));
    }
    for reason in skipped {
        println!("not measured: {reason}");
    }
    let p50 = |wanted: &str| {
        p50s.iter()
            .find(|(n, _)| n.starts_with(wanted))
            .map(|(_, v)| *v)
    };
    let Some(ours) = p50("airlock container") else {
        bail!("no container-tier figure");
    };
    if let Some(process) = p50("airlock process") {
        let ratio = ours / process;
        let verdict = if ratio <= 1.3 { "meets" } else { "misses" };
        println!("ratio container / process tier (p50): {ratio:.2}x ({verdict} the 1.3x target)");
    }
    if let Some(crun) = p50("crun") {
        println!("ratio container / crun run (p50): {:.2}x", ours / crun);
    }
    if let Some(podman) = p50("podman") {
        let ratio = ours / podman;
        let verdict = if ratio <= 0.1 { "meets" } else { "misses" };
        println!("ratio container / podman run (p50): {ratio:.3}x ({verdict} the 0.1x target)");
    }
    drop(dir);
    Ok(ExitCode::SUCCESS)
}

/// `podman import` of the rootfs (a tar made by `tar`), once, before anything is timed.
fn import_into_podman(dir: &Path, rootfs: &Path) -> anyhow::Result<()> {
    let tar = dir.join("rootfs.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .context("tar")?;
    anyhow::ensure!(status.success(), "tar of the rootfs failed");
    let output = podman(dir)
        .arg("import")
        .arg(&tar)
        .arg(PODMAN_IMAGE)
        .output()
        .context("podman import")?;
    anyhow::ensure!(
        output.status.success(),
        "podman import failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}
