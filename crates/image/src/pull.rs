//! `ImageStore::pull`: manifest (an index resolved to linux/amd64), config, then every layer
//! through the store's verified ingest, downloaded and unpacked at the same time.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};

use crate::digest::Digest;
use crate::oci::{Document, DocumentError, ImageConfigFile, LayerCompression};
use crate::reference::Reference;
use crate::registry::auth::Credentials;
use crate::registry::http::{self, HttpError};
use crate::registry::{Registry, RegistryError, content_range_start};
use crate::store::db::{LayerRecord, ManifestRecord};
use crate::store::ingest::{
    self, Incoming, IngestError, LayerJob, Phase, Progress, ProgressFn, TransferFailed,
};
use crate::store::{ImageStore, StoreError};

/// How to pull.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Allow plain HTTP to a registry that is not on loopback.
    pub insecure: bool,
    /// Credentials to use; `None` reads the Docker config.
    pub credentials: Option<Credentials>,
}

/// What a pull did with one layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerPulled {
    pub blob: String,
    pub diff_id: String,
    /// Bytes fetched from the registry now (0 if the blob was stored; less than the size
    /// when an interrupted download was resumed).
    pub downloaded_bytes: u64,
    /// Whether this pull unpacked the layer (else it was in the store, or another pull did it).
    pub unpacked: bool,
    pub warnings: Vec<String>,
}

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PullReport {
    /// The name the image is recorded under (`registry/repo:tag` or `registry/repo@digest`).
    pub name: String,
    /// The manifest's digest (for an index: the linux/amd64 manifest's).
    pub digest: String,
    pub index_digest: Option<String>,
    pub layers: Vec<LayerPulled>,
}

/// Why a pull failed. The store is unchanged but for verified blobs and layers, which the
/// next pull reuses, and a partial download, which it resumes.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("pulling {reference}")]
    Registry {
        reference: String,
        #[source]
        source: RegistryError,
    },
    #[error("pulling {reference}: bad manifest or config")]
    Document {
        reference: String,
        #[source]
        source: DocumentError,
    },
    #[error(
        "pulling {reference}: the registry sent a manifest with digest {actual}, expected {expected}"
    )]
    ManifestDigest {
        reference: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("pulling {reference}: an index points to another index")]
    NestedIndex { reference: String },
    #[error("pulling {reference}")]
    Ingest {
        reference: String,
        #[source]
        source: IngestError,
    },
    #[error("pulling {reference}")]
    Store {
        reference: String,
        #[source]
        source: StoreError,
    },
    #[error("pulling {reference}: a worker thread failed ({message})")]
    Worker { reference: String, message: String },
}

