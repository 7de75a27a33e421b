//! E2B's control-plane JSON, field for field as the SDKs send and read it (camelCase, with
//! E2B's own quirks such as `allow_internet_access`). Requests list every field any supported
//! SDK version sends, so that `deny_unknown_fields` still catches typos; what Airlock does not
//! implement is accepted and ignored (see the README's compatibility table). Responses carry
//! every field the SDKs require: a missing one is a `KeyError` in the Python SDK.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /sandboxes` (`NewSandbox`) and `POST /v2/sandboxes` (`NewSandboxV2`, which is the
/// same without `secure`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Lifetime in seconds; E2B's default when absent (300 on v2, 15 on v1).
    #[serde(rename = "timeout", default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<i64>,
    /// Pause instead of kill at the timeout. Ignored: Airlock cannot pause yet.
    #[serde(rename = "autoPause", default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// Ignored, as `autoPause`.
    #[serde(
        rename = "autoPauseMemory",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_pause_memory: Option<bool>,
    /// Ignored, as `autoPause`.
    #[serde(
        rename = "autoResume",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_resume: Option<Value>,
    /// v1 only: issue an `envdAccessToken` and require it on the data plane. v2 always does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    /// Ignored: the process tier has no network but loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// Ignored, as `allow_internet_access`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment of every command in the sandbox.
    #[serde(rename = "envVars", default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Ignored: no MCP gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Value>,
    /// Ignored: no workload identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iam: Option<Value>,
    /// Refused when not empty, as E2B refuses them where volumes are not enabled.
    #[serde(
        rename = "volumeMounts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub volume_mounts: Option<Vec<Value>>,
}

/// `POST /sandboxes/{id}/connect` (timeout required by E2B's v1 schema, accepted as optional
/// here) and `POST /v2/sandboxes/{id}/connect`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectSandbox {
    /// Seconds the sandbox should live from now at least; never shortens it.
    #[serde(rename = "timeout", default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<i64>,
    /// How to resume a paused sandbox (with or without its memory); nothing is ever paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends this many seconds from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    #[serde(rename = "timeout")]
    pub timeout_s: i64,
}

/// `POST /sandboxes/{id}/refreshes`: keep the sandbox alive this much longer from now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refresh {
    #[serde(rename = "duration", default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<i64>,
}

/// `POST /sandboxes/{id}/pause`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    #[serde(
        rename = "requireHealthyGuest",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/resume` (legacy; the SDKs resume through connect).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    #[serde(rename = "timeout", default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<i64>,
    #[serde(rename = "autoPause", default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
}

/// The answer to create and connect (`Sandbox` in E2B's spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(
        rename = "envdAccessToken",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub envd_access_token: Option<String>,
    /// `<port>-<id>.<domain>` reaches a port of the sandbox (`get_host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

/// One entry of `GET /v2/sandboxes` and `GET /sandboxes` (`ListedSandbox`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// RFC 3339.
    #[serde(rename = "startedAt")]
    pub started_at: String,
    /// RFC 3339: when the sandbox will be destroyed.
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub metadata: BTreeMap<String, String>,
    pub state: SandboxState,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
}

/// `GET /sandboxes/{id}` (`SandboxDetail`): the listed fields plus how to reach the sandbox.
/// (Spelled out rather than flattened: serde cannot deny unknown fields through `flatten`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "startedAt")]
    pub started_at: String,
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub metadata: BTreeMap<String, String>,
    pub state: SandboxState,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(
        rename = "envdAccessToken",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub envd_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Always false: the process tier has no network but loopback.
    #[serde(rename = "allowInternetAccess")]
    pub allow_internet_access: bool,
    /// `full` or `filesystem`, while paused.
    #[serde(rename = "pauseMode", default, skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
}

