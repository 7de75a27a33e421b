//! File contexts of `COPY` steps: a tar (or tar.gz, told apart by its magic bytes) uploaded
//! under the hash its `COPY` names, streamed to disk (at most `--max-upload-bytes`), then
//! decompressed and published under its final name only once complete, so a cut upload
//! leaves nothing a build could use. The hash is the client's key (E2B's SDK hashes the
//! files' paths, modes and contents), not checked against the bytes; anyone with an API key
//! may upload, as anyone with one may build.

use std::io::BufReader;
use std::path::PathBuf;

use airlock_api::v1::{ErrorCode, TemplateFiles};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;

use crate::error::ApiError;
use crate::http::too_large;
use crate::lifecycle::Daemon;

const FILES_DIR: &str = "files";

/// Whether `hash` is lower-case hex SHA-256.
pub fn is_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn io_error(action: &str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ApiError {
    let message = format!("cannot {action} {}", path.display());
    move |e| ApiError::internal(format!("{message}: {e}"))
}

/// Streams a request body into a new file at `path`, at most `limit` bytes (413 past it).
pub(crate) async fn save_body(
    mut body: Incoming,
    path: &std::path::Path,
    limit: u64,
) -> Result<u64, ApiError> {
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(io_error("create", path))?;
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("the upload broke off: {e}")))?;
        if let Ok(data) = frame.into_data() {
            total += data.len() as u64;
            if total > limit {
                return Err(too_large(limit));
            }
            file.write_all(&data)
                .await
                .map_err(io_error("write", path))?;
        }
    }
    file.flush().await.map_err(io_error("write", path))?;
    Ok(total)
}

impl Daemon {
    /// Where the uploaded files of `hash` are kept (a plain tar).
    pub fn files_path(&self, hash: &str) -> PathBuf {
        self.config
            .builds_dir()
            .join(FILES_DIR)
            .join(format!("{hash}.tar"))
    }

    /// The stored files of `hash`, if they were uploaded.
    pub fn files(&self, hash: &str) -> Option<TemplateFiles> {
        let meta = std::fs::metadata(self.files_path(hash)).ok()?;
        Some(TemplateFiles {
            hash: hash.to_owned(),
            size_bytes: meta.len(),
        })
    }

    /// Stores an upload of `hash`'s files.
    pub async fn store_files(&self, hash: &str, body: Incoming) -> Result<TemplateFiles, ApiError> {
        if !is_hash(hash) {
            return Err(ApiError::invalid(format!(
                "{hash:?} is not a files hash (64 lower-case hex digits)"
            )));
        }
        let dir = self.config.builds_dir().join(FILES_DIR);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(io_error("create", &dir))?;
        let sequence = crate::auth::hex(
            &crate::auth::random_bytes::<6>()
                .map_err(|e| ApiError::from_chain(ErrorCode::Internal, &e))?,
        );
        let raw = dir.join(format!("{hash}.{sequence}.upload"));
        let partial = dir.join(format!("{hash}.{sequence}.partial"));
        let cleanup = || {
            let _ = std::fs::remove_file(&raw);
            let _ = std::fs::remove_file(&partial);
        };
        if let Err(err) = save_body(body, &raw, self.config.max_upload_bytes).await {
            cleanup();
            return Err(err);
        }
        let (from, to, final_path) = (raw.clone(), partial.clone(), self.files_path(hash));
        let published = tokio::task::spawn_blocking(move || -> Result<(), ApiError> {
            let input = std::fs::File::open(&from).map_err(io_error("open", &from))?;
            let mut reader = BufReader::new(input);
            let mut plain = airlock_image::layer::Decompressed::new(
                &mut reader,
                airlock_image::oci::LayerCompression::None,
            )
            .map_err(|e| ApiError::invalid(format!("the upload is not readable: {e}")))?;
            let mut out = std::fs::File::create(&to).map_err(io_error("create", &to))?;
            std::io::copy(&mut plain, &mut out).map_err(|e| {
                ApiError::invalid(format!("the upload cannot be decompressed: {e}"))
            })?;
            // It must be a tar: refuse anything else now rather than at the COPY.
            airlock_image::tarball::check_tar(&to)
                .map_err(|e| ApiError::invalid(format!("the upload is not a tar archive: {e}")))?;
            std::fs::rename(&to, &final_path).map_err(io_error("publish", &final_path))
        })
        .await
        .map_err(|e| ApiError::internal(format!("the upload task failed: {e}")));
        cleanup();
        published??;
        self.files(hash)
            .ok_or_else(|| ApiError::internal("the upload vanished after it was stored"))
    }
}
