"""The Procfile is what production runs, and `make run` runs it: it must name a web and a worker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def test_the_procfile_declares_the_web_server_and_the_worker_and_honcho_accepts_it() -> None:
    processes = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line and line[0] != "#"
    )
    assert set(processes) == {"web", "worker"}
    assert "gunicorn config.wsgi" in processes["web"] and "$" in processes["web"]  # bound to $PORT
    assert "rebuild_rollups --every" in processes["worker"]
    honcho = shutil.which("honcho", path=str(Path(sys.executable).parent)) or "honcho"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([honcho, "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
