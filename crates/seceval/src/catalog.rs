//! The attack catalog as data (`crates/seceval/catalog.json`, compiled into the binary)
//! and the outcome vocabulary the runner and the catalog share.
//!
//! An outcome is what one attempt ended with: `ok [detail]`, `errno NAME`, `killed SIGNAME`,
//! `exit N` or `http STATUS`. A case states the outcome it expects inside the sandbox and the
//! layers that produce it, and how that attribution is proven (see `Proof`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The reviewed catalog, as shipped.
pub const CATALOG_JSON: &str = include_str!("../catalog.json");

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("the catalog is not valid JSON for its schema")]
    Json(#[source] serde_json::Error),
    #[error("case `{case}`: {problem}")]
    Case { case: String, problem: String },
    #[error("the catalog has {found} cases; at least {min} are required")]
    TooSmall { found: usize, min: usize },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub version: u32,
    pub groups: Vec<Group>,
    pub layers: Vec<LayerInfo>,
    /// Policy documents that cases name as `{policy:NAME}`.
    #[serde(default)]
    pub policies: BTreeMap<String, String>,
    pub cases: Vec<Case>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    pub id: String,
    pub title: String,
    /// The section of the research catalog (policy-and-security.md §(d)) it covers.
    pub section: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerInfo {
    pub id: String,
    pub title: String,
    /// How a case shows that this layer, and not another, stopped it.
    pub attribution: String,
}

/// Where an attempt runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Via {
    /// `airlock run` (with the case's flags) around the probe.
    #[default]
    Run,
    /// A command of a long-lived sandbox of a daemon the suite starts (`airlock serve`).
    Daemon,
    /// A host-side scenario against that daemon, coded in `daemon.rs`.
    Scenario,
    /// The microvm tier's VMM, read from the host's `/proc` (`microvm.rs`, by the case's id).
    Vmm,
}

/// Host objects a case needs; the suite creates them once and removes them at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    /// Fake home directories with planted credentials (world-readable, so that only
    /// Airlock's layers stand between them and the sandbox).
    Home,
    /// Listening sockets on the host: loopback TCP, UDP and abstract, pathname sockets in
    /// `/run`, in the host's `/tmp` and in a world-writable scratch directory.
    Sinks,
    /// The test upstream behind the egress proxy (`{upstream}`), on the host's loopback.
    Upstream,
    /// The fake internet: network namespaces holding 169.254.169.254, fd00:ec2::254, a DNS
    /// server and an exfiltration sink (needs `ip`).
    Fakenet,
    /// A listener on the host's own non-loopback address.
    Lan,
    /// A set-user-id root copy of the probe in the scratch directory.
    Setuid,
    /// The daemon and its sandboxes.
    Daemon,
}

/// A confinement change for a proof run (see `airlock_runtime::Ablation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ablate {
    Landlock,
    Seccomp,
    SeccompTag,
    Masks,
    Cgroup,
}

impl Ablate {
    pub fn flag(self) -> &'static str {
        match self {
            Ablate::Landlock => "landlock",
            Ablate::Seccomp => "seccomp",
            Ablate::SeccompTag => "seccomp-tag",
            Ablate::Masks => "masks",
            Ablate::Cgroup => "cgroup",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The layers that stop the attack (ids of `Catalog::layers`), strongest first.
    pub layers: Vec<String>,
    pub outcome: String,
}

/// One more run that pins the attribution: with `ablate` applied (and, if given, another
/// probe, such as `stat` of a mask), the outcome must be `outcome`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proof {
    #[serde(default)]
    pub ablate: Vec<Ablate>,
    #[serde(default)]
    pub probe: Option<Vec<String>>,
    pub outcome: String,
}

/// Where a control attempt runs: the host itself, or the client namespace of the fake
/// internet (which has a route to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ControlAt {
    Host,
    FakeClient,
}

/// The same attack outside any sandbox, to show that it is real on this host. Only for
/// attempts that change nothing outside the suite's own fixtures.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Control {
    pub at: ControlAt,
    pub outcome: String,
}

/// Something the suite does on the host when the probe prints `on`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interact {
    pub on: String,
    pub action: InteractAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InteractAction {
    /// Write the late secret, then the ready marker (`{late}`, `{ready}`).
    PlantLateSecret,
    /// Connect from the host to `127.0.0.1:{port}`.
    ConnectInbound,
}

