//! `airlock bench egress`: the egress proxy's cost on loopback, against direct access in the
//! same run (see `airlock_egress::bench`): added latency of small GETs and the throughput of a
//! bulk download through a pass-through CONNECT tunnel.

use std::process::ExitCode;

use airlock_egress::bench::{BenchOptions, bench_blocking};

/// Added p50 latency the proxy may cost.
const TARGET_ADDED_P50_US: i64 = 1000;
/// CONNECT pass-through throughput the proxy must reach.
const TARGET_BYTES_PER_S: f64 = 1e9;

pub fn egress(requests: usize, download_mib: u64) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(requests >= 10, "--requests must be at least 10");
    anyhow::ensure!(download_mib >= 1, "--download-mib must be at least 1");
    let options = BenchOptions {
        requests,
        download_bytes: download_mib * 1024 * 1024,
        ..BenchOptions::default()
    };
    let report = bench_blocking(&options)?;
    println!(
        "{requests} small GETs each, interleaved, after 100 warm-up requests; keep-alive, loopback"
    );
    println!("{:<34} {:>9} {:>9}", "contender", "p50 ms", "p95 ms");
    for (name, latency) in [
        ("direct", report.direct),
        ("through the proxy", report.proxied),
    ] {
        println!(
            "{name:<34} {:>9.3} {:>9.3}",
            latency.p50_us as f64 / 1e3,
            latency.p95_us as f64 / 1e3
        );
    }
    let verdict = if report.added_p50_us <= TARGET_ADDED_P50_US {
        "meets"
    } else {
        "misses"
    };
    println!(
        "added by the proxy: p50 {:.3} ms, p95 {:.3} ms ({verdict} the +1 ms p50 target)",
        report.added_p50_us as f64 / 1e3,
        report.added_p95_us as f64 / 1e3
    );
    let gb = |rate: f64| rate / 1e9;
    println!(
        "{download_mib} MiB download, best of {}: direct {:.2} GB/s, CONNECT pass-through {:.2} GB/s (ratio {:.2})",
        options.download_rounds,
        gb(report.direct_download_bytes_per_s),
        gb(report.proxied_download_bytes_per_s),
        report.download_ratio
    );
    let verdict = if report.proxied_download_bytes_per_s >= TARGET_BYTES_PER_S {
        "meets"
    } else {
        "misses"
    };
    println!("CONNECT pass-through throughput {verdict} the 1 GB/s target");
    Ok(ExitCode::SUCCESS)
}
