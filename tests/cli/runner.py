"""The tenant CLI as a tenant runs it: `python -m better_compute ...` in a subprocess, its own environment.

The end-to-end tests (tests/cli/test_better_compute*.py) drive it against
pytest-django's `live_server`; `Cli.api` asks the API straight over HTTP, to
compare `--json` with.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import requests

from tests.support.commands import run_python

# A zone with a half-hour offset, so "local time" cannot pass by being UTC by accident.
ZONE = "Asia/Kolkata"
ZONE_OFFSET = "+05:30"
RUN_SECONDS = 60


class Cli:
    """Runs the CLI with a clean environment: no user config, this server, this token and tenant."""

    def __init__(self, tmp_path: Path, url: str, token: str, tenant: str) -> None:
        empty = tmp_path / "empty-config.toml"
        empty.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BETTER_COMPUTE_", "COLUMNS"))}
        env.update(
            {
                "HOME": str(tmp_path),
                "BETTER_COMPUTE_CONFIG": str(empty),
                "BETTER_COMPUTE_URL": url,
                "BETTER_COMPUTE_TOKEN": token,
                "BETTER_COMPUTE_TENANT": tenant,
                "TZ": ZONE,
                "NO_COLOR": "1",
            }
        )
        self.env = env
        self.url = url
        self.token = token
        self.tenant = tenant

    def __call__(
        self, *args: str, env: dict[str, str | None] | None = None
    ) -> subprocess.CompletedProcess[str]:
        run_env = dict(self.env)
        for key, value in (env or {}).items():
            if value is None:
                run_env.pop(key, None)
            else:
                run_env[key] = value
        return run_python("-m", "better_compute", *args, env=run_env, timeout=RUN_SECONDS)

    def json(self, *args: str) -> Any:
        result = self(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def api(self, method: str, body: dict[str, Any]) -> Any:
        """The API's own answer, straight over HTTP, to compare `--json` with."""
        response = requests.post(
            f"{self.url}/api/compute/{method}",
            json={"tenantId": self.tenant, **body},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=RUN_SECONDS,
        )
        return response.json()
