//! The client's image and template calls (`/v1/images`, `/v1/templates`, `/v1/builds`,
//! `/v1/template-files`).

use std::marker::PhantomData;
use std::path::Path;

use airlock_api::v1::{
    BuildLogEntry, BuildTemplateRequest, ImageDetails, ImageList, ImageSummary, ImportResponse,
    PruneResponse, PullEvent, PullImageRequest, RemovedImage, Template, TemplateBuild,
    TemplateFiles,
};
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::Method;
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

use super::{Client, ClientError};
use crate::http::{encode_query_value, path_encode};

/// An NDJSON answer, one value at a time (a pull's progress, a build's log).
#[derive(Debug)]
pub struct Lines<T> {
    body: Incoming,
    buffer: BytesMut,
    kind: PhantomData<T>,
}

impl<T: DeserializeOwned> Lines<T> {
    fn new(body: Incoming) -> Lines<T> {
        Lines {
            body,
            buffer: BytesMut::new(),
            kind: PhantomData,
        }
    }

    /// The next value; `None` when the answer ends.
    pub async fn next(&mut self) -> Result<Option<T>, ClientError> {
        loop {
            if let Some(newline) = self.buffer.iter().position(|&b| b == b'\n') {
                let line = self.buffer.split_to(newline + 1);
                let value = serde_json::from_slice(&line[..newline])
                    .map_err(|e| ClientError::Protocol(format!("bad NDJSON line: {e}")))?;
                return Ok(Some(value));
            }
            match self.body.frame().await {
                None if self.buffer.is_empty() => return Ok(None),
                None => {
                    return Err(ClientError::Protocol("the answer ended mid-line".into()));
                }
                Some(Err(err)) => return Err(ClientError::Http(err)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

impl Client {
    pub async fn images(&self) -> Result<Vec<ImageSummary>, ClientError> {
        let list: ImageList = self.call(Method::GET, "/v1/images", None::<&()>).await?;
        Ok(list.images)
    }

    pub async fn inspect_image(&self, reference: &str) -> Result<ImageDetails, ClientError> {
        let path = format!("/v1/images/{}", path_encode(reference));
        self.call(Method::GET, &path, None::<&()>).await
    }

    pub async fn remove_image(&self, reference: &str) -> Result<Vec<String>, ClientError> {
        let path = format!("/v1/images/{}", path_encode(reference));
        let removed: RemovedImage = self.call(Method::DELETE, &path, None::<&()>).await?;
        Ok(removed.names)
    }

    pub async fn prune_images(&self) -> Result<PruneResponse, ClientError> {
        self.call(Method::POST, "/v1/images/prune", None::<&()>)
            .await
    }

    /// Starts a pull; its progress, then one `done` or `error`, arrive on the stream.
    pub async fn pull_image(
        &self,
        request: &PullImageRequest,
    ) -> Result<Lines<PullEvent>, ClientError> {
        let response = self
            .call_raw(Method::POST, "/v1/images/pull", Some(request))
            .await?;
        Ok(Lines::new(response.into_body()))
    }

    /// Uploads the archive at `path` (a docker-save archive, an OCI layout tar or a rootfs
    /// tarball) into the daemon's store.
    pub async fn import_image(
        &self,
        path: &Path,
        tag: Option<&str>,
    ) -> Result<ImportResponse, ClientError> {
        let query = tag.map_or_else(String::new, |t| format!("?tag={}", encode_query_value(t)));
        self.put_file(Method::POST, &format!("/v1/images/import{query}"), path)
            .await
    }

    pub async fn build_template(
        &self,
        request: &BuildTemplateRequest,
    ) -> Result<TemplateBuild, ClientError> {
        self.call(Method::POST, "/v1/templates", Some(request))
            .await
    }

    pub async fn template(&self, name: &str) -> Result<Template, ClientError> {
        let path = format!("/v1/templates/{}", path_encode(name));
        self.call(Method::GET, &path, None::<&()>).await
    }

    pub async fn delete_template(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/v1/templates/{}", path_encode(name));
        self.call_raw(Method::DELETE, &path, None::<&()>)
            .await
            .map(drop)
    }

    pub async fn build(&self, id: &str) -> Result<TemplateBuild, ClientError> {
        let path = format!("/v1/builds/{}", path_encode(id));
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// A build's log from `offset`; with `follow` the stream goes on until the build ends.
    pub async fn build_logs(
        &self,
        id: &str,
        offset: u64,
        follow: bool,
    ) -> Result<Lines<BuildLogEntry>, ClientError> {
        let path = format!(
            "/v1/builds/{}/logs?offset={offset}&follow={follow}",
            path_encode(id)
        );
        let response = self.call_raw(Method::GET, &path, None::<&()>).await?;
        Ok(Lines::new(response.into_body()))
    }

    /// The uploaded files of `hash`, if the daemon has them.
    pub async fn template_files(&self, hash: &str) -> Result<Option<TemplateFiles>, ClientError> {
        let path = format!("/v1/template-files/{}", path_encode(hash));
        match self.call(Method::GET, &path, None::<&()>).await {
            Ok(files) => Ok(Some(files)),
            Err(err) if err.code() == Some(airlock_api::v1::ErrorCode::NotFound) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Uploads the tar at `path` as the files of `hash`.
    pub async fn put_template_files(
        &self,
        hash: &str,
        path: &Path,
    ) -> Result<TemplateFiles, ClientError> {
        let uri = format!("/v1/template-files/{}", path_encode(hash));
        self.put_file(Method::PUT, &uri, path).await
    }

    /// Streams a local file as a request body; decodes the JSON answer.
    async fn put_file<T: DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
        path: &Path,
    ) -> Result<T, ClientError> {
        let file = tokio::fs::File::open(path).await.map_err(ClientError::Io)?;
        let length = file.metadata().await.map_err(ClientError::Io)?.len();
        self.put_stream(method, uri, file, Some(length)).await
    }
}
