//! `GET /metrics`: the daemon's counters, gauges and histograms for Prometheus.
//!
//! Counters and histograms are updated where things happen (creates, execs, egress decisions,
//! error answers); gauges of state (sandboxes by state, pool sizes) are read from the daemon at
//! each scrape, so they cannot drift from what the API lists. The answer is Prometheus's text
//! format (0.0.4), or OpenMetrics when the scraper's `Accept` asks for it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The media type of OpenMetrics, which a scraper may ask for instead of the text format.
pub const OPENMETRICS: &str = "application/openmetrics-text";

/// Where a sandbox of a create came from.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum CreateSource {
    /// Started for the request.
    Cold,
    /// Claimed from a warm pool.
    Pool,
    /// Started from a snapshot (create from snapshot, fork).
    Snapshot,
}

/// Which API a request came through.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Surface {
    V1,
    E2b,
}

impl CreateSource {
    fn label(self) -> &'static str {
        match self {
            CreateSource::Cold => "cold",
            CreateSource::Pool => "pool",
            CreateSource::Snapshot => "snapshot",
        }
    }
}

impl Surface {
    fn label(self) -> &'static str {
        match self {
            Surface::V1 => "v1",
            Surface::E2b => "e2b",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CreateLabels {
    source: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SurfaceLabels {
    api: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    kind: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    api: &'static str,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabels {
    template: String,
}

/// What a scrape reads from the daemon at that moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Sandboxes by state (`creating`, `running`, `paused`, `stopping`); pool members apart.
    pub sandboxes: Vec<(String, i64)>,
    /// Per template with a pool: (template, ready members, target size).
    pub pools: Vec<(String, i64, i64)>,
    /// Network namespaces the host made for sandboxes: (from the zygote's pool, made by a
    /// helper because the pool was empty); counters, kept by the runtime.
    pub host_networks: (u64, u64),
}

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    creates: Family<CreateLabels, Counter>,
    create_seconds: Family<SourceLabels, Histogram>,
    execs: Family<SurfaceLabels, Counter>,
    egress: Family<DecisionLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    pool_claims: Family<TemplateLabels, Counter>,
    sandboxes: Family<StateLabels, Gauge>,
    pool_ready: Family<TemplateLabels, Gauge>,
    pool_target: Family<TemplateLabels, Gauge>,
    host_networks: Family<SourceLabels, Counter>,
}

/// Create latencies from 0.25 ms to about 8 s, doubling.
fn create_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("airlock");
        let creates = Family::<CreateLabels, Counter>::default();
        registry.register(
            "sandbox_creates",
            "Sandbox creates answered, by where the sandbox came from and outcome",
            creates.clone(),
        );
        let create_seconds =
            Family::<SourceLabels, Histogram>::new_with_constructor(create_histogram as fn() -> _);
        registry.register_with_unit(
            "sandbox_create_duration",
            "Time from a create request to a usable sandbox",
            Unit::Seconds,
            create_seconds.clone(),
        );
        let execs = Family::<SurfaceLabels, Counter>::default();
        registry.register("execs", "Processes started in sandboxes", execs.clone());
        let egress = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "egress_decisions",
            "Egress proxy decisions (kind egress, credential or approval) by outcome",
            egress.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "api_errors",
            "Error answers by API and stable error code (HTTP status for E2B's own errors)",
            errors.clone(),
        );
        let pool_claims = Family::<TemplateLabels, Counter>::default();
        registry.register(
            "pool_claims",
            "Creates served from a template's warm pool",
            pool_claims.clone(),
        );
        let sandboxes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "sandboxes",
            "Sandboxes by state (warm pool members not included)",
            sandboxes.clone(),
        );
        let pool_ready = Family::<TemplateLabels, Gauge>::default();
        registry.register(
            "pool_ready",
            "Started sandboxes waiting in a template's warm pool",
            pool_ready.clone(),
        );
        let pool_target = Family::<TemplateLabels, Gauge>::default();
        registry.register(
            "pool_target",
            "The size a template's warm pool is kept at",
            pool_target.clone(),
        );
        let host_networks = Family::<SourceLabels, Counter>::default();
        registry.register(
            "network_namespaces",
            "Network namespaces made by the host for sandboxes, from the zygote's pool (pool) or by their helper when the pool was empty (helper)",
            host_networks.clone(),
        );
        Metrics {
            registry,
            creates,
            create_seconds,
            execs,
            egress,
            errors,
            pool_claims,
            sandboxes,
            pool_ready,
            pool_target,
            host_networks,
        }
    }

    /// A create answered after `seconds`.
    pub fn create(&self, source: CreateSource, ok: bool, seconds: f64) {
        let outcome = if ok { "ok" } else { "error" };
        let source = source.label();
        self.creates
            .get_or_create(&CreateLabels { source, outcome })
            .inc();
        if ok {
            self.create_seconds
                .get_or_create(&SourceLabels { source })
                .observe(seconds);
        }
    }

    pub fn exec(&self, api: Surface) {
        self.execs
            .get_or_create(&SurfaceLabels { api: api.label() })
            .inc();
    }

    pub fn pool_claim(&self, template: &str) {
        self.pool_claims
            .get_or_create(&TemplateLabels {
                template: template.to_owned(),
            })
            .inc();
    }

    /// An audit record of the egress proxy (`kind`, `outcome` as in `AuditRecord`).
    pub fn egress_decision(&self, kind: &str, outcome: &str) {
        self.egress
            .get_or_create(&DecisionLabels {
                kind: kind.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// An error answer with its stable code.
    pub fn error(&self, api: Surface, code: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                api: api.label(),
                code: code.to_owned(),
            })
            .inc();
    }

    /// Encodes every metric, with the gauges set from `now`; returns the body and its media
    /// type.
    pub fn render(&self, now: &Snapshot, openmetrics: bool) -> (String, &'static str) {
        set_gauges(
            &self.sandboxes,
            now.sandboxes.iter().map(|(state, n)| {
                (
                    StateLabels {
                        state: state.clone(),
                    },
                    *n,
                )
            }),
        );
        let template = |name: &String| TemplateLabels {
            template: name.clone(),
        };
        set_gauges(
            &self.pool_ready,
            now.pools
                .iter()
                .map(|(name, ready, _)| (template(name), *ready)),
        );
        set_gauges(
            &self.pool_target,
            now.pools
                .iter()
                .map(|(name, _, size)| (template(name), *size)),
        );
        let (pooled, made) = now.host_networks;
        for (source, total) in [("pool", pooled), ("helper", made)] {
            // The runtime keeps the totals; the counter catches up with them.
            let counter = self.host_networks.get_or_create(&SourceLabels { source });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let mut text = String::new();
        if openmetrics {
            // Writing into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
            (
                text,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        } else {
            let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
            (
                text,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            )
        }
    }
}

/// Replaces a gauge family's series: a state or pool that went away disappears.
fn set_gauges<L>(family: &Family<L, Gauge>, values: impl Iterator<Item = (L, i64)>)
where
    L: Clone + std::hash::Hash + Eq,
{
    family.clear();
    for (labels, value) in values {
        family.get_or_create(&labels).set(value);
    }
}
