"""Drive the API over HTTP: latency of one method, and create + release throughput with N clients.

Plain `http.client` in threads: one connection object per client thread,
bounded by a request count (latency) or a duration (throughput), so a run
never depends on the server keeping up.
"""

from __future__ import annotations

import http.client
import itertools
import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class Client:
    """One client: a bearer token and a (re)connecting HTTP connection to the server."""

    def __init__(self, *, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        for attempt in range(2):
            try:
                self.conn.request("POST", f"/api/compute/{method}", json.dumps(body), self.headers)
                response = self.conn.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                return response.status, json.loads(data) if data else {}
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The sync worker closed a kept-alive socket: reconnect once.
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Latency:
    """Latencies of one measurement, in milliseconds."""

    samples_ms: list[float]
    statuses: dict[int, int]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 99)

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": len(self.samples_ms),
            "p50_ms": round(self.p50, 3),
            "p99_ms": round(self.p99, 3),
            "mean_ms": round(statistics.fmean(self.samples_ms), 3),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


def latency_measure(
    *, client: Client, method: str, body: Callable[[int], dict[str, Any]], n: int, warmup: int = 5
) -> Latency:
    """Call `method` `n` times in a row (after `warmup` unmeasured calls); time each call."""
    for i in range(warmup):
        client.call(method, body(-1 - i))
    samples: list[float] = []
    statuses: Counter[int] = Counter()
    for i in range(n):
        started = time.perf_counter()
        status, _ = client.call(method, body(i))
        samples.append((time.perf_counter() - started) * 1000)
        statuses[status] += 1
    return Latency(samples_ms=samples, statuses=dict(statuses))


def clients_run(work: Callable[[int, T], None], each: list[T]) -> float:
    """`work(index, item)` for every item, each in its own thread, all at once; the seconds they took."""
    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(i, item)) for i, item in enumerate(each)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


@dataclass
class CreateRate:
    """What N clients created in `seconds`: the rate the report sets the API's against the floor's."""

    clients: int
    seconds: float
    creates: int = 0

    @property
    def per_second(self) -> float:
        return self.creates / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "seconds": round(self.seconds, 2),
            "creates": self.creates,
            "creates_per_s": round(self.per_second, 1),
        }


@dataclass
class Throughput(CreateRate):
    """What N clients did in `seconds`: completed create + release pairs, and the refusals."""

    releases: int = 0
    no_capacity: int = 0
    other_errors: Counter[str] = field(default_factory=Counter)
    create_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            **super().as_dict(),
            "releases": self.releases,
            "no_capacity": self.no_capacity,
            "other_errors": dict(self.other_errors),
            "create_p50_ms": round(statistics.median(self.create_ms), 2) if self.create_ms else None,
            "create_p99_ms": round(percentile(self.create_ms, 99), 2) if self.create_ms else None,
        }


_keys = itertools.count()


def one_gpu_hour(*, tenant_id: str, pool_id: str, key: str) -> dict[str, Any]:
    """The body of the bench's create: 1 GPU for 1 hour; every create + release loop books this."""
    return {
        "tenantId": tenant_id,
        "poolId": pool_id,
        "devices": [{"class": "gpu", "count": 1}],
        "duration": 3600,
        "idempotencyKey": key,
    }


def create_release_run(
    *,
    clients: list[Client],
    seconds: float,
    target: Callable[[int, int], tuple[str, str]],
    run_id: str,
) -> Throughput:
    """Each client loops `create` (1 GPU, 1 h) then `release` until `seconds` pass.

    `target(client_index, op_index)` names the (tenantId, poolId) of each create.
    """
    result = Throughput(clients=len(clients), seconds=seconds)
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def work(index: int, client: Client) -> None:
        local = Throughput(clients=1, seconds=seconds)
        op = 0
        while time.monotonic() < deadline:
            tenant_id, pool_id = target(index, op)
            op += 1
            body = one_gpu_hour(tenant_id=tenant_id, pool_id=pool_id, key=f"{run_id}-{index}-{next(_keys)}")
            started = time.perf_counter()
            status, answer = client.call("reservations/create", body)
            if status in (200, 201):
                local.create_ms.append((time.perf_counter() - started) * 1000)
                local.creates += 1
                status, answer = client.call(
                    "reservations/release", {"tenantId": tenant_id, "reservationId": answer["id"]}
                )
                if status == 200:
                    local.releases += 1
                else:
                    local.other_errors[f"release {status}"] += 1
            elif answer.get("error", {}).get("code") == "NO_CAPACITY":
                local.no_capacity += 1
            else:
                local.other_errors[f"create {status} {answer.get('error', {}).get('code')}"] += 1
        with lock:
            result.creates += local.creates
            result.releases += local.releases
            result.no_capacity += local.no_capacity
            result.other_errors.update(local.other_errors)
            result.create_ms.extend(local.create_ms)

    result.seconds = clients_run(work, clients)
    return result