/// Checks on the host after the sandbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Post {
    /// No sink (host loopback, fake internet) saw anything during the attempt.
    Silent,
    /// No process whose command line holds `{marker}` is left on the host.
    NoSurvivor,
    /// The egress proxy's test upstream received no byte during the attempt.
    UpstreamSilent,
    /// The container-tier test image's layer directory is exactly as it was (a write inside
    /// landed in the sandbox's own upper directory).
    LayersUntouched,
}

/// How a case differs on the container tier, where `/` is the image's own overlay and
/// nothing of the host is visible. A field left out keeps the case's own; `null` clears an
/// optional one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierCase {
    #[serde(default)]
    pub probe: Option<Vec<String>>,
    #[serde(default)]
    pub sandbox: Option<Vec<String>>,
    #[serde(default)]
    pub expect: Option<Expect>,
    #[serde(default)]
    pub proofs: Option<Vec<Proof>>,
    #[serde(default, deserialize_with = "present")]
    pub control: Option<Option<Control>>,
    #[serde(default)]
    pub post: Option<Vec<Post>>,
    #[serde(default, deserialize_with = "present")]
    pub na: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    pub known_gap: Option<Option<String>>,
}

/// A field that is present, even as `null` (`Some(None)`), told from one left out (`None`).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub id: String,
    pub group: String,
    pub title: String,
    /// Where the attack comes from (test suites and benchmarks it was drawn from).
    pub source: String,
    /// Item numbers of policy-and-security.md §(d).
    pub refs: Vec<u32>,
    #[serde(default)]
    pub via: Via,
    /// The probe's arguments (for `run` and `daemon`), with `{placeholders}`.
    #[serde(default)]
    pub probe: Vec<String>,
    /// For `via: scenario`, its name in `daemon.rs`.
    #[serde(default)]
    pub scenario: Option<String>,
    /// Extra `airlock run` flags.
    #[serde(default)]
    pub sandbox: Vec<String>,
    #[serde(default)]
    pub needs: Vec<Need>,
    pub expect: Expect,
    #[serde(default)]
    pub proofs: Vec<Proof>,
    #[serde(default)]
    pub control: Option<Control>,
    #[serde(default)]
    pub interact: Option<Interact>,
    #[serde(default)]
    pub post: Vec<Post>,
    /// Run the sandbox from a caller that leaked descriptors 7 and 8 (no close-on-exec).
    #[serde(default)]
    pub leak_descriptors: bool,
    /// Why the bwrap baseline cannot run this case, if it cannot.
    #[serde(default)]
    pub baseline_na: Option<String>,
    /// Why the case cannot run at all yet; it is reported n/a with this reason.
    #[serde(default)]
    pub na: Option<String>,
    /// A documented gap (SECURITY.md names the case id): the attack is expected to succeed on
    /// this tier, and the scorecard shows it red with this reason.
    #[serde(default)]
    pub known_gap: Option<String>,
    /// What changes on the container tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<TierCase>,
    /// Set: the case runs on the microvm tier, changed so (`microvm.rs`); unset, it is n/a
    /// there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microvm: Option<TierCase>,
}

impl Case {
    /// The case as it runs on `tier`.
    pub fn on_tier(&self, tier: airlock_api::Tier) -> Case {
        let mut case = self.clone();
        case.container = None;
        case.microvm = None;
        let over = match tier {
            airlock_api::Tier::Container => self.container.clone(),
            airlock_api::Tier::Microvm => self.microvm.clone(),
            _ => None,
        };
        let Some(over) = over else {
            return case;
        };
        if let Some(probe) = over.probe {
            case.probe = probe;
        }
        if let Some(sandbox) = over.sandbox {
            case.sandbox = sandbox;
        }
        if let Some(expect) = over.expect {
            case.expect = expect;
        }
        if let Some(proofs) = over.proofs {
            case.proofs = proofs;
        }
        if let Some(control) = over.control {
            case.control = control;
        }
        if let Some(post) = over.post {
            case.post = post;
        }
        if let Some(na) = over.na {
            case.na = na;
        }
        if let Some(known_gap) = over.known_gap {
            case.known_gap = known_gap;
        }
        case
    }
}

