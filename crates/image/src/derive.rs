//! Images made here rather than pulled: each step of a template build is a new image, its
//! parent's layers plus the step's own (an uncompressed tar, verified and unpacked by the same
//! ingest and applier as a pulled layer) and a new config. Such an image has no name; a
//! lease keeps it (the build cache's, a template's, a sandbox's).
//!
//! The config and manifest are deterministic (no timestamps), so the same parent, layers and
//! config always make the same digest.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use airlock_api::ImageConfig;
use serde_json::{Value, json};

use crate::digest::{Digest, HashingSink};
use crate::oci::{self, LayerCompression};
use crate::store::db::{self, LayerRecord, ManifestRecord};
use crate::store::ingest::{self, Incoming, IngestError, LayerJob};
use crate::store::{ImageStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read the layer tar `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the new layer cannot be added")]
    Ingest(#[from] IngestError),
    #[error("the parent image's config is not a JSON object")]
    Config,
}

/// The parts of a derived image's config that change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derivation {
    pub config: ImageConfig,
    /// Recorded in the config's `history` (the step that made the image).
    pub created_by: String,
}

fn hash_file(path: &Path) -> Result<(Digest, u64), DeriveError> {
    let read = |source| DeriveError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(read)?;
    let mut sink = HashingSink::default();
    let size = io::copy(&mut file, &mut sink).map_err(read)?;
    Ok((sink.0.finish(), size))
}

/// `value[key]` as an object, created when missing.
fn object<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut serde_json::Map<String, Value>> {
    let map = value.as_object_mut()?;
    let entry = map
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(serde_json::Map::new());
    }
    entry.as_object_mut()
}

fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}

impl ImageStore {
    /// Records a new image: `base`'s layers (none: `FROM scratch`) plus `layers` (uncompressed
    /// tar files, lowest first), with `derivation`'s config, leased by `holder`. Returns its
    /// digest. Blocking; safe beside pulls and imports (prune waits for it).
    pub fn derive(
        &self,
        base: Option<&str>,
        layers: &[PathBuf],
        derivation: &Derivation,
        holder: &str,
    ) -> Result<String, DeriveError> {
        let _lock = self.store_lock(false)?;
        let (mut records, mut config) = match base {
            Some(reference) => {
                let conn = self.db();
                let digest = self.find(&conn, reference)?;
                let record = self.load(&conn, &digest, reference)?;
                let config: Value =
                    serde_json::from_slice(&record.config).map_err(|_| DeriveError::Config)?;
                (record.layers, config)
            }
            None => (
                Vec::new(),
                json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}),
            ),
        };
        let paths = &self.inner.paths;
        let (limits, ownership) = (self.inner.options.limits, self.inner.ownership);
        for tar in layers {
            let (digest, size) = hash_file(tar)?;
            let job = LayerJob {
                blob: digest.clone(),
                size_bytes: size,
                diff_id: digest.clone(),
                compression: LayerCompression::None,
            };
            let _locks = ingest::lock_layer(paths, &job)?;
            if !(paths.blob(&digest).is_file() && paths.layer(&digest).is_dir()) {
                let file = File::open(tar).map_err(|source| DeriveError::Read {
                    path: tar.clone(),
                    source,
                })?;
                ingest::ingest(
                    paths,
                    &job,
                    Incoming::Local(Box::new(file)),
                    &limits,
                    ownership,
                    None,
                )?;
            }
            records.push(LayerRecord {
                blob: digest.clone(),
                blob_size_bytes: size,
                media_type: oci::OCI_LAYER_TAR.to_owned(),
                diff_id: digest,
            });
        }
        let image = &derivation.config;
        let run = object(&mut config, "config").ok_or(DeriveError::Config)?;
        run.insert("Env".into(), strings(&image.env));
        for (key, value) in [("WorkingDir", &image.working_dir), ("User", &image.user)] {
            match value {
                Some(value) => run.insert(key.into(), Value::String(value.clone())),
                None => run.remove(key),
            };
        }
        for (key, value) in [("Entrypoint", &image.entrypoint), ("Cmd", &image.cmd)] {
            if value.is_empty() {
                run.remove(key);
            } else {
                run.insert(key.into(), strings(value));
            }
        }
        let rootfs = object(&mut config, "rootfs").ok_or(DeriveError::Config)?;
        rootfs.insert("type".into(), Value::String("layers".into()));
        rootfs.insert(
            "diff_ids".into(),
            Value::Array(
                records
                    .iter()
                    .map(|l| Value::String(l.diff_id.to_string()))
                    .collect(),
            ),
        );
        if let Some(map) = config.as_object_mut() {
            let history = map
                .entry("history")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(history) = history {
                let mut entry = json!({"created_by": derivation.created_by});
                if layers.is_empty() {
                    entry["empty_layer"] = Value::Bool(true);
                }
                history.push(entry);
            }
        }
        let config = serde_json::to_vec(&config).map_err(|_| DeriveError::Config)?;
        let descriptors = records
            .iter()
            .map(|l| json!({"mediaType": l.media_type, "digest": l.blob.to_string(), "size": l.blob_size_bytes}))
            .collect();
        let manifest = crate::import::synthesized_manifest(&config, descriptors);
        let record = ManifestRecord {
            digest: Digest::of(&manifest),
            media_type: oci::OCI_MANIFEST.to_owned(),
            manifest,
            config_digest: Digest::of(&config),
            config,
            layers: records,
        };
        self.record(&record, &[], None)?;
        let digest = record.digest.to_string();
        db::lease(&self.db(), holder, &digest).map_err(self.db_error())?;
        Ok(digest)
    }

    /// Leases the image `reference` names for `holder` (see
    /// [`resolve_leased`](Self::resolve_leased)); returns its digest.
    pub fn lease(&self, reference: &str, holder: &str) -> Result<String, StoreError> {
        let conn = self.db();
        let digest = self.find(&conn, reference)?;
        db::lease(&conn, holder, &digest).map_err(self.db_error())?;
        Ok(digest)
    }

    /// Every holder of a lease.
    pub fn holders(&self) -> Result<Vec<String>, StoreError> {
        db::holders(&self.db()).map_err(self.db_error())
    }

    /// The manifest digest a reference names.
    pub fn digest_of(&self, reference: &str) -> Result<String, StoreError> {
        self.find(&self.db(), reference)
    }
}
