//! `airlock bench image`: pull and unpack of an image from a local registry, against
//! `skopeo copy` of the same image to an OCI directory (download and verify only) and GNU tar
//! extracting the uncompressed layers (the unpack floor of this filesystem), interleaved in one
//! run. Figures only; nothing is asserted.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use airlock_image::{ImageStore, PullOptions, Reference, StoreOptions};

use airlock_image::human_size as human;

#[derive(Debug, clap::Args)]
pub struct ImageBenchArgs {
    /// Interleaved rounds (each contender once per round).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The OCI layout to serve [default: target/test-images/layouts/python, made by
    /// scripts/test-images.sh].
    #[arg(long, value_name = "DIR")]
    layout: Option<PathBuf>,
    /// The layout's tag.
    #[arg(long, default_value = "gzip")]
    tag: String,
    /// Where the contenders write (a directory on the filesystem to measure) [default: /var/tmp].
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
}

/// Debian's docker-registry on a free loopback port, stopped on drop.
struct LocalRegistry {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_registry(scratch: &Path) -> anyhow::Result<LocalRegistry> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = scratch.join("registry");
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        ),
    )?;
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("docker-registry (Debian's package) cannot start: {e}"))?;
    let registry = LocalRegistry { child, port, dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "docker-registry did not listen on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(registry)
}

fn skopeo(policy: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("skopeo")
        .arg("--policy")
        .arg(policy)
        .args(args)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| anyhow::anyhow!("skopeo cannot start: {e}"))?;
    anyhow::ensure!(status.success(), "skopeo {} failed", args.join(" "));
    Ok(())
}

/// Flushes dirty pages so that no contender pays for another's writeback. Outputs are removed
/// only after the last round: ext4 skips inodes freed in the last minutes when it allocates
/// new ones, which would charge the unpackers for the previous round's deletions.
fn settle() {
    let _ = Command::new("sync").status();
}

/// The compressed and uncompressed sizes of the layout's image, and its layer blobs.
fn sizes(layout: &Path, tag: &str) -> anyhow::Result<(u64, Vec<PathBuf>)> {
    let read = |path: PathBuf| -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_slice(&std::fs::read(path)?)?)
    };
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let index = read(layout.join("index.json"))?;
    let entry = index["manifests"]
        .as_array()
        .and_then(|m| {
            m.iter()
                .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        })
        .ok_or_else(|| anyhow::anyhow!("{} has no tag {tag}", layout.display()))?;
    let manifest = read(blob(entry["digest"].as_str().unwrap_or("")))?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    let compressed = layers.iter().filter_map(|l| l["size"].as_u64()).sum();
    let blobs = layers
        .iter()
        .map(|l| blob(l["digest"].as_str().unwrap_or("")))
        .collect();
    Ok((compressed, blobs))
}

fn median(times: &mut [Duration]) -> f64 {
    times.sort();
    times
        .get(times.len() / 2)
        .map_or(0.0, Duration::as_secs_f64)
}

