//! The compiled form of a policy's `network`, `credentials` and `approvals` sections: what the
//! egress proxy (`crates/egress`) enforces. Plain data, produced by the policy compiler and
//! replaced atomically on hot reload. Secrets never appear here: a credential names where its
//! value comes from on the host, and the runtime reads it outside the sandbox.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Only through Airlock's egress proxy, which applies [`EgressPlan`].
    Proxy,
    /// The host's network, unfiltered (the prover flags it).
    Full,
}

/// A host pattern: `api.example.com` exactly, or `*.example.com` (any name strictly below it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostPattern(pub String);

impl HostPattern {
    /// Whether `host` (lower-case, no trailing dot, no port) matches.
    pub fn matches(&self, host: &str) -> bool {
        match self.0.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => host == self.0,
        }
    }
}

/// One HTTP-level permission: methods (upper-case; empty = any) and path globs (`*` within a
/// segment, `**` across segments; empty = any).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRule {
    pub methods: Vec<String>,
    pub paths: Vec<String>,
}

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRule {
    /// The rule's name in audit lines.
    pub name: String,
    pub host: HostPattern,
    /// Allowed ports (never empty after compilation; 443 and 80 by default).
    pub ports: Vec<u16>,
    /// L7 rules: empty means any request (and TLS may pass through uninspected); non-empty
    /// means the proxy must see the request (TLS is intercepted) and one rule must allow it.
    pub http: Vec<HttpRule>,
    /// Git pushes (`POST .../git-receive-pack`) through this rule may change only these refs
    /// (globs as for paths); `None`: the rule says nothing about pushes. A host and port with
    /// any such rule is always intercepted, and its pushes must match one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_push_refs: Option<Vec<String>>,
}

/// Where a credential's real value lives on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum CredentialSource {
    /// An environment variable of the process that starts the sandbox (CLI or daemon).
    Env { var: String },
    /// A file on the host (trailing newline trimmed).
    File { path: PathBuf },
}

/// How the proxy puts the real value into a matching request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "style", rename_all = "snake_case", deny_unknown_fields)]
pub enum Injection {
    /// `<name>: <secret>`; the placeholder may appear in that header's value.
    Header { name: String },
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// `Authorization: Basic base64(<username>:<secret>)`.
    Basic { username: String },
}

/// Where a credential may be used: a destination and, optionally, methods and paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub host: HostPattern,
    pub port: u16,
    pub http: HttpRule,
}

/// A credential the sandbox uses without ever seeing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialPlan {
    pub name: String,
    pub source: CredentialSource,
    /// The environment variable that holds the placeholder inside the sandbox. The runtime
    /// generates the placeholder (random, per sandbox) when it starts the sandbox.
    pub env: String,
    pub inject: Injection,
    /// Never empty; each endpoint is also covered by an [`EgressRule`].
    pub endpoints: Vec<Endpoint>,
}

/// What happens to a request no rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum ApprovalMode {
    #[default]
    Deny,
    /// Hold the request until someone approves (once or always) or denies it, or until
    /// `timeout_ms` passes (then it is denied).
    Ask { timeout_ms: u64 },
}

/// Everything the egress proxy enforces for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPlan {
    pub mode: NetworkMode,
    pub rules: Vec<EgressRule>,
    pub credentials: Vec<CredentialPlan>,
    pub approvals: ApprovalMode,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_host_patterns_match_exactly_or_strictly_below() {
        let exact = HostPattern("api.example.com".into());
        assert!(exact.matches("api.example.com"));
        assert!(!exact.matches("xapi.example.com"));
        let wild = HostPattern("*.example.com".into());
        assert!(wild.matches("a.example.com"));
        assert!(wild.matches("a.b.example.com"));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("badexample.com"));
    }
}
