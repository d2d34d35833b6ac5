"""A production server for the benchmark: gunicorn on a free loopback port, and its peak memory.

The server runs the project's WSGI app with `DEBUG` off against the bench
database. A sampler thread reads the resident set size of every worker
process while the server runs, so the report can say the peak per worker.
"""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.database import BASE_DIR

READY_TIMEOUT_S = 60.0
RSS_SAMPLE_S = 0.1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Gunicorn:
    """`gunicorn config.wsgi -w N` on 127.0.0.1, its stderr in `log_path`."""

    def __init__(self, *, database_url: str, log_path: Path, workers: int = 2, threads: int = 1) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.workers = workers
        self.threads = threads
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.peak_rss: dict[int, int] = {}
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "DEBUG": "0",
            "SECRET_KEY": secrets.token_urlsafe(32),
            "ALLOWED_HOSTS": "127.0.0.1",
            # The placer logs its lost races and replans at INFO; the bench counts them.
            "LOG_LEVEL": "INFO",
            # The benchmark measures the write path, not the rate limiter's refusals.
            "API_WRITES_PER_MINUTE_PER_TOKEN": str(10**9),
            "API_WRITES_PER_MINUTE_PER_TENANT": str(10**9),
        }
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        args = [
            gunicorn,
            "config.wsgi",
            "-w",
            str(self.workers),
            "-b",
            f"127.0.0.1:{self.port}",
            "--log-level",
            "warning",
        ]
        if self.threads > 1:
            args += ["--threads", str(self.threads)]
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(args, cwd=BASE_DIR, env=env, stdout=log, stderr=log)  # noqa: S603
        self._wait_ready()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited; see {self.log_path}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/api/nothing")
                conn.getresponse().read()
                conn.close()
                if len(self.workers_pids()) >= self.workers:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("gunicorn did not answer in time")

    def workers_pids(self) -> list[int]:
        if self.process is None:
            return []
        try:
            return [child.pid for child in psutil.Process(self.process.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def _sample(self) -> None:
        while not self._stop.is_set():
            for pid in self.workers_pids():
                try:
                    rss = psutil.Process(pid).memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                self.peak_rss[pid] = max(self.peak_rss.get(pid, 0), rss)
            self._stop.wait(RSS_SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_count(self, needle: str) -> int:
        """How many lines of the server's log contain `needle`."""
        if not self.log_path.exists():
            return 0
        return sum(1 for line in self.log_path.read_text(errors="replace").splitlines() if needle in line)

    def __enter__(self) -> Gunicorn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