pub fn image(args: ImageBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let layout = args
        .layout
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/test-images/layouts/python"));
    anyhow::ensure!(
        layout.join("index.json").exists(),
        "no OCI layout at {} (scripts/test-images.sh builds it)",
        layout.display()
    );
    let (compressed, blobs) = sizes(&layout, &args.tag)?;
    let scratch = args
        .scratch
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp"))
        .join(format!("airlock-bench-image-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = run(&args, &layout, compressed, &blobs, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn run(
    args: &ImageBenchArgs,
    layout: &Path,
    compressed: u64,
    blobs: &[PathBuf],
    scratch: &Path,
) -> anyhow::Result<ExitCode> {
    let registry = start_registry(scratch)?;
    let policy = scratch.join("policy.json");
    std::fs::write(
        &policy,
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )?;
    let reference = format!("127.0.0.1:{}/airlock/bench:{}", registry.port, args.tag);
    let source = format!("oci:{}:{}", layout.display(), args.tag);
    let destination = format!("docker://{reference}");
    skopeo(
        &policy,
        &[
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
            &source,
            &destination,
        ],
    )?;
    // The unpack floor extracts the uncompressed layers, made once, outside the timing.
    let mut plain_layers = Vec::new();
    let mut unpacked = 0u64;
    for (i, blob) in blobs.iter().enumerate() {
        let plain = scratch.join(format!("layer-{i}.tar"));
        let mut input = std::io::BufReader::new(std::fs::File::open(blob)?);
        let mut stream = airlock_image::layer::Decompressed::new(
            &mut input,
            airlock_image::oci::LayerCompression::None,
        )?;
        unpacked += std::io::copy(&mut stream, &mut std::fs::File::create(&plain)?)?;
        plain_layers.push(plain);
    }
    println!(
        "image {reference}: {} layer(s), {} compressed, {} unpacked; {} interleaved round(s)",
        blobs.len(),
        human(compressed),
        human(unpacked),
        args.rounds
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let parsed = Reference::parse(&reference)?;
    let (mut skopeo_times, mut airlock_times, mut tar_times) = (Vec::new(), Vec::new(), Vec::new());
    let mut inflate_times = Vec::new();
    for round in 0..args.rounds {
        let out = scratch.join(format!("skopeo-oci-{round}"));
        settle();
        let started = Instant::now();
        let destination = format!("oci:{}:bench", out.display());
        skopeo(
            &policy,
            &[
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                &format!("docker://{reference}"),
                &destination,
            ],
        )?;
        skopeo_times.push(started.elapsed());

        let store_dir = scratch.join(format!("airlock-store-{round}"));
        settle();
        let started = Instant::now();
        let store = ImageStore::open(&store_dir, StoreOptions::default())?;
        runtime.block_on(store.pull(&parsed, &PullOptions::default(), None))?;
        airlock_times.push(started.elapsed());
        drop(store);

        let tree = scratch.join(format!("tar-tree-{round}"));
        settle();
        std::fs::create_dir_all(&tree)?;
        let started = Instant::now();
        for plain in &plain_layers {
            let status = Command::new("tar")
                .arg("-xf")
                .arg(plain)
                .arg("-C")
                .arg(&tree)
                .status()?;
            anyhow::ensure!(status.success(), "tar -xf {} failed", plain.display());
        }
        tar_times.push(started.elapsed());

        // Decompressing alone, in-process, to nowhere: one gzip stream inflates on one core.
        let started = Instant::now();
        for blob in blobs {
            let mut input = std::io::BufReader::new(std::fs::File::open(blob)?);
            let mut stream = airlock_image::layer::Decompressed::new(
                &mut input,
                airlock_image::oci::LayerCompression::None,
            )?;
            std::io::copy(&mut stream, &mut std::io::sink())?;
        }
        inflate_times.push(started.elapsed());
    }
    let megabytes = compressed as f64 / 1e6;
    let inflate = median(&mut inflate_times);
    let (skopeo, airlock, tar) = (
        median(&mut skopeo_times),
        median(&mut airlock_times),
        median(&mut tar_times),
    );
    println!(
        "{:<52} {:>9} {:>12}",
        "contender (median)", "seconds", "MB/s"
    );
    println!(
        "{:<52} {skopeo:>9.3} {:>12.1}",
        "skopeo copy docker:// -> oci: (download, verify)",
        megabytes / skopeo
    );
    println!(
        "{:<52} {airlock:>9.3} {:>12.1}",
        "airlock image pull (download, verify, unpack)",
        megabytes / airlock
    );
    println!(
        "{:<52} {tar:>9.3} {:>12}",
        "tar -xf of the uncompressed layers (unpack floor)", "-"
    );
    println!(
        "{:<52} {inflate:>9.3} {:>12.1}",
        "decompressing the layers alone (no I/O)",
        megabytes / inflate
    );
    println!(
        "throughput airlock / skopeo: {:.2}x (target >= 1.0x); airlock / (skopeo + unpack floor): {:.2}x",
        skopeo / airlock,
        (skopeo + tar) / airlock
    );
    Ok(ExitCode::SUCCESS)
}