impl Catalog {
    /// The shipped catalog, checked.
    pub fn shipped() -> Result<Catalog, CatalogError> {
        Catalog::parse(CATALOG_JSON)
    }

    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        let catalog: Catalog = serde_json::from_str(text).map_err(CatalogError::Json)?;
        catalog.validate()?;
        Ok(catalog)
    }

    fn validate(&self) -> Result<(), CatalogError> {
        const MIN_CASES: usize = 45;
        if self.cases.len() < MIN_CASES {
            return Err(CatalogError::TooSmall {
                found: self.cases.len(),
                min: MIN_CASES,
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        let tiers: Vec<Case> = self
            .cases
            .iter()
            .filter(|c| c.container.is_some())
            .map(|c| c.on_tier(airlock_api::Tier::Container))
            .chain(
                self.cases
                    .iter()
                    .filter(|c| c.microvm.is_some())
                    .map(|c| c.on_tier(airlock_api::Tier::Microvm)),
            )
            .collect();
        for case in &self.cases {
            if !seen.insert(case.id.as_str()) {
                return Err(CatalogError::Case {
                    case: case.id.clone(),
                    problem: "the id is used twice".into(),
                });
            }
        }
        for case in self.cases.iter().chain(&tiers) {
            let bad = |problem: String| CatalogError::Case {
                case: case.id.clone(),
                problem,
            };
            if !self.groups.iter().any(|g| g.id == case.group) {
                return Err(bad(format!("unknown group `{}`", case.group)));
            }
            if case.expect.layers.is_empty() {
                return Err(bad("names no expected layer".into()));
            }
            for layer in &case.expect.layers {
                if !self.layers.iter().any(|l| &l.id == layer) {
                    return Err(bad(format!("unknown layer `{layer}`")));
                }
            }
            if case.title.is_empty() || case.source.is_empty() || case.refs.is_empty() {
                return Err(bad("needs a title, a source and §(d) refs".into()));
            }
            let mut outcomes = vec![&case.expect.outcome];
            outcomes.extend(case.proofs.iter().map(|p| &p.outcome));
            outcomes.extend(case.control.iter().map(|c| &c.outcome));
            for outcome in outcomes {
                Pattern::parse(outcome).map_err(&bad)?;
            }
            match case.via {
                Via::Scenario if case.scenario.is_none() => {
                    return Err(bad("`via: scenario` needs a scenario name".into()));
                }
                Via::Run | Via::Daemon if case.probe.is_empty() && case.na.is_none() => {
                    return Err(bad("needs probe arguments".into()));
                }
                _ => {}
            }
            if case.via != Via::Run && case.proofs.iter().any(|p| !p.ablate.is_empty()) {
                return Err(bad("only `airlock run` cases can take layers away".into()));
            }
            for arg in case.probe.iter().chain(&case.sandbox) {
                if let Some(name) = arg
                    .split('{')
                    .nth(1)
                    .and_then(|rest| rest.split('}').next())
                    .and_then(|p| p.strip_prefix("policy:"))
                    && !self.policies.contains_key(name)
                {
                    return Err(bad(format!("unknown policy `{name}`")));
                }
            }
        }
        Ok(())
    }

    pub fn group_title<'a>(&'a self, id: &'a str) -> &'a str {
        self.groups
            .iter()
            .find(|g| g.id == id)
            .map_or(id, |g| g.title.as_str())
    }
}

/// The end of one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Outcome {
    Ok(String),
    Errno(i32),
    Killed(i32),
    Exit(i32),
    Http(u16),
    /// Nothing came back within the suite's bound.
    Hung,
}

impl Outcome {
    /// The probe's verdict (the last `ok`/`errno` line), else the exit status.
    pub fn from_probe(stdout: &str, code: Option<i32>, signal: Option<i32>) -> Outcome {
        let verdict = stdout
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| *l == "ok" || l.starts_with("ok ") || l.starts_with("errno "));
        if let Some(line) = verdict {
            if let Some(rest) = line.strip_prefix("errno ") {
                let number = rest.split_whitespace().next().and_then(|n| n.parse().ok());
                return Outcome::Errno(number.unwrap_or(0));
            }
            return Outcome::Ok(line.strip_prefix("ok").unwrap_or("").trim().to_owned());
        }
        match (code, signal) {
            (_, Some(signal)) => Outcome::Killed(signal),
            // airlock and bwrap report a workload killed by signal N as 128 + N.
            (Some(code), None) if code > 128 && code < 160 => Outcome::Killed(code - 128),
            (Some(code), None) => Outcome::Exit(code),
            (None, None) => Outcome::Hung,
        }
    }

    /// Whether the attempt got through: the probe reports success.
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_)) || matches!(self, Outcome::Http(s) if *s < 300)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Ok(detail) if detail.is_empty() => write!(f, "ok"),
            Outcome::Ok(detail) => write!(f, "ok {detail}"),
            Outcome::Errno(n) => write!(f, "{}", errno_name(*n)),
            Outcome::Killed(n) => write!(f, "killed {}", signal_name(*n)),
            Outcome::Exit(n) => write!(f, "exit {n}"),
            Outcome::Http(s) => write!(f, "http {s}"),
            Outcome::Hung => write!(f, "no answer"),
        }
    }
}

