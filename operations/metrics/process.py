"""What only the process that saw it knows: request latency, create outcomes, the placer's time.

Counters and histograms of prometheus_client. Under gunicorn each worker
writes its values to files in `PROMETHEUS_MULTIPROC_DIR` (made per server
start by `gunicorn.conf.py`), and the worker that answers the scrape sums
every worker's files (`MultiProcessCollector`); without that directory
(runserver, tests, the management command) they are the process's own.
There is no gauge here, so none needs a multiprocess mode of its own.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

# Every create outcome a dashboard or an alert names is a series from the start, at 0.
CREATE_OUTCOMES = ("created", "replayed", "NO_CAPACITY", "QUOTA_EXCEEDED", "RATE_LIMITED", "other_error")

# Seconds; an API answer is milliseconds to a second, a waiting create up to its timeout.
# 2.0 is the p99 create alert's threshold (deploy/prometheus/alerts.yml), so it is exact.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PLANNING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# No `_created` series beside each counter: nothing here reads them, and they double a scrape's lines.
disable_created_metrics()
REGISTRY = CollectorRegistry(auto_describe=True)

REQUEST_SECONDS = Histogram(
    "better_compute_api_request_duration_seconds",
    "API answers by method (`reservations/create`, ...) and HTTP status, timed from the outermost "
    "middleware to the answer built (a create that waits for capacity counts its wait).",
    ("method", "status"),
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
CREATES = Counter(
    "better_compute_reservation_creates",
    "reservations/create answers by outcome: created, replayed (an idempotent retry), "
    "or the error code (NO_CAPACITY, QUOTA_EXCEEDED, RATE_LIMITED; other_error for the rest).",
    ("outcome",),
    registry=REGISTRY,
)
PLANNING_SECONDS = Histogram(
    "better_compute_placement_duration_seconds",
    "The placer's time per create (planning and the guarded commit, replans included).",
    buckets=_PLANNING_BUCKETS,
    registry=REGISTRY,
)
REPLANS = Counter(
    "better_compute_placement_replans",
    "Shortlists spent on lost races (every option taken by a concurrent commit) and planned again.",
    registry=REGISTRY,
)
RATE_LIMITED = Counter(
    "better_compute_rate_limited",
    "Answers refused with RATE_LIMITED, by method (writes over the per-minute limits, "
    "creates beyond the waiting slots).",
    ("method",),
    registry=REGISTRY,
)
for _outcome in CREATE_OUTCOMES:
    CREATES.labels(_outcome)


def placer_observed(event: str, seconds: float) -> None:
    """What `reservations.placer.commit.OBSERVERS` tells: each placement's time, each replan."""
    if event == "placement":
        PLANNING_SECONDS.observe(seconds)
    elif event == "replan":
        REPLANS.inc()


def process_exposition() -> bytes:
    """The counters and histograms in the text format: every gunicorn worker's, or this process's."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory and os.path.isdir(directory):
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)
        return generate_latest(registry)
    return generate_latest(REGISTRY)
