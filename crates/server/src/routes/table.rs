//! The route table: every endpoint of the native API, with its access level, documentation
//! and payloads. The dispatcher (`super`) matches requests against it and `openapi` documents
//! it, so the two cannot drift.

use airlock_api::v1;

use super::{computer, git, lsp};
use hyper::Method;
use schemars::{JsonSchema, Schema, SchemaGenerator};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (health).
    Public,
    /// An API key.
    ApiKey,
    /// An API key or the access token of the sandbox named by `{id}`.
    Sandbox,
}

/// What travels in a request or response body, for the OpenAPI document.
#[derive(Debug, Clone, Copy)]
pub enum Payload {
    None,
    Json(fn(&mut SchemaGenerator) -> Schema),
    /// A JSON body that may be left out (an empty body reads as `{}`).
    OptionalJson(fn(&mut SchemaGenerator) -> Schema),
    /// Newline-delimited JSON, one value of this schema per line.
    Ndjson(fn(&mut SchemaGenerator) -> Schema),
    Octets,
    /// Prometheus's text format (or OpenMetrics, by `Accept`).
    Metrics,
    /// Whatever the agent speaks (the envd pass-through).
    Any,
}

/// What a query parameter's value must be, as the handler checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryValue {
    /// A path inside the sandbox: non-empty, no NUL.
    Path,
    /// Any string.
    Text,
    /// `true` or `false`.
    Bool,
    /// A non-negative integer of at most `max`.
    Integer { min: u64, max: u64 },
    /// Comma-separated sandbox states.
    States,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

/// A query parameter: name, required, description, value.
pub type QueryDoc = (&'static str, bool, &'static str, QueryValue);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Health,
    Metrics,
    ListTemplates,
    GetPool,
    SetPool,
    CreateSandbox,
    ListSandboxes,
    GetSandbox,
    DeleteSandbox,
    SetTimeout,
    PauseSandbox,
    ResumeSandbox,
    CreateSnapshot,
    ForkSandbox,
    ListSnapshots,
    DeleteSnapshot,
    Logs,
    Events,
    PutPolicy,
    ListApprovals,
    DecideApproval,
    GitPush,
    PullRequest,
    StartLsp,
    Computer,
    LspSocket,
    Exec,
    Eval,
    FileGet,
    FilePut,
    FileRemove,
    FileList,
    FileStat,
    FileMkdir,
    FileMove,
    Envd,
    ListImages,
    PullImage,
    ImportImage,
    PruneImages,
    InspectImage,
    DeleteImage,
    BuildTemplate,
    GetTemplate,
    DeleteTemplate,
    GetBuild,
    BuildLogs,
    GetTemplateFiles,
    PutTemplateFiles,
    UploadFiles,
}

#[derive(Debug)]
pub struct Route {
    /// `None` matches every method (the envd pass-through).
    pub method: Option<Method>,
    /// Segments in braces are parameters; `{rest}` at the end takes the remaining path.
    pub path: &'static str,
    pub handler: Handler,
    pub access: Access,
    pub summary: &'static str,
    pub query: &'static [QueryDoc],
    pub request: Payload,
    pub success: u16,
    pub response: Payload,
    /// Error statuses this route can answer besides 401 (and 500/502).
    pub errors: &'static [u16],
}

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

const PATH_Q: &[QueryDoc] = &[("path", true, "Path inside the sandbox.", QueryValue::Path)];

macro_rules! route {
    ($method:expr, $path:expr, $handler:ident, $access:ident, $summary:expr, $query:expr, $request:expr, $success:expr, $response:expr, $errors:expr) => {
        Route {
            method: $method,
            path: $path,
            handler: Handler::$handler,
            access: Access::$access,
            summary: $summary,
            query: $query,
            request: $request,
            success: $success,
            response: $response,
            errors: $errors,
        }
    };
}

