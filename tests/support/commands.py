"""Management commands run in-process, and Python run as a child process at the repository's root (on
this test database when it needs one)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from subprocess import CompletedProcess
from typing import Any

from django.core.management import call_command
from django.db import connection

from tests.support.paths import ROOT


def run_command(name: str, *args: str, **options: Any) -> str:
    """Run command `name` and return what it printed on stdout."""
    out = io.StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def child_env_on_this_database(**extra: str) -> dict[str, str]:
    """This process's environment for a child on this test database, with `extra` set.

    Its settings are the torture servers' (`tests.support.torture.server_settings`), which
    read the database's name from TORTURE_DB_NAME.
    """
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return env | {
        "DJANGO_SETTINGS_MODULE": "tests.support.torture.server_settings",
        "TORTURE_DB_NAME": str(connection.settings_dict["NAME"]),
        **extra,
    }


def run_python(*args: str, env: dict[str, str], timeout: float | None = None) -> CompletedProcess[str]:
    """`python ARGS` in a child process at the repository's root, with exactly `env`.

    Its output is captured as text; its exit status is the caller's to check (a failure raises nothing).
    """
    command = [sys.executable, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
