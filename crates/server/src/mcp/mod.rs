//! MCP (the Model Context Protocol) for Airlock's sandboxes, with the official Rust SDK
//! (`rmcp`): `airlock mcp` over stdio for desktop agents, and the daemon's `/mcp` over
//! streamable HTTP (API key auth, as for `/v1`).
//!
//! Both serve the same tools ([`tools`]), which call a daemon's `/v1` API and its data plane
//! through [`Client`]: over stdio the daemon named by `--url`/`AIRLOCK_URL` with
//! `AIRLOCK_API_KEY`; over HTTP the daemon itself, on its own listening address, with the key
//! the MCP request carried. So a tool can do exactly what its caller's key can do, and every
//! check of the API applies unchanged. A failure is an MCP tool error (`isError`) whose text
//! is `{"code": <the API's stable code>, "message"}`; unknown or malformed arguments are tool
//! errors too (rmcp's), never a crash.

mod args;
mod tools;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use hyper::body::Incoming;
use hyper::{Request, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, ServiceExt, tool_handler};

use crate::auth::API_KEY_HEADER;
use crate::client::Client;
use crate::http::{Body, boxed, error_response};
use crate::lifecycle::Daemon;

/// The path the daemon serves MCP on.
pub const PATH: &str = "/mcp";

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("unknown tool {0:?} in --tools (the tools: {1})")]
    UnknownTool(String, String),
    #[error("the MCP session over stdio failed to start")]
    Start(#[source] std::io::Error),
    #[error("the MCP session over stdio failed")]
    Session(#[source] tokio::task::JoinError),
}

/// The MCP server: the tools, and the daemon they call.
#[derive(Debug, Clone)]
pub struct AirlockMcp {
    /// The daemon; over HTTP the key of each request replaces this one's.
    client: Client,
    tool_router: ToolRouter<Self>,
}

impl AirlockMcp {
    /// All tools, or those named in `only` (clients cap how many tools they take).
    pub fn new(client: Client, only: &[String]) -> Result<AirlockMcp, McpError> {
        let mut tool_router = Self::tool_router();
        if !only.is_empty() {
            let names: Vec<String> = tool_router
                .list_all()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect();
            if let Some(unknown) = only.iter().find(|n| !names.contains(n)) {
                return Err(McpError::UnknownTool(unknown.clone(), names.join(", ")));
            }
            for name in names.iter().filter(|n| !only.contains(n)) {
                tool_router.remove_route(name);
            }
        }
        Ok(AirlockMcp {
            client,
            tool_router,
        })
    }

    /// The names of every tool, in their order.
    pub fn tool_names() -> Vec<String> {
        Self::tool_router()
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// The client for one call: over HTTP with the key the request carried.
    fn client_for(&self, context: &rmcp::service::RequestContext<rmcp::RoleServer>) -> Client {
        let Some(parts) = context.extensions.get::<hyper::http::request::Parts>() else {
            return self.client.clone();
        };
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let bearer = header("authorization").and_then(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_owned())
        });
        let key = header(API_KEY_HEADER).or(bearer);
        Client::new(&self.client.base_url(), key).unwrap_or_else(|_| self.client.clone())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Airlock sandboxes: create one (template code-interpreter-v1 for run_code), \
                 run code and commands in it, read and write its files, kill it when done.",
            )
    }
}

/// `airlock mcp`: serves MCP on stdin/stdout until the client closes it.
pub async fn serve_stdio(client: Client, only: &[String]) -> Result<(), McpError> {
    let server = AirlockMcp::new(client, only)?;
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Start(std::io::Error::other(e.to_string())))?;
    running.waiting().await.map_err(McpError::Session)?;
    Ok(())
}

/// The daemon's own address, for the tools its `/mcp` runs (set once it listens).
static DAEMON_URL: OnceLock<String> = OnceLock::new();
static HTTP_SERVICE: OnceLock<StreamableHttpService<AirlockMcp, LocalSessionManager>> =
    OnceLock::new();

/// Records where the daemon listens (an unspecified address is reached on loopback).
pub fn set_daemon_address(addr: SocketAddr) {
    let ip = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => std::net::Ipv4Addr::LOCALHOST.into(),
        ip if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let _ = DAEMON_URL.set(format!("http://{}", SocketAddr::new(ip, addr.port())));
}

/// `/mcp` on the daemon: the API key is checked here, then rmcp's streamable HTTP service
/// answers (sessions in memory; `DELETE` ends one).
pub async fn serve_http(daemon: Arc<Daemon>, request: Request<Incoming>) -> Response<Body> {
    let no_auth = daemon.config.no_auth;
    if let Err(err) =
        crate::auth::check_api_key_or_bearer(&daemon.store, request.headers(), no_auth)
    {
        crate::http::linger(request.into_body());
        return error_response(&err);
    }
    let Some(url) = DAEMON_URL.get() else {
        return error_response(&crate::error::ApiError::internal(
            "the daemon does not know its own address yet",
        ));
    };
    let client = match Client::new(url, None) {
        Ok(client) => client,
        Err(err) => {
            return error_response(&crate::error::ApiError::internal(err.to_string()));
        }
    };
    let service = HTTP_SERVICE.get_or_init(|| {
        let mut config = StreamableHttpServerConfig::default().with_sse_keep_alive(None);
        // A key is the capability: a page that rebinds a name to the daemon cannot send one.
        // Without auth (loopback only) the Host check against DNS rebinding stays.
        if !no_auth {
            config = config.disable_allowed_hosts();
        }
        StreamableHttpService::new(
            move || AirlockMcp::new(client.clone(), &[]).map_err(std::io::Error::other),
            Arc::new(LocalSessionManager::default()),
            config,
        )
    });
    let response: Response<http_body_util::combinators::BoxBody<bytes::Bytes, Infallible>> =
        service.handle(request).await;
    response.map(boxed)
}