/// `SandboxDetail.lifecycle`: both fields are required when the object is present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// `pause` or `kill`.
    #[serde(rename = "onTimeout")]
    pub on_timeout: String,
    #[serde(rename = "autoResume")]
    pub auto_resume: bool,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// A snapshot as E2B's SDK reads it (create and list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fork {
    #[serde(rename = "timeout", default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// One entry of the fork answer: the new sandbox, or why it could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl SandboxDetail {
    pub fn new(listed: ListedSandbox, token: Option<String>, domain: Option<String>) -> Self {
        SandboxDetail {
            template_id: listed.template_id,
            alias: listed.alias,
            sandbox_id: listed.sandbox_id,
            client_id: listed.client_id,
            started_at: listed.started_at,
            end_at: listed.end_at,
            cpu_count: listed.cpu_count,
            memory_mb: listed.memory_mb,
            disk_size_mb: listed.disk_size_mb,
            metadata: listed.metadata,
            state: listed.state,
            envd_version: listed.envd_version,
            envd_access_token: token,
            domain,
            allow_internet_access: false,
            pause_mode: None,
            lifecycle: None,
        }
    }
}

/// Every control-plane error: `{"code": 404, "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

/// The proxy's answer when it cannot reach a sandbox or one of its ports (always 502).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyErrorBody {
    pub code: u16,
    #[serde(rename = "sandboxId")]
    pub sandbox_id: String,
    /// Contains `was not found` (the sandbox is gone) or `port is not open`: the SDKs match
    /// these words.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_requests_take_what_each_sdk_sends_and_nothing_else() {
        // 2.63 on /v2/sandboxes, and 2.10's v1 body with the snake_case quirk.
        let v2: NewSandbox = serde_json::from_str(
            r#"{"templateID":"base","timeout":120,"metadata":{"k":"v"},"envVars":{"FOO":"bar"},
                "autoPause":false,"autoResume":{"enabled":false},"mcp":null,"volumeMounts":[]}"#,
        )
        .unwrap();
        assert_eq!(v2.timeout_s, Some(120));
        assert_eq!(v2.env_vars.unwrap()["FOO"], "bar");
        let v1: NewSandbox = serde_json::from_str(
            r#"{"templateID":"base","timeout":15,"autoPause":false,"secure":true,
                "allow_internet_access":true}"#,
        )
        .unwrap();
        assert_eq!(v1.secure, Some(true));
        let typo = serde_json::from_str::<NewSandbox>(r#"{"templateID":"base","timout":5}"#);
        assert!(typo.unwrap_err().to_string().contains("timout"));
        assert!(
            serde_json::from_str::<NewSandbox>("{}").is_err(),
            "templateID is required"
        );
        let connect: ConnectSandbox =
            serde_json::from_str(r#"{"timeout":60,"memory":false}"#).unwrap();
        assert_eq!(connect.timeout_s, Some(60));
    }

    #[test]
    fn test_detail_is_a_listed_sandbox_plus_access() {
        let listed = ListedSandbox {
            template_id: "base".into(),
            alias: Some("base".into()),
            sandbox_id: "abc".into(),
            client_id: "airlock".into(),
            started_at: "2026-01-01T00:00:00.000Z".into(),
            end_at: "2026-01-01T00:05:00.000Z".into(),
            cpu_count: 2,
            memory_mb: 2048,
            disk_size_mb: 1024,
            metadata: BTreeMap::new(),
            state: SandboxState::Running,
            envd_version: "0.5.7".into(),
        };
        let detail = SandboxDetail::new(listed, Some("at_x".into()), Some("localhost:3000".into()));
        let json = serde_json::to_value(&detail).unwrap();
        for key in [
            "templateID",
            "sandboxID",
            "clientID",
            "startedAt",
            "endAt",
            "cpuCount",
            "memoryMB",
            "diskSizeMB",
            "state",
            "envdVersion",
            "envdAccessToken",
            "domain",
        ] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        assert_eq!(json["state"], "running");
        let back: SandboxDetail = serde_json::from_value(json).unwrap();
        assert_eq!(back, detail);
    }
}
