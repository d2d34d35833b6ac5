"""`better-compute` end to end, when it cannot answer: refused (1), usage or configuration (2), no server (3).

Also the configuration file, the help and the installed console script. The CLI
runs as a subprocess against a live server (tests/cli/runner.py).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inventory.models import Pool
from tests.cli.runner import RUN_SECONDS, Cli

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_pool_the_tenant_cannot_see_is_not_found_exit_1(cli: Cli) -> None:
    result = cli("capacity", "--pool", "pool_01aaaaaaaaaaaaaaaaaaaaaaaa")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: NOT_FOUND: ")
    by_name = cli("timeline", "--pool", "no-such-pool")
    assert by_name.returncode == 1
    assert "error: NOT_FOUND: " in by_name.stderr


def test_a_bad_token_is_unauthenticated_exit_1(cli: Cli) -> None:
    result = cli("capacity", "--token", "tok_nope.nope")
    assert result.returncode == 1
    assert result.stderr.startswith("error: UNAUTHENTICATED: ")


def test_invalid_input_prints_each_detail_on_its_own_line(cli: Cli, pool: Pool) -> None:
    result = cli("capacity", "--pool", pool.pk, "--preview", "--gpus", "0", "--for", "1h")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: INVALID_INPUT: ")
    assert "  devices[0].count: " in lines[1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_server_exits_3(cli: Cli) -> None:
    result = cli("capacity", "--url", f"http://127.0.0.1:{_closed_port()}")
    assert result.returncode == 3
    assert result.stderr.startswith("error: cannot reach ")
    assert "Traceback" not in result.stderr


def test_an_answer_that_is_not_the_api_json_exits_3(cli: Cli, live_server: Any) -> None:
    # Under /admin/ the server answers HTML, not the contract's JSON.
    result = cli("capacity", "--url", f"{live_server.url}/admin")
    assert result.returncode == 3
    assert "not the API's JSON" in result.stderr


def test_a_missing_token_is_a_configuration_error_exit_2(cli: Cli) -> None:
    result = cli("capacity", env={"BETTER_COMPUTE_TOKEN": None})
    assert result.returncode == 2
    assert "no API token" in result.stderr and "BETTER_COMPUTE_TOKEN" in result.stderr
    no_tenant = cli("capacity", env={"BETTER_COMPUTE_TENANT": None})
    assert no_tenant.returncode == 2
    assert "no tenant" in no_tenant.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["capacity", "--gpus", "8"],  # request flags without --preview
        ["capacity", "--preview", "--gpus", "8"],  # --preview without --pool and --for
        [
            "capacity",
            "--pool",
            "h100-east",
            "--preview",
            "--gpus",
            "1",
            "--for",
            "1h",
            "--selector",
            "vramGiB >=",
        ],
        ["reserve", "--pool", "h100-east", "--gpus", "1"],  # --for is required
        ["reserve", "--pool", "h100-east", "--gpus", "1", "--for", "1h", "--start", "tomorrow-ish"],
        ["list", "--state", "sleeping"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(cli: Cli, args: list[str]) -> None:
    result = cli(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_selector_is_a_usage_error_before_any_request(cli: Cli) -> None:
    result = cli(
        "capacity",
        "--url",
        f"http://127.0.0.1:{_closed_port()}",
        "--preview",
        "--pool",
        "h100-east",
        "--gpus",
        "1",
        "--for",
        "1h",
        "--selector",
        "vramGiB >= 80, gpuModel > H100",
    )
    assert result.returncode == 2
    assert "clause 'gpuModel > H100'" in result.stderr


def test_the_config_file_is_used_when_nothing_else_is_set(cli: Cli, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'url = "{cli.url}"\ntoken = "{cli.token}"\ntenant = "acme"\n')
    env: dict[str, str | None] = {
        "BETTER_COMPUTE_CONFIG": str(config),
        "BETTER_COMPUTE_URL": None,
        "BETTER_COMPUTE_TOKEN": None,
        "BETTER_COMPUTE_TENANT": None,
    }
    result = cli("capacity", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tenantId"] == "acme"
    # The environment beats the file: a bad token there is used, and refused.
    refused = cli("capacity", env={**env, "BETTER_COMPUTE_TOKEN": "tok_env.wrong"})
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr


def test_help_documents_the_commands_and_exit_codes(cli: Cli) -> None:
    result = cli("--help")
    assert result.returncode == 0
    for word in ("capacity", "reserve", "release", "list", "get", "renew", "timeline", "exit codes"):
        assert word in result.stdout
    for code in ("0  ok", "1  the API refused", "2  usage", "3  the server could not be reached"):
        assert code in result.stdout
    sub = cli("capacity", "--help")
    assert sub.returncode == 0 and "--preview" in sub.stdout and "exit codes" in sub.stdout


def test_the_console_script_is_installed_in_the_venv() -> None:
    # `make venv` (and so `make test` and CI) installs it with `pip install -e .`.
    script = Path(sys.executable).with_name("better-compute")
    assert script.exists(), "no console script: run `make venv` (it runs `pip install --no-deps -e .`)"
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=RUN_SECONDS, check=False
    )
    assert result.returncode == 0
    assert result.stdout.startswith("better-compute ")
