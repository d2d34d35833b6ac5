"""Read by gunicorn from the working directory: the metrics' multiprocess directory, per server start.

prometheus_client's multiprocess mode (operations/metrics/process.py) needs a
directory that starts empty, that every worker of this server writes to and no
other server does. Unless the environment names one, each start makes its own
and removes it at exit; a dead worker's live values are dropped when it goes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

_made: list[str] = []


def on_starting(server: Any) -> None:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        directory = tempfile.mkdtemp(prefix="better-compute-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        _made.append(directory)


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    for directory in _made:
        shutil.rmtree(directory, ignore_errors=True)
