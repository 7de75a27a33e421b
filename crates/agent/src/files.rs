//! envd's plain-HTTP file transfer: `GET /files?path=` streams a file, `POST /files?path=`
//! writes one (raw `application/octet-stream` body) or several (`multipart/form-data`, parts
//! named `file`) as the body arrives, creating parents and overwriting.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Response, StatusCode, header};
use serde_json::json;

use crate::connect::{ERRNO_HEADER, HttpResponse, ResponseBody, caller_errno, full};
use crate::multipart::{Multipart, Part};
use crate::user::User;

const FILE_CHUNK_BYTES: usize = 64 * 1024;
/// What a download's buffer holds: hyper may still hold the last chunk or two when it asks for
/// the next.
const FILE_BUFFER_BYTES: usize = 8 * FILE_CHUNK_BYTES;

/// A file streamed as a response body, read chunk by chunk when hyper asks for more.
#[derive(Debug)]
pub struct FileBody {
    file: Option<File>,
    /// Room for a few chunks, read into and split off one by one, so that the body makes one
    /// allocation per [`FILE_BUFFER_BYTES`], or none once hyper has dropped every chunk of it.
    /// An allocation per chunk is cheap with glibc's allocator, but musl's maps and unmaps
    /// memory for each (a download ran 30% slower).
    buf: BytesMut,
}

impl FileBody {
    fn new(file: File) -> FileBody {
        FileBody {
            file: Some(file),
            buf: BytesMut::new(),
        }
    }

    /// The next chunk, or `None` at end of file (a read error also ends the body).
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        let file = self.file.as_mut()?;
        self.buf.clear();
        if self.buf.capacity() < FILE_CHUNK_BYTES {
            self.buf.reserve(FILE_BUFFER_BYTES);
        }
        self.buf.resize(FILE_CHUNK_BYTES, 0);
        match file.read(&mut self.buf) {
            Ok(n) if n > 0 => Some(self.buf.split_to(n).freeze()),
            Ok(_) => {
                self.file = None;
                None
            }
            Err(e) => {
                crate::log_line!("airlock-agent: reading a file for GET /files failed: {e}");
                self.file = None;
                None
            }
        }
    }
}

/// envd's error body for the plain-HTTP endpoints: `{"message","code"}`.
pub fn http_error(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    let message = message.into();
    full(
        status,
        "application/json",
        json!({"message": message, "code": status.as_u16()}).to_string(),
    )
}

/// `GET /files`.
pub fn download(path: Option<&str>, user: &User) -> HttpResponse {
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return http_error(
            StatusCode::BAD_REQUEST,
            "the path query parameter is required",
        );
    };
    let path = user.resolve(path);
    // Open first and check the type of what was opened, never of the path: the workload can
    // swap a FIFO in between, and opening one without O_NONBLOCK would block the agent's only
    // thread. O_NONBLOCK changes nothing for the regular file that is then read.
    let file = match open_nonblocking(&path, std::fs::OpenOptions::new().read(true)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return http_error(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", path.display()),
            );
        }
        Err(e) => {
            return UploadError::io(&e, &format!("cannot open '{}'", path.display())).response();
        }
    };
    match file.metadata() {
        Ok(m) if m.is_dir() => is_a_directory(&path).response(),
        Ok(m) if !m.is_file() => http_error(
            StatusCode::BAD_REQUEST,
            format!("path '{}' is not a regular file", path.display()),
        ),
        Ok(_) => {
            let mut response = Response::new(ResponseBody::File(FileBody::new(file)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/octet-stream"),
            );
            response
        }
        Err(e) => UploadError::io(&e, &format!("cannot open '{}'", path.display())).response(),
    }
}

