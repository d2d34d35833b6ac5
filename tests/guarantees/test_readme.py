"""The README's "Try it" block runs as written, top to bottom, against a live server.

The block is read out of README.md (never copied here), pasted into bash with
`set -euo pipefail`, and pointed at a server on the test database; its
`manage.py` commands reach the same database through the environment, as
`make run`'s `.env` gives them the embedded one. Before it, one pass of every
worker job, as `make run` runs before it serves.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
from typing import Any

import pytest
from django.core.management import call_command

from fleets.load import fleet_load
from tests.support.commands import child_env_on_this_database
from tests.support.paths import ROOT


def try_it_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Try it", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "README.md has no bash block under 'Try it'"
    return match.group(1)


def test_the_block_uses_no_placeholder_and_no_hidden_environment() -> None:
    block = try_it_block()
    assert "…" not in block
    assert "export " not in block


@pytest.mark.django_db(transaction=True)
def test_the_try_it_block_runs_as_written(live_server: Any) -> None:
    fleet_load(data=json.loads((ROOT / "fleets" / "demo.json").read_text()))
    call_command("worker", "--once", stdout=io.StringIO())
    env = child_env_on_this_database(BASE_URL=live_server.url)
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + try_it_block()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    out = result.stdout
    assert '"error"' not in out
    # What the walkthrough shows: a reservation made, answered again, released; a node cordoned.
    assert '"status": "ok"' in out or '"status":"ok"' in out  # /healthz: the worker has run
    assert '"state": "released"' in out or '"state":"released"' in out
    assert '"cordoned": true' in out or '"cordoned":true' in out
    assert "fits: yes" in out
