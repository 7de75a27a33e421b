//! The OCI image and Docker v2 schema 2 documents the store reads: indexes, manifests and
//! configs. Foreign documents: unknown fields are ignored (registries add their own), but
//! every field the store relies on is checked.

use std::collections::BTreeMap;

use airlock_api::ImageConfig;
use serde::{Deserialize, Serialize};

use crate::digest::{Digest, DigestError};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// What a registry may answer a manifest request with, best first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

/// The largest manifest, index or config the store reads (they are held in memory).
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;

/// Why a document was refused.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("{what} is not valid JSON of the expected shape")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("unsupported manifest media type `{0}` (Docker schema 1 and others are not supported)")]
    MediaType(String),
    #[error("manifest has schemaVersion {0}, expected 2")]
    SchemaVersion(u32),
    #[error("descriptor digest")]
    Digest(#[from] DigestError),
    #[error(
        "layer media type `{0}` is not a tar layer (foreign and non-distributable layers are refused)"
    )]
    LayerMediaType(String),
    #[error("the index has no linux/amd64 image (it offers {0})")]
    NoPlatform(String),
    #[error("the config lists {diff_ids} diff ids for {layers} layers")]
    LayerCount { layers: usize, diff_ids: usize },
    #[error("the image is for {os}/{architecture}, not linux/amd64")]
    Platform { os: String, architecture: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    pub fn digest(&self) -> Result<Digest, DigestError> {
        Digest::parse(&self.digest)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image index or Docker manifest list.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    #[serde(default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

/// An image manifest (OCI or Docker v2 schema 2).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// A manifest or an index, told apart by media type (the body's, else the response's).
#[derive(Debug, Clone)]
pub enum Document {
    Index(Index),
    Manifest(Manifest),
}

impl Document {
    pub fn parse(body: &[u8], content_type: Option<&str>) -> Result<Document, DocumentError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            #[serde(default)]
            media_type: Option<String>,
            #[serde(default)]
            manifests: Option<serde_json::Value>,
        }
        let probe: Probe = serde_json::from_slice(body).map_err(|source| DocumentError::Json {
            what: "manifest",
            source,
        })?;
        let media_type = probe
            .media_type
            .or_else(|| content_type.map(|t| t.split(';').next().unwrap_or("").trim().to_owned()))
            .filter(|t| !t.is_empty() && t != "application/json");
        let is_index = match media_type.as_deref() {
            Some(OCI_INDEX | DOCKER_LIST) => true,
            Some(OCI_MANIFEST | DOCKER_MANIFEST) => false,
            Some(other) => return Err(DocumentError::MediaType(other.to_owned())),
            None => probe.manifests.is_some(),
        };
        if is_index {
            let index = serde_json::from_slice(body).map_err(|source| DocumentError::Json {
                what: "image index",
                source,
            })?;
            return Ok(Document::Index(index));
        }
        let manifest: Manifest =
            serde_json::from_slice(body).map_err(|source| DocumentError::Json {
                what: "manifest",
                source,
            })?;
        if manifest.schema_version != 2 {
            return Err(DocumentError::SchemaVersion(manifest.schema_version));
        }
        manifest.config.digest()?;
        for layer in &manifest.layers {
            layer.digest()?;
            LayerCompression::from_media_type(&layer.media_type)?;
        }
        Ok(Document::Manifest(manifest))
    }
}

impl Index {
    /// The linux/amd64 entry (attestations, which name `unknown/unknown`, never match).
    pub fn select_linux_amd64(&self) -> Result<&Descriptor, DocumentError> {
        self.manifests
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
            })
            .ok_or_else(|| {
                let offered: Vec<String> = self
                    .manifests
                    .iter()
                    .map(|d| {
                        d.platform.as_ref().map_or("no platform".to_owned(), |p| {
                            format!("{}/{}", p.os, p.architecture)
                        })
                    })
                    .collect();
                DocumentError::NoPlatform(if offered.is_empty() {
                    "nothing".to_owned()
                } else {
                    offered.join(", ")
                })
            })
    }
}

/// What a layer's media type says about its compression (the bytes have the last word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerCompression {
    None,
    Gzip,
    Zstd,
}

impl LayerCompression {
    pub fn from_media_type(media_type: &str) -> Result<LayerCompression, DocumentError> {
        Ok(match media_type {
            OCI_LAYER_TAR | "application/vnd.docker.image.rootfs.diff.tar" => {
                LayerCompression::None
            }
            OCI_LAYER_GZIP | "application/vnd.docker.image.rootfs.diff.tar.gzip" => {
                LayerCompression::Gzip
            }
            OCI_LAYER_ZSTD | "application/vnd.docker.image.rootfs.diff.tar.zstd" => {
                LayerCompression::Zstd
            }
            other => return Err(DocumentError::LayerMediaType(other.to_owned())),
        })
    }

