"""The Procfile is what production runs, and `make run` runs it: a web server, a worker, the agents' poll.

(`tests/worker/test_worker_e2e.py` starts it with honcho, as `make run` does, and stops it with Ctrl-C.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def procfile() -> dict[str, str]:
    return {
        name.strip(): command.strip()
        for name, command in (
            line.split(":", 1)
            for line in (ROOT / "Procfile").read_text().splitlines()
            if line and line[0] != "#"
        )
    }


def test_the_procfile_declares_the_web_server_and_the_worker_and_honcho_accepts_it() -> None:
    processes = procfile()
    assert set(processes) == {"web", "worker", "agents"}
    assert "AGENTS_PROCESS=1 uvicorn config.asgi:application" in processes["agents"]
    assert "gunicorn config.wsgi" in processes["web"] and "$" in processes["web"]  # bound to $PORT
    assert processes["worker"] == "python manage.py worker"
    honcho = shutil.which("honcho", path=str(Path(sys.executable).parent)) or "honcho"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([honcho, "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_make_run_brings_the_ledger_up_to_date_then_starts_the_procfile() -> None:
    # `make -n` prints the recipe without running it.
    result = subprocess.run(
        ["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    once = next(i for i, line in enumerate(lines) if "manage.py worker --once" in line)
    start = next(i for i, line in enumerate(lines) if "honcho start" in line)
    migrate = next(i for i, line in enumerate(lines) if "manage.py migrate" in line)
    # Migrated, one pass of every job (so /healthz is 200 from the first second), then web + worker.
    assert migrate < once < start