/// An expected outcome, parsed from the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    OkAny,
    OkExact(String),
    OkContains(String),
    OkLacks(String),
    Errno(i32),
    Killed(i32),
    Exit(i32),
    Http(u16),
}

impl Pattern {
    /// `ok`, `ok=DETAIL`, `ok~PART`, `ok!~PART`, `errno NAME`, `killed SIGNAME`, `exit N`, `http STATUS`.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let bad = || {
            format!(
                "`{text}` is not an outcome (ok, ok=X, ok~X, ok!~X, errno NAME, killed SIG, exit N, http N)"
            )
        };
        if text == "ok" {
            return Ok(Pattern::OkAny);
        }
        if let Some(detail) = text.strip_prefix("ok=") {
            return Ok(Pattern::OkExact(detail.to_owned()));
        }
        if let Some(part) = text.strip_prefix("ok~") {
            return Ok(Pattern::OkContains(part.to_owned()));
        }
        if let Some(part) = text.strip_prefix("ok!~") {
            return Ok(Pattern::OkLacks(part.to_owned()));
        }
        let (word, value) = text.split_once(' ').ok_or_else(bad)?;
        match word {
            "errno" => errno_number(value).map(Pattern::Errno).ok_or_else(bad),
            "killed" => signal_number(value).map(Pattern::Killed).ok_or_else(bad),
            "exit" => value.parse().map(Pattern::Exit).map_err(|_| bad()),
            "http" => value.parse().map(Pattern::Http).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    pub fn matches(&self, outcome: &Outcome) -> bool {
        match (self, outcome) {
            (Pattern::OkAny, Outcome::Ok(_)) => true,
            (Pattern::OkExact(want), Outcome::Ok(got)) => want == got,
            (Pattern::OkContains(part), Outcome::Ok(got)) => got.contains(part.as_str()),
            (Pattern::OkLacks(part), Outcome::Ok(got)) => !got.contains(part.as_str()),
            (Pattern::Errno(a), Outcome::Errno(b))
            | (Pattern::Killed(a), Outcome::Killed(b))
            | (Pattern::Exit(a), Outcome::Exit(b)) => a == b,
            (Pattern::Http(a), Outcome::Http(b)) => a == b,
            _ => false,
        }
    }

    /// Whether this pattern describes a refusal (rather than an observation made by a
    /// successful probe, such as an empty capability set).
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            Pattern::OkAny | Pattern::OkExact(_) | Pattern::OkContains(_) | Pattern::OkLacks(_)
        )
    }

    /// The expected errno or signal, for the scorecard's docs.
    pub fn errno_text(&self) -> String {
        match self {
            Pattern::Errno(n) => errno_name(*n),
            Pattern::Killed(n) => format!("killed by {}", signal_name(*n)),
            Pattern::Exit(n) => format!("exit {n}"),
            Pattern::Http(s) => format!("HTTP {s}"),
            Pattern::OkAny | Pattern::OkExact(_) | Pattern::OkContains(_) | Pattern::OkLacks(_) => {
                "none (observed)".into()
            }
        }
    }
}

