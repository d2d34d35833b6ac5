"""`LOG_FORMAT=json`: the Procfile's web server writes one JSON object per line; plain stays the default.

The server is the Procfile's `web` line itself (gunicorn with its logger
class), on the test database, so what is checked is what production writes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from django.test import Client
from rest_framework.test import APIClient

from core.logs import JsonFormatter
from core.services import token_issue
from tests.core.test_procfile import procfile
from tests.support.api import post
from tests.support.commands import child_env_on_this_database
from tests.support.paths import ROOT

# Only a bound that stops a broken start from hanging the suite.
START_SECONDS = 60.0
REQUEST_LOGGER = "better_compute.request"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Web:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def call(self, method: str, token: str, body: Any, **headers: str) -> requests.Response:
        return requests.post(
            f"{self.url}/api/compute/{method}",
            json=body,
            headers={"Authorization": f"Bearer {token}", **headers},
            timeout=30,
        )

    def stop(self) -> str:
        """Stop it as a process manager does (SIGTERM) and answer everything it wrote."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        return self.log.read_text()


@contextmanager
def web_running(tmp_path: Path, **extra: str) -> Iterator[Web]:
    """The Procfile's `web`, one worker, on a free port of 127.0.0.1 and this test database."""
    port = _free_port()
    env = child_env_on_this_database(
        DEBUG="0", HOST="127.0.0.1", PORT=str(port), WEB_CONCURRENCY="1", WEB_THREADS="4", **extra
    )
    if "LOG_FORMAT" not in extra:
        env.pop("LOG_FORMAT", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = tmp_path / "web.log"
    # `exec`: the process waited for is gunicorn's master, which exits after its workers' last lines.
    process = subprocess.Popen(  # noqa: S602 (the Procfile's line is a shell command, as honcho runs it)
        f"exec {procfile()['web']}",
        shell=True,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    web = Web(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert process.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the server did not start: {log.read_text()[-2000:]}"
            try:
                requests.get(f"{web.url}/healthz", timeout=30)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        yield web
    finally:
        web.stop()


def json_lines(output: str) -> list[dict[str, Any]]:
    """Every line the server wrote, each parsed as one JSON object (a line that is not one fails)."""
    lines = [line for line in output.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        value = json.loads(line)
        assert isinstance(value, dict), line
        parsed.append(value)
    return parsed


def request_line(lines: list[dict[str, Any]], request_id: str) -> dict[str, Any]:
    (found,) = lines_of(lines, REQUEST_LOGGER, request_id)
    return found


def lines_of(lines: list[dict[str, Any]], logger: str, request_id: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["logger"] == logger and line["requestId"] == request_id]


@pytest.mark.django_db(transaction=True)
def test_json_logs_are_one_object_per_line_with_a_request_line_per_request(
    tmp_path: Path, owner_tenant: Any
) -> None:
    member = token_issue(tenant_id="acme", role="member", name="logs")[1]
    operator = token_issue(tenant_id=None, role="operator", name="logs operator")[1]
    with web_running(tmp_path, LOG_FORMAT="json") as web:
        ok = web.call("capacity/summary", member, {"tenantId": "acme"}, **{"X-Request-ID": "trace-1"})
        refused = web.call("capacity/summary", member, {"tenantId": "acme", "color": "red"})
        platform = web.call("capacity/summary", operator, {"tenantId": "acme"})
        missing = requests.get(f"{web.url}/no-such-page", timeout=30)
        output = web.stop()
    assert (ok.status_code, refused.status_code, platform.status_code, missing.status_code) == (
        200,
        400,
        200,
        404,
    )
    # gunicorn's own lines too: every line is a JSON object, and there is no access line beside ours.
    lines = json_lines(output)
    assert any(line["logger"] == "gunicorn.error" for line in lines), output

    line = request_line(lines, "trace-1")
    assert ok.headers["X-Request-ID"] == "trace-1"
    assert line["event"] == "POST /api/compute/capacity/summary 200"
    assert (line["level"], line["tenant"]) == ("INFO", "acme")
    assert (line["method"], line["path"], line["httpMethod"], line["status"]) == (
        "capacity/summary",
        "/api/compute/capacity/summary",
        "POST",
        200,
    )
    assert isinstance(line["durationMs"], float) and line["durationMs"] >= 0
    when = datetime.fromisoformat(line["time"])
    assert line["time"].endswith("Z") and when.utcoffset() == timedelta(0)

    refused_id = refused.headers["X-Request-ID"]
    assert refused.json()["error"]["details"][-1] == {"field": "requestId", "message": refused_id}
    assert request_line(lines, refused_id)["status"] == 400
    # Django's own warning about the refusal names the same request.
    warning = lines_of(lines, "django.request", refused_id)
    assert warning and warning[0]["level"] == "WARNING" and warning[0]["tenant"] == "acme"

    assert request_line(lines, platform.headers["X-Request-ID"])["tenant"] is None  # a platform credential
    page = request_line(lines, missing.headers["X-Request-ID"])
    assert (page["method"], page["status"], page["tenant"]) == ("/no-such-page", 404, None)
    # One request line per request (beside the start's /healthz), and no other.
    served = [line for line in lines if line["logger"] == REQUEST_LOGGER and line["path"] != "/healthz"]
    assert len(served) == 4


@pytest.mark.django_db(transaction=True)
def test_plain_is_the_default_and_keeps_gunicorns_access_line(tmp_path: Path, owner_tenant: Any) -> None:
    member = token_issue(tenant_id="acme", role="member", name="logs")[1]
    with web_running(tmp_path) as web:
        answer = web.call("capacity/summary", member, {"tenantId": "acme"}, **{"X-Request-ID": "plain-1"})
        output = web.stop()
    assert answer.status_code == 200 and answer.headers["X-Request-ID"] == "plain-1"
    access = [line for line in output.splitlines() if "POST /api/compute/capacity/summary" in line]
    assert len(access) == 1, output  # gunicorn's, once: no request line of ours beside it
    for line in output.splitlines():
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)


@pytest.mark.django_db
def test_the_formatter_names_a_call_through_the_test_client(
    owner_client: APIClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The same line through the test client: the request logger is off in plain mode, on when asked."""
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        response = post(owner_client, "capacity/summary", {"tenantId": "acme"})
        admin = Client().get("/admin/login/")
    records = [record for record in caplog.records if record.name == REQUEST_LOGGER]
    assert len(records) == 2
    api, page = (json.loads(JsonFormatter().format(record)) for record in records)
    assert api["requestId"] == response["X-Request-ID"] and api["tenant"] == "acme"
    assert api["method"] == "capacity/summary" and api["status"] == 200
    assert page["requestId"] == admin["X-Request-ID"] and page["tenant"] is None
    assert (page["method"], page["path"], page["httpMethod"]) == ("/admin/login/", "/admin/login/", "GET")
    assert set(api) == {
        "time",
        "level",
        "event",
        "logger",
        "requestId",
        "tenant",
        "method",
        "path",
        "httpMethod",
        "status",
        "durationMs",
    }
