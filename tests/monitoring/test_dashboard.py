"""The Grafana dashboard: JSON of the schema Grafana 10 writes, the panels the issue lists, and no metric name
that a scrape of the service does not have."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from inventory.models import Node, Pool
from reservations.rollups.recount import rollup_rebuild
from tests.monitoring.prometheus import DASHBOARD
from tests.support.api import post, reservation_body

METRIC = re.compile(r"\bbetter_compute_[a-zA-Z0-9_]+")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that draws something (rows, and the panels collapsed inside them, flattened)."""
    found = []
    for panel in board["panels"]:
        found.extend(panel.get("panels", []))
        if panel["type"] != "row":
            found.append(panel)
    return found


def expressions(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets and the template variables' queries."""
    exprs = [target["expr"] for panel in panels(board) for target in panel["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


def by_title(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {panel["title"]: panel for panel in panels(board)}


def scraped_names(text: str) -> set[str]:
    """The metric names in a scrape: each sample's, and each declared family's (a histogram's three)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names.update(f"{name}{suffix}" for suffix in HISTOGRAM_SUFFIXES)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.django_db(transaction=True)
def test_every_metric_the_dashboard_uses_is_in_a_scrape(
    owner_client: APIClient, owned_pool: Pool, gpu_node: Node
) -> None:
    rollup_rebuild(pool_id=owned_pool.id)
    call_command("worker", "--once", stdout=io.StringIO())
    created = post(owner_client, "reservations/create", reservation_body(owned_pool, "acme", gpus=2))
    assert created.status_code == 201, created.json()
    response = Client().get("/metrics")  # from 127.0.0.1: METRICS_ALLOWED_NETS
    assert response.status_code == 200
    text = response.content.decode()
    have = scraped_names(text)
    used = {name for expr in expressions(dashboard()) for name in METRIC.findall(expr)}
    assert used, "the dashboard names no metric"
    assert used <= have, f"not in a scrape: {sorted(used - have)}"
    # The scrape had the series themselves, not only their declarations: the fleet, the worker, a request.
    for name in (
        "better_compute_pool_capacity",
        "better_compute_worker_job_lag_seconds",
        "better_compute_api_request_duration_seconds_bucket",
        "better_compute_reservation_creates_total",
    ):
        assert re.search(rf"^{name}\{{", text, re.MULTILINE), name


def test_the_dashboard_is_grafana_json_with_a_datasource_and_a_pool_variable() -> None:
    board = dashboard()
    assert board["schemaVersion"] == 39
    assert board["uid"] and board["title"]
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    pool = variables["pool"]
    assert pool["type"] == "query" and pool["datasource"] == DATASOURCE
    assert pool["definition"] == "label_values(better_compute_pool_capacity, pool)"
    assert pool["multi"] and pool["includeAll"]
    every = panels(board)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in every:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]


def test_the_dashboard_has_the_panels_the_issue_lists() -> None:
    board = dashboard()
    titles = by_title(board)

    capacity = titles["Capacity of $pool over time ($resource)"]
    assert capacity["repeat"] == "pool"
    assert capacity["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    stacked = [re.search(r'column="(\w+)"', target["expr"]).group(1) for target in capacity["targets"]]
    assert stacked == [
        "allocated",
        "reserved",
        "available",
        "provisioning",
        "unhealthy",
        "maintenance",
        "unreachable",
    ]

    (free,) = titles["Free GPUs per model"]["targets"]
    assert free["expr"].startswith("sum by (gpu_model)")
    assert 'resource="gpu", column="available"' in free["expr"]

    lag = [target["expr"] for target in titles["Worker lag per job"]["targets"]]
    assert any("better_compute_worker_job_lag_seconds" in expr for expr in lag)

    latency = [target["expr"] for target in titles["Request latency by method (p50, p99)"]["targets"]]
    assert [expr.split(",")[0] for expr in latency] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    assert all("by (method, le)" in expr for expr in latency)

    (outcomes,) = titles["Create outcomes"]["targets"]
    assert "sum by (outcome) (rate(better_compute_reservation_creates_total" in outcomes["expr"]

    (at_risk,) = titles["At-risk reservations"]["targets"]
    assert "better_compute_pool_at_risk_reservations" in at_risk["expr"]

    outbox = " ".join(target["expr"] for target in titles["Outbox backlog"]["targets"])
    assert "better_compute_outbox_rows" in outbox and "better_compute_outbox_oldest_age_seconds" in outbox

    (nodes,) = titles["Nodes by bucket"]["targets"]
    assert nodes["expr"].startswith("sum by (bucket)")