impl ImageStore {
    /// Pulls `reference` into the store and names it. Safe to run in several processes at
    /// once (shared layers are fetched and unpacked once) and to kill at any point.
    pub async fn pull(
        &self,
        reference: &Reference,
        options: &PullOptions,
        progress: Option<ProgressFn>,
    ) -> Result<PullReport, PullError> {
        let name = reference.to_string();
        let registry_error = |source| PullError::Registry {
            reference: name.clone(),
            source,
        };
        let document_error = |source| PullError::Document {
            reference: name.clone(),
            source,
        };
        let worker = |e: tokio::task::JoinError| PullError::Worker {
            reference: name.clone(),
            message: e.to_string(),
        };
        let store = self.clone();
        let _lock = tokio::task::spawn_blocking(move || store.store_lock(false))
            .await
            .map_err(worker)?
            .map_err(|source| PullError::Store {
                reference: name.clone(),
                source,
            })?;
        let registry = Arc::new(
            Registry::new(reference, options.insecure, options.credentials.clone())
                .map_err(registry_error)?,
        );

        let selector = reference.manifest_selector();
        let (mut body, mut content_type) =
            registry.manifest(&selector).await.map_err(registry_error)?;
        let mut digest = Digest::of(&body);
        if let Some(expected) = &reference.digest
            && &digest != expected
        {
            return Err(PullError::ManifestDigest {
                reference: name.clone(),
                expected: expected.clone(),
                actual: digest,
            });
        }
        let mut index_digest = None;
        let mut document =
            Document::parse(&body, content_type.as_deref()).map_err(document_error)?;
        if let Document::Index(index) = &document {
            let chosen = index.select_linux_amd64().map_err(document_error)?;
            let expected = chosen
                .digest()
                .map_err(|e| document_error(DocumentError::Digest(e)))?;
            (body, content_type) = registry
                .manifest(expected.as_str())
                .await
                .map_err(registry_error)?;
            index_digest = Some(digest);
            digest = Digest::of(&body);
            if digest != expected {
                return Err(PullError::ManifestDigest {
                    reference: name.clone(),
                    expected,
                    actual: digest,
                });
            }
            document = Document::parse(&body, content_type.as_deref()).map_err(document_error)?;
        }
        let Document::Manifest(manifest) = document else {
            return Err(PullError::NestedIndex {
                reference: name.clone(),
            });
        };
        let config_digest = manifest
            .config
            .digest()
            .map_err(|e| document_error(DocumentError::Digest(e)))?;
        let config_bytes = registry
            .small_blob(&config_digest)
            .await
            .map_err(registry_error)?;
        let config = ImageConfigFile::parse(&config_bytes).map_err(document_error)?;
        let diff_ids = config
            .diff_ids(manifest.layers.len())
            .map_err(document_error)?;
        let mut jobs = Vec::new();
        for (layer, diff_id) in manifest.layers.iter().zip(diff_ids) {
            jobs.push(LayerJob {
                blob: layer
                    .digest()
                    .map_err(|e| document_error(DocumentError::Digest(e)))?,
                size_bytes: layer.size,
                diff_id,
                compression: LayerCompression::from_media_type(&layer.media_type)
                    .map_err(document_error)?,
            });
        }

        let limit = Arc::new(Semaphore::new(self.inner.options.concurrent_layers.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        let mut unique: Vec<LayerJob> = Vec::new();
        for job in &jobs {
            if !unique.contains(job) {
                unique.push(job.clone());
            }
        }
        for (position, job) in unique.iter().cloned().enumerate() {
            let (store, registry, progress, limit) = (
                self.clone(),
                registry.clone(),
                progress.clone(),
                limit.clone(),
            );
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                (position, ensure_layer(store, registry, job, progress).await)
            });
        }
        let mut pulled: Vec<Option<LayerPulled>> = vec![None; unique.len()];
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((position, Ok(layer))) => pulled[position] = Some(layer),
                Ok((_, Err(source))) => {
                    first_error.get_or_insert(PullError::Ingest {
                        reference: name.clone(),
                        source,
                    });
                }
                Err(e) => {
                    first_error.get_or_insert(worker(e));
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }

        let record = ManifestRecord {
            digest: digest.clone(),
            media_type: manifest
                .media_type
                .clone()
                .or(content_type)
                .unwrap_or_else(|| crate::oci::OCI_MANIFEST.to_owned()),
            manifest: body.to_vec(),
            config_digest,
            config: config_bytes.to_vec(),
            layers: manifest
                .layers
                .iter()
                .zip(&jobs)
                .map(|(layer, job)| LayerRecord {
                    blob: job.blob.clone(),
                    blob_size_bytes: job.size_bytes,
                    media_type: layer.media_type.clone(),
                    diff_id: job.diff_id.clone(),
                })
                .collect(),
        };
        let record_name = reference.record_name();
        let (store, names, index) = (
            self.clone(),
            vec![record_name.clone()],
            index_digest.clone(),
        );
        tokio::task::spawn_blocking(move || store.record(&record, &names, index.as_ref()))
            .await
            .map_err(worker)?
            .map_err(|source| PullError::Store {
                reference: name.clone(),
                source,
            })?;
        Ok(PullReport {
            name: record_name,
            digest: digest.to_string(),
            index_digest: index_digest.map(|d| d.to_string()),
            layers: pulled.into_iter().flatten().collect(),
        })
    }
}

fn transfer(blob: &Digest, error: HttpError) -> IngestError {
    IngestError::Transfer {
        blob: blob.clone(),
        source: std::io::Error::other(error),
    }
}

