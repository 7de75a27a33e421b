//! The image store on disk:
//!
//! ```text
//! <root>/images.db                 references, manifests, configs, leases (SQLite)
//! <root>/store.lock                shared by pulls and imports, exclusive for prune
//! <root>/blobs/sha256/<hex>        compressed layer blobs, verified
//! <root>/layers/sha256/<hex>/      one unpacked layer per diff id (overlay form, read-only use)
//! <root>/layers/sha256/<hex>.json  what unpacking it reported (warnings)
//! <root>/disks/sha256/<hex>.ext4  an image's root filesystem disk (microvm tier, crate::disk)
//! <root>/locks/{blob,layer,disk}-<hex>.lock
//! <root>/tmp/                      partial downloads and unpacks in progress
//! ```

pub(crate) mod db;
pub mod ingest;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use airlock_api::{ImageConfig, ImageRootfs};
use rusqlite::Connection;
use serde::Serialize;

use crate::digest::Digest;
use crate::layer::{LayerReport, Limits, Ownership};
use crate::oci::ImageConfigFile;
use crate::reference::{Reference, ReferenceError};
use db::ManifestRecord;

/// Paths inside a store root.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    root: PathBuf,
}

impl Paths {
    pub fn blob(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }
    pub fn layer(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(diff_id.hex())
    }
    pub fn layer_meta(&self, diff_id: &Digest) -> PathBuf {
        self.root
            .join("layers/sha256")
            .join(format!("{}.json", diff_id.hex()))
    }
    pub fn lock(&self, kind: &str, digest: &Digest) -> PathBuf {
        self.root
            .join("locks")
            .join(format!("{kind}-{}.lock", digest.hex()))
    }
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} `{path}`")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("image store database `{path}`")]
    Database {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("no image `{0}` in the store")]
    NotFound(String),
    #[error("bad image reference")]
    Reference(#[from] ReferenceError),
    #[error(
        "image {digest}: layer {diff_id} is missing from the store (pull or import the image again)"
    )]
    LayerMissing { digest: String, diff_id: Digest },
    #[error("image {digest}: stored config is unreadable")]
    Config {
        digest: String,
        #[source]
        source: crate::oci::DocumentError,
    },
}

/// Settings of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    pub limits: Limits,
    /// Layers downloaded and unpacked at the same time by one pull.
    pub concurrent_layers: usize,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            limits: Limits::default(),
            concurrent_layers: 3,
        }
    }
}

pub(crate) struct Inner {
    pub paths: Paths,
    db: Mutex<Connection>,
    db_path: PathBuf,
    pub options: StoreOptions,
    pub ownership: Ownership,
}

/// An image store rooted at one directory. Cheap to clone; safe to share between threads and
/// between processes (SQLite plus file locks).
#[derive(Clone)]
pub struct ImageStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("root", &self.inner.paths.root)
            .finish()
    }
}

/// One image in [`ImageStore::list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageSummary {
    pub digest: String,
    pub names: Vec<String>,
    pub layers: u64,
    /// Sum of the compressed layer blobs.
    pub size_bytes: u64,
    pub created_ms: i64,
}

/// One layer in [`ImageDetails`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerDetails {
    pub blob: String,
    pub blob_size_bytes: u64,
    pub media_type: String,
    pub diff_id: String,
    pub directory: PathBuf,
    pub present: bool,
    pub unpack_report: Option<LayerReport>,
}

/// [`ImageStore::inspect`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageDetails {
    pub digest: String,
    pub names: Vec<String>,
    pub index_digest: Option<String>,
    pub media_type: String,
    pub config_digest: String,
    pub config: ImageConfig,
    /// Names plus leases that keep the image from `prune`.
    pub refcount: u64,
    pub layers: Vec<LayerDetails>,
}

/// What [`ImageStore::prune`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    pub manifests: Vec<String>,
    pub blobs: u64,
    pub layers: u64,
    pub freed_bytes: u64,
}

