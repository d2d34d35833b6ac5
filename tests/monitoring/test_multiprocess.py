"""gunicorn's several workers, one scrape: the Procfile's `web` with two workers, requests that both served,
and a single `GET /metrics` that counts every one of them, whichever worker answers it."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from core.services import token_issue
from tests.monitoring.servers import Web, procfile_web
from tests.support.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)

METHOD = "capacity/summary"
REQUESTS = 40
# Only a bound: connections are handed to whichever worker accepts first, so more may be needed.
MAX_REQUESTS = 400


def served_by(web: Web) -> Counter[str]:
    """How many answers of METHOD each gunicorn worker (by pid) wrote, from the access log."""
    return Counter(
        pid for pid, _verb, path, _status in web.access_lines() if path == f"/api/compute/{METHOD}"
    )


def request_counts(text: str) -> dict[tuple[str, str], float]:
    """`better_compute_api_request_duration_seconds_count` by (method, status)."""
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "better_compute_api_request_duration_seconds_count":
                counts[(sample.labels["method"], sample.labels["status"])] = sample.value
    return counts


def test_one_scrape_counts_the_requests_of_both_gunicorn_workers(tmp_path: Path) -> None:
    TenantFactory.create(id="acme")
    token = token_issue(tenant_id="acme", role="member", name="multiprocess")[1]
    with procfile_web(tmp_path / "web.log", workers=2) as web:
        made = 0
        while made < REQUESTS or len(served_by(web)) < 2:
            assert made < MAX_REQUESTS, f"one worker served all {made} requests: {served_by(web)}"
            status, body = web.call(METHOD, token, {"tenantId": "acme"})
            assert status == 200, body
            made += 1
        # gunicorn writes a request's access line after its answer has gone: wait for the last ones.
        deadline = time.monotonic() + 10
        while sum(served_by(web).values()) < made and time.monotonic() < deadline:
            time.sleep(0.05)
        served = served_by(web)
        assert sum(served.values()) == made and len(served) == 2
        # From 127.0.0.1: METRICS_ALLOWED_NETS lets it in without a token.
        scrape = requests.get(f"{web.url}/metrics", timeout=30)
    assert scrape.status_code == 200, scrape.text[:500]
    counts = request_counts(scrape.text)
    # Each worker counted only its own; the one that answered the scrape summed both.
    assert max(served.values()) < made
    assert counts == {(METHOD, "200"): made}
