//! Directory watchers on inotify: the polling API (CreateWatcher, GetWatcherEvents,
//! RemoveWatcher) and the streaming `WatchDir`. A recursive watch also watches every
//! subdirectory, including those created later.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use airlock_jail::inotify::{self, Inotify};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::connect::{self, Code, RpcError, RpcResult};
use crate::filesystem::{Names, entry_info};
use crate::process::StreamOptions;
use crate::user::User;
use crate::wire::non_empty;

/// Events kept for a polling watcher between two GetWatcherEvents calls; later ones are
/// dropped (and logged).
const MAX_BUFFERED_EVENTS: usize = 10_000;

const WATCH_MASK: u32 = inotify::CREATE
    | inotify::MODIFY
    | inotify::DELETE
    | inotify::MOVED_FROM
    | inotify::MOVED_TO
    | inotify::ATTRIB
    | inotify::DELETE_SELF
    | inotify::MOVE_SELF
    | inotify::ONLYDIR;

// Proto3 JSON requests: unknown fields are ignored on purpose (no deny_unknown_fields).

#[derive(Debug, Deserialize)]
pub struct WatchRequest {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default, alias = "include_entry")]
    #[serde(rename = "includeEntry")]
    include_entry: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct WatcherIdRequest {
    #[serde(default, alias = "watcher_id")]
    #[serde(rename = "watcherId")]
    watcher_id: Option<String>,
}

/// Where a watcher's events go.
#[derive(Debug, Clone)]
enum Sink {
    Buffer(Arc<Mutex<VecDeque<serde_json::Value>>>),
    Stream(mpsc::Sender<serde_json::Value>),
}

#[derive(Debug)]
struct PollWatcher {
    events: Arc<Mutex<VecDeque<serde_json::Value>>>,
    task: JoinHandle<()>,
}

/// The polling watchers by id.
#[derive(Debug, Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, PollWatcher>>,
    next_id: AtomicU64,
}

/// One inotify instance and which directory each watch descriptor stands for.
struct Watch {
    fd: pipe::Receiver,
    /// The same inotify instance, for adding watches.
    control: File,
    root: PathBuf,
    recursive: bool,
    include_entry: bool,
    /// wd → directory relative to the root ("" for the root).
    dirs: HashMap<i32, PathBuf>,
}

impl Watch {
    fn open(root: PathBuf, recursive: bool, include_entry: bool) -> RpcResult<Watch> {
        match std::fs::metadata(&root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RpcError::new(
                    Code::NotFound,
                    format!("path '{}' does not exist", root.display()),
                ));
            }
            Err(e) => {
                return Err(RpcError::from_io(
                    &e,
                    &format!("cannot watch '{}'", root.display()),
                ));
            }
            Ok(m) if !m.is_dir() => {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("path '{}' is not a directory", root.display()),
                ));
            }
            Ok(_) => {}
        }
        let instance = Inotify::new()
            .map_err(|e| RpcError::from_io(&e, "cannot create an inotify instance"))?;
        let control = instance.into_file();
        let reader = control
            .try_clone()
            .and_then(pipe::Receiver::from_file_unchecked)
            .map_err(|e| RpcError::from_io(&e, "cannot register the inotify instance"))?;
        let mut watch = Watch {
            fd: reader,
            control,
            root,
            recursive,
            include_entry,
            dirs: HashMap::new(),
        };
        watch.add_tree(PathBuf::new()).map_err(|e| {
            RpcError::from_io(&e, &format!("cannot watch '{}'", watch.root.display()))
        })?;
        Ok(watch)
    }

    /// Watches `relative` (and, when recursive, every directory below it).
    fn add_tree(&mut self, relative: PathBuf) -> std::io::Result<()> {
        let absolute = self.root.join(&relative);
        let wd = Inotify::add_watch(&self.control, &absolute, WATCH_MASK)?;
        self.dirs.insert(wd, relative.clone());
        if self.recursive
            && let Ok(children) = std::fs::read_dir(&absolute)
        {
            for child in children.flatten() {
                if child.file_type().is_ok_and(|t| t.is_dir()) {
                    // A subdirectory that vanished meanwhile is not an error.
                    let _ = self.add_tree(relative.join(child.file_name()));
                }
            }
        }
        Ok(())
    }

    /// Waits for the next batch of events and turns them into `{name, type, entry?}` JSON.
    async fn next_events(&mut self) -> std::io::Result<Vec<serde_json::Value>> {
        let mut buf = vec![0u8; inotify::READ_BUFFER_BYTES];
        let n = loop {
            self.fd.readable().await?;
            match self.fd.try_read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        };
        let mut out = Vec::new();
        for event in inotify::parse_events(&buf[..n]) {
            if event.mask & inotify::Q_OVERFLOW != 0 {
                crate::log_line!(
                    "airlock-agent: inotify queue overflow under {}",
                    self.root.display()
                );
                continue;
            }
            if event.mask & inotify::IGNORED != 0 {
                self.dirs.remove(&event.wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&event.wd).cloned() else {
                continue;
            };
            let relative = if event.name.is_empty() {
                dir.clone()
            } else {
                dir.join(std::ffi::OsStr::from_bytes(&event.name))
            };
            let self_event = event.name.is_empty();
            if self_event && !dir.as_os_str().is_empty() {
                continue; // reported by the parent directory's watch
            }
            let kind = if event.mask & (inotify::CREATE | inotify::MOVED_TO) != 0 {
                if self.recursive && event.mask & inotify::ISDIR != 0 {
                    let _ = self.add_tree(relative.clone());
                }
                "EVENT_TYPE_CREATE"
            } else if event.mask & inotify::MODIFY != 0 {
                "EVENT_TYPE_WRITE"
            } else if event.mask & (inotify::DELETE | inotify::DELETE_SELF) != 0 {
                "EVENT_TYPE_REMOVE"
            } else if event.mask & (inotify::MOVED_FROM | inotify::MOVE_SELF) != 0 {
                "EVENT_TYPE_RENAME"
            } else if event.mask & inotify::ATTRIB != 0 {
                "EVENT_TYPE_CHMOD"
            } else {
                continue;
            };
            let mut json = json!({"name": relative.to_string_lossy(), "type": kind});
            if self.include_entry
                && let Ok(entry) = entry_info(&self.root.join(&relative), &mut Names::default())
            {
                json["entry"] = entry;
            }
            out.push(json);
        }
        Ok(out)
    }
}

