//! Airlock's image store.
//!
//! Compressed blobs addressed by SHA-256 and verified on arrival, each layer unpacked once into
//! its own directory (keyed by its diff id, shared by every image that has it), references,
//! manifests and leases in SQLite, pulls from OCI distribution registries and imports of
//! local archives. [`ImageStore::resolve`] gives the container tier an
//! [`airlock_api::ImageRootfs`]. ARCHITECTURE.md ("crates/image") has the layout on disk and
//! the crash-safety argument; [`layer`] the applier's rules.

pub mod capture;
pub mod copy;
mod derive;
pub mod digest;
pub mod disk;
pub mod fuzzing;
pub mod glob;
mod import;
pub mod layer;
pub mod oci;
mod pull;
pub mod reference;
pub mod registry;
pub mod stack;
pub mod store;
pub mod tarball;

pub use derive::{Derivation, DeriveError};
pub use digest::Digest;
pub use disk::{DiskError, RootDisk};
pub use import::{ImportError, ImportKind, ImportOptions, ImportReport, ImportedImage};
pub use pull::{LayerPulled, PullError, PullOptions, PullReport};
pub use reference::Reference;
pub use store::ingest::{Phase, Progress, ProgressFn};
pub use store::{
    ImageDetails, ImageStore, ImageSummary, LayerDetails, PruneReport, StoreError, StoreOptions,
};

/// `bytes` for people: `512 B`, `1.5 MB` (decimal units, as registries and `docker images` show).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