/// Every endpoint of the daemon.
pub static ROUTES: [Route; 50] = [
    route!(
        Some(Method::GET),
        "/v1/health",
        Health,
        Public,
        "Liveness of the daemon.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::Health>),
        &[]
    ),
    route!(
        Some(Method::GET),
        "/metrics",
        Metrics,
        ApiKey,
        "The daemon's metrics in Prometheus's text format (OpenMetrics when Accept asks for application/openmetrics-text): sandboxes by state, creates and their latency, warm pools, execs, egress decisions, errors by code.",
        &[],
        Payload::None,
        200,
        Payload::Metrics,
        &[]
    ),
    route!(
        Some(Method::GET),
        "/v1/templates",
        ListTemplates,
        ApiKey,
        "List templates.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::TemplateList>),
        &[]
    ),
    route!(
        Some(Method::GET),
        "/v1/templates/{id}/pool",
        GetPool,
        ApiKey,
        "A template's warm pool: its size, members ready and starting, claims.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::PoolStatus>),
        &[404, 409]
    ),
    route!(
        Some(Method::PUT),
        "/v1/templates/{id}/pool",
        SetPool,
        ApiKey,
        "Keep `size` sandboxes of the template started and ready (0 removes the pool); creates for it that ask for nothing else claim one. Kept across restarts. 409 for a name that cannot have a pool (another tier's snapshot, a microvm snapshot of a template warmed as it starts).",
        &[],
        Payload::Json(schema::<v1::PoolRequest>),
        200,
        Payload::Json(schema::<v1::PoolStatus>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes",
        CreateSandbox,
        ApiKey,
        "Create a sandbox; returns once it is usable, with its access token.",
        &[],
        Payload::OptionalJson(schema::<v1::CreateSandboxRequest>),
        201,
        Payload::Json(schema::<v1::CreateSandboxResponse>),
        &[400, 403, 404, 413, 422, 503, 504]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes",
        ListSandboxes,
        ApiKey,
        "List sandboxes.",
        &[
            (
                "state",
                false,
                "Comma-separated states to keep (creating, running, paused).",
                QueryValue::States
            ),
            (
                "metadata.{key}",
                false,
                "Keep sandboxes whose metadata has key = value; repeatable.",
                QueryValue::Text
            ),
            (
                "include",
                false,
                "`pool`: also list the unclaimed members of warm pools (`pool: true`).",
                QueryValue::OneOf(&["pool"])
            )
        ],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SandboxList>),
        &[400]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}",
        GetSandbox,
        ApiKey,
        "Get a sandbox.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[404]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/sandboxes/{id}",
        DeleteSandbox,
        ApiKey,
        "Destroy a sandbox and everything it owned; 409 while it is still starting or already being removed.",
        &[],
        Payload::None,
        204,
        Payload::None,
        &[404, 409]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/timeout",
        SetTimeout,
        ApiKey,
        "Make the sandbox end timeout_ms from now.",
        &[],
        Payload::Json(schema::<v1::SetTimeoutRequest>),
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/pause",
        PauseSandbox,
        ApiKey,
        "Pause a running sandbox: frozen (its processes keep their memory; the default) or filesystem (they end, its files stay). Its timeout clock stops. 409 sandbox_paused if it already is; 422 for a filesystem pause of a sandbox whose files live in memory.",
        &[],
        Payload::OptionalJson(schema::<v1::PauseRequest>),
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/resume",
        ResumeSandbox,
        ApiKey,
        "Resume a paused sandbox (a running one only gets its deadline extended): it lives what it had left, or timeout_ms from now if that is later.",
        &[],
        Payload::OptionalJson(schema::<v1::ResumeRequest>),
        200,
        Payload::Json(schema::<v1::Sandbox>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/snapshots",
        CreateSnapshot,
        ApiKey,
        "Snapshot a sandbox's files (/workspace and /tmp; processes are not captured), freezing it only for the copy. Create from it with template = its id or name. 409 if the name is taken; 422 without disk scratch.",
        &[],
        Payload::OptionalJson(schema::<v1::CreateSnapshotRequest>),
        201,
        Payload::Json(schema::<v1::Snapshot>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/fork",
        ForkSandbox,
        ApiKey,
        "count (1 to 20) new sandboxes from a consistent copy of the sandbox's files; each fork succeeds or fails on its own. Processes are not carried over.",
        &[],
        Payload::OptionalJson(schema::<v1::ForkRequest>),
        201,
        Payload::Json(schema::<v1::ForkResponse>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::GET),
        "/v1/snapshots",
        ListSnapshots,
        ApiKey,
        "List snapshots.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SnapshotList>),
        &[]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/snapshots/{id}",
        DeleteSnapshot,
        ApiKey,
        "Delete a snapshot by id or name; the sandboxes made from it keep their files.",
        &[],
        Payload::None,
        204,
        Payload::None,
        &[404]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/logs",
        Logs,
        ApiKey,
        "The sandbox's events and the tail of its agent's log.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SandboxLogs>),
        &[404]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/events",
        Events,
        ApiKey,
        "The sandbox's audit lines (egress, credentials, approvals, policy, files) and lifecycle events, oldest first; secrets and placeholders are redacted.",
        &[
            (
                "since_ms",
                false,
                "Only events at or after this Unix time in ms (the previous answer's next_since_ms).",
                QueryValue::Integer {
                    min: 0,
                    max: u64::MAX
                }
            ),
            (
                "limit",
                false,
                "At most this many events (default 1000, at most 10000).",
                QueryValue::Integer {
                    min: 1,
                    max: crate::audit::MAX_EVENTS_PER_PAGE as u64
                }
            )
        ],
        Payload::None,
        200,
        Payload::Json(schema::<v1::SandboxEvents>),
        &[400, 404]
    ),
    route!(
        Some(Method::PUT),
        "/v1/sandboxes/{id}/policy",
        PutPolicy,
        ApiKey,
        "Replace a proxy-mode sandbox's network, credentials and approvals at once; 409 if the change widens access in a way that needs review and approve is not true, 422 if invalid (the old policy stays).",
        &[(
            "approve",
            false,
            "true: apply a change whose findings need review.",
            QueryValue::Bool
        )],
        Payload::Json(schema::<airlock_api::policy::PolicyDocument>),
        200,
        Payload::Json(schema::<v1::PolicyApplied>),
        &[400, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::GET),
        "/v1/approvals",
        ListApprovals,
        ApiKey,
        "Requests held under approvals: ask, waiting for a decision, oldest first.",
        &[("sandbox", false, "Only this sandbox's.", QueryValue::Text)],
        Payload::None,
        200,
        Payload::Json(schema::<v1::ApprovalList>),
        &[400, 404]
    ),
    route!(
        Some(Method::POST),
        "/v1/approvals/{id}",
        DecideApproval,
        ApiKey,
        "Answer a held request: once, always (identical requests while the sandbox lives) or deny.",
        &[],
        Payload::Json(schema::<v1::DecideApprovalRequest>),
        204,
        Payload::None,
        &[400, 404, 413]
    ),
    git::PUSH,
    git::PULL_REQUEST,
    lsp::START,
    lsp::SOCKET,
    computer::ACT,
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/exec",
        Exec,
        Sandbox,
        "Run a command; streams start, stdout, stderr and exit events as NDJSON.",
        &[],
        Payload::Json(schema::<v1::ExecRequest>),
        200,
        Payload::Ndjson(schema::<v1::ExecEvent>),
        &[400, 403, 404, 409, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/eval",
        Eval,
        Sandbox,
        "Evaluate a JavaScript or Python snippet in a fresh isolate (templates wasm-js and wasm-python); an error of the code is a 200 with `error`.",
        &[],
        Payload::Json(schema::<v1::EvalRequest>),
        200,
        Payload::Json(schema::<v1::EvalResponse>),
        &[400, 403, 404, 409, 413, 502]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/files",
        FileGet,
        Sandbox,
        "Download a file (streamed).",
        PATH_Q,
        Payload::None,
        200,
        Payload::Octets,
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::PUT),
        "/v1/sandboxes/{id}/files",
        FilePut,
        Sandbox,
        "Upload a file (streamed); creates parent directories, replaces the file. A refused upload (403 read-only or denied path, 413 file-size limit, 507 disk full) is answered as soon as it fails, with Connection: close.",
        PATH_Q,
        Payload::Octets,
        200,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409, 413, 507]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/sandboxes/{id}/files",
        FileRemove,
        Sandbox,
        "Remove a file or a directory tree.",
        PATH_Q,
        Payload::None,
        204,
        Payload::None,
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/files/list",
        FileList,
        Sandbox,
        "List a directory.",
        &[
            (
                "path",
                true,
                "Directory inside the sandbox.",
                QueryValue::Path
            ),
            (
                "depth",
                false,
                "Levels to descend (default 1; 0 means 1).",
                QueryValue::Integer {
                    min: 0,
                    max: u32::MAX as u64
                }
            )
        ],
        Payload::None,
        200,
        Payload::Json(schema::<v1::FileList>),
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::GET),
        "/v1/sandboxes/{id}/files/stat",
        FileStat,
        Sandbox,
        "Describe a file.",
        PATH_Q,
        Payload::None,
        200,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/files/mkdir",
        FileMkdir,
        Sandbox,
        "Create a directory and its parents; 409 if it exists.",
        &[],
        Payload::Json(schema::<v1::MkdirRequest>),
        201,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409, 413, 507]
    ),
    route!(
        Some(Method::POST),
        "/v1/sandboxes/{id}/files/move",
        FileMove,
        Sandbox,
        "Rename or move a file.",
        &[],
        Payload::Json(schema::<v1::MoveRequest>),
        200,
        Payload::Json(schema::<v1::FileEntry>),
        &[400, 403, 404, 409, 413, 507]
    ),
    route!(
        None,
        "/v1/sandboxes/{id}/envd/{rest}",
        Envd,
        Sandbox,
        "Pass-through to the sandbox's envd-compatible agent: its Connect RPCs (POST process.Process/* and filesystem.Filesystem/*, whose errors are Connect's), POST and GET files, GET health. Any other path is 404, another method 405; errors of files and of the daemon are ErrorBody.",
        &[],
        Payload::Any,
        200,
        Payload::Any,
        &[400, 403, 404, 405, 409, 413, 507]
    ),
    route!(
        Some(Method::GET),
        "/v1/images",
        ListImages,
        ApiKey,
        "List the images of the daemon's store (<state>/images).",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::ImageList>),
        &[]
    ),
    route!(
        Some(Method::POST),
        "/v1/images/pull",
        PullImage,
        ApiKey,
        "Pull an image from a registry into the store; streams progress lines as NDJSON, then one done or error line. Plain HTTP only to a registry on loopback, or with insecure.",
        &[],
        Payload::Json(schema::<v1::PullImageRequest>),
        200,
        Payload::Ndjson(schema::<v1::PullEvent>),
        &[400, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/images/import",
        ImportImage,
        ApiKey,
        "Import a docker-save archive, an OCI layout tar or a plain rootfs tarball (gzip or zstd compressed or not), uploaded as the body.",
        &[(
            "tag",
            false,
            "A name (NAME[:TAG]) for the image: needed for a rootfs tarball, else it is named by its digest.",
            QueryValue::Text
        )],
        Payload::Octets,
        201,
        Payload::Json(schema::<v1::ImportResponse>),
        &[400, 413, 422]
    ),
    route!(
        Some(Method::POST),
        "/v1/images/prune",
        PruneImages,
        ApiKey,
        "Remove the images nothing refers to (no name; no lease of a sandbox, a template or the build cache), and their blobs and layers.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::PruneResponse>),
        &[]
    ),
    route!(
        Some(Method::GET),
        "/v1/images/{rest}",
        InspectImage,
        ApiKey,
        "Inspect an image by name (REGISTRY/REPO:TAG, slashes and all) or digest.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::ImageDetails>),
        &[400, 404]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/images/{rest}",
        DeleteImage,
        ApiKey,
        "Remove a name (or every name of a digest); the files stay until prune, and so does an image a sandbox or template uses.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::RemovedImage>),
        &[400, 404]
    ),
    route!(
        Some(Method::POST),
        "/v1/templates",
        BuildTemplate,
        ApiKey,
        "Build a template from steps; answers at once with the build (202), which runs on: follow GET /v1/builds/{id}/logs and GET /v1/builds/{id}.",
        &[],
        Payload::Json(schema::<v1::BuildTemplateRequest>),
        202,
        Payload::Json(schema::<v1::TemplateBuild>),
        &[400, 413, 422]
    ),
    route!(
        Some(Method::GET),
        "/v1/templates/{id}",
        GetTemplate,
        ApiKey,
        "Get a template by NAME:TAG, or NAME (its latest tag, else its newest).",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::Template>),
        &[404]
    ),
    route!(
        Some(Method::DELETE),
        "/v1/templates/{id}",
        DeleteTemplate,
        ApiKey,
        "Delete NAME:TAG, or every tag of NAME; sandboxes made from it keep running. 409 for the built-in base.",
        &[],
        Payload::None,
        204,
        Payload::None,
        &[404, 409]
    ),
    route!(
        Some(Method::GET),
        "/v1/builds/{id}",
        GetBuild,
        ApiKey,
        "A template build: its state, progress, image and, on error, the failed step.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::TemplateBuild>),
        &[404]
    ),
    route!(
        Some(Method::GET),
        "/v1/builds/{id}/logs",
        BuildLogs,
        ApiKey,
        "A build's log from offset on, as NDJSON; with follow=true the answer goes on until the build has finished.",
        &[
            (
                "offset",
                false,
                "The first line wanted (0 by default).",
                QueryValue::Integer {
                    min: 0,
                    max: u64::MAX
                }
            ),
            (
                "follow",
                false,
                "true: stream new lines until the build ends.",
                QueryValue::Bool
            )
        ],
        Payload::None,
        200,
        Payload::Ndjson(schema::<v1::BuildLogEntry>),
        &[400, 404]
    ),
    route!(
        Some(Method::GET),
        "/v1/template-files/{id}",
        GetTemplateFiles,
        ApiKey,
        "Whether the files of a COPY step (by their hash) are uploaded.",
        &[],
        Payload::None,
        200,
        Payload::Json(schema::<v1::TemplateFiles>),
        &[400, 404]
    ),
    route!(
        Some(Method::PUT),
        "/v1/template-files/{id}",
        PutTemplateFiles,
        ApiKey,
        "Upload the files of a COPY step under their hash: a tar (or tar.gz) whose names are relative to the build context.",
        &[],
        Payload::Octets,
        201,
        Payload::Json(schema::<v1::TemplateFiles>),
        &[400, 413]
    ),
    route!(
        Some(Method::PUT),
        "/v1/uploads/{id}",
        UploadFiles,
        Public,
        "A one-time upload URL that E2B's template API hands out (GET /templates/{id}/files/{hash}): the token is the credential. 404 once used or expired.",
        &[],
        Payload::Octets,
        201,
        Payload::Json(schema::<v1::TemplateFiles>),
        &[400, 404, 413]
    ),
];
