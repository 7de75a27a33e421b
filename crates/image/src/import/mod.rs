//! `ImageStore::import`: local images without a registry, through the same verified ingest as
//! pulls. Three kinds, told apart by content:
//! - an OCI image layout, as a directory or a tar (`oci-layout` and `index.json`);
//! - a `docker save` archive (`manifest.json`; Docker 25 and later also write an OCI layout,
//!   which is then preferred);
//! - anything else that is a tar: a plain root filesystem, imported as one layer with an empty
//!   config.
//!
//! A gzip or zstd compressed file is decompressed into the store's `tmp/` first to look inside.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;

mod archive;

use archive::{Source, normalise};

use crate::digest::{Digest, HashingSink};
use crate::layer::Decompressed;
use crate::oci::{self, Descriptor, Document, DocumentError, ImageConfigFile, LayerCompression};
use crate::pull::LayerPulled;
use crate::reference::Reference;
use crate::store::db::{LayerRecord, ManifestRecord};
use crate::store::ingest::{self, Incoming, IngestError, LayerJob, ProgressFn};
use crate::store::{ImageStore, StoreError};

/// How to import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// A name for the image (`name[:tag]`); required to name a plain rootfs tarball or an
    /// unnamed layout image, and only allowed when the source holds one image.
    pub tag: Option<String>,
}

/// What kind of source an import found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportKind {
    OciLayout,
    DockerSave,
    RootfsTarball,
}

/// One image an import recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImportedImage {
    pub digest: String,
    /// Its names; the digest itself when the source named it nothing.
    pub names: Vec<String>,
    pub layers: Vec<LayerPulled>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    pub kind: ImportKind,
    pub images: Vec<ImportedImage>,
}

/// Why an import failed (the store keeps only complete, verified blobs and layers).
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("importing `{path}`: cannot read `{member}`")]
    Read {
        path: PathBuf,
        member: String,
        #[source]
        source: io::Error,
    },
    #[error("importing `{path}`: not a tar archive, nor an OCI layout directory")]
    NotArchive {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("importing `{path}`: `{member}` is missing")]
    Missing { path: PathBuf, member: String },
    #[error(
        "importing `{path}`: a directory must be an OCI image layout (`oci-layout` and `index.json`)"
    )]
    NotLayout { path: PathBuf },
    #[error("importing `{path}`: `{member}` is not valid")]
    Document {
        path: PathBuf,
        member: String,
        #[source]
        source: DocumentError,
    },
    #[error("importing `{path}`: `{member}` has digest {actual}, not {expected}")]
    Digest {
        path: PathBuf,
        member: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("importing `{path}`: it holds no linux/amd64 image")]
    NoImage { path: PathBuf },
    #[error("importing `{path}`: --tag names one image, but it holds {images}")]
    TagAmbiguous { path: PathBuf, images: usize },
    #[error("importing `{path}`: bad name `{name}`")]
    Name {
        path: PathBuf,
        name: String,
        #[source]
        source: crate::reference::ReferenceError,
    },
    #[error("importing `{path}`")]
    Ingest {
        path: PathBuf,
        #[source]
        source: IngestError,
    },
    #[error("importing `{path}`")]
    Store {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
}

struct Importer<'a> {
    store: &'a ImageStore,
    path: PathBuf,
    source: Source,
    progress: Option<ProgressFn>,
}

/// A layer of an image to import: where its blob is, and what it must be.
struct PendingLayer {
    member: String,
    job: LayerJob,
    media_type: String,
}