    /// The OCI media type for a layer stored with this compression.
    pub fn oci_media_type(self) -> &'static str {
        match self {
            LayerCompression::None => OCI_LAYER_TAR,
            LayerCompression::Gzip => OCI_LAYER_GZIP,
            LayerCompression::Zstd => OCI_LAYER_ZSTD,
        }
    }

    /// From the first bytes of a blob: gzip `1f 8b`, zstd `28 b5 2f fd`, else `None`.
    pub fn sniff(head: &[u8]) -> LayerCompression {
        if head.starts_with(&[0x1f, 0x8b]) {
            LayerCompression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            LayerCompression::Zstd
        } else {
            LayerCompression::None
        }
    }
}

/// The image config, as far as the store uses it.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ImageConfigFile {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<RunConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// The OCI config's `config` object (Docker's capitalised names).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct RunConfig {
    #[serde(rename = "Env", default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(
        rename = "WorkingDir",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(
        rename = "Entrypoint",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

impl ImageConfigFile {
    pub fn parse(body: &[u8]) -> Result<ImageConfigFile, DocumentError> {
        serde_json::from_slice(body).map_err(|source| DocumentError::Json {
            what: "image config",
            source,
        })
    }

    /// The diff ids, checked against the manifest's layer count and the platform.
    pub fn diff_ids(&self, layers: usize) -> Result<Vec<Digest>, DocumentError> {
        if !self.os.is_empty() && (self.os != "linux" || self.architecture != "amd64") {
            return Err(DocumentError::Platform {
                os: self.os.clone(),
                architecture: self.architecture.clone(),
            });
        }
        if self.rootfs.diff_ids.len() != layers {
            return Err(DocumentError::LayerCount {
                layers,
                diff_ids: self.rootfs.diff_ids.len(),
            });
        }
        Ok(self
            .rootfs
            .diff_ids
            .iter()
            .map(|d| Digest::parse(d))
            .collect::<Result<_, _>>()?)
    }

    /// What the container tier applies at start.
    pub fn image_config(&self) -> ImageConfig {
        let run = self.config.clone().unwrap_or_default();
        let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
        ImageConfig {
            env: run.env.unwrap_or_default(),
            working_dir: nonempty(run.working_dir),
            user: nonempty(run.user),
            entrypoint: run.entrypoint.unwrap_or_default(),
            cmd: run.cmd.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(media_type: &str, data: &[u8]) -> serde_json::Value {
        serde_json::json!({"mediaType": media_type, "digest": Digest::of(data).to_string(), "size": data.len()})
    }

    #[test]
    fn test_document_index_selects_linux_amd64() {
        let body = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": Digest::of(b"arm").to_string(), "size": 3,
                 "platform": {"os": "linux", "architecture": "arm64"}},
                {"mediaType": OCI_MANIFEST, "digest": Digest::of(b"amd").to_string(), "size": 3,
                 "platform": {"os": "linux", "architecture": "amd64"}},
            ]
        });
        let Document::Index(index) = Document::parse(body.to_string().as_bytes(), None).unwrap()
        else {
            panic!("not an index");
        };
        assert_eq!(
            index.select_linux_amd64().unwrap().digest,
            Digest::of(b"amd").to_string()
        );
    }

    #[test]
    fn test_document_manifest_media_type_from_header() {
        let body = serde_json::json!({
            "schemaVersion": 2,
            "config": descriptor(DOCKER_CONFIG, b"{}"),
            "layers": [descriptor("application/vnd.docker.image.rootfs.diff.tar.gzip", b"l")],
        });
        let doc = Document::parse(body.to_string().as_bytes(), Some(DOCKER_MANIFEST)).unwrap();
        assert!(matches!(doc, Document::Manifest(m) if m.layers.len() == 1));
    }

    #[test]
    fn test_document_foreign_layer_and_schema1_refused() {
        let body = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, b"{}"),
            "layers": [descriptor("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", b"l")],
        });
        assert!(matches!(
            Document::parse(body.to_string().as_bytes(), None),
            Err(DocumentError::LayerMediaType(_))
        ));
        let v1 = br#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
        assert!(
            Document::parse(
                v1,
                Some("application/vnd.docker.distribution.manifest.v1+prettyjws")
            )
            .is_err()
        );
    }

    #[test]
    fn test_config_run_fields_mapped() {
        let config = ImageConfigFile::parse(
            br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"/w","User":"1:2","Cmd":["sh"]},
                "rootfs":{"type":"layers","diff_ids":[]}}"#,
        )
        .unwrap();
        let image = config.image_config();
        assert_eq!(image.env, vec!["A=1"]);
        assert_eq!(image.working_dir.as_deref(), Some("/w"));
        assert_eq!(image.user.as_deref(), Some("1:2"));
        assert_eq!(image.cmd, vec!["sh"]);
        assert!(image.entrypoint.is_empty());
        assert!(config.diff_ids(1).is_err());
    }
}
