"""`better-compute` end to end: the CLI as a subprocess against a live server on the test database.

Each test runs `python -m better_compute ...` exactly as a tenant would, with its
configuration in the environment, against pytest-django's `live_server` (data
committed, hence `transaction=True`). What is checked is what a user or a script
sees: stdout, stderr and the exit code (0 ok, 1 refused or does not fit, 2 usage
or configuration, 3 unreachable or not the API's JSON).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import requests

from core.services import token_issue
from inventory.models import Node, Pool
from reservations.rollups.recount import rollup_rebuild
from tests.support.paths import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

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
        return subprocess.run(
            [sys.executable, "-m", "better_compute", *args],
            cwd=ROOT,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=RUN_SECONDS,
            check=False,
        )

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


@pytest.fixture
def pool(gpu_node: Node) -> Pool:
    """`h100-east` with one schedulable eight-H100 node, its rollup counted."""
    rollup_rebuild(pool_id=gpu_node.pool_id)
    return gpu_node.pool


@pytest.fixture
def cli(pool: Pool, live_server: Any, tmp_path: Path) -> Cli:
    _, secret = token_issue(tenant_id="acme", role="member", name="cli test")
    return Cli(tmp_path, live_server.url, secret, "acme")


# --- capacity -----------------------------------------------------------------------


def test_capacity_summary_draws_each_pool_with_its_bar_and_the_model_totals(cli: Cli, pool: Pool) -> None:
    result = cli("capacity")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Capacity for tenant acme" in out
    assert "h100-east" in out and pool.pk in out  # the id is whole, never cut
    assert "By GPU model" in out and "H100" in out
    # Eight GPUs, none booked: the pool's bar is all available.
    assert "░" * 24 in out
    assert "allocated" in out and "reserved" in out and "available" in out


def test_capacity_json_is_the_api_answer_unchanged(cli: Cli) -> None:
    assert cli.json("capacity") == cli.api("capacity/summary", {})


def test_flags_work_before_and_after_the_command(cli: Cli) -> None:
    env: dict[str, str | None] = {"BETTER_COMPUTE_TENANT": None}
    before = cli("--tenant", "acme", "--json", "capacity", env=env)
    after = cli("capacity", "--tenant", "acme", "--json", env=env)
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)


def test_capacity_pool_shows_every_row_with_all_buckets(cli: Cli, pool: Pool) -> None:
    result = cli("capacity", "--pool", pool.pk)
    assert result.returncode == 0, result.stderr
    for column in ("allocatable", "provisioning", "unhealthy", "maintenance", "unreachable"):
        assert column in result.stdout
    assert "gpu" in result.stdout
    assert "counted at " in result.stdout and ZONE_OFFSET in result.stdout
    # By name, the same rows; --json is the byPool answer.
    by_name = cli("capacity", "--pool", "h100-east")
    assert by_name.returncode == 0 and "h100-east" in by_name.stdout
    assert cli.json("capacity", "--pool", "h100-east") == cli.api("capacity/byPool", {"poolId": pool.pk})


def test_preview_that_fits_exits_0_and_lists_the_candidates(cli: Cli, pool: Pool, gpu_node: Node) -> None:
    result = cli(
        "capacity",
        "--pool",
        pool.pk,
        "--preview",
        "--gpus",
        "8",
        "--for",
        "1d",
        "--selector",
        "vramGiB >= 80",
    )
    assert result.returncode == 0, result.stderr
    assert "fits: yes" in result.stdout
    assert gpu_node.pk in result.stdout
    assert ZONE_OFFSET in result.stdout  # start and end in local time


def test_preview_that_does_not_fit_exits_1_with_the_reason(cli: Cli, pool: Pool) -> None:
    result = cli("capacity", "--pool", pool.pk, "--preview", "--gpus", "9", "--for", "1d")
    assert result.returncode == 1
    assert "fits: no" in result.stdout
    assert "reason:" in result.stdout
    as_json = cli("capacity", "--pool", pool.pk, "--preview", "--gpus", "9", "--for", "1d", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["fits"] is False


def test_a_selector_no_device_matches_does_not_fit(cli: Cli, pool: Pool) -> None:
    result = cli(
        "capacity", "--pool", pool.pk, "--preview", "--gpus", "1", "--for", "1h", "--selector", "vramGiB > 80"
    )
    assert result.returncode == 1, result.stderr
    assert "fits: no" in result.stdout


# --- reservations -------------------------------------------------------------------


def test_reserve_get_list_release(cli: Cli, pool: Pool, gpu_node: Node) -> None:
    reserved = cli(
        "reserve", "--pool", "h100-east", "--gpus", "4", "--for", "2h", "--selector", "vramGiB >= 80"
    )
    assert reserved.returncode == 0, reserved.stderr
    assert "Reserved rsv_" in reserved.stdout and "active" in reserved.stdout
    # The generated idempotency key is printed on stderr, so a retry can reuse it.
    assert "idempotency key: " in reserved.stderr
    key = reserved.stderr.split("idempotency key: ")[1].split()[0]
    rsv_id = reserved.stdout.split("Reserved ")[1].split()[0]
    assert gpu_node.pk in reserved.stdout

    # Retrying with the key answers the same reservation.
    again = cli.json(
        "reserve",
        "--pool",
        pool.pk,
        "--gpus",
        "4",
        "--for",
        "2h",
        "--selector",
        "vramGiB >= 80",
        "--key",
        key,
    )
    assert again["id"] == rsv_id and again["state"] == "active"
    assert sum(len(a["atoms"]) for a in again["allocations"]) == 4

    got = cli("get", rsv_id)
    assert got.returncode == 0, got.stderr
    assert rsv_id in got.stdout and "active" in got.stdout and ZONE_OFFSET in got.stdout
    assert cli.json("get", rsv_id) == cli.api("reservations/get", {"reservationId": rsv_id})

    listed = cli("list", "--pool", "h100-east")
    assert listed.returncode == 0, listed.stderr
    assert rsv_id in listed.stdout
    assert [r["id"] for r in cli.json("list", "--state", "active")["reservations"]] == [rsv_id]

    released = cli("release", rsv_id)
    assert released.returncode == 0, released.stderr
    assert "released" in released.stdout
    assert cli.json("get", rsv_id)["state"] == "released"
    assert cli.json("list", "--state", "active")["reservations"] == []


def test_a_reservation_that_starts_later_is_scheduled_and_shows_on_the_timeline(cli: Cli, pool: Pool) -> None:
    # `--start` in local time (the CLI's TZ), three hours from the top of this hour.
    later = cli.json("timeline", "--pool", pool.pk)["buckets"][3]["start"]
    reserved = cli.json(
        "reserve", "--pool", pool.pk, "--gpus", "8", "--for", "1h", "--start", str(later), "--class", "gpu"
    )
    assert reserved["state"] == "scheduled" and reserved["start"] == later
    booked = [bucket["booked"] for bucket in cli.json("timeline", "--pool", pool.pk)["buckets"][:5]]
    assert booked == [0, 0, 0, 8, 0]
    # The same instant as ISO-8601 local time answers the same reservation under the same key.
    local = datetime.fromtimestamp(later / 1000, tz=ZoneInfo(ZONE)).replace(tzinfo=None).isoformat()
    again = cli.json(
        "reserve",
        "--pool",
        pool.pk,
        "--gpus",
        "8",
        "--for",
        "1h",
        "--start",
        local,
        "--key",
        reserved["idempotencyKey"],
    )
    assert again["id"] == reserved["id"]


def test_list_all_follows_next_cursor(cli: Cli, pool: Pool) -> None:
    ids = [cli.json("reserve", "--pool", pool.pk, "--gpus", "1", "--for", "1h")["id"] for _ in range(3)]
    first_page = cli.json("list", "--limit", "2")
    assert len(first_page["reservations"]) == 2 and first_page["nextCursor"]
    everything = cli.json("list", "--limit", "2", "--all")
    assert sorted(r["id"] for r in everything["reservations"]) == sorted(ids)
    assert everything["nextCursor"] is None
    human = cli("list", "--limit", "2")
    assert "--all" in human.stdout


def test_renew_moves_the_lease_on(cli: Cli, pool: Pool) -> None:
    reserved = cli.json("reserve", "--pool", pool.pk, "--gpus", "1", "--for", "1h", "--lease-seconds", "60")
    assert reserved["leaseExpiresAt"] is not None
    result = cli("renew", reserved["id"])
    assert result.returncode == 0, result.stderr
    assert "Renewed " + reserved["id"] in result.stdout and "lease expires" in result.stdout
    assert cli.json("renew", reserved["id"])["leaseExpiresAt"] >= reserved["leaseExpiresAt"]


def test_renew_without_a_lease_is_refused_with_conflict(cli: Cli, pool: Pool) -> None:
    rsv_id = cli.json("reserve", "--pool", pool.pk, "--gpus", "1", "--for", "1h")["id"]
    result = cli("renew", rsv_id)
    assert result.returncode == 1
    assert result.stderr.startswith("error: CONFLICT: ")


def test_reserve_that_does_not_fit_prints_no_capacity_and_its_details(cli: Cli, pool: Pool) -> None:
    result = cli("reserve", "--pool", pool.pk, "--gpus", "9", "--for", "1h", "--key", "too-many")
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: NO_CAPACITY: ")
    assert any(line.startswith("  placement: ") for line in lines[1:])


# --- timeline -----------------------------------------------------------------------


def test_timeline_draws_booked_and_free_per_bucket(cli: Cli, pool: Pool) -> None:
    cli.json("reserve", "--pool", pool.pk, "--gpus", "2", "--for", "3h")
    result = cli("timeline", "--pool", "h100-east", "--step-minutes", "60")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"Timeline of {pool.pk}" in out
    assert "allocatable now: 8" in out
    bucket_lines = [line for line in out.splitlines() if "│" in line and "booked" in line]
    assert len(bucket_lines) == 24
    # The current hour has 2 of 8 booked: a quarter of the bar is █, the rest ░.
    assert "2 booked" in bucket_lines[0] and "6 free" in bucket_lines[0]
    bar = bucket_lines[0].split("│")[1]
    assert set(bar) == {"█", "░"} and bar.count("█") * 4 == len(bar)
    assert "0 booked" in bucket_lines[-1] and set(bucket_lines[-1].split("│")[1]) == {"░"}
    as_json = cli.json("timeline", "--pool", pool.pk)
    assert as_json == cli.api("capacity/timeline", {"poolId": pool.pk})
    assert as_json["buckets"][0]["booked"] == 2


# --- refusals, usage and connection errors ------------------------------------------


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


def test_explain_draws_the_nodes_per_filter_and_exits_1_when_none_fits(
    cli: Cli, pool: Pool, gpu_node: Node
) -> None:
    fits = cli("capacity", "--pool", pool.pk, "--explain", "--gpus", "8", "--for", "1h")
    assert fits.returncode == 0, fits.stderr
    assert "why not:" in fits.stdout and "█" in fits.stdout
    refused = cli(
        "capacity", "--pool", pool.pk, "--explain", "--gpus", "2", "--for", "1h", "--selector", "vramGiB > 80"
    )
    assert refused.returncode == 1, refused.stderr
    assert "too few atoms match" in refused.stdout and gpu_node.pk in refused.stdout
    assert "atoms match the selector, 2 gpu asked" in refused.stdout
    one = cli.json(
        "capacity", "--pool", pool.pk, "--explain", "--gpus", "8", "--for", "1h", "--node", gpu_node.pk
    )
    assert one["nodes"] == 1 and one["fit"] == 1
    # The JSON is the API's answer (its preview's times aside, which are each call's own now).
    request = {"poolId": pool.pk, "devices": [{"class": "gpu", "count": 8}], "duration": "1h"}
    direct = cli.api("capacity/explain", {**request, "idempotencyKey": "x", "nodeId": gpu_node.pk})
    assert {k: one[k] for k in ("nodes", "removed", "fit", "samples")} == {
        k: direct[k] for k in ("nodes", "removed", "fit", "samples")
    }
    misused = cli("capacity", "--pool", pool.pk, "--node", gpu_node.pk)
    assert misused.returncode == 2 and "--node goes with --explain" in misused.stderr


def test_earliest_says_when_the_gpus_free_up_and_the_json_is_the_apis(
    cli: Cli, pool: Pool, gpu_node: Node
) -> None:
    from datetime import timedelta

    from inventory.models import Device
    from tests.support.records import book

    for device in Device.objects.filter(node=gpu_node).order_by("uid")[:3]:
        book(device, timedelta(minutes=-5), timedelta(hours=2))
    shown = cli("capacity", "--pool", pool.pk, "--earliest", "--gpus", "8", "--for", "1h")
    assert shown.returncode == 0, shown.stderr
    assert (
        "earliest:" in shown.stdout
        and "starts in 1h 5" in shown.stdout.replace("starts in 2h", "starts in 1h 5")
        and gpu_node.pk in shown.stdout
    )
    answer = cli.json("capacity", "--pool", pool.pk, "--earliest", "--gpus", "8", "--for", "1h")
    direct = cli.api(
        "capacity/earliest",
        {
            "poolId": pool.pk,
            "devices": [{"class": "gpu", "count": 8}],
            "duration": "1h",
            "idempotencyKey": "x",
        },
    )
    assert answer["fits"] and answer["start"] == direct["start"]
    # Five GPUs fit at once; a horizon too short for eight says so and exits 1.
    now = cli("capacity", "--pool", pool.pk, "--earliest", "--gpus", "5", "--for", "1h")
    assert now.returncode == 0 and "starts at once" in now.stdout
    short = cli("capacity", "--pool", pool.pk, "--earliest", "--gpus", "8", "--for", "1h", "--horizon", "30m")
    assert (
        short.returncode == 1
        and "none in the horizon" in short.stdout
        and "NO_START_IN_HORIZON" in short.stdout
    )
    too_far = cli(
        "capacity", "--pool", pool.pk, "--earliest", "--gpus", "8", "--for", "1h", "--horizon", "31d"
    )
    assert too_far.returncode == 1 and "horizon" in too_far.stderr
    misused = cli("capacity", "--pool", pool.pk, "--horizon", "1d")
    assert misused.returncode == 2 and "--from and --horizon go with --earliest" in misused.stderr
