//! `airlock bench desktop`: the desktop template through the native computer API: create →
//! first screenshot (cold, and from a warm pool of one), screenshot p50/p95 and click round
//! trip p50, beside the same tools run directly on the host against a host Xvfb of the same
//! size (the floor: scrot, and xdotool's move + click). Figures are printed, never asserted.

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_api::v1::{ComputerAction, ComputerResult, CreateSandboxRequest, MouseButton};
use airlock_server::client::Client;
use airlock_server::lifecycle::DESKTOP_TEMPLATE;
use anyhow::Context;

use crate::api::BenchDaemon;
use crate::percentile;

const SCREEN: (u32, u32) = (1024, 768);

async fn screenshot(client: &Client, id: &str) -> anyhow::Result<()> {
    match client.computer(id, &ComputerAction::Screenshot {}).await? {
        ComputerResult::Screenshot {
            width_px,
            height_px,
            ..
        } => {
            anyhow::ensure!(
                (width_px, height_px) == SCREEN,
                "a {width_px}x{height_px} screenshot"
            );
            Ok(())
        }
        other => anyhow::bail!("a screenshot answered {other:?}"),
    }
}

async fn click(client: &Client, id: &str, round: usize) -> anyhow::Result<()> {
    let action = ComputerAction::Click {
        x_px: 100 + u32::try_from(round % 500).unwrap_or(0),
        y_px: 300,
        button: MouseButton::Left,
    };
    client.computer(id, &action).await?;
    Ok(())
}

