"""The capacity reads over HTTP: summary, byPool, preview, earliest, timeline and usage, p50 and p99.

`python -m bench` runs them against gunicorn at every fleet size, in the
H100 exclusive pool (the fleet's main pool) of its owner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.clock import Clock
from bench.metrics import scrape_measure

READ_SAMPLES = 200
PREVIEW_SAMPLES = 25
TIMELINE_SAMPLES = 25
EARLIEST_SAMPLES = 15
USAGE_SAMPLES = 50


def _usage_bodies(tenant: str) -> dict[str, dict[str, Any]]:
    """`usage/hourly` for one tenant: the 31 days that end with the last closed hour, and the open hour."""
    from capacity.models import UsageHour

    last = UsageHour.objects.order_by("-hour").values_list("hour", flat=True).first()
    open_ms = (int(time.time() * 1000) // 3_600_000) * 3_600_000
    end_ms = int(last.timestamp() * 1000) + 3_600_000 if last else open_ms
    return {
        "usage/hourly": {"tenantId": tenant, "from": end_ms - 31 * 86_400_000, "to": end_ms, "limit": 1000},
        "usage/hourly open hour": {"tenantId": tenant, "from": open_ms, "to": open_ms + 3_600_000},
    }


def _preview_bodies(tenant: str, pool_id: str) -> dict[str, dict[str, Any]]:
    selector = {"vramGiB": {"gte": 80}, "gpuModel": "H100"}
    base = {"tenantId": tenant, "poolId": pool_id, "duration": 3600, "idempotencyKey": "bench-preview"}
    return {
        "1 GPU": {**base, "devices": [{"class": "gpu", "count": 1}]},
        "1 GPU + selector": {**base, "devices": [{"class": "gpu", "count": 1, "selector": selector}]},
        "8 GPUs": {**base, "devices": [{"class": "gpu", "count": 8}]},
        "8 GPUs + selector": {**base, "devices": [{"class": "gpu", "count": 8, "selector": selector}]},
        "gang 4x8": {**base, "devices": [{"class": "gpu", "count": 8}], "gang": {"size": 4}},
        "gang 4x8 + selector": {
            **base,
            "devices": [{"class": "gpu", "count": 8, "selector": selector}],
            "gang": {"size": 4},
        },
    }


def _earliest_bodies(tenant: str, pool_id: str) -> dict[str, dict[str, Any]]:
    """capacity/earliest over the next 7 days: one that fits at once, and two that must wait."""
    base = {"tenantId": tenant, "poolId": pool_id, "idempotencyKey": "bench-earliest", "horizon": "7d"}
    eight = [{"class": "gpu", "count": 8}]
    return {
        "8 GPUs for 1 day": {**base, "devices": eight, "duration": "1d"},
        "8 GPUs for 3 days": {**base, "devices": eight, "duration": "3d"},
        "gang 4x8 for 1 day": {**base, "devices": eight, "duration": "1d", "gang": {"size": 4}},
    }


def reads_measure(
    *, port: int, tokens: dict[str, str], pools: dict[str, Any], clock: Clock, nodes: int
) -> dict[str, Any]:
    """Every read's latency at this fleet size, keyed as the report reads them."""
    from bench.load import Client, latency_measure

    tenant, pool_id = pools["main"]
    client = Client(port=port, token=tokens[tenant])
    out: dict[str, Any] = {}
    with clock.step(f"{nodes} nodes: summary and byPool x{READ_SAMPLES}"):
        # The fixed cost of any call on this machine: HTTP, gunicorn, Django and
        # DRF, refused (401) before any query because the bearer token is empty.
        anonymous = Client(port=port, token="")
        out["no credential (401)"] = latency_measure(
            client=anonymous, method="capacity/summary", body=lambda i: {"tenantId": tenant}, n=READ_SAMPLES
        ).as_dict()
        anonymous.close()
        out["summary"] = latency_measure(
            client=client, method="capacity/summary", body=lambda i: {"tenantId": tenant}, n=READ_SAMPLES
        ).as_dict()
        out["byPool"] = latency_measure(
            client=client,
            method="capacity/byPool",
            body=lambda i: {"tenantId": tenant, "poolId": pool_id},
            n=READ_SAMPLES,
        ).as_dict()
    with clock.step(f"{nodes} nodes: GET /metrics x{READ_SAMPLES}"):
        # Prometheus's scrape, from loopback (allowed without a token), as one Prometheus would.
        out["metrics scrape"] = scrape_measure(port=port, n=READ_SAMPLES)
    with clock.step(f"{nodes} nodes: preview x{PREVIEW_SAMPLES} per shape"):
        out["preview"] = {}
        for name, body in _preview_bodies(tenant, pool_id).items():
            result = latency_measure(
                client=client, method="capacity/preview", body=_constant(body), n=PREVIEW_SAMPLES
            )
            out["preview"][name] = result.as_dict()
    with clock.step(f"{nodes} nodes: earliest fit over 7 days x{EARLIEST_SAMPLES} per shape"):
        out["earliest"] = _earliest_measure(client, tenant, pool_id)
    with clock.step(f"{nodes} nodes: timeline 7 days / 336 buckets x{TIMELINE_SAMPLES}"):
        from_ms = (int(time.time() * 1000) // 3_600_000) * 3_600_000 - 3 * 86_400_000
        body = {
            "tenantId": tenant,
            "poolId": pool_id,
            "from": from_ms,
            "to": from_ms + 7 * 86_400_000,
            "stepMinutes": 30,
        }
        out["timeline"] = latency_measure(
            client=client, method="capacity/timeline", body=lambda i: body, n=TIMELINE_SAMPLES
        ).as_dict()
    with clock.step(f"{nodes} nodes: usage/hourly one tenant, 31 days x{USAGE_SAMPLES}"):
        for name, usage_body in _usage_bodies(tenant).items():
            out[name] = latency_measure(
                client=client, method="usage/hourly", body=_constant(usage_body), n=USAGE_SAMPLES
            ).as_dict()
            status, answer = client.call("usage/hourly", usage_body)
            out[name]["rows"] = len(answer.get("rows", [])) if status == 200 else None
    client.close()
    return out


def _earliest_measure(client: Any, tenant: str, pool_id: str) -> dict[str, Any]:
    """Each earliest-fit shape's latency, and what the search found: how far off, how many instants tried."""
    from bench.load import latency_measure

    out: dict[str, Any] = {}
    for name, earliest_body in _earliest_bodies(tenant, pool_id).items():
        earliest = latency_measure(
            client=client, method="capacity/earliest", body=_constant(earliest_body), n=EARLIEST_SAMPLES
        ).as_dict()
        status, answer = client.call("capacity/earliest", earliest_body)
        if status == 200:
            earliest["fits"] = answer["fits"]
            earliest["tried"] = answer["instantsTried"]
            if answer["fits"]:
                earliest["wait_h"] = round((answer["start"] - answer["searchedFrom"]) / 3_600_000, 1)
        out[name] = earliest
    return out


def _constant(body: dict[str, Any]) -> Callable[[int], dict[str, Any]]:
    """The same body for every call of a latency measurement."""
    return lambda _i: body
