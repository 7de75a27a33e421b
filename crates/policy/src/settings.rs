//! The policy values that become `SandboxConfig` fields (tier, user, limits, timeout), parsed
//! with the command line's own parsers so that `512MiB` means the same in both places.

use airlock_api::policy::{PolicyDocument, Quantity};
use airlock_api::{
    SandboxConfig, Tier, UserSpec, parse_cpus_milli, parse_duration_ms, parse_size_bytes,
};

use crate::compile::{AIRLOCK_PROCESSES, PIDS_LIMIT};

/// A limit that `max` lifts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Max,
    Value(u64),
}

impl Limit {
    /// As a `ResourceLimits` field: `None` is unlimited.
    pub fn as_option(self) -> Option<u64> {
        match self {
            Limit::Max => None,
            Limit::Value(value) => Some(value),
        }
    }
}

/// The configuration-level values of a policy. `None` leaves Airlock's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    /// The weakest tier allowed.
    pub tier: Option<Tier>,
    pub user: Option<UserSpec>,
    pub memory: Option<Limit>,
    pub pids: Option<Limit>,
    pub cpu_milli: Option<u32>,
    pub disk_bytes: Option<u64>,
    pub timeout_ms: Option<u64>,
}

impl Settings {
    /// Writes the policy's values into `config`. Callers apply their explicit flags afterwards,
    /// so flags win; `tier` only ever strengthens.
    pub fn apply(&self, config: &mut SandboxConfig) {
        if let Some(tier) = self.tier
            && tier.strength() > config.tier.strength()
        {
            config.tier = tier;
        }
        if let Some(user) = self.user {
            config.set_user(user);
        }
        let r = &mut config.resources;
        if let Some(memory) = self.memory {
            r.memory_bytes = memory.as_option();
        }
        if let Some(pids) = self.pids {
            r.pids_max = pids.as_option();
        }
        if let Some(cpu) = self.cpu_milli {
            r.cpu_milli = Some(cpu);
        }
        if let Some(disk) = self.disk_bytes {
            r.disk_bytes = disk;
        }
        if let Some(timeout) = self.timeout_ms {
            config.timeout_ms = Some(timeout);
        }
    }
}

pub(crate) fn parse_memory(value: &Quantity) -> Result<Limit, String> {
    if value.0 == "max" {
        return Ok(Limit::Max);
    }
    parse_size_bytes(&value.0)
        .map(Limit::Value)
        .map_err(|e| e.to_string())
}

pub(crate) fn parse_pids(value: &Quantity) -> Result<Limit, String> {
    if value.0 == "max" {
        return Ok(Limit::Max);
    }
    let most = PIDS_LIMIT - AIRLOCK_PROCESSES;
    match value.0.parse::<u64>() {
        Ok(n) if (1..=most).contains(&n) => Ok(Limit::Value(n)),
        Ok(n) => Err(format!("must be between 1 and {most}, got {n}")),
        Err(_) => Err(format!("`{}` is not a whole number or `max`", value.0)),
    }
}

pub(crate) fn parse_cpus(value: &Quantity) -> Result<u32, String> {
    parse_cpus_milli(&value.0).map_err(|e| e.to_string())
}

pub(crate) fn parse_size(value: &Quantity) -> Result<u64, String> {
    parse_size_bytes(&value.0).map_err(|e| e.to_string())
}

pub(crate) fn parse_duration(value: &Quantity) -> Result<u64, String> {
    parse_duration_ms(&value.0).map_err(|e| e.to_string())
}

pub(crate) fn parse_user(value: &str) -> Result<UserSpec, String> {
    value.parse::<UserSpec>().map_err(|e| e.to_string())
}

/// The settings of a validated document (invalid values were refused before; here they are
/// skipped).
pub(crate) fn settings(doc: &PolicyDocument) -> Settings {
    let r = &doc.resources;
    Settings {
        tier: doc.tier,
        user: doc.process.user.as_deref().and_then(|u| parse_user(u).ok()),
        memory: r.memory.as_ref().and_then(|v| parse_memory(v).ok()),
        pids: r.pids.as_ref().and_then(|v| parse_pids(v).ok()),
        cpu_milli: r.cpus.as_ref().and_then(|v| parse_cpus(v).ok()),
        disk_bytes: r.disk.as_ref().and_then(|v| parse_size(v).ok()),
        timeout_ms: r.timeout.as_ref().and_then(|v| parse_duration(v).ok()),
    }
}
