//! The policy document (`version: 1`): what a sandbox may read, write, call and reach, written
//! by a person in YAML or sent as JSON in the daemon's create call.
//!
//! These are the wire types only: strict (`deny_unknown_fields`) and without any semantics. The
//! `airlock-policy` crate parses YAML with line and column, merges `extends`, validates,
//! compiles a document per tier and diffs two documents. Sizes and durations are strings in the
//! command line's units (`512MiB`, `30s`), so that a policy reads like the flags it replaces.
//! `api/policy.schema.json` is generated from these types.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::Tier;

/// The only document version this build reads.
pub const POLICY_VERSION: u32 = 1;

/// A whole policy. Every section is optional; an absent section keeps Airlock's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// Always `1`.
    #[schemars(range(min = 1, max = 1))]
    pub version: u32,
    /// Built-in profiles merged first, in order (`read-only`, `workspace`, `networked-dev`);
    /// this document is merged last. Maps override by key, lists append, named entries
    /// (egress rules, credentials) replace an earlier entry of the same name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("uniqueItems" = true))]
    pub extends: Vec<String>,
    /// The weakest tier this policy may run on; a stronger one is always allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    #[serde(default, skip_serializing_if = "FilesystemPolicy::is_empty")]
    pub filesystem: FilesystemPolicy,
    #[serde(default, skip_serializing_if = "ProcessPolicy::is_empty")]
    pub process: ProcessPolicy,
    #[serde(default, skip_serializing_if = "ResourcesPolicy::is_empty")]
    pub resources: ResourcesPolicy,
    #[serde(default, skip_serializing_if = "NetworkPolicy::is_empty")]
    pub network: NetworkPolicy,
    /// Secrets the sandbox uses without seeing them: the egress proxy puts them into requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialPolicy>,
    #[serde(default, skip_serializing_if = "ApprovalsPolicy::is_empty")]
    pub approvals: ApprovalsPolicy,
    #[serde(default, skip_serializing_if = "AuditPolicy::is_empty")]
    pub audit: AuditPolicy,
}

/// What a path rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PathAccess {
    /// Visible and readable.
    Ro,
    /// Readable and writable.
    Rw,
    /// Hidden: neither its contents nor (for files) its data can be read.
    Deny,
}

impl PathAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            PathAccess::Ro => "ro",
            PathAccess::Rw => "rw",
            PathAccess::Deny => "deny",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilesystemPolicy {
    /// Path → access. A path is absolute, or starts with a token: `:workspace`, `:tmp`, or `~`
    /// (the sandbox user's home inside the sandbox, never the host's). `*` may stand for one
    /// whole component in `deny` rules.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<String, PathAccess>,
    /// Paths inside writable roots that stay read-only (if they exist when the sandbox starts),
    /// in addition to `:workspace/.git/hooks` and `:workspace/.git/config`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protected: Vec<String>,
    /// Whether `:workspace/.git/hooks` and `:workspace/.git/config` are protected (default
    /// true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_git: Option<bool>,
}

impl FilesystemPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessPolicy {
    /// `UID[:GID]` inside the sandbox, numeric, as `airlock run --user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "SyscallsPolicy::is_empty")]
    pub syscalls: SyscallsPolicy,
}

impl ProcessPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Changes to the built-in seccomp profile, by syscall name (x86_64).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyscallsPolicy {
    /// Also denied (`EPERM`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_extra: Vec<String>,
    /// Removed from the built-in deny-list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_extra: Vec<String>,
}

impl SyscallsPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A value with a unit, as on the command line: `512MiB`, `30s`, `1.5`, `max`. A YAML or JSON
/// number is read as its decimal text (so `pids: 256` and `cpus: 1.5` work).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Quantity(pub String);

impl Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Quantity;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string such as 512MiB, 30s or max")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        deserializer.deserialize_any(Text)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A value in the command line's units: a size (`512MiB`, `2G`), a duration (`30s`, `500ms`), a CPU count (`1.5`), a count, or `max` where a limit can be lifted.",
            "type": ["string", "number"],
        })
    }
}

/// Resource limits; each overrides Airlock's default (2 GiB memory, 1024 pids, 1 GiB disk, no
/// CPU cap, no timeout).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesPolicy {
    /// Memory without swap (`512MiB`), or `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Most processes and threads at once, or `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<Quantity>,
    /// CPU bandwidth in CPUs (`1.5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Quantity>,
    /// Size of `/tmp` and a fresh `/workspace`, and the largest file written (`1GiB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Quantity>,
    /// Wall-clock limit of the sandbox (`30s`, `2m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Quantity>,
}