/// x86_64 Linux errno values the catalog uses.
const ERRNOS: &[(&str, i32)] = &[
    ("EPERM", 1),
    ("ENOENT", 2),
    ("ESRCH", 3),
    ("EIO", 5),
    ("ENXIO", 6),
    ("EBADF", 9),
    ("EAGAIN", 11),
    ("ENOMEM", 12),
    ("EACCES", 13),
    ("EBUSY", 16),
    ("EEXIST", 17),
    ("EXDEV", 18),
    ("ENOTDIR", 20),
    ("EISDIR", 21),
    ("EINVAL", 22),
    ("EMFILE", 24),
    ("ENOTTY", 25),
    ("EFBIG", 27),
    ("ENOSPC", 28),
    ("EROFS", 30),
    ("ENOSYS", 38),
    ("ELOOP", 40),
    ("EPROTO", 71),
    ("EOPNOTSUPP", 95),
    ("EAFNOSUPPORT", 97),
    ("EADDRNOTAVAIL", 99),
    ("ENETUNREACH", 101),
    ("ECONNRESET", 104),
    ("ETIMEDOUT", 110),
    ("ECONNREFUSED", 111),
    ("EHOSTUNREACH", 113),
    ("EHWPOISON", 133),
];

const SIGNALS: &[(&str, i32)] = &[
    ("SIGKILL", 9),
    ("SIGSEGV", 11),
    ("SIGTERM", 15),
    ("SIGXFSZ", 25),
    ("SIGSYS", 31),
];

pub fn errno_number(name: &str) -> Option<i32> {
    ERRNOS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

pub fn errno_name(number: i32) -> String {
    ERRNOS
        .iter()
        .find(|(_, v)| *v == number)
        .map_or_else(|| format!("errno {number}"), |(n, _)| (*n).to_owned())
}

fn signal_number(name: &str) -> Option<i32> {
    SIGNALS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

pub fn signal_name(number: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, v)| *v == number)
        .map_or_else(|| format!("signal {number}"), |(n, _)| (*n).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_shipped_catalog_is_valid_and_covers_every_group() {
        let catalog = Catalog::shipped().unwrap();
        assert!(catalog.cases.len() >= 45);
        for group in &catalog.groups {
            assert!(
                catalog.cases.iter().any(|c| c.group == group.id),
                "group {} has no case",
                group.id
            );
        }
        // The tag errno is the runtime's.
        assert_eq!(
            errno_number("EHWPOISON"),
            Some(i32::from(airlock_runtime::SECCOMP_TAG_ERRNO))
        );
    }

    #[test]
    fn test_outcomes_parse_from_probe_output_and_exit_status() {
        assert_eq!(
            Outcome::from_probe("errno 13 EACCES\n", Some(0), None),
            Outcome::Errno(13)
        );
        assert_eq!(
            Outcome::from_probe("started\nok forked 3 errno 11\n", Some(0), None),
            Outcome::Ok("forked 3 errno 11".into())
        );
        assert_eq!(
            Outcome::from_probe("", Some(159), None),
            Outcome::Killed(31)
        );
        assert_eq!(Outcome::from_probe("", Some(124), None), Outcome::Exit(124));
        assert_eq!(Outcome::from_probe("", None, Some(9)), Outcome::Killed(9));
    }

    #[test]
    fn test_patterns_match_and_bad_ones_are_named() {
        let errno = Pattern::parse("errno EACCES").unwrap();
        assert!(errno.matches(&Outcome::Errno(13)));
        assert!(!errno.matches(&Outcome::Errno(30)));
        assert!(
            Pattern::parse("ok~errno 11")
                .unwrap()
                .matches(&Outcome::Ok("forked 3 errno 11".into()))
        );
        assert!(
            !Pattern::parse("ok=0,1,2")
                .unwrap()
                .matches(&Outcome::Ok("0,1,2,7".into()))
        );
        assert!(
            Pattern::parse("killed SIGSYS")
                .unwrap()
                .matches(&Outcome::Killed(31))
        );
        let err = Pattern::parse("errno EWHATEVER").unwrap_err();
        assert!(err.contains("EWHATEVER"), "{err}");
    }
}
