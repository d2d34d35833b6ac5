"""A real Prometheus (Debian's) scraping the service as production runs it, every second.

One gunicorn of the Procfile (two workers) and one Prometheus serve every test
of this module. Prometheus's configuration is deploy/prometheus/prometheus.yml
pointed at that server, with a `metrics` token in its token file (the server
allows no address without one), and its rules are deploy/prometheus/alerts.yml
with the worker-behind alert's `for:` cut to a second. The server and the
worker judge the worker behind after two seconds without a pass
(CAPACITY_WORKER_MAX_SLEEP_SECONDS=1, CAPACITY_WORKER_LAG_SECONDS=1) instead
of ninety. Each test issues its own token (the database is emptied after each)
and writes it into the file, which Prometheus reads at every scrape.

What it shows: the pool's allocated GPUs in Prometheus equal `capacity/byPool`'s
after a reservation, and the worker-behind alert fires once the worker stops.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from core.services import token_issue
from fleets.load import fleet_load
from tests.monitoring.prometheus import ALERTS as ALERTS_FILE
from tests.monitoring.prometheus import (
    DASHBOARD,
    Prometheus,
    alert_rules,
    binary,
    load_yaml,
    prometheus_running,
    scrape_config,
    wait_for,
)
from tests.monitoring.servers import Web, free_port, procfile_web, procfile_worker
from tests.support.paths import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKER_BEHIND = "BetterComputeWorkerBehind"
# The worker is behind after max sleep + lag without a pass (core/worker_status.py).
FAST_WORKER = {"CAPACITY_WORKER_MAX_SLEEP_SECONDS": "1", "CAPACITY_WORKER_LAG_SECONDS": "1"}
# Only bounds that stop a broken run from hanging the suite: a scrape a second, an evaluation a second.
SEEN_SECONDS = 30.0


@dataclass
class Monitored:
    web: Web
    prometheus: Prometheus
    token_file: Path
    where: Path

    def scrape_with(self, token: str) -> None:
        self.token_file.write_text(token)


def fast_alerts() -> dict[str, Any]:
    """alerts.yml with the worker-behind alert's `for:` at one second."""
    rules = load_yaml(ALERTS_FILE)
    (behind,) = [
        rule for group in rules["groups"] for rule in group["rules"] if rule.get("alert") == WORKER_BEHIND
    ]
    behind["for"] = "1s"
    return dict(rules)