fn create_private_dir(path: &Path) -> Result<(), StoreError> {
    let io = |action| {
        move |source| StoreError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    fs::create_dir_all(path).map_err(io("create"))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(io("set permissions of"))
}

impl ImageStore {
    /// Where `airlock run` keeps images: `/var/lib/airlock/images` as root, else
    /// `$XDG_CACHE_HOME/airlock/images` (or `~/.cache/airlock/images`).
    pub fn default_root() -> PathBuf {
        if airlock_jail::host::effective_uid() == 0 {
            return PathBuf::from("/var/lib/airlock/images");
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        cache.join("airlock/images")
    }

    /// Opens (creating) the store at `root`.
    pub fn open(root: &Path, options: StoreOptions) -> Result<ImageStore, StoreError> {
        create_private_dir(root)?;
        // Absolute, so that the layer directories handed to the container tier are too.
        let root = &fs::canonicalize(root).map_err(|source| StoreError::Io {
            action: "resolve",
            path: root.to_path_buf(),
            source,
        })?;
        for sub in ["blobs/sha256", "layers/sha256", "locks", "tmp"] {
            create_private_dir(&root.join(sub))?;
        }
        let db_path = root.join("images.db");
        let conn = db::open(&db_path).map_err(|source| StoreError::Database {
            path: db_path.clone(),
            source,
        })?;
        Ok(ImageStore {
            inner: Arc::new(Inner {
                paths: Paths {
                    root: root.to_path_buf(),
                },
                db: Mutex::new(conn),
                db_path,
                options,
                ownership: Ownership::for_this_process(),
            }),
        })
    }

    pub fn root(&self) -> &Path {
        &self.inner.paths.root
    }

    pub(crate) fn db(&self) -> MutexGuard<'_, Connection> {
        self.inner
            .db
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn db_error(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Database {
            path: self.inner.db_path.clone(),
            source,
        }
    }

    /// The store lock: shared while a pull or import runs, exclusive for prune.
    pub(crate) fn store_lock(&self, exclusive: bool) -> Result<File, StoreError> {
        let path = self.inner.paths.root.join("store.lock");
        let io = |source| StoreError::Io {
            action: "lock",
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        if exclusive {
            file.lock()
        } else {
            file.lock_shared()
        }
        .map_err(io)?;
        Ok(file)
    }

    /// Records a manifest whose blobs and layers are all in place, and names it.
    pub(crate) fn record(
        &self,
        record: &ManifestRecord,
        names: &[String],
        index: Option<&Digest>,
    ) -> Result<(), StoreError> {
        for layer in &record.layers {
            if !self.inner.paths.layer(&layer.diff_id).is_dir()
                || !self.inner.paths.blob(&layer.blob).is_file()
            {
                return Err(StoreError::LayerMissing {
                    digest: record.digest.to_string(),
                    diff_id: layer.diff_id.clone(),
                });
            }
        }
        db::record_image(&mut self.db(), record, names, index).map_err(self.db_error())
    }

    /// The manifest digest a reference names: `sha256:…`, `name@sha256:…` (content-addressed:
    /// any name) or `name[:tag]`.
    pub(crate) fn find(&self, conn: &Connection, text: &str) -> Result<String, StoreError> {
        let found = if let Ok(digest) = Digest::parse(text) {
            db::find_digest(conn, &digest)
        } else {
            let reference = Reference::parse(text)?;
            match &reference.digest {
                Some(digest) => db::find_digest(conn, digest),
                None => db::find_name(conn, &reference.record_name()),
            }
        };
        found
            .map_err(self.db_error())?
            .ok_or_else(|| StoreError::NotFound(text.to_owned()))
    }

    fn rootfs(&self, record: &ManifestRecord) -> Result<ImageRootfs, StoreError> {
        let config =
            ImageConfigFile::parse(&record.config).map_err(|source| StoreError::Config {
                digest: record.digest.to_string(),
                source,
            })?;
        // A diff id twice in the stack (empty layers are common) is kept only at its highest
        // position: the lower copy can show nothing the upper one does not (same content, same
        // whiteouts), and overlayfs refuses one directory twice.
        let mut layers: Vec<PathBuf> = Vec::new();
        for (i, layer) in record.layers.iter().enumerate() {
            if record.layers[i + 1..]
                .iter()
                .any(|l| l.diff_id == layer.diff_id)
            {
                continue;
            }
            let dir = self.inner.paths.layer(&layer.diff_id);
            if !dir.is_dir() {
                return Err(StoreError::LayerMissing {
                    digest: record.digest.to_string(),
                    diff_id: layer.diff_id.clone(),
                });
            }
            layers.push(dir);
        }
        Ok(ImageRootfs {
            digest: record.digest.to_string(),
            layers,
            config: config.image_config(),
        })
    }

    pub(crate) fn load(
        &self,
        conn: &Connection,
        digest: &str,
        text: &str,
    ) -> Result<ManifestRecord, StoreError> {
        db::load(conn, digest)
            .map_err(self.db_error())?
            .ok_or_else(|| StoreError::NotFound(text.to_owned()))
    }

    /// The unpacked layers and config of an image, for the container tier.
    pub fn resolve(&self, reference: &str) -> Result<ImageRootfs, StoreError> {
        let conn = self.db();
        let digest = self.find(&conn, reference)?;
        let record = self.load(&conn, &digest, reference)?;
        self.rootfs(&record)
    }

    /// [`resolve`](Self::resolve), and a lease for `holder` (e.g. a sandbox id) that keeps the
    /// image from `prune` until [`release`](Self::release), even if its names are removed.
    pub fn resolve_leased(&self, reference: &str, holder: &str) -> Result<ImageRootfs, StoreError> {
        let conn = self.db();
        let digest = self.find(&conn, reference)?;
        let record = self.load(&conn, &digest, reference)?;
        let rootfs = self.rootfs(&record)?;
        db::lease(&conn, holder, &digest).map_err(self.db_error())?;
        Ok(rootfs)
    }

    /// Drops every lease `holder` holds; returns how many.
    pub fn release(&self, holder: &str) -> Result<u64, StoreError> {
        db::release(&self.db(), holder).map_err(self.db_error())
    }

    pub fn list(&self) -> Result<Vec<ImageSummary>, StoreError> {
        let listed = db::list(&self.db()).map_err(self.db_error())?;
        Ok(listed
            .into_iter()
            .map(|l| ImageSummary {
                digest: l.digest,
                names: l.names,
                layers: l.layers,
                size_bytes: l.size_bytes,
                created_ms: l.created_ms,
            })
            .collect())
    }

    pub fn inspect(&self, reference: &str) -> Result<ImageDetails, StoreError> {
        let conn = self.db();
        let digest = self.find(&conn, reference)?;
        let record = self.load(&conn, &digest, reference)?;
        let (names, index_digest) = db::names_of(&conn, &digest).map_err(self.db_error())?;
        let refcount = db::refcount(&conn, &digest).map_err(self.db_error())?;
        drop(conn);
        let config =
            ImageConfigFile::parse(&record.config).map_err(|source| StoreError::Config {
                digest: digest.clone(),
                source,
            })?;
        let layers = record
            .layers
            .iter()
            .map(|layer| {
                let directory = self.inner.paths.layer(&layer.diff_id);
                let unpack_report = fs::read(self.inner.paths.layer_meta(&layer.diff_id))
                    .ok()
                    .and_then(|bytes| serde_json::from_slice(&bytes).ok());
                LayerDetails {
                    blob: layer.blob.to_string(),
                    blob_size_bytes: layer.blob_size_bytes,
                    media_type: layer.media_type.clone(),
                    diff_id: layer.diff_id.to_string(),
                    present: directory.is_dir(),
                    directory,
                    unpack_report,
                }
            })
            .collect();
        Ok(ImageDetails {
            digest,
            names,
            index_digest,
            media_type: record.media_type,
            config_digest: record.config_digest.to_string(),
            config: config.image_config(),
            refcount,
            layers,
        })
    }

    /// Removes a name (`name:tag`, `name@digest`), or every name of an image (`sha256:…`).
    /// Files stay until [`prune`](Self::prune). Returns the names removed.
    pub fn remove(&self, reference: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.db();
        if Digest::parse(reference).is_ok() {
            let digest = self.find(&conn, reference)?;
            return db::remove_names_of(&mut conn, &digest).map_err(self.db_error());
        }
        let parsed = Reference::parse(reference)?;
        let name = match (&parsed.tag, &parsed.digest) {
            (None, Some(digest)) => {
                let by_digest = format!("{}@{digest}", parsed.name());
                if db::remove_name(&conn, &by_digest).map_err(self.db_error())? {
                    return Ok(vec![by_digest]);
                }
                // Every name of this repository that points at the digest.
                let manifest = self.find(&conn, reference)?;
                let (names, _) = db::names_of(&conn, &manifest).map_err(self.db_error())?;
                let mine: Vec<String> = names
                    .into_iter()
                    .filter(|n| n.starts_with(&format!("{}:", parsed.name())))
                    .collect();
                for n in &mine {
                    db::remove_name(&conn, n).map_err(self.db_error())?;
                }
                return if mine.is_empty() {
                    Err(StoreError::NotFound(reference.to_owned()))
                } else {
                    Ok(mine)
                };
            }
            _ => parsed.record_name(),
        };
        if db::remove_name(&conn, &name).map_err(self.db_error())? {
            Ok(vec![name])
        } else {
            Err(StoreError::NotFound(reference.to_owned()))
        }
    }

    /// Removes every image nothing refers to (no name, no lease), then every blob and layer
    /// directory no remaining image uses, and whatever interrupted pulls left in `tmp/`. Waits
    /// for running pulls and imports (the store lock).
    pub fn prune(&self) -> Result<PruneReport, StoreError> {
        let _lock = self.store_lock(true)?;
        let (manifests, blobs, layers) = db::prune(&mut self.db()).map_err(self.db_error())?;
        let mut report = PruneReport {
            manifests,
            ..PruneReport::default()
        };
        let paths = &self.inner.paths;
        let keep_blobs: std::collections::HashSet<String> = blobs
            .iter()
            .filter_map(|d| Digest::parse(d).ok())
            .map(|d| d.hex().to_owned())
            .collect();
        let keep_layers: std::collections::HashSet<String> = layers
            .iter()
            .filter_map(|d| Digest::parse(d).ok())
            .map(|d| d.hex().to_owned())
            .collect();
        let trash = paths.tmp().join(format!("prune-{}", std::process::id()));
        create_private_dir(&trash)?;
        for (dir, keep, is_layer) in [
            (paths.root.join("blobs/sha256"), &keep_blobs, false),
            (paths.root.join("layers/sha256"), &keep_layers, true),
        ] {
            let entries = fs::read_dir(&dir).map_err(|source| StoreError::Io {
                action: "list",
                path: dir.clone(),
                source,
            })?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let hex = name.strip_suffix(".json").unwrap_or(&name);
                if keep.contains(hex) {
                    continue;
                }
                let size = if is_layer {
                    0
                } else {
                    entry.metadata().map_or(0, |m| m.len())
                };
                let moved = trash.join(format!(
                    "{}-{name}",
                    if is_layer { "layer" } else { "blob" }
                ));
                if fs::rename(entry.path(), &moved).is_ok() {
                    if is_layer && !name.ends_with(".json") {
                        report.layers += 1;
                    } else if !is_layer {
                        report.blobs += 1;
                        report.freed_bytes += size;
                    }
                }
            }
        }
        // The microvm tier's root disks of the images just removed (crate::disk).
        for digest in report
            .manifests
            .iter()
            .filter_map(|d| Digest::parse(d).ok())
        {
            let disk = self.disk_path(&digest);
            let _ = fs::rename(&disk, trash.join(format!("disk-{}", digest.hex())));
        }
        // Nothing runs while the exclusive lock is held: every temporary file and lock is stale.
        for sub in ["tmp", "locks"] {
            let dir = paths.root.join(sub);
            if let Ok(entries) = fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    let path = entry.path();
                    let _ = if path.is_dir() {
                        fs::remove_dir_all(&path)
                    } else {
                        fs::remove_file(&path)
                    };
                }
            }
        }
        Ok(report)
    }
}
