//! What `airlock run --image REF` runs:
//! - a reference to an image in the local store (`airlock image pull|import`, e.g.
//!   `127.0.0.1:5000/airlock/minbase:bookworm` or `sha256:...`);
//! - an OCI layout directory, imported into the store first;
//! - a plain rootfs directory: one layer, an empty config (give the command after `--`);
//! - an image description, a `.json` file holding an [`ImageRootfs`] (layer directories,
//!   lowest first, already in overlay form, and the config), as tests write them.

use std::path::Path;

use airlock_api::{ImageConfig, ImageRootfs};
use airlock_image::{ImageStore, ImportOptions, StoreOptions};
use anyhow::{Context, bail};

/// The most bytes of an image description that are read.
const MAX_DESCRIPTION_BYTES: u64 = 1 << 20;

pub fn resolve(reference: &str) -> anyhow::Result<ImageRootfs> {
    let path = std::path::absolute(Path::new(reference))
        .with_context(|| format!("--image {reference}"))?;
    let Ok(meta) = std::fs::metadata(&path) else {
        let store = ImageStore::open(&ImageStore::default_root(), StoreOptions::default())
            .context("opening the image store")?;
        return store.resolve(reference).with_context(|| {
            format!("--image {reference}: no such file, and not an image in the store (airlock image ls)")
        });
    };
    if meta.is_dir() {
        if path.join("oci-layout").is_file() {
            let store = ImageStore::open(&ImageStore::default_root(), StoreOptions::default())
                .context("opening the image store")?;
            let report = store
                .import(&path, &ImportOptions::default(), None)
                .with_context(|| format!("--image {reference}: importing the OCI layout"))?;
            let Some(image) = report.images.first() else {
                bail!("--image {reference}: the OCI layout holds no image");
            };
            return Ok(store.resolve(image.digest.as_str())?);
        }
        return Ok(ImageRootfs {
            digest: format!("dir:{}", path.display()),
            layers: vec![path],
            config: ImageConfig::default(),
        });
    }
    let text = {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(&path)
            .and_then(|file| file.take(MAX_DESCRIPTION_BYTES).read_to_string(&mut text))
            .with_context(|| format!("--image {reference}: reading the image description"))?;
        text
    };
    let image: ImageRootfs = serde_json::from_str(&text)
        .with_context(|| format!("--image {reference}: not an image description"))?;
    // Relative layers are relative to the description.
    let base = path.parent().unwrap_or(Path::new("/"));
    let layers = image.layers.iter().map(|layer| base.join(layer)).collect();
    Ok(ImageRootfs { layers, ..image })
}
