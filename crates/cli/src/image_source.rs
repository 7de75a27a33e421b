//! What `airlock run --image REF` runs, until the image store lands: the one function the
//! lead points at `airlock_image::ImageStore::resolve` when merging (engineer A's branch).
//!
//! Accepted for now:
//! - a plain rootfs directory: one layer, an empty config (give the command after `--`);
//! - an image description, a `.json` file holding an [`ImageRootfs`] (layer directories,
//!   lowest first, already in overlay form, and the config): what the store's `resolve`
//!   returns, written by hand or by a test.
//!
//! An OCI layout directory (or a registry reference) needs the store's layer applier, and is
//! refused with a message that says so.

use std::path::Path;

use airlock_api::{ImageConfig, ImageRootfs};
use anyhow::{Context, bail};

/// The most bytes of an image description that are read.
const MAX_DESCRIPTION_BYTES: u64 = 1 << 20;

pub fn resolve(reference: &str) -> anyhow::Result<ImageRootfs> {
    let path = std::path::absolute(Path::new(reference))
        .with_context(|| format!("--image {reference}"))?;
    let meta = std::fs::metadata(&path)
        .with_context(|| format!("--image {reference}: no such directory or file"))?;
    if meta.is_dir() {
        if path.join("oci-layout").is_file() {
            bail!(
                "--image {reference} is an OCI layout; its layers must be unpacked by the image store (`airlock image import`), which this build does not have yet: give a rootfs directory or an image description (.json)"
            );
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
