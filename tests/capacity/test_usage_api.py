"""`usage/hourly` over HTTP, `manage.py usage` as a child process, the admin's CSV link as clicked."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from capacity.models import HourlyUsage, UsageHour
from capacity.services import usage_close_due
from capacity.usage import HOUR, hour_floor
from core.clock import compute_now, to_millis
from inventory.models import Pool
from reservations.services import reservation_create
from tests.support.admin import links_of
from tests.support.api import assert_error, invalid_fields, post_json
from tests.support.commands import child_env_on_this_database, run_python
from tests.support.factories import (
    AllocationFactory,
    PoolFactory,
    ProjectFactory,
    ReservationFactory,
    TenantFactory,
)
from tests.support.placement import gpu_request, make_node
from tests.support.records import book

DAY_MS = 86_400_000


@pytest.fixture
def used_pool(owned_pool: Pool, clock: Any) -> dict[str, Any]:
    """Acme held 2 GPUs and 8 vCPUs in a project, and 1 spot GPU, for two hours; an hour of it is closed."""
    make_node(owned_pool, gpus=4, resources={"vcpu": 32})
    project = ProjectFactory.create(tenant=owned_pool.owner)
    now = compute_now()
    start = clock(hour_floor(now) + HOUR - now)  # on the hour, so the amounts are round
    for request in (
        gpu_request(owned_pool, 2, project_id=project.pk, resources={"vcpu": 8}, duration_seconds=7200),
        gpu_request(owned_pool, 1, spot=True, duration_seconds=7200),
    ):
        reservation_create(request=request, actor="test", pool=owned_pool)
    clock(timedelta(hours=1, minutes=30))
    usage_close_due()  # closes the first hour; the second is open, half gone
    return {"start": start, "project": project}


def body(**fields: Any) -> dict[str, Any]:
    return {"tenantId": "acme", **fields}


def window(start: Any, hours: int = 24) -> dict[str, int]:
    return {"from": to_millis(start) or 0, "to": (to_millis(start) or 0) + hours * 3_600_000}


@pytest.mark.django_db
def test_hourly_answers_each_hour_per_pool_project_resource_and_spot_closed_hours_first(
    owner_client: APIClient, owned_pool: Pool, used_pool: dict[str, Any]
) -> None:
    start, project = used_pool["start"], used_pool["project"]
    status, answer = post_json(owner_client, "usage/hourly", body(**window(start)))
    assert status == 200, answer
    assert (answer["from"], answer["to"], answer["nextCursor"]) == (
        to_millis(start),
        to_millis(start) + DAY_MS,
        None,
    )
    rows = [
        (
            r["hour"] - to_millis(start),
            r["projectId"],
            r["resource"],
            r["spot"],
            r["unit"],
            r["amount"],
            r["closed"],
        )
        for r in answer["rows"]
    ]
    first, second = 0, 3_600_000
    assert rows == [
        (first, None, "gpu", True, "atom-hours", 1.0, True),
        (first, project.pk, "gpu", False, "atom-hours", 2.0, True),
        (first, project.pk, "vcpu", False, "unit-hours", 8.0, True),
        (second, None, "gpu", True, "atom-hours", 0.5, False),
        (second, project.pk, "gpu", False, "atom-hours", 1.0, False),
        (second, project.pk, "vcpu", False, "unit-hours", 4.0, False),
    ]
    assert {r["poolId"] for r in answer["rows"]} == {owned_pool.pk}
    assert answer["rows"][0]["microseconds"] == 3_600_000_000
    status, only_project = post_json(
        owner_client, "usage/hourly", body(projectId=project.pk, **window(start))
    )
    assert status == 200 and {r["projectId"] for r in only_project["rows"]} == {project.pk}


@pytest.mark.django_db
def test_closed_hours_are_read_from_the_table_and_only_the_open_hour_from_the_bookings(
    owner_client: APIClient, used_pool: dict[str, Any]
) -> None:
    """A report never rescans the bookings of closed hours: one statement reads them, for the open hour."""
    start = used_pool["start"]
    for hours, reads_of_bookings in ((1, 0), (24 * 31, 1)):
        with CaptureQueriesContext(connection) as queries:
            status, answer = post_json(owner_client, "usage/hourly", body(**window(start, hours)))
        assert status == 200, answer
        booking_reads = [q["sql"] for q in queries.captured_queries if "device_bookings" in q["sql"]]
        assert len(booking_reads) == reads_of_bookings, hours
        assert len(queries.captured_queries) <= 12, [q["sql"][:80] for q in queries.captured_queries]


@pytest.mark.django_db
def test_pages_follow_the_cursor_and_together_are_the_whole_answer(
    owner_client: APIClient, used_pool: dict[str, Any]
) -> None:
    request = body(**window(used_pool["start"]))
    _, whole = post_json(owner_client, "usage/hourly", request)
    pages: list[dict[str, Any]] = []
    cursor = None
    while True:
        status, page = post_json(owner_client, "usage/hourly", {**request, "limit": 2, "cursor": cursor})
        assert status == 200, page
        assert len(page["rows"]) <= 2
        pages.extend(page["rows"])
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert pages == whole["rows"] and len(pages) == 6


@pytest.mark.django_db
def test_a_tenant_offered_the_pool_sees_only_its_own_usage(
    offered_client: APIClient, owned_pool: Pool, used_pool: dict[str, Any]
) -> None:
    status, answer = post_json(
        offered_client,
        "usage/hourly",
        {"tenantId": "beta", "poolId": owned_pool.pk, **window(used_pool["start"])},
    )
    assert status == 200 and answer["rows"] == []


def _nothing_written() -> tuple[int, int]:
    return HourlyUsage.objects.count(), UsageHour.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"from": 0, "to": 31 * DAY_MS + 1}, "to"),  # 31 days and an hour, once rounded to whole hours
        ({"from": DAY_MS, "to": DAY_MS}, "to"),
        ({"from": DAY_MS, "to": DAY_MS - 1}, "to"),
        ({"from": -1, "to": DAY_MS}, "from"),
        ({"to": DAY_MS}, "from"),
        ({"from": 0, "to": DAY_MS, "limit": 1001}, "limit"),
        ({"from": 0, "to": DAY_MS, "cursor": "not-ours"}, "cursor"),
        ({"from": 0, "to": DAY_MS, "poolId": "nope"}, "poolId"),
        ({"from": 0, "to": DAY_MS, "extra": 1}, "extra"),
    ],
)
def test_bad_input_is_invalid_input_in_the_envelope_and_changes_nothing(
    owner_client: APIClient, used_pool: dict[str, Any], fields: dict[str, Any], bad: str
) -> None:
    before = _nothing_written()
    status, answer = post_json(owner_client, "usage/hourly", body(**fields))
    assert bad in invalid_fields(status, answer)
    assert _nothing_written() == before


@pytest.mark.django_db
def test_exactly_31_days_is_accepted(owner_client: APIClient, used_pool: dict[str, Any]) -> None:
    status, answer = post_json(
        owner_client, "usage/hourly", body(**window(used_pool["start"], hours=31 * 24))
    )
    assert status == 200 and len(answer["rows"]) == 6


@pytest.mark.django_db
def test_an_unknown_pool_or_another_tenants_project_is_not_found_and_changes_nothing(
    owner_client: APIClient, outsider_tenant: Any, used_pool: dict[str, Any]
) -> None:
    before = _nothing_written()
    times = window(used_pool["start"])
    status, answer = post_json(owner_client, "usage/hourly", body(poolId="pool_" + "0" * 26, **times))
    assert_error(status, answer, "NOT_FOUND", 404)
    foreign_pool = PoolFactory.create(owner=outsider_tenant)
    status, answer = post_json(owner_client, "usage/hourly", body(poolId=foreign_pool.pk, **times))
    assert_error(status, answer, "NOT_FOUND", 404)
    their_project = ProjectFactory.create(tenant=outsider_tenant)
    status, answer = post_json(owner_client, "usage/hourly", body(projectId=their_project.pk, **times))
    assert_error(status, answer, "NOT_FOUND", 404)
    assert _nothing_written() == before


@pytest.mark.django_db
def test_another_tenant_is_denied_before_the_body_is_looked_at_further(
    outsider_client: APIClient, used_pool: dict[str, Any]
) -> None:
    status, answer = post_json(outsider_client, "usage/hourly", body(**window(used_pool["start"])))
    assert_error(status, answer, "PERMISSION_DENIED", 403)


@pytest.mark.django_db
def test_the_method_is_in_the_openapi_document_with_its_examples(client: Client) -> None:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    operation = schema["paths"]["/api/compute/usage/hourly"]["post"]
    request_examples = operation["requestBody"]["content"]["application/json"]["examples"]
    response_examples = operation["responses"]["200"]["content"]["application/json"]["examples"]
    assert request_examples and response_examples
    example = next(iter(response_examples.values()))["value"]
    keys = {"hour", "poolId", "projectId", "resource", "spot", "unit", "amount", "microseconds", "closed"}
    assert keys <= set(example["rows"][0])


# --- the command line and the admin ----------------------------------------------------------


@pytest.fixture
def past_usage(db: Any) -> dict[str, Any]:
    """Two whole GPUs held for two hours that ended an hour ago, committed (for a child process)."""
    acme = TenantFactory.create(id="acme")
    pool = PoolFactory.create(owner=acme, name="cli-pool")
    node = make_node(pool, gpus=2, hostname="cli-1")
    end = hour_floor(compute_now()) - HOUR
    reservation = ReservationFactory.create(
        pool=pool, tenant=acme, starts_at=end - 2 * HOUR, ends_at=end, state="ended"
    )
    allocation = AllocationFactory.create(reservation=reservation, node=node)
    for device in node.devices.all():
        book(device, end - 2 * HOUR, end, allocation=allocation)
    return {"pool": pool, "from": end - 3 * HOUR, "to": end + 2 * HOUR}


@pytest.mark.django_db(transaction=True)
def test_manage_py_usage_prints_a_table_and_csv_that_add_up_to_the_bookings(
    past_usage: dict[str, Any],
) -> None:
    pool: Pool = past_usage["pool"]
    times = ["--from", past_usage["from"].isoformat(), "--to", past_usage["to"].isoformat()]
    env = child_env_on_this_database()
    table = run_python("manage.py", "usage", "--tenant", "acme", *times, env=env, timeout=60)
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("2.000000") == 2 and "atom-hours" in table.stdout

    result = run_python(
        "manage.py",
        "usage",
        "--tenant",
        "acme",
        "--pool",
        pool.pk,
        "--csv",
        *times,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["poolId"], r["resource"], r["amount"]) for r in rows] == [(pool.pk, "gpu", "2.000000")] * 2
    assert sum(int(r["microseconds"]) for r in rows) == 4 * 3_600_000_000

    unknown = run_python("manage.py", "usage", "--tenant", "nosuch", env=env, timeout=60)
    assert unknown.returncode == 1 and "tenant nosuch not found" in unknown.stderr
    too_long = run_python(
        "manage.py", "usage", "--tenant", "acme", "--from", "2026-01-01", "--to", "2026-03-01",
        env=env, timeout=60,
    )  # fmt: skip
    assert too_long.returncode == 1 and "31 days" in too_long.stderr


@pytest.mark.django_db
def test_the_admin_csv_link_on_the_usage_list_downloads_what_the_api_answers(
    admin_client: Client, past_usage: dict[str, Any]
) -> None:
    usage_close_due()
    page = admin_client.get(reverse("admin:capacity_hourlyusage_changelist") + "?tenant_id__exact=acme")
    assert page.status_code == 200
    html = page.content.decode()
    rows = links_of(html)
    assert len(rows) == 2 and all(admin_client.get(row).status_code == 200 for row in rows)
    link = html.split('class="usage-csv"')[0].rsplit('href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    assert "tenant_id=acme" in link
    response = admin_client.get(link)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    records = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["tenantId"], r["resource"], r["amount"], r["closed"]) for r in records] == [
        ("acme", "gpu", "2.000000", "true")
    ] * 2
