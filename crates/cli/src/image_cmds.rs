//! `airlock image pull|import|ls|inspect|rm|prune|disk|overlay-disk`: the local image store
//! (`airlock-image`) and the microvm tier's disks made from its images.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_image::{
    ImageStore, ImportOptions, Phase, Progress, ProgressFn, PullOptions, Reference, StoreOptions,
};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The image store's directory [default: /var/lib/airlock/images as root, else
    /// $XDG_CACHE_HOME/airlock/images].
    #[arg(long, value_name = "DIR", global = true)]
    store: Option<PathBuf>,
}

impl StoreArgs {
    pub fn open(&self) -> anyhow::Result<ImageStore> {
        let root = self.store.clone().unwrap_or_else(ImageStore::default_root);
        Ok(ImageStore::open(&root, StoreOptions::default())?)
    }
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Pull REGISTRY/REPO[:TAG|@DIGEST] into the store and print its digest.
    Pull {
        /// Allow plain HTTP to a registry that is not on loopback.
        #[arg(long)]
        insecure: bool,
        /// Print the pull's report as JSON (each layer: downloaded bytes, unpacked or not).
        #[arg(long)]
        json: bool,
        reference: String,
    },
    /// Import a docker-save archive, an OCI layout (directory or tar) or a rootfs tarball.
    Import {
        /// Name the image (needed to name a rootfs tarball).
        #[arg(long, value_name = "NAME[:TAG]")]
        tag: Option<String>,
        /// Print the import's report as JSON.
        #[arg(long)]
        json: bool,
        path: PathBuf,
    },
    /// List the images in the store.
    Ls,
    /// Show an image's names, config and layers as JSON.
    Inspect { reference: String },
    /// Remove a name (`name:tag`, `name@digest`), or every name of an image (`sha256:...`).
    Rm { reference: String },
    /// Remove every image, blob and layer that nothing refers to.
    Prune,
    /// Print the path of the image's ext4 root disk for the microvm tier (built from its
    /// layers on first use, cached per image digest; AIRLOCK_MICROVM_ROOT_DISK takes it).
    Disk { reference: String },
    /// Make an empty, sparse overlay disk (ext4 holding `upper/` and `work/`) at PATH, as the
    /// microvm tier gives each sandbox over its image's root disk.
    OverlayDisk {
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        path: PathBuf,
    },
}

pub fn image(store: &StoreArgs, command: ImageCommand) -> anyhow::Result<ExitCode> {
    // This one needs no store: none is opened (or created) for it.
    if let ImageCommand::OverlayDisk { size_mib, path } = &command {
        return overlay_disk(*size_mib, path);
    }
    let store = store.open()?;
    match command {
        ImageCommand::Pull {
            insecure,
            json,
            reference,
        } => pull(&store, &reference, insecure, json),
        ImageCommand::Import { tag, json, path } => {
            let progress = ProgressView::new();
            let report = store.import(&path, &ImportOptions { tag }, Some(progress.callback()));
            progress.finish();
            let report = report?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for image in &report.images {
                    println!("{} {}", image.digest, image.names.join(" "));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Ls => {
            println!(
                "{:<60} {:<12} {:>6} {:>10}",
                "NAME", "DIGEST", "LAYERS", "SIZE"
            );
            for image in store.list()? {
                let digest = image
                    .digest
                    .trim_start_matches("sha256:")
                    .get(..12)
                    .unwrap_or("")
                    .to_owned();
                let names = if image.names.is_empty() {
                    vec!["<none>".to_owned()]
                } else {
                    image.names
                };
                for name in names {
                    println!(
                        "{name:<60} {digest:<12} {:>6} {:>10}",
                        image.layers,
                        airlock_image::human_size(image.size_bytes)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Inspect { reference } => {
            println!(
                "{}",
                serde_json::to_string_pretty(&store.inspect(&reference)?)?
            );
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Rm { reference } => {
            for name in store.remove(&reference)? {
                println!("removed {name}");
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Disk { reference } => {
            println!("{}", store.root_disk(&reference)?.path.display());
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::OverlayDisk { size_mib, path } => overlay_disk(size_mib, &path),
        ImageCommand::Prune => {
            let report = store.prune()?;
            println!(
                "removed {} images, {} layers, {} blobs ({})",
                report.manifests.len(),
                report.layers,
                report.blobs,
                airlock_image::human_size(report.freed_bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn overlay_disk(size_mib: u64, path: &std::path::Path) -> anyhow::Result<ExitCode> {
    let size_bytes = size_mib
        .checked_mul(1 << 20)
        .ok_or_else(|| anyhow::anyhow!("--size-mib {size_mib} is too large"))?;
    airlock_image::disk::overlay_disk(path, size_bytes)?;
    Ok(ExitCode::SUCCESS)
}

fn pull(
    store: &ImageStore,
    reference: &str,
    insecure: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let parsed = Reference::parse(reference)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let progress = ProgressView::new();
    let options = PullOptions {
        insecure,
        credentials: None,
    };
    let report = runtime.block_on(store.pull(&parsed, &options, Some(progress.callback())));
    progress.finish();
    let report = report?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.name);
        println!("Digest: {}", report.digest);
    }
    Ok(ExitCode::SUCCESS)
}

/// Progress on stderr: one redrawn bar on a terminal, a line per finished layer otherwise.
struct ProgressView {
    terminal: bool,
    state: Arc<Mutex<ViewState>>,
}

#[derive(Default)]
struct ViewState {
    layers: BTreeMap<String, (u64, u64, bool)>,
    drawn: Option<Instant>,
}

impl ProgressView {
    fn new() -> ProgressView {
        ProgressView {
            terminal: std::io::stderr().is_terminal(),
            state: Arc::default(),
        }
    }

    fn callback(&self) -> ProgressFn {
        let (state, terminal) = (self.state.clone(), self.terminal);
        Arc::new(move |event: &Progress| {
            let mut state = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let done = matches!(event.phase, Phase::Done | Phase::Present);
            let short = event.blob.short().to_owned();
            let first_done = done && !state.layers.get(&short).is_some_and(|l| l.2);
            state
                .layers
                .insert(short.clone(), (event.done_bytes, event.total_bytes, done));
            if terminal {
                let due = state
                    .drawn
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
                if due || done {
                    state.drawn = Some(Instant::now());
                    draw(&state);
                }
            } else if first_done {
                let status = if event.phase == Phase::Present {
                    "already present"
                } else {
                    "done"
                };
                eprintln!(
                    "{short}: {status} ({})",
                    airlock_image::human_size(event.total_bytes)
                );
            }
        })
    }

    fn finish(&self) {
        if self.terminal
            && !self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .layers
                .is_empty()
        {
            eprintln!();
        }
    }
}

fn draw(state: &ViewState) {
    let (done, total) = state
        .layers
        .values()
        .fold((0, 0), |(d, t), l| (d + l.0, t + l.1));
    let finished = state.layers.values().filter(|l| l.2).count();
    let width = 30usize;
    let filled = done
        .saturating_mul(width as u64)
        .checked_div(total)
        .map_or(width, |f| usize::try_from(f).unwrap_or(width).min(width));
    let mut stderr = std::io::stderr().lock();
    let _ = write!(
        stderr,
        "\r[{}{}] {} / {}  {finished}/{} layers ",
        "=".repeat(filled),
        " ".repeat(width - filled),
        airlock_image::human_size(done),
        airlock_image::human_size(total),
        state.layers.len()
    );
    let _ = stderr.flush();
}