impl Importer<'_> {
    fn read_error(&self, member: &str) -> impl FnOnce(io::Error) -> ImportError + '_ {
        let member = member.to_owned();
        move |source| ImportError::Read {
            path: self.path.clone(),
            member,
            source,
        }
    }

    fn read_small(&self, member: &str) -> Result<Vec<u8>, ImportError> {
        let (reader, size) = self.source.open(member).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ImportError::Missing {
                path: self.path.clone(),
                member: member.to_owned(),
            },
            _ => self.read_error(member)(e),
        })?;
        if size > oci::MAX_DOCUMENT_BYTES as u64 {
            return Err(self.read_error(member)(io::Error::other(
                "larger than 4 MiB",
            )));
        }
        let mut bytes = Vec::new();
        reader
            .take(oci::MAX_DOCUMENT_BYTES as u64)
            .read_to_end(&mut bytes)
            .map_err(self.read_error(member))?;
        Ok(bytes)
    }

    fn blob_member(digest: &Digest) -> String {
        format!("blobs/sha256/{}", digest.hex())
    }

    fn read_verified(&self, digest: &Digest) -> Result<Vec<u8>, ImportError> {
        let member = Self::blob_member(digest);
        let bytes = self.read_small(&member)?;
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(ImportError::Digest {
                path: self.path.clone(),
                member,
                expected: digest.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    fn document_error(&self, member: &str) -> impl FnOnce(DocumentError) -> ImportError + '_ {
        let member = member.to_owned();
        move |source| ImportError::Document {
            path: self.path.clone(),
            member,
            source,
        }
    }

    /// SHA-256 and size of a member; `decompressed` hashes its uncompressed content instead.
    fn hash_member(
        &self,
        member: &str,
        decompressed: bool,
    ) -> Result<(Digest, u64, LayerCompression), ImportError> {
        let (reader, size) = self.source.open(member).map_err(self.read_error(member))?;
        let mut reader = BufReader::with_capacity(1 << 20, reader);
        let mut sink = HashingSink::default();
        let compression = if decompressed {
            let mut stream = Decompressed::new(&mut reader, LayerCompression::None)
                .map_err(self.read_error(member))?;
            let compression = stream.compression();
            io::copy(&mut stream, &mut sink).map_err(self.read_error(member))?;
            compression
        } else {
            let mut head = [0u8; 4];
            let n = reader.read(&mut head).map_err(self.read_error(member))?;
            sink.0.update(&head[..n]);
            io::copy(&mut reader, &mut sink).map_err(self.read_error(member))?;
            LayerCompression::sniff(&head[..n])
        };
        Ok((sink.0.finish(), size, compression))
    }

    /// Ingests every layer, then records the manifest under `names`.
    fn finish_image(
        &self,
        manifest: Vec<u8>,
        media_type: &str,
        config: Vec<u8>,
        layers: Vec<PendingLayer>,
        names: Vec<String>,
    ) -> Result<ImportedImage, ImportError> {
        let digest = Digest::of(&manifest);
        let paths = &self.store.inner.paths;
        let (limits, ownership) = (self.store.inner.options.limits, self.store.inner.ownership);
        let mut imported = Vec::new();
        for layer in &layers {
            let ingest_error = |source| ImportError::Ingest {
                path: self.path.clone(),
                source,
            };
            let _locks = ingest::lock_layer(paths, &layer.job).map_err(ingest_error)?;
            let have_blob = paths.blob(&layer.job.blob).is_file();
            let have_layer = paths.layer(&layer.job.diff_id).is_dir();
            let mut pulled = LayerPulled {
                blob: layer.job.blob.to_string(),
                diff_id: layer.job.diff_id.to_string(),
                downloaded_bytes: 0,
                unpacked: false,
                warnings: Vec::new(),
            };
            if !(have_blob && have_layer) {
                let (reader, _) = self
                    .source
                    .open(&layer.member)
                    .map_err(self.read_error(&layer.member))?;
                let ingested = ingest::ingest(
                    paths,
                    &layer.job,
                    Incoming::Local(reader),
                    &limits,
                    ownership,
                    self.progress.clone(),
                )
                .map_err(ingest_error)?;
                if !have_blob {
                    pulled.downloaded_bytes = layer.job.size_bytes;
                }
                if let Some(report) = ingested.unpacked {
                    pulled.unpacked = true;
                    pulled.warnings = report.warnings;
                }
            }
            imported.push(pulled);
        }
        let config_digest = Digest::of(&config);
        let record = ManifestRecord {
            digest: digest.clone(),
            media_type: media_type.to_owned(),
            manifest,
            config_digest,
            config,
            layers: layers
                .iter()
                .map(|l| LayerRecord {
                    blob: l.job.blob.clone(),
                    blob_size_bytes: l.job.size_bytes,
                    media_type: l.media_type.clone(),
                    diff_id: l.job.diff_id.clone(),
                })
                .collect(),
        };
        let names = if names.is_empty() {
            vec![digest.to_string()]
        } else {
            names
        };
        self.store
            .record(&record, &names, None)
            .map_err(|source| ImportError::Store {
                path: self.path.clone(),
                source,
            })?;
        Ok(ImportedImage {
            digest: digest.to_string(),
            names,
            layers: imported,
        })
    }

    /// Layers of a manifest, checked against its config's diff ids.
    fn manifest_layers(
        &self,
        manifest: &oci::Manifest,
        config: &ImageConfigFile,
        member: &str,
    ) -> Result<Vec<PendingLayer>, ImportError> {
        let diff_ids = config
            .diff_ids(manifest.layers.len())
            .map_err(self.document_error(member))?;
        manifest
            .layers
            .iter()
            .zip(diff_ids)
            .map(|(layer, diff_id)| {
                let blob = layer
                    .digest()
                    .map_err(|e| self.document_error(member)(DocumentError::Digest(e)))?;
                Ok(PendingLayer {
                    member: Self::blob_member(&blob),
                    job: LayerJob {
                        blob,
                        size_bytes: layer.size,
                        diff_id,
                        compression: LayerCompression::from_media_type(&layer.media_type)
                            .map_err(self.document_error(member))?,
                    },
                    media_type: layer.media_type.clone(),
                })
            })
            .collect()
    }

    fn name_of(&self, text: &str) -> Result<String, ImportError> {
        Reference::parse(text)
            .map(|r| r.record_name())
            .map_err(|source| ImportError::Name {
                path: self.path.clone(),
                name: text.to_owned(),
                source,
            })
    }

    fn oci_layout(&self, tag: Option<&str>) -> Result<Vec<ImportedImage>, ImportError> {
        let index_bytes = self.read_small("index.json")?;
        let Document::Index(index) = Document::parse(&index_bytes, Some(oci::OCI_INDEX))
            .map_err(self.document_error("index.json"))?
        else {
            return Err(self.document_error("index.json")(DocumentError::MediaType(
                "not an index".into(),
            )));
        };
        // Each entry is an image (or an index of them), named by its annotations when they
        // hold a full reference (`io.containerd.image.name`, or a ref.name with `/` or `:`).
        let mut images: Vec<(Descriptor, Vec<String>)> = Vec::new();
        for entry in &index.manifests {
            let mut descriptor = entry.clone();
            if matches!(entry.media_type.as_str(), oci::OCI_INDEX | oci::DOCKER_LIST) {
                let digest = entry
                    .digest()
                    .map_err(|e| self.document_error("index.json")(DocumentError::Digest(e)))?;
                let nested = self.read_verified(&digest)?;
                let member = Self::blob_member(&digest);
                let Document::Index(nested) = Document::parse(&nested, Some(&entry.media_type))
                    .map_err(self.document_error(&member))?
                else {
                    continue;
                };
                match nested.select_linux_amd64() {
                    Ok(chosen) => descriptor = chosen.clone(),
                    Err(_) => continue,
                }
            } else if entry
                .platform
                .as_ref()
                .is_some_and(|p| p.os != "linux" || p.architecture != "amd64")
            {
                continue;
            }
            let mut names = Vec::new();
            for key in [
                "io.containerd.image.name",
                "org.opencontainers.image.ref.name",
            ] {
                if let Some(name) = entry.annotations.get(key)
                    && (name.contains('/') || name.contains(':'))
                    && let Ok(reference) = Reference::parse(name)
                {
                    names.push(reference.record_name());
                    break;
                }
            }
            match images
                .iter_mut()
                .find(|(d, _)| d.digest == descriptor.digest)
            {
                Some((_, existing)) => existing.extend(names),
                None => images.push((descriptor, names)),
            }
        }
        self.apply_tag(&mut images, tag)?;
        let mut imported = Vec::new();
        for (descriptor, names) in images {
            let digest = descriptor
                .digest()
                .map_err(|e| self.document_error("index.json")(DocumentError::Digest(e)))?;
            let member = Self::blob_member(&digest);
            let manifest_bytes = self.read_verified(&digest)?;
            let Document::Manifest(manifest) =
                Document::parse(&manifest_bytes, Some(&descriptor.media_type))
                    .map_err(self.document_error(&member))?
            else {
                continue;
            };
            let config_digest = manifest
                .config
                .digest()
                .map_err(|e| self.document_error(&member)(DocumentError::Digest(e)))?;
            let config_bytes = self.read_verified(&config_digest)?;
            let config = ImageConfigFile::parse(&config_bytes)
                .map_err(self.document_error(&Self::blob_member(&config_digest)))?;
            let layers = self.manifest_layers(&manifest, &config, &member)?;
            let media_type = manifest
                .media_type
                .clone()
                .unwrap_or_else(|| descriptor.media_type.clone());
            imported.push(self.finish_image(
                manifest_bytes,
                &media_type,
                config_bytes,
                layers,
                names,
            )?);
        }
        Ok(imported)
    }

    fn apply_tag<T>(
        &self,
        images: &mut [(T, Vec<String>)],
        tag: Option<&str>,
    ) -> Result<(), ImportError> {
        if images.is_empty() {
            return Err(ImportError::NoImage {
                path: self.path.clone(),
            });
        }
        if let Some(tag) = tag {
            if images.len() != 1 {
                return Err(ImportError::TagAmbiguous {
                    path: self.path.clone(),
                    images: images.len(),
                });
            }
            let name = self.name_of(tag)?;
            images[0].1 = vec![name];
        }
        Ok(())
    }

    fn docker_save(&self, tag: Option<&str>) -> Result<Vec<ImportedImage>, ImportError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        let bytes = self.read_small("manifest.json")?;
        let entries: Vec<Entry> = serde_json::from_slice(&bytes).map_err(|source| {
            self.document_error("manifest.json")(DocumentError::Json {
                what: "docker save manifest",
                source,
            })
        })?;
        let mut images: Vec<(Entry, Vec<String>)> = Vec::new();
        for entry in entries {
            let names = entry
                .repo_tags
                .clone()
                .unwrap_or_default()
                .iter()
                .map(|t| self.name_of(t))
                .collect::<Result<_, _>>()?;
            images.push((entry, names));
        }
        self.apply_tag(&mut images, tag)?;
        let mut imported = Vec::new();
        for (entry, names) in images {
            let config_member = normalise(&entry.config);
            let config_bytes = self.read_small(&config_member)?;
            let config = ImageConfigFile::parse(&config_bytes)
                .map_err(self.document_error(&config_member))?;
            let diff_ids = config
                .diff_ids(entry.layers.len())
                .map_err(self.document_error(&config_member))?;
            let mut layers = Vec::new();
            let mut descriptors = Vec::new();
            for (member, diff_id) in entry.layers.iter().map(|l| normalise(l)).zip(diff_ids) {
                let (blob, size, compression) = self.hash_member(&member, false)?;
                let media_type = compression.oci_media_type().to_owned();
                descriptors.push(serde_json::json!({"mediaType": media_type, "digest": blob.to_string(), "size": size}));
                layers.push(PendingLayer {
                    member,
                    job: LayerJob {
                        blob,
                        size_bytes: size,
                        diff_id,
                        compression,
                    },
                    media_type,
                });
            }
            let manifest = synthesized_manifest(&config_bytes, descriptors);
            imported.push(self.finish_image(
                manifest,
                oci::OCI_MANIFEST,
                config_bytes,
                layers,
                names,
            )?);
        }
        Ok(imported)
    }

    fn rootfs_tarball(
        &self,
        member: &str,
        tag: Option<&str>,
    ) -> Result<Vec<ImportedImage>, ImportError> {
        let (blob, size, compression) = self.hash_member(member, false)?;
        let (diff_id, _, _) = self.hash_member(member, true)?;
        let config = ImageConfigFile {
            architecture: "amd64".into(),
            os: "linux".into(),
            config: Some(oci::RunConfig::default()),
            rootfs: oci::RootFs {
                kind: "layers".into(),
                diff_ids: vec![diff_id.to_string()],
            },
        };
        let config_bytes = serde_json::to_vec(&config).unwrap_or_default();
        let media_type = compression.oci_media_type().to_owned();
        let descriptor =
            serde_json::json!({"mediaType": media_type, "digest": blob.to_string(), "size": size});
        let manifest = synthesized_manifest(&config_bytes, vec![descriptor]);
        let names = tag
            .map(|t| self.name_of(t))
            .transpose()?
            .into_iter()
            .collect();
        let layer = PendingLayer {
            member: member.to_owned(),
            job: LayerJob {
                blob,
                size_bytes: size,
                diff_id,
                compression,
            },
            media_type,
        };
        Ok(vec![self.finish_image(
            manifest,
            oci::OCI_MANIFEST,
            config_bytes,
            vec![layer],
            names,
        )?])
    }
}

