"""Debian's Prometheus for the monitoring tests: the binaries, a server scraping the service, its HTTP API.

The programs come from the distribution (`apt-get install prometheus`), never
downloaded at test time. Without them the tests that need them are skipped,
saying how to install them; CI sets REQUIRE_PROMETHEUS=1 (`.ci/run` installs
the package), which turns that skip into a failure, as REQUIRE_BROWSER does
for Chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import yaml

from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy" / "prometheus"
ALERTS = DEPLOY / "alerts.yml"
ALERTS_TEST = DEPLOY / "alerts_test.yml"
SCRAPE_CONFIG = DEPLOY / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "better-compute.json"
RUNBOOK = ROOT / "docs" / "operations.md"

INSTALL = "apt-get install prometheus"
# Only bounds that stop a broken start or a missing answer from hanging the suite.
START_SECONDS = 60.0
STOP_SECONDS = 30.0

T = TypeVar("T")


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`; a skip (a failure under REQUIRE_PROMETHEUS=1) without it."""
    path = shutil.which(name)
    if path is None:
        message = f"needs Debian's Prometheus ({name}): {INSTALL}"
        if os.environ.get("REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"REQUIRE_PROMETHEUS=1 but {name} is missing; {message}")
        pytest.skip(message)
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS` at the repository's root; its status is the caller's to check."""
    return subprocess.run(
        [binary("promtool"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of alerts.yml, in file order."""
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"] if "alert" in rule]


def wait_for(check: Callable[[], T | None], *, seconds: float, what: str) -> T:
    """Poll `check` until it returns something true (a non-empty list, True); fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"gave up waiting for {what} after {seconds:.0f} s"
        time.sleep(0.25)


@dataclass
class Prometheus:
    """A running `prometheus`, its HTTP API's address, and where its log goes."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """`GET /api/v1/<path>`'s `data`, asserting the API's status is success."""
        answer = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: each series' labels (`metric`) and value."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def value(self, expr: str) -> float | None:
        """The value of a query that answers one series; None while it answers none."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, result
        return float(result[0]["value"][1])

    def latest(self, selector: str) -> tuple[float, float] | None:
        """The newest sample of one series, (its scrape's time, its value); None without one.

        An instant query answers the last sample seen within five minutes, which may
        be from before what the caller just changed; the sample's own time says.
        """
        data = self.api("query", query=f"{selector}[30s]")
        assert data["resultType"] == "matrix", data
        if not data["result"]:
            return None
        (series,) = data["result"]
        at, value = series["values"][-1]
        return float(at), float(value)

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts of this name."""
        return [alert for alert in self.api("alerts")["alerts"] if alert["labels"]["alertname"] == name]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def scrape_config(*, target: str, token_file: Path, rule_file: Path, interval: str = "1s") -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml aimed at `target` with this token file, scraping every `interval`."""
    config: dict[str, Any] = load_yaml(SCRAPE_CONFIG)
    config["global"] |= {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(rule_file)]
    (job,) = config["scrape_configs"]
    job["scrape_interval"] = interval
    job["scrape_timeout"] = interval
    job["authorization"]["credentials_file"] = str(token_file)
    job["static_configs"] = [{"targets": [target]}]
    return config


@contextmanager
def prometheus_running(*, config: dict[str, Any], where: Path, port: int) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1:`port` with `config` (written as JSON, which is YAML), data in `where`."""
    config_file = where / "prometheus.yml"
    config_file.write_text(json.dumps(config, indent=2))
    log = where / "prometheus.log"
    command = [
        binary("prometheus"),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={where / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    process = subprocess.Popen(command, cwd=where, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = Prometheus(url=f"http://127.0.0.1:{port}", process=process, log=log)

    def ready() -> bool:
        assert process.poll() is None, f"prometheus exited:\n{server.output()[-3000:]}"
        try:
            return requests.get(f"{server.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(ready, seconds=START_SECONDS, what="prometheus to be ready")
        yield server
    finally:
        stop(process)


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not gone within the bound."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_SECONDS)