async fn wait_pool(client: &Client) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(300);
    while client.pool(DESKTOP_TEMPLATE).await?.ready < 1 {
        anyhow::ensure!(Instant::now() < give_up, "the warm pool never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn row(name: &str, times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    let (p50, p95) = (percentile(times, 50), percentile(times, 95));
    println!("{name:<44} {p50:>10.3} {p95:>10.3}");
    (p50, p95)
}

/// A host X server (and window manager) of the same size, killed on drop.
struct HostDisplay {
    display: String,
    children: Vec<Child>,
}

impl HostDisplay {
    fn start() -> anyhow::Result<HostDisplay> {
        let display = format!(":{}", 200 + std::process::id() % 500);
        let screen = format!("{}x{}x24", SCREEN.0, SCREEN.1);
        let xvfb = Command::new("Xvfb")
            .args([&display, "-ac", "-screen", "0", &screen, "-nolisten", "tcp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the host's Xvfb (apt-get install xvfb)")?;
        let mut host = HostDisplay {
            display,
            children: vec![xvfb],
        };
        let ready = Instant::now() + Duration::from_secs(20);
        while !host.run(&["xdpyinfo"])? {
            anyhow::ensure!(Instant::now() < ready, "the host's Xvfb never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        let wm = Command::new("xfwm4")
            .arg("--compositor=off")
            .env("DISPLAY", &host.display)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting xfwm4 on the host's Xvfb")?;
        host.children.push(wm);
        std::thread::sleep(Duration::from_millis(500));
        Ok(host)
    }

    fn run(&self, argv: &[&str]) -> anyhow::Result<bool> {
        Ok(Command::new(argv[0])
            .args(&argv[1..])
            .env("DISPLAY", &self.display)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .with_context(|| format!("running {}", argv[0]))?
            .success())
    }
}

impl Drop for HostDisplay {
    fn drop(&mut self) {
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn desktop(url: Option<String>, creates: usize, iterations: usize) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        creates >= 1 && iterations >= 10,
        "need --creates >= 1 and --iterations >= 10"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut daemon = BenchDaemon::start(url, 16)?;
        daemon.wait_ready().await?;
        let client = daemon.client.clone();
        let request = CreateSandboxRequest {
            template: Some(DESKTOP_TEMPLATE.to_owned()),
            ..CreateSandboxRequest::default()
        };
        let (mut cold, mut pooled, mut pooled_claims) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..creates {
            let start = Instant::now();
            let id = client.create(&request).await?.sandbox.id;
            let shot = screenshot(&client, &id).await;
            let whole = start.elapsed();
            client.delete(&id).await?;
            shot?;
            cold.push(whole);
        }
        client.set_pool(DESKTOP_TEMPLATE, 1).await?;
        let filled = async {
            for _ in 0..creates {
                wait_pool(&client).await?;
                let claims = client.pool(DESKTOP_TEMPLATE).await?.claims_total;
                let start = Instant::now();
                let id = client.create(&request).await?.sandbox.id;
                pooled_claims.push(start.elapsed());
                let shot = screenshot(&client, &id).await;
                let whole = start.elapsed();
                client.delete(&id).await?;
                shot?;
                anyhow::ensure!(
                    client.pool(DESKTOP_TEMPLATE).await?.claims_total == claims + 1,
                    "a create meant for the warm pool did not claim from it"
                );
                pooled.push(whole);
            }
            Ok::<_, anyhow::Error>(())
        }
        .await;
        client.set_pool(DESKTOP_TEMPLATE, 0).await?;
        filled?;
        let id = client.create(&request).await?.sandbox.id;
        let (mut shots, mut clicks) = (Vec::new(), Vec::new());
        let measured = async {
            for round in 0..iterations + 5 {
                let start = Instant::now();
                screenshot(&client, &id).await?;
                if round >= 5 {
                    shots.push(start.elapsed());
                }
            }
            for round in 0..iterations + 5 {
                let start = Instant::now();
                click(&client, &id, round).await?;
                if round >= 5 {
                    clicks.push(start.elapsed());
                }
            }
            Ok::<_, anyhow::Error>(())
        }
        .await;
        client.delete(&id).await?;
        measured?;
        // The floor: the same tools on the host, with no sandbox, API or agent between.
        let host = HostDisplay::start()?;
        let (mut host_shots, mut host_clicks) = (Vec::new(), Vec::new());
        let file = std::env::temp_dir().join(format!("airlock-bench-{}.png", std::process::id()));
        let file_arg = file.display().to_string();
        for round in 0..iterations + 5 {
            let start = Instant::now();
            anyhow::ensure!(
                host.run(&["scrot", "--pointer", "--overwrite", &file_arg])?,
                "scrot failed on the host"
            );
            let _ = std::fs::read(&file)?;
            if round >= 5 {
                host_shots.push(start.elapsed());
            }
            let x = (100 + round % 500).to_string();
            let start = Instant::now();
            anyhow::ensure!(
                host.run(&["xdotool", "mousemove", "--sync", &x, "300", "click", "1"])?,
                "xdotool failed on the host"
            );
            if round >= 5 {
                host_clicks.push(start.elapsed());
            }
        }
        let _ = std::fs::remove_file(&file);
        drop(host);
        println!(
            "desktop template on the process tier ({}x{}): {creates} creates each way, {iterations} screenshots and clicks after 5 warm-up ones",
            SCREEN.0, SCREEN.1
        );
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "load average at the end: {}; a pool member's display and XFCE session start before its claim",
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
        println!("{:<44} {:>10} {:>10}", "step", "p50 ms", "p95 ms");
        let (cold_p50, _) = row("create + first screenshot, no pool", &mut cold);
        let (warm_p50, _) = row("create + first screenshot, from a pool", &mut pooled);
        row("  of which the create (a claim)", &mut pooled_claims);
        let (shot_p50, shot_p95) = row("screenshot (POST /computer)", &mut shots);
        let (click_p50, _) = row("click round trip (POST /computer)", &mut clicks);
        let (host_shot, _) = row("host floor: scrot + read", &mut host_shots);
        let (host_click, _) = row("host floor: xdotool move + click", &mut host_clicks);
        let verdict = |value: f64, target: f64| if value <= target { "meets" } else { "misses" };
        println!(
            "screenshot p50 {shot_p50:.1} ms (p95 {shot_p95:.1}), {:.2}x the host's scrot; {} the 150 ms target",
            shot_p50 / host_shot,
            verdict(shot_p50, 150.0)
        );
        println!(
            "click round trip p50 {click_p50:.1} ms, {:.2}x the host's xdotool",
            click_p50 / host_click
        );
        println!(
            "create + first screenshot p50 {warm_p50:.1} ms from a pool ({} the 300 ms target), {cold_p50:.1} ms without ({:.2}x)",
            verdict(warm_p50, 300.0),
            cold_p50 / warm_p50
        );
        Ok(ExitCode::SUCCESS)
    })
}
