"""GET /metrics read by Prometheus's own Python parsers (the 0.0.4 text format and OpenMetrics):
the figures follow what E2B clients do, and the endpoint needs an API key."""

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families


def scrape(daemon, openmetrics=False, headers=None):
    sent = {"X-API-Key": daemon.key} if headers is None else headers
    if openmetrics:
        sent["Accept"] = "application/openmetrics-text; version=1.0.0"
    response = daemon.request("GET", "/metrics", sent)
    assert response.status == 200, response.body
    families = openmetrics_families if openmetrics else text_families
    return response, {family.name: family for family in families(response.body.decode())}


def sample(families, family, name, **labels):
    """The value of one sample, 0 when the series (or its whole family) does not exist yet."""
    if family not in families:
        return 0.0
    for s in families[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


def host_networks(families):
    """Network namespaces the host made for sandboxes, from the pool or by their helper."""
    return sum(sample(families, "airlock_network_namespaces", "airlock_network_namespaces_total",
                      source=source) for source in ("pool", "helper"))


def test_metrics_without_api_key_is_refused(daemon):
    response = daemon.request("GET", "/metrics")
    assert response.status == 401
    assert response.json()["code"] == "unauthenticated"
    wrong = daemon.request("GET", "/metrics", {"Authorization": "Bearer not-a-key"})
    assert wrong.status == 401


def test_metrics_accepts_a_bearer_key_as_prometheus_sends_it(daemon):
    response, families = scrape(daemon, headers={"Authorization": f"Bearer {daemon.key}"})
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "airlock_sandboxes" in families


def test_metrics_count_creates_execs_and_errors(daemon, new_sandbox):
    _, before = scrape(daemon)
    creates = sample(before, "airlock_sandbox_creates", "airlock_sandbox_creates_total",
                     source="cold", outcome="ok")
    latency_count = sample(before, "airlock_sandbox_create_duration_seconds",
                           "airlock_sandbox_create_duration_seconds_count", source="cold")
    execs = sample(before, "airlock_execs", "airlock_execs_total", api="e2b")
    not_found = sample(before, "airlock_api_errors", "airlock_api_errors_total",
                       api="e2b", code="404")
    networks = host_networks(before)

    sandbox = new_sandbox()
    assert sandbox.commands.run("true").exit_code == 0
    assert daemon.api("GET", "/sandboxes/nosuchsandbox0000").status == 404

    _, after = scrape(daemon)
    assert sample(after, "airlock_sandbox_creates", "airlock_sandbox_creates_total",
                  source="cold", outcome="ok") == creates + 1
    assert sample(after, "airlock_sandbox_create_duration_seconds",
                  "airlock_sandbox_create_duration_seconds_count",
                  source="cold") == latency_count + 1
    assert sample(after, "airlock_execs", "airlock_execs_total", api="e2b") == execs + 1
    assert sample(after, "airlock_api_errors", "airlock_api_errors_total",
                  api="e2b", code="404") == not_found + 1
    assert sample(after, "airlock_sandboxes", "airlock_sandboxes", state="running") >= 1
    # A process-tier sandbox of a root daemon runs in a network namespace the host made (a
    # refilling warm pool elsewhere may add its own members').
    assert host_networks(after) >= networks + 1
    # Histogram buckets are cumulative and end with +Inf holding every observation.
    buckets = [s for s in after["airlock_sandbox_create_duration_seconds"].samples
               if s.name.endswith("_bucket") and s.labels.get("source") == "cold"]
    values = [s.value for s in buckets]
    assert values == sorted(values)
    assert buckets[-1].labels["le"] == "+Inf"
    assert buckets[-1].value == latency_count + 1


def test_metrics_sandbox_gauge_follows_kill(daemon, new_sandbox):
    _, before = scrape(daemon)
    running = sample(before, "airlock_sandboxes", "airlock_sandboxes", state="running")
    sandbox = new_sandbox()
    _, during = scrape(daemon)
    assert sample(during, "airlock_sandboxes", "airlock_sandboxes", state="running") == running + 1
    sandbox.kill()
    _, after = scrape(daemon)
    assert sample(after, "airlock_sandboxes", "airlock_sandboxes", state="running") == running


def test_metrics_in_openmetrics_when_asked(daemon):
    response, families = scrape(daemon, openmetrics=True)
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.body.decode().endswith("# EOF\n")
    assert families["airlock_sandbox_creates"].type == "counter"
    assert families["airlock_sandbox_create_duration_seconds"].type == "histogram"
    assert families["airlock_sandboxes"].type == "gauge"
    assert families["airlock_network_namespaces"].type == "counter"
