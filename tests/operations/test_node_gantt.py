"""The node page's booking chart: each atom's bookings as bars, reached from the node list.

Bars name the reservation, its tenant and state; spot bookings are hatched,
at-risk ones outlined; the chart's data is one query whatever the bookings.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from core.clock import compute_now
from inventory.models import Device, Node, Pool
from operations.selectors import node_gantt
from reservations.models import Reservation
from tests.support.admin import links_of
from tests.support.factories import AllocationFactory, ReservationFactory
from tests.support.placement import make_node
from tests.support.records import book


def booked_node(pool: Pool) -> tuple[Node, Reservation, Reservation]:
    """A node with a regular reservation now and an at-risk spot one later."""
    node = make_node(pool, hostname="gantt-node", gpus=4)
    devices = list(Device.objects.filter(node=node).order_by("uid"))
    regular = ReservationFactory(pool=pool, tenant=pool.owner, state="active")
    spot = ReservationFactory(pool=pool, tenant=pool.owner, state="scheduled", spot=True)
    Reservation.objects.filter(pk=spot.pk).update(at_risk_since="2026-01-01T00:00:00Z", at_risk_reason="xid")
    held = AllocationFactory(node=node, reservation=regular)
    for device in devices[:2]:
        book(device, timedelta(hours=-1), timedelta(hours=2), allocation=held)
    book(
        devices[3],
        timedelta(hours=3),
        timedelta(hours=5),
        allocation=AllocationFactory(node=node, reservation=spot),
    )
    # Outside a 24-hour window (a quarter past, three quarters ahead): not drawn.
    book(devices[2], timedelta(hours=30), timedelta(hours=31), allocation=held)
    return node, regular, spot


@pytest.mark.django_db
def test_the_node_page_draws_each_atoms_bookings_reached_from_the_node_list(
    operator: Client, owned_pool: Pool
) -> None:
    _, regular, spot = booked_node(owned_pool)
    listing = operator.get(reverse("admin:inventory_node_changelist")).content.decode()
    (link,) = [href for href in links_of(listing) if href.endswith("/change/")]
    page = operator.get(link).content.decode()
    chart = page.split('id="node-gantt"', 1)[1].split("</svg>", 1)[0]
    assert chart.count('class="gantt-bar') == 3
    assert chart.count(f"{regular.pk} (acme), active, regular") == 2
    assert f"{spot.pk} (acme), scheduled, spot, at risk" in chart
    assert 'class="gantt-bar gantt-spot gantt-at-risk"' in chart
    # Every atom is a row, booked or not.
    assert chart.count("(gpu)</text>") == 4
    # A wider window, by its link on the page, also draws the booking 30 hours ahead.
    wider = operator.get(link + "?gantt=72").content.decode()
    assert wider.split('id="node-gantt"', 1)[1].split("</svg>", 1)[0].count('class="gantt-bar') == 4


@pytest.mark.django_db
def test_the_chart_is_one_query_however_many_bookings(owned_pool: Pool) -> None:
    node, _, _ = booked_node(owned_pool)
    with CaptureQueriesContext(connection) as queries:
        gantt = node_gantt(node=node, hours=24)
    assert len(queries) == 1
    assert len(gantt.atoms) == 4 and len(gantt.bars) == 3
    assert all(gantt.start <= bar.start < bar.end <= gantt.end for bar in gantt.bars)


@pytest.mark.django_db
def test_a_maintenance_window_is_its_own_bar_labelled_with_its_reason(
    operator: Client, owned_pool: Pool
) -> None:
    from reservations.maintenance.services import maintenance_schedule

    node, regular, _ = booked_node(owned_pool)
    now = compute_now()
    impact = maintenance_schedule(
        node_ids=[node.pk],
        starts_at=now + timedelta(hours=6),
        ends_at=now + timedelta(hours=8),
        reason="firmware <b>2.1</b>",
        actor="test",
    )
    window = impact.window
    listing = operator.get(reverse("admin:inventory_node_changelist")).content.decode()
    (link,) = [href for href in links_of(listing) if href.endswith("/change/")]
    chart = operator.get(link).content.decode().split('id="node-gantt"', 1)[1].split("</svg>", 1)[0]
    # One bar in the windows' row, labelled with the reason (escaped), over a shaded band.
    assert chart.count('class="gantt-window"') == 1 and chart.count('class="gantt-window-band"') == 1
    assert ">maintenance windows</text>" in chart
    assert ">firmware &lt;b&gt;2.1&lt;/b&gt;</text>" in chart
    assert f"maintenance window: firmware &lt;b&gt;2.1&lt;/b&gt; ({window.pk})" in chart
    # Each atom's hold is drawn as maintenance, not as a layout change; the reservations as before.
    assert chart.count('class="gantt-bar gantt-maintenance"') == 4
    assert "gantt-layout-change" not in chart
    assert chart.count(f"{regular.pk} (acme), active, regular") == 2
    assert ">maintenance window</text>" in chart


@pytest.mark.django_db
def test_the_chart_with_a_window_is_still_one_query(owned_pool: Pool) -> None:
    from reservations.maintenance.services import maintenance_schedule

    node, _, _ = booked_node(owned_pool)
    now = compute_now()
    window = maintenance_schedule(
        node_ids=[node.pk],
        starts_at=now + timedelta(hours=6),
        ends_at=now + timedelta(hours=8),
        reason="firmware",
        actor="test",
    ).window
    with CaptureQueriesContext(connection) as queries:
        gantt = node_gantt(node=node, hours=24)
    assert len(queries) == 1
    assert [(w.window_id, w.reason, w.start, w.end) for w in gantt.windows] == [
        (window.pk, "firmware", window.starts_at, window.ends_at)
    ]
    assert sum(1 for bar in gantt.bars if bar.window_id == window.pk) == 4