/// Opens `path` with `options` plus `O_NONBLOCK | O_NOCTTY`: neither a FIFO nor a terminal
/// can block or adopt the agent. Callers check the type of the opened file.
fn open_nonblocking(path: &Path, options: &mut std::fs::OpenOptions) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    options
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// envd's statuses (507 for a full disk, which the E2B SDKs raise as "not enough space"),
/// and the caller's mistakes as 4xx: a read-only or denied path 403, the file-size limit 413.
fn io_status(err: &std::io::Error) -> StatusCode {
    use std::io::ErrorKind as K;
    match err.kind() {
        K::NotFound => StatusCode::NOT_FOUND,
        K::PermissionDenied | K::ReadOnlyFilesystem => StatusCode::FORBIDDEN,
        K::StorageFull | K::QuotaExceeded => StatusCode::INSUFFICIENT_STORAGE,
        K::FileTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        K::IsADirectory | K::NotADirectory | K::InvalidInput | K::InvalidFilename => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A failed transfer: what to answer.
struct UploadError {
    status: StatusCode,
    message: String,
    errno: Option<&'static str>,
}

impl UploadError {
    fn new(status: StatusCode, message: impl Into<String>) -> UploadError {
        UploadError {
            status,
            message: message.into(),
            errno: None,
        }
    }

    fn io(err: &std::io::Error, what: &str) -> UploadError {
        UploadError {
            errno: caller_errno(err),
            ..UploadError::new(io_status(err), format!("{what}: {err}"))
        }
    }

    fn response(self) -> HttpResponse {
        let mut response = http_error(self.status, self.message);
        if let Some(errno) = self.errno {
            response
                .headers_mut()
                .insert(ERRNO_HEADER, header::HeaderValue::from_static(errno));
        }
        response
    }
}

/// envd's 400 for a directory where a file is wanted; `EISDIR` tells the daemon it is a
/// conflict with what exists, not a malformed request.
fn is_a_directory(path: &Path) -> UploadError {
    UploadError {
        errno: Some("EISDIR"),
        ..UploadError::new(
            StatusCode::BAD_REQUEST,
            format!("path '{}' is a directory", path.display()),
        )
    }
}

fn open_target(path: &Path) -> Result<File, UploadError> {
    let not_regular = || {
        UploadError::new(
            StatusCode::BAD_REQUEST,
            format!("path '{}' exists and is not a regular file", path.display()),
        )
    };
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(is_a_directory(path));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| UploadError::io(&e, &format!("cannot create '{}'", parent.display())))?;
    }
    // Opened without truncating, and without blocking on a FIFO swapped in by the workload
    // (ENXIO when nobody reads it); only a regular file is then truncated and written.
    let file = open_nonblocking(path, std::fs::OpenOptions::new().write(true).create(true))
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => not_regular(),
            _ => UploadError::io(&e, &format!("cannot create '{}'", path.display())),
        })?;
    match file.metadata() {
        Ok(m) if m.is_dir() => Err(is_a_directory(path)),
        Ok(m) if !m.is_file() => Err(not_regular()),
        Ok(_) => {
            file.set_len(0).map_err(|e| {
                UploadError::io(&e, &format!("cannot truncate '{}'", path.display()))
            })?;
            Ok(file)
        }
        Err(e) => Err(UploadError::io(
            &e,
            &format!("cannot create '{}'", path.display()),
        )),
    }
}

fn write_chunk(file: &mut File, path: &Path, data: &[u8]) -> Result<(), UploadError> {
    file.write_all(data)
        .map_err(|e| UploadError::io(&e, &format!("cannot write '{}'", path.display())))
}

fn written_entry(path: &Path) -> serde_json::Value {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    json!({"path": path.to_string_lossy(), "name": name, "type": "file"})
}

/// After an early answer: reads away at most 64 MiB of the rest of a body, for at most 10 s.
async fn discard_rest(mut body: Incoming) {
    let discard = async {
        let mut left: u64 = 64 << 20;
        while let Some(Ok(frame)) = body.frame().await {
            let len = frame.data_ref().map_or(0, |d| d.len() as u64);
            left = match left.checked_sub(len) {
                Some(left) => left,
                None => return,
            };
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), discard).await;
}

/// Reads and discards the rest of a request body (keep-alive safety).
pub async fn drain(body: &mut Incoming) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return;
        }
    }
}