/// One layer: nothing if stored, an unpack of the stored blob if only the layer is missing,
/// else a download (resumed when a partial file is left) unpacked as it arrives.
async fn ensure_layer(
    store: ImageStore,
    registry: Arc<Registry>,
    job: LayerJob,
    progress: Option<ProgressFn>,
) -> Result<LayerPulled, IngestError> {
    let paths = store.inner.paths.clone();
    let (limits, ownership) = (store.inner.options.limits, store.inner.ownership);
    let joined = |e: tokio::task::JoinError| IngestError::Transfer {
        blob: job.blob.clone(),
        source: std::io::Error::other(e.to_string()),
    };
    let locks = {
        let (paths, job) = (paths.clone(), job.clone());
        tokio::task::spawn_blocking(move || ingest::lock_layer(&paths, &job))
            .await
            .map_err(joined)??
    };
    let report = |phase, done| {
        if let Some(progress) = &progress {
            progress(&Progress {
                blob: job.blob.clone(),
                done_bytes: done,
                total_bytes: job.size_bytes,
                phase,
            });
        }
    };
    let mut pulled = LayerPulled {
        blob: job.blob.to_string(),
        diff_id: job.diff_id.to_string(),
        downloaded_bytes: 0,
        unpacked: false,
        warnings: Vec::new(),
    };
    let have_blob = paths.blob(&job.blob).is_file();
    let have_layer = paths.layer(&job.diff_id).is_dir();
    if have_blob && have_layer {
        report(Phase::Present, job.size_bytes);
        return Ok(pulled);
    }
    let ingested = if have_blob {
        let blob_path = paths.blob(&job.blob);
        let (paths, job, progress) = (paths.clone(), job.clone(), progress.clone());
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&blob_path).map_err(|source| IngestError::Io {
                blob: job.blob.clone(),
                action: "open",
                path: blob_path.clone(),
                source,
            })?;
            ingest::ingest(
                &paths,
                &job,
                Incoming::Local(Box::new(file)),
                &limits,
                ownership,
                progress,
            )
        })
        .await
        .map_err(joined)??
    } else {
        let partial = paths.tmp().join(format!("{}.partial", job.blob.hex()));
        let partial_bytes = std::fs::metadata(&partial).map_or(0, |m| m.len());
        let from = (partial_bytes > 0 && partial_bytes < job.size_bytes).then_some(partial_bytes);
        let response = registry
            .blob(&job.blob, from)
            .await
            .map_err(|e| IngestError::Transfer {
                blob: job.blob.clone(),
                source: std::io::Error::other(e),
            })?;
        let resume_from = match (from, response.status().as_u16()) {
            (Some(from), 206) if content_range_start(&response) == Some(from) => from,
            (_, 200) => 0,
            (_, status) => {
                return Err(IngestError::Transfer {
                    blob: job.blob.clone(),
                    source: std::io::Error::other(format!("unexpected HTTP {status} for a blob")),
                });
            }
        };
        pulled.downloaded_bytes = job.size_bytes - resume_from;
        let (sender, chunks) = mpsc::channel(16);
        let worker = {
            let (paths, job, progress) = (paths.clone(), job.clone(), progress.clone());
            tokio::task::spawn_blocking(move || {
                ingest::ingest(
                    &paths,
                    &job,
                    Incoming::Channel {
                        chunks,
                        resume_from,
                    },
                    &limits,
                    ownership,
                    progress,
                )
            })
        };
        let mut body = response.into_body();
        loop {
            match http::next_chunk(&mut body, "the registry").await {
                Ok(Some(chunk)) => {
                    if sender.send(Ok(chunk)).await.is_err() {
                        break; // The worker stopped (bad content); its error says why.
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    let _ = sender
                        .send(Err(TransferFailed(airlock_jail::error_chain(&error))))
                        .await;
                    drop(sender);
                    return match worker.await.map_err(joined)? {
                        Err(e) => Err(e),
                        Ok(_) => Err(transfer(&job.blob, error)),
                    };
                }
            }
        }
        drop(sender);
        worker.await.map_err(joined)??
    };
    drop(locks);
    if let Some(unpack) = ingested.unpacked {
        pulled.unpacked = true;
        pulled.warnings = unpack.warnings;
    }
    report(Phase::Done, job.size_bytes);
    Ok(pulled)
}
