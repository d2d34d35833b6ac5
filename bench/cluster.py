"""`make bench-cluster`: throughput through 1, 2 and 3 API replicas of the cluster of `make cluster`.

It starts a cluster of its own (`.cluster-bench/`, other ports), then for 3,
2 and 1 live API replicas (the others killed; HAProxy's checks take them out)
measures, with 16 client threads through the balancer for a fixed time:

* create + release of one GPU, one after the other per client (the pair is one
  operation), in one pool;
* `capacity/summary` of a tenant that does not write (so it is answered by the
  streaming replica).

Beside each number it reports the CPU that each kind of process used (cores
busy: CPU seconds per second), from /proc: the API replicas, PostgreSQL
(primary and replica), PgBouncer, HAProxy and the load generator itself, which
share the same cores. That is where the scaling stops on a small machine.
Prints a Markdown table (docs/scaling.md quotes it) and a JSON line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from bench.load import one_gpu_hour
from config.cluster_state import MEMBERS

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 16
BENCH_ENV = {
    "CLUSTER_DIR": str(ROOT / ".cluster-bench"),
    "CLUSTER_PORT": "8300",
    "CLUSTER_PG_PORT": "25461",
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_SETTINGS"))}
    env |= BENCH_ENV
    env.setdefault("SECRET_KEY", "cluster-bench-secret-key")
    return env


def launcher(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "config.cluster", *args], cwd=ROOT, env=_env(), check=True)  # noqa: S603


def issue_token(*args: str) -> str:
    env = _env() | {"DATABASE_URL": f"postgres://postgres@127.0.0.1:{BENCH_ENV['CLUSTER_PG_PORT']}/postgres"}
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "issue_token", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


class Client:
    """One keep-alive connection to the balancer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, method: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
        payload = json.dumps(body)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            self.conn.request("POST", f"/api/compute/{method}", payload, headers)
            response = self.conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            return 0, None


def _postmasters() -> set[int]:
    pids = set()
    for name in MEMBERS:
        pidfile = Path(BENCH_ENV["CLUSTER_DIR"]) / name / "postmaster.pid"
        if pidfile.exists():
            pids.add(int(pidfile.read_text().split()[0]))
    return pids


def _kind(process: psutil.Process, postmasters: set[int]) -> str | None:
    """Which part of the bench's cluster a process is, if any (the machine runs other things too)."""
    if process.pid == os.getpid():
        return "load generator"
    if process.pid in postmasters or process.ppid() in postmasters:
        return "PostgreSQL"
    cmdline = " ".join(process.cmdline())
    if BENCH_ENV["CLUSTER_DIR"] not in cmdline and process.name() not in ("gunicorn", "python", "python3"):
        return None
    if process.name() == "pgbouncer":
        return "PgBouncer"
    if process.name() == "haproxy":
        return "HAProxy"
    if process.name() == "etcd" or "patroni" in cmdline:
        return "Patroni and etcd"
    if process.environ().get("CLUSTER_DIR") != BENCH_ENV["CLUSTER_DIR"]:
        return None
    if "gunicorn" in cmdline:
        return "API replicas"
    if "manage.py worker" in cmdline:
        return "worker"
    return None


def cpu_by_kind() -> Counter[str]:
    """CPU seconds so far of each kind of process of the bench's cluster (and of the bench itself)."""
    totals: Counter[str] = Counter()
    postmasters = _postmasters()
    for process in psutil.process_iter():
        try:
            kind = _kind(process, postmasters)
            if kind is not None:
                times = process.cpu_times()
                totals[kind] += times.user + times.system
        except psutil.Error:
            continue
    return totals


def measure(seconds: float, work: Any) -> tuple[float, dict[str, float], int]:
    """Run `work(client)` on CLIENTS threads for `seconds`: operations per second, cores busy, errors."""
    stop = threading.Event()
    done = Counter[str]()
    lock = threading.Lock()

    def run() -> None:
        client = Client(int(BENCH_ENV["CLUSTER_PORT"]))
        while not stop.is_set():
            outcome = work(client)
            with lock:
                done[outcome] += 1

    threads = [threading.Thread(target=run, daemon=True) for _ in range(CLIENTS)]
    before, started = cpu_by_kind(), time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(60)
    elapsed = time.monotonic() - started
    after = cpu_by_kind()
    cores = {kind: round((after[kind] - before[kind]) / elapsed, 2) for kind in after}
    return done["ok"] / elapsed, cores, sum(n for k, n in done.items() if k != "ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    options = parser.parse_args()
    launcher("up", "--detach", "--apis", "3")
    try:
        results = run_all(options.seconds)
    finally:
        launcher("stop")
    print_report(results)


def run_all(seconds: float) -> list[dict[str, Any]]:
    member = issue_token("--tenant", "acme", "--role", "member", "--name", "bench")
    viewer = issue_token("--tenant", "gamma", "--role", "viewer", "--name", "bench")
    status, summary = Client(int(BENCH_ENV["CLUSTER_PORT"])).post(
        "capacity/summary", member, {"tenantId": "acme"}
    )
    assert status == 200, summary
    pool = next(p["poolId"] for p in summary["pools"] if p["name"] == "h100-east")

    def create_release(client: Client) -> str:
        body = one_gpu_hour(tenant_id="acme", pool_id=pool, key=f"bench-{uuid.uuid4()}")
        status, answer = client.post("reservations/create", member, body)
        if status != 201:
            return f"create {status}"
        status, _ = client.post(
            "reservations/release", member, {"tenantId": "acme", "reservationId": answer["id"]}
        )
        return "ok" if status == 200 else f"release {status}"

    def summary_read(client: Client) -> str:
        status, _ = client.post("capacity/summary", viewer, {"tenantId": "gamma"})
        return "ok" if status == 200 else f"summary {status}"

    results: list[dict[str, Any]] = []
    for live in (3, 2, 1):
        if live < 3:
            launcher("kill-api", str(live + 1))
            time.sleep(4)  # HAProxy's checks (every second, three failures) take it out
        writes, write_cores, write_errors = measure(seconds, create_release)
        reads, read_cores, read_errors = measure(seconds, summary_read)
        results.append(
            {
                "apis": live,
                "createReleasePerSecond": round(writes, 1),
                "createReleaseErrors": write_errors,
                "createReleaseCores": write_cores,
                "summaryPerSecond": round(reads, 1),
                "summaryErrors": read_errors,
                "summaryCores": read_cores,
            }
        )
        results[-1]["apiMemoryMB"] = api_memory_mb()
    return sorted(results, key=lambda r: r["apis"])


def api_memory_mb() -> float:
    """The largest resident memory of an API replica's gunicorn process, after its load."""
    sizes = [0]
    postmasters = _postmasters()
    for process in psutil.process_iter():
        try:
            if _kind(process, postmasters) == "API replicas":
                sizes.append(process.memory_info().rss)
        except psutil.Error:
            continue
    return round(max(sizes) / 2**20, 1)


def print_report(results: list[dict[str, Any]]) -> None:
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(f"\n{CLIENTS} clients through HAProxy, {cores} cores, load average {load:.1f} at the end\n")
    print(
        "| API replicas | create + release per s | summary per s (replica) | cores busy, create + release |"
    )
    print("| ---: | ---: | ---: | --- |")
    for r in results:
        busy = ", ".join(f"{k} {v}" for k, v in sorted(r["createReleaseCores"].items()))
        print(f"| {r['apis']} | {r['createReleasePerSecond']} | {r['summaryPerSecond']} | {busy} |")
    print(f"\nlargest API replica process after the load: {max(r['apiMemoryMB'] for r in results)} MB")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