/// `POST /files`.
pub async fn upload(
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    path: Option<&str>,
    user: &User,
    mut body: Incoming,
) -> HttpResponse {
    let path = path.filter(|p| !p.is_empty()).map(|p| user.resolve(p));
    if let Some(encoding) = content_encoding.filter(|e| !e.eq_ignore_ascii_case("identity")) {
        drain(&mut body).await;
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Encoding '{encoding}' is not supported; send identity"),
        );
    }
    let media = content_type
        .and_then(|ct| ct.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let result = if media == "multipart/form-data" {
        match content_type.and_then(boundary_of) {
            Some(boundary) => upload_multipart(&boundary, path, user, &mut body).await,
            None => Err(UploadError::new(
                StatusCode::BAD_REQUEST,
                "multipart/form-data without a boundary parameter",
            )),
        }
    } else {
        match path {
            Some(path) => upload_raw(&path, &mut body).await,
            None => Err(UploadError::new(
                StatusCode::BAD_REQUEST,
                "the path query parameter is required for a raw upload",
            )),
        }
    };
    match result {
        // Whatever follows the last part (the closing boundary may come in a frame of its
        // own) is read before the answer: a client still writing it must not meet a closed
        // connection.
        Ok(written) => {
            drain(&mut body).await;
            full(
                StatusCode::OK,
                "application/json",
                json!(written).to_string(),
            )
        }
        // Answered at once, not after reading a body that will never be written, and the
        // connection is not reused. The rest is read away beside the answer (bounded), so that
        // a client still sending sees the answer, not a broken pipe.
        Err(error) => {
            let mut response = error.response();
            if !hyper::body::Body::is_end_stream(&body) {
                response.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
                tokio::spawn(discard_rest(body));
            }
            response
        }
    }
}

fn boundary_of(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (key, value) = param.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty())
    })
}

async fn next_data(body: &mut Incoming) -> Result<Option<Bytes>, UploadError> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => {
                return Err(UploadError::new(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body failed: {e}"),
                ));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

async fn upload_raw(
    path: &Path,
    body: &mut Incoming,
) -> Result<Vec<serde_json::Value>, UploadError> {
    let mut file = open_target(path)?;
    while let Some(data) = next_data(body).await? {
        write_chunk(&mut file, path, &data)?;
    }
    Ok(vec![written_entry(path)])
}

async fn upload_multipart(
    boundary: &str,
    path: Option<PathBuf>,
    user: &User,
    body: &mut Incoming,
) -> Result<Vec<serde_json::Value>, UploadError> {
    let bad = |message: String| UploadError::new(StatusCode::BAD_REQUEST, message);
    let mut parser = Multipart::new(boundary);
    let mut written = Vec::new();
    let mut current: Option<(File, PathBuf)> = None;
    let mut query_path = path;
    let mut finished = false;
    while !finished {
        let data = next_data(body).await?;
        match &data {
            Some(d) => parser.push(d),
            None => parser.finish(),
        }
        while let Some(part) = parser.next_part().map_err(|e| bad(e.to_string()))? {
            match part {
                Part::Start { name, filename } => {
                    if name != "file" {
                        current = None;
                        continue;
                    }
                    // The query path names the first file; the others are named by filename.
                    let target = match (query_path.take(), filename) {
                        (Some(path), _) => path,
                        (None, Some(filename)) if !filename.is_empty() => user.resolve(&filename),
                        (None, _) => {
                            return Err(bad(
                                "a file part has no filename and no path was given".into()
                            ));
                        }
                    };
                    current = Some((open_target(&target)?, target));
                }
                Part::Data(bytes) => {
                    if let Some((file, target)) = current.as_mut() {
                        write_chunk(file, target, &bytes)?;
                    }
                }
                Part::End => {
                    if let Some((_, target)) = current.take() {
                        written.push(written_entry(&target));
                    }
                }
                Part::Done => finished = true,
            }
        }
        if data.is_none() && !finished {
            return Err(bad(
                "the multipart body ended before its closing boundary".into()
            ));
        }
    }
    Ok(written)
}
