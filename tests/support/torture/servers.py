"""Real server processes (gunicorn) sharing the test database, for the HTTP runs and the faults."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.services import token_issue
from tests.support.commands import child_env_on_this_database
from tests.support.paths import ROOT
from tests.support.torture.fleet import Fleet

# Only a bound that stops a broken start from hanging the suite.
START_SECONDS = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/ping", timeout=2):  # noqa: S310 (local test server)
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (the JSON 404) means the server is up
    except OSError:
        return False


def http_tokens(fleet: Fleet) -> dict[str, str]:
    """A member token per tenant of the fleet and an operator token, committed for the servers to see."""
    tokens = {
        tenant: token_issue(tenant_id=tenant, role="member", name="torture")[1] for tenant in fleet.tenants
    }
    tokens["operator"] = token_issue(tenant_id=None, role="operator", name="torture operator")[1]
    return tokens


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class ServerGroup:
    """`count` gunicorn processes, each one worker with threads, on their own ports, one database."""

    servers: list[Server] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def all_alive(self) -> bool:
        return all(server.process.poll() is None for server in self.servers)

    def spawn(self, index: int) -> Server:
        port = _free_port()
        env = child_env_on_this_database(DEBUG="0")
        log = ROOT / f".pytest_cache/torture-server-{index}.log"
        log.parent.mkdir(exist_ok=True)
        command = [
            str(Path(sys.executable).with_name("gunicorn")),
            "config.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--worker-class",
            "gthread",
            "--threads",
            "8",
            "--timeout",
            "120",
        ]
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        server = Server(url=f"http://127.0.0.1:{port}", process=process, log=log)
        deadline = time.monotonic() + START_SECONDS
        while not server_ready(server.url):
            assert process.poll() is None, f"server exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        return server

    def worker_pids(self, server: Server) -> list[int]:
        """The gunicorn worker processes under this server's master."""
        out = subprocess.run(
            ["/usr/bin/pgrep", "-P", str(server.process.pid)], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in out.stdout.split()]

    def stop(self) -> None:
        for server in self.servers:
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGTERM)
        for server in self.servers:
            try:
                server.process.wait(30)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait(30)

    @classmethod
    @contextmanager
    def start(cls, *, count: int) -> Iterator[ServerGroup]:
        group = cls()
        try:
            for index in range(count):
                group.servers.append(group.spawn(index))
            yield group
        finally:
            group.stop()