impl ResourcesPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// How the sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only (the default).
    None,
    /// Only through Airlock's egress proxy, which applies `egress` and `credentials`.
    Proxy,
    /// The host's network, unfiltered.
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<NetworkMode>,
    /// Destinations the proxy lets through. Loopback, link-local (169.254.169.254 included),
    /// private and multicast addresses stay blocked after DNS resolution, whatever the name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressPolicy>,
}

impl NetworkPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// HTTP methods by intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AccessPreset {
    /// GET, HEAD and OPTIONS.
    ReadOnly,
    /// Also POST, PUT, PATCH and DELETE.
    ReadWrite,
}

/// One allowed destination.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// Unique among the rules; the host when absent. A later document's rule of the same name
    /// replaces an earlier one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `api.example.com` exactly, or `*.example.com` (any name strictly below it).
    pub host: String,
    /// Allowed ports; 443 and 80 when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// A method preset; exclusive with `methods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<AccessPreset>,
    /// Allowed HTTP methods (upper case).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Allowed request paths: `*` within a segment, `**` across segments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Private or link-local ranges (CIDR) this destination may resolve to despite the block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_ips: Vec<String>,
    /// The git refs a push through this rule may create, update or delete (`refs/heads/x`;
    /// `*` within a segment, `**` across segments); empty: no pushes. The proxy reads the ref
    /// update commands of every `POST .../git-receive-pack` to this host and port, so a host
    /// with such a rule takes pushes only through rules that list the refs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_push_refs: Option<Vec<String>>,
}

/// Where a credential's real value lives on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CredentialSourceSpec {
    /// An environment variable of the process that starts the sandbox.
    Env(String),
    /// An absolute path of a file on the host (a trailing newline is trimmed).
    File(String),
}

/// How the proxy puts the value into a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum InjectSpec {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// The named header carries the secret.
    Header(String),
    /// `Authorization: Basic base64(<username>:<secret>)`.
    Basic { username: String },
}

/// A destination where a credential may be used.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialEndpoint {
    pub host: String,
    /// 443 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Any method when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Any path when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

/// A secret the sandbox uses through a placeholder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialPolicy {
    pub name: String,
    pub source: CredentialSourceSpec,
    /// The sandbox's environment variable holding the opaque placeholder.
    pub env: String,
    pub inject: InjectSpec,
    /// Where the real value may be sent; each must be covered by an egress rule.
    pub endpoints: Vec<CredentialEndpoint>,
}

/// What happens to a request no rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Unmatched {
    /// Refused (the default).
    Deny,
    /// Held until someone approves or denies it, or `timeout` passes.
    Ask,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatched: Option<Unmatched>,
    /// How long an `ask` waits before denying (`60s` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Quantity>,
}

impl ApprovalsPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Which egress decisions are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditLevel {
    None,
    /// Refused requests only (the default).
    Denied,
    All,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<AuditLevel>,
}

impl AuditPolicy {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The JSON Schema of [`PolicyDocument`], as committed in `api/policy.schema.json`.
pub fn schema() -> Schema {
    schemars::schema_for!(PolicyDocument)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_document_round_trips_through_json_and_rejects_unknown_fields() {
        let json = r#"{"version":1,"extends":["workspace"],"tier":"process",
            "filesystem":{"rules":{"~/.ssh":"deny"}},
            "resources":{"memory":"512MiB","pids":256,"cpus":1.5},
            "credentials":[{"name":"gh","source":{"env":"GH"},"env":"GH_TOKEN",
              "inject":"bearer","endpoints":[{"host":"api.github.com"}]}]}"#;
        let doc: PolicyDocument = serde_json::from_str(json).unwrap();
        assert_eq!(doc.resources.pids, Some(Quantity("256".into())));
        assert_eq!(doc.resources.cpus, Some(Quantity("1.5".into())));
        assert_eq!(doc.credentials[0].inject, InjectSpec::Bearer);
        let back: PolicyDocument =
            serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
        assert_eq!(back, doc);
        let err = serde_json::from_str::<PolicyDocument>(r#"{"version":1,"netwrk":{}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `netwrk`"), "{err}");
        let err = serde_json::from_str::<PolicyDocument>(
            r#"{"version":1,"network":{"egress":[{"host":"a.b","port":1}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `port`"), "{err}");
    }

    #[test]
    fn test_injection_styles_are_externally_tagged() {
        let header: InjectSpec = serde_json::from_str(r#"{"header":"X-Api-Key"}"#).unwrap();
        assert_eq!(header, InjectSpec::Header("X-Api-Key".into()));
        let basic: InjectSpec = serde_json::from_str(r#"{"basic":{"username":"bot"}}"#).unwrap();
        assert_eq!(
            basic,
            InjectSpec::Basic {
                username: "bot".into()
            }
        );
    }
}
