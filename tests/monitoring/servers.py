"""The Procfile's `web` (gunicorn, two workers) and `worker`, on the test database, for the monitoring tests.

The web command is read from the Procfile and run by a shell, as honcho would,
so the scrape is tested under exactly what production runs, `gunicorn.conf.py`
(the metrics' multiprocess directory) included.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.core.test_procfile import procfile
from tests.monitoring.prometheus import START_SECONDS, stop, wait_for
from tests.support.commands import child_env_on_this_database
from tests.support.paths import ROOT

VENV_BIN = str(Path(sys.executable).parent)
# The access log's format under the tests: the serving worker's pid, the method and path, the status.
ACCESS_LOG_FORMAT = "access %(p)s %(m)s %(U)s %(s)s"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_env(**extra: str) -> dict[str, str]:
    """A child's environment on this test database, the venv first on PATH, no inherited metrics directory."""
    env = child_env_on_this_database(DEBUG="0", PYTHONUNBUFFERED="1", **extra)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    return env


@dataclass
class Web:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def access_lines(self) -> list[list[str]]:
        """Each access log line's fields after `access`: pid, method, path, status."""
        return [line.split()[1:] for line in self.output().splitlines() if line.startswith("access ")]

    def call(self, method: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
        """One API call over a fresh connection (no session: each request is a new TCP connection)."""
        response = requests.post(
            f"{self.url}/api/compute/{method}",
            json=body,
            headers={"Authorization": f"Bearer {token}", "Connection": "close"},
            timeout=30,
        )
        return response.status_code, response.json()


@contextmanager
def procfile_web(log: Path, *, workers: int = 2, **env: str) -> Iterator[Web]:
    """The Procfile's `web` on a free port with `workers` gunicorn workers; stopped after."""
    port = free_port()
    environment = process_env(
        HOST="127.0.0.1",
        PORT=str(port),
        WEB_CONCURRENCY=str(workers),
        WEB_THREADS="8",
        # gunicorn's access line (under the plain format; json has the app's request line instead).
        LOG_FORMAT="plain",
        GUNICORN_CMD_ARGS=f"--access-logformat '{ACCESS_LOG_FORMAT}'",
        **env,
    )
    process = subprocess.Popen(
        ["/bin/sh", "-c", f"exec {procfile()['web']}"],
        cwd=ROOT,
        env=environment,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    web = Web(url=f"http://127.0.0.1:{port}", process=process, log=log)

    def up() -> bool:
        assert process.poll() is None, f"gunicorn exited:\n{web.output()[-3000:]}"
        try:
            requests.get(f"{web.url}/api/ping", timeout=2)
        except requests.RequestException:
            return False
        return True  # any HTTP answer (the JSON 404) means a worker is serving

    try:
        wait_for(up, seconds=START_SECONDS, what="gunicorn to answer")
        yield web
    finally:
        stop(process)


@contextmanager
def procfile_worker(log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """The Procfile's `worker` (`python manage.py worker`), with the venv's python; stopped after."""
    process = subprocess.Popen(
        ["/bin/sh", "-c", f"exec {procfile()['worker']}"],
        cwd=ROOT,
        env=process_env(**env),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        stop(process)
