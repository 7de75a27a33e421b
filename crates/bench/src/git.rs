//! `airlock bench git`: create-with-repository through a private daemon, cold (no mirror in
//! the cache) and from the cache, beside `git clone` of the same repository on the host from
//! the same server, and a local `git clone --no-hardlinks` of the bare repository (the floor
//! of copying its objects), interleaved in one run. The repository (`--size-mib` of random,
//! incompressible file contents in three commits) is made for the run and served by
//! `git http-backend` on loopback (`airlock_server::testing::GitServer`, plain HTTP, behind a
//! token that the sandbox's egress proxy injects). Figures are printed, never asserted.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_api::v1::{CreateSandboxRequest, GitWorkspace, Workspace};
use airlock_server::testing::GitServer;
use anyhow::{Context, bail};

use crate::api::BenchDaemon;
use crate::percentile;

const TOKEN: &str = "bench-token-5b0e93c1";
const HOST: &str = "git.bench";

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@test",
            "-c",
            "init.defaultBranch=main",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running git")?;
    if !output.status.success() {
        bail!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A bare repository of about `mib` MiB under `root/bench/repo.git`; returns its pack size.
fn make_repository(dir: &Path, root: &Path, mib: u64) -> anyhow::Result<u64> {
    let work = dir.join("work");
    std::fs::create_dir_all(work.join("data"))?;
    git(&work, &["init", "-q"])?;
    let mut random = std::fs::File::open("/dev/urandom")?;
    let mut chunk = vec![0u8; 1 << 20];
    for commit in 0..3u64 {
        for file in (0..mib).filter(|f| f % 3 == commit) {
            random.read_exact(&mut chunk)?;
            std::fs::write(work.join(format!("data/blob-{file:04}.bin")), &chunk)?;
        }
        std::fs::write(
            work.join("README"),
            format!("bench repository, commit {commit}\n"),
        )?;
        git(&work, &["add", "."])?;
        git(&work, &["commit", "-q", "-m", &format!("commit {commit}")])?;
    }
    std::fs::create_dir_all(root.join("bench"))?;
    let bare = root.join("bench/repo.git");
    git(
        dir,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap_or_default(),
            bare.to_str().unwrap_or_default(),
        ],
    )?;
    std::fs::remove_dir_all(&work)?;
    // A local clone copies loose objects; a served repository is packed.
    git(&bare, &["repack", "-a", "-d", "-q"])?;
    let mut bytes = 0;
    for entry in std::fs::read_dir(bare.join("objects/pack"))?.flatten() {
        bytes += entry.metadata()?.len();
    }
    Ok(bytes)
}

fn clear_cache(cache: &Path) -> anyhow::Result<()> {
    if let Ok(entries) = std::fs::read_dir(cache) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
    }
    Ok(())
}

fn timed_clone(args: &[&str], target: &Path) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let status = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(args)
        .arg(target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    let elapsed = start.elapsed();
    anyhow::ensure!(status.success(), "git {args:?} failed");
    std::fs::remove_dir_all(target)?;
    Ok(elapsed)
}

fn row(name: &str, times: &mut [Duration]) -> f64 {
    times.sort();
    let p50 = percentile(times, 50);
    let (min, max) = (
        times.first().map_or(0.0, |t| t.as_secs_f64() * 1000.0),
        times.last().map_or(0.0, |t| t.as_secs_f64() * 1000.0),
    );
    println!("{name:<52} {p50:>9.1} {min:>9.1} {max:>9.1}");
    p50
}

pub fn git_bench(size_mib: u64, rounds: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(rounds >= 1, "--rounds must be at least 1");
    anyhow::ensure!(size_mib >= 3, "--size-mib must be at least 3");
    let dir = PathBuf::from(format!("/var/tmp/airlock-bench-git-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir, size_mib, rounds);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &Path, size_mib: u64, rounds: usize) -> anyhow::Result<ExitCode> {
    let root = dir.join("root");
    let pack_bytes = make_repository(dir, &root, size_mib)?;
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let server = GitServer::start(&root, Some(TOKEN.to_owned()), None).await?;
        let extra = [
            "--test-egress-resolve".to_owned(),
            format!("{HOST}={}", server.address),
            "--forge-git-host".to_owned(),
            HOST.to_owned(),
            "--forge-token-file".to_owned(),
            token_file.display().to_string(),
        ];
        let mut daemon = BenchDaemon::start_with(None, 16, &extra)?;
        daemon.wait_ready().await?;
        let cache = daemon
            .state_dir()
            .context("the private daemon has a state directory")?
            .join("git-cache");
        let client = daemon.client.clone();
        let request = CreateSandboxRequest {
            workspace: Workspace::Git {
                git: GitWorkspace {
                    url: format!("http://{HOST}/bench/repo.git"),
                    reference: None,
                    branch: Some("bench".into()),
                },
            },
            ..CreateSandboxRequest::default()
        };
        let header = {
            use base64::Engine as _;
            let pair = format!("x-access-token:{TOKEN}");
            format!("http.extraHeader=Authorization: Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        };
        let url = format!("http://{}/bench/repo.git", server.address);
        let bare = root.join("bench/repo.git");
        let bare = bare.to_str().unwrap_or_default().to_owned();
        let target = dir.join("clone");
        let (mut cold, mut warm, mut host, mut local) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // One warm-up of each, then `rounds` interleaved rounds.
        for round in 0..=rounds {
            clear_cache(&cache)?;
            for times in [&mut cold, &mut warm] {
                let start = Instant::now();
                let created = client.create(&request).await?;
                let elapsed = start.elapsed();
                client.delete(&created.sandbox.id).await?;
                if round > 0 {
                    times.push(elapsed);
                }
            }
            let elapsed = timed_clone(&["-c", &header, "clone", "-q", &url], &target)?;
            let copy = timed_clone(&["clone", "-q", "--no-hardlinks", &bare], &target)?;
            if round > 0 {
                host.push(elapsed);
                local.push(copy);
            }
        }
        println!(
            "repository: {:.1} MB of packs ({size_mib} MiB of random files, 3 commits); {rounds} interleaved round(s) after a warm-up",
            pack_bytes as f64 / 1e6
        );
        println!("{:<52} {:>9} {:>9} {:>9}", "contender", "p50 ms", "min ms", "max ms");
        let cold_ms = row("airlock create with repository, cold (no mirror)", &mut cold);
        let warm_ms = row("airlock create with repository, from the cache", &mut warm);
        let host_ms = row("git clone on the host (same server, no proxy)", &mut host);
        let local_ms = row("git clone --no-hardlinks of the bare repo (local copy)", &mut local);
        println!(
            "ratios (p50): cold / git clone {:.2}x, cached / git clone {:.2}x, cached / cold {:.2}x, local copy / git clone {:.2}x",
            cold_ms / host_ms,
            warm_ms / host_ms,
            warm_ms / cold_ms,
            local_ms / host_ms
        );
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