/// An OCI manifest for images that arrive without one (docker save, rootfs tarballs).
pub(crate) fn synthesized_manifest(config: &[u8], layers: Vec<serde_json::Value>) -> Vec<u8> {
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": oci::OCI_MANIFEST,
        "config": {"mediaType": oci::OCI_CONFIG, "digest": Digest::of(config).to_string(), "size": config.len()},
        "layers": layers,
    });
    serde_json::to_vec(&manifest).unwrap_or_default()
}

impl ImageStore {
    /// Imports a docker-save archive, an OCI layout (directory or tar) or a plain rootfs
    /// tarball from `path`. Blocking; safe beside pulls and other imports.
    pub fn import(
        &self,
        path: &Path,
        options: &ImportOptions,
        progress: Option<ProgressFn>,
    ) -> Result<ImportReport, ImportError> {
        let store_error = |source| ImportError::Store {
            path: path.to_path_buf(),
            source,
        };
        let _lock = self.store_lock(false).map_err(store_error)?;
        let read_error = |source| ImportError::Read {
            path: path.to_path_buf(),
            member: path.display().to_string(),
            source,
        };
        let tag = options.tag.as_deref();
        if path.is_dir() {
            let importer = Importer {
                store: self,
                path: path.to_path_buf(),
                source: Source::Dir(path.to_path_buf()),
                progress,
            };
            if !importer.source.exists("oci-layout") || !importer.source.exists("index.json") {
                return Err(ImportError::NotLayout {
                    path: path.to_path_buf(),
                });
            }
            return Ok(ImportReport {
                kind: ImportKind::OciLayout,
                images: importer.oci_layout(tag)?,
            });
        }
        // A compressed file is looked into through a decompressed copy.
        let mut head = [0u8; 4];
        let n = File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .map_err(read_error)?;
        let compressed = LayerCompression::sniff(&head[..n]) != LayerCompression::None;
        let scratch = self.inner.paths.tmp().join(format!(
            "import-{}-{}.tar",
            std::process::id(),
            Digest::of(path.as_os_str().as_encoded_bytes()).short()
        ));
        let cleanup = Cleanup(compressed.then(|| scratch.clone()));
        let tar_path = if compressed {
            let mut input = BufReader::new(File::open(path).map_err(read_error)?);
            let mut stream =
                Decompressed::new(&mut input, LayerCompression::None).map_err(read_error)?;
            let mut out = File::create(&scratch).map_err(read_error)?;
            io::copy(&mut stream, &mut out).map_err(read_error)?;
            scratch.clone()
        } else {
            path.to_path_buf()
        };
        let scanned = Source::scan_tar(&tar_path).map_err(|source| ImportError::NotArchive {
            path: path.to_path_buf(),
            source,
        })?;
        let importer = Importer {
            store: self,
            path: path.to_path_buf(),
            source: scanned,
            progress,
        };
        let report = if importer.source.exists("oci-layout") && importer.source.exists("index.json")
        {
            ImportReport {
                kind: ImportKind::OciLayout,
                images: importer.oci_layout(tag)?,
            }
        } else if importer.source.exists("manifest.json") {
            ImportReport {
                kind: ImportKind::DockerSave,
                images: importer.docker_save(tag)?,
            }
        } else {
            // The rootfs blob is the file as given (compressed or not), not the scratch copy.
            let whole = Importer {
                store: self,
                path: path.to_path_buf(),
                source: Source::Dir(path.parent().unwrap_or(Path::new("/")).to_path_buf()),
                progress: importer.progress.clone(),
            };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            ImportReport {
                kind: ImportKind::RootfsTarball,
                images: whole.rootfs_tarball(&name, tag)?,
            }
        };
        drop(cleanup);
        Ok(report)
    }
}

/// Removes the decompressed copy however the import ends.
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}
