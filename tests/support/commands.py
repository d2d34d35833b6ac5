"""Management commands run in-process, and Python run as a child process at the repository's root."""

from __future__ import annotations

import io
import subprocess
import sys
from subprocess import CompletedProcess
from typing import Any

from django.core.management import call_command

from tests.support.paths import ROOT


def run_command(name: str, *args: str, **options: Any) -> str:
    """Run command `name` and return what it printed on stdout."""
    out = io.StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def run_python(*args: str, env: dict[str, str], timeout: float | None = None) -> CompletedProcess[str]:
    """`python ARGS` in a child process at the repository's root, with exactly `env`.

    Its output is captured as text; its exit status is the caller's to check (a failure raises nothing).
    """
    command = [sys.executable, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