async fn run_watch(mut watch: Watch, sink: Sink) {
    loop {
        let events = match watch.next_events().await {
            Ok(events) => events,
            Err(e) => {
                crate::log_line!(
                    "airlock-agent: watcher on {} failed: {e}",
                    watch.root.display()
                );
                return;
            }
        };
        for event in events {
            match &sink {
                Sink::Buffer(buffer) => {
                    let Ok(mut buffer) = buffer.lock() else {
                        return;
                    };
                    if buffer.len() < MAX_BUFFERED_EVENTS {
                        buffer.push_back(event);
                    }
                }
                Sink::Stream(tx) => {
                    if tx.send(event).await.is_err() {
                        return; // the stream is gone; dropping `watch` closes inotify
                    }
                }
            }
        }
    }
}

fn resolve_root(request: &WatchRequest, user: &User) -> RpcResult<PathBuf> {
    let path = non_empty(&request.path)
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "path is required"))?;
    Ok(user.resolve(path))
}

/// `CreateWatcher`.
pub fn create(
    watchers: &Watchers,
    request: &WatchRequest,
    user: &User,
) -> RpcResult<serde_json::Value> {
    let root = resolve_root(request, user)?;
    let watch = Watch::open(
        root,
        request.recursive.unwrap_or(false),
        request.include_entry.unwrap_or(false),
    )?;
    let events = Arc::new(Mutex::new(VecDeque::new()));
    let task = tokio::spawn(run_watch(watch, Sink::Buffer(events.clone())));
    let id = format!("w{}", watchers.next_id.fetch_add(1, Ordering::Relaxed) + 1);
    if let Ok(mut by_id) = watchers.by_id.lock() {
        by_id.insert(id.clone(), PollWatcher { events, task });
    }
    Ok(json!({ "watcherId": id }))
}

fn watcher_id(request: &WatcherIdRequest) -> RpcResult<&str> {
    non_empty(&request.watcher_id)
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "watcherId is required"))
}

fn unknown_watcher(id: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher '{id}' not found"))
}

/// `GetWatcherEvents`: the events since the last call.
pub fn get_events(watchers: &Watchers, request: &WatcherIdRequest) -> RpcResult<serde_json::Value> {
    let id = watcher_id(request)?;
    let by_id = watchers
        .by_id
        .lock()
        .map_err(|_| RpcError::new(Code::Internal, "watcher table poisoned"))?;
    let watcher = by_id.get(id).ok_or_else(|| unknown_watcher(id))?;
    let events: Vec<serde_json::Value> = watcher
        .events
        .lock()
        .map(|mut e| e.drain(..).collect())
        .unwrap_or_default();
    Ok(json!({ "events": events }))
}

/// `RemoveWatcher`.
pub fn remove(watchers: &Watchers, request: &WatcherIdRequest) -> RpcResult<serde_json::Value> {
    let id = watcher_id(request)?;
    let removed = watchers
        .by_id
        .lock()
        .ok()
        .and_then(|mut by_id| by_id.remove(id));
    let watcher = removed.ok_or_else(|| unknown_watcher(id))?;
    watcher.task.abort();
    Ok(json!({}))
}

/// `WatchDir`: a stream of `{start:{}}`, then `{filesystem:{…}}` events and keepalives.
pub fn watch_dir(
    request: &WatchRequest,
    user: &User,
    options: StreamOptions,
) -> RpcResult<mpsc::Receiver<Bytes>> {
    let root = resolve_root(request, user)?;
    let watch = Watch::open(
        root,
        request.recursive.unwrap_or(false),
        request.include_entry.unwrap_or(false),
    )?;
    let (events_tx, mut events_rx) = mpsc::channel(16);
    let (frames_tx, frames_rx) = mpsc::channel::<Bytes>(2);
    let watch_task = tokio::spawn(run_watch(watch, Sink::Stream(events_tx)));
    tokio::spawn(async move {
        let frame =
            |message: serde_json::Value| connect::envelope(0, message.to_string().as_bytes());
        if frames_tx.send(frame(json!({"start": {}}))).await.is_err() {
            watch_task.abort();
            return;
        }
        let deadline = options.timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let keepalive = async {
                match options.keepalive {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            let until_deadline = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                event = events_rx.recv() => match event {
                    Some(event) => frame(json!({"filesystem": event})),
                    None => {
                        let error = RpcError::new(Code::Internal, "the directory watch failed");
                        let _ = frames_tx.send(connect::end_envelope(Some(&error))).await;
                        return;
                    }
                },
                () = keepalive => frame(json!({"keepalive": {}})),
                () = until_deadline => {
                    watch_task.abort();
                    let error = RpcError::new(Code::DeadlineExceeded, "the stream's Connect-Timeout-Ms elapsed");
                    let _ = frames_tx.send(connect::end_envelope(Some(&error))).await;
                    return;
                }
            };
            if frames_tx.send(next).await.is_err() {
                watch_task.abort();
                return;
            }
        }
    });
    Ok(frames_rx)
}
