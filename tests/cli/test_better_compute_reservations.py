"""`better-compute` end to end, the reservations: reserve, get, list, release and renew, as a tenant would.

The CLI runs as a subprocess against a live server (tests/cli/runner.py); what is
checked is what a user or a script sees: stdout, stderr and the exit code.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from inventory.models import Node, Pool
from tests.cli.runner import ZONE, ZONE_OFFSET, Cli

pytestmark = pytest.mark.django_db(transaction=True)


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