@pytest.fixture(scope="module")
def monitored(django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    binary("prometheus")  # skipped (or failed under REQUIRE_PROMETHEUS=1) before anything starts
    where = tmp_path_factory.mktemp("prometheus")
    token_file = where / "better-compute.token"
    token_file.write_text("no token yet")
    rule_file = where / "alerts.yml"
    rule_file.write_text(yaml.safe_dump(fast_alerts(), sort_keys=False))
    # No address may scrape without a token: the scrape config's bearer token is what lets Prometheus in.
    with procfile_web(where / "web.log", METRICS_ALLOWED_NETS="", **FAST_WORKER) as web:
        config = scrape_config(
            target=web.url.removeprefix("http://"), token_file=token_file, rule_file=rule_file
        )
        with prometheus_running(config=config, where=where, port=free_port()) as prometheus:
            yield Monitored(web=web, prometheus=prometheus, token_file=token_file, where=where)


def seen_since(prometheus: Prometheus, selector: str, since: float, value: float) -> bool:
    """Whether a scrape after `since` (epoch seconds) gave the series `value`."""
    latest = prometheus.latest(selector)
    return latest is not None and latest[0] > since and latest[1] == value


@pytest.fixture
def scraping(monitored: Monitored) -> Monitored:
    """The module's servers, with a metrics token of this test's database in Prometheus's token file."""
    monitored.scrape_with(token_issue(tenant_id=None, role="metrics", name="prometheus")[1])
    written = time.time()
    wait_for(
        lambda: seen_since(monitored.prometheus, 'up{job="better-compute"}', written, 1),
        seconds=SEEN_SECONDS,
        what="Prometheus to scrape the service with the token",
    )
    return monitored


def test_prometheus_has_the_pools_allocated_gpus_that_by_pool_answers(scraping: Monitored) -> None:
    fleet_load(data=json.loads((ROOT / "fleets" / "demo.json").read_text()))
    call_command("worker", "--once", stdout=io.StringIO())
    member = token_issue(tenant_id="acme", role="member", name="monitoring")[1]
    web, prometheus = scraping.web, scraping.prometheus
    status, summary = web.call("capacity/summary", member, {"tenantId": "acme"})
    assert status == 200, summary
    pool = next(p["poolId"] for p in summary["pools"] if p["name"] == "h100-east")
    request = {
        "tenantId": "acme",
        "poolId": pool,
        "devices": [{"class": "gpu", "count": 4, "selector": {"vramGiB": {"gte": 80}}}],
        "duration": "2h",
        "idempotencyKey": "monitoring-1",
    }
    status, created = web.call("reservations/create", member, request)
    assert status == 201, created
    status, by_pool = web.call("capacity/byPool", member, {"tenantId": "acme", "poolId": pool})
    assert status == 200, by_pool
    (row,) = [row for row in by_pool["rows"] if row["resource"] == "gpu"]
    assert row["allocated"] == 4

    selector = f'pool_id="{pool}", resource="gpu", column="allocated"'
    query = f"max by (pool) (better_compute_pool_capacity{{{selector}}})"
    wait_for(
        lambda: prometheus.value(query) == row["allocated"],
        seconds=SEEN_SECONDS,
        what=f"Prometheus's allocated GPUs of h100-east to be {row['allocated']}",
    )
    (series,) = prometheus.query(query)
    assert series["metric"] == {"pool": "h100-east"}
    # The request counters of both gunicorn workers reached Prometheus too.
    creates = 'sum(better_compute_reservation_creates_total{outcome="created"})'
    wait_for(lambda: (prometheus.value(creates) or 0) >= 1, seconds=SEEN_SECONDS, what="the create counted")


def test_the_worker_behind_alert_fires_when_the_worker_stops(scraping: Monitored) -> None:
    prometheus = scraping.prometheus

    def firing() -> list[dict[str, Any]]:
        return [alert for alert in prometheus.alerts(WORKER_BEHIND) if alert["state"] == "firing"]

    started = time.time()
    with procfile_worker(scraping.where / "worker.log", **FAST_WORKER) as worker:
        # Running: Prometheus sees it on time, and the alert (firing while no worker had ever run) is gone.
        wait_for(
            lambda: seen_since(prometheus, "better_compute_worker_behind", started, 0) and not firing(),
            seconds=SEEN_SECONDS,
            what="Prometheus to see the worker on time",
        )
        assert worker.poll() is None
    assert worker.returncode == 0, (scraping.where / "worker.log").read_text()[-2000:]

    (alert,) = wait_for(firing, seconds=SEEN_SECONDS, what="the worker-behind alert to fire")
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["job"] == "better-compute"
    assert alert["annotations"]["runbook"] == "docs/operations.md#the-worker-is-behind"
    assert "better-compute" in alert["annotations"]["summary"]


def test_every_rule_and_every_dashboard_query_evaluates_in_prometheus(scraping: Monitored) -> None:
    prometheus = scraping.prometheus
    names = {rule["alert"] for rule in alert_rules()}

    def evaluated() -> dict[str, str] | None:
        loaded = {
            rule["name"]: rule["health"]
            for group in prometheus.api("rules")["groups"]
            for rule in group["rules"]
        }
        return loaded if set(loaded) == names and "unknown" not in loaded.values() else None

    health = wait_for(evaluated, seconds=SEEN_SECONDS, what="every rule evaluated")
    assert set(health.values()) == {"ok"}, health

    # The worker's per-job series name their job in `worker_job`, beside Prometheus's own `job`.
    call_command("worker", "--once", stdout=io.StringIO())
    lags = wait_for(
        lambda: prometheus.query("better_compute_worker_job_lag_seconds"),
        seconds=SEEN_SECONDS,
        what="the worker's jobs scraped",
    )
    jobs = {series["metric"].get("worker_job") for series in lags}
    assert "rollup-rebuild" in jobs and None not in jobs
    assert {series["metric"]["job"] for series in lags} == {"better-compute"}
    assert not any("exported_job" in series["metric"] for series in lags)

    board = json.loads(DASHBOARD.read_text())
    variables = {"$pool": ".*", "$resource": "gpu", "$__rate_interval": "1m"}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$\w+", lambda m: variables[m.group(0)], target["expr"])
            prometheus.query(expr)  # asserts the API's status is success: the PromQL is valid
