"""`better-compute` end to end: the CLI as a subprocess against a live server on the test database.

Each test runs `python -m better_compute ...` exactly as a tenant would, with its
configuration in the environment, against pytest-django's `live_server` (data
committed, hence `transaction=True`). What is checked is what a user or a script
sees: stdout, stderr and the exit code (0 ok, 1 refused or does not fit, 2 usage
or configuration, 3 unreachable or not the API's JSON). Here: the capacity reads,
the placer's answers (preview, explain, earliest) and the timeline; the
reservations are in test_better_compute_reservations.py, the refusals, usage
and configuration errors in test_better_compute_errors.py.
"""

from __future__ import annotations

import json

import pytest

from inventory.models import Node, Pool
from tests.cli.runner import ZONE_OFFSET, Cli

pytestmark = pytest.mark.django_db(transaction=True)


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
