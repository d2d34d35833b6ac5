"""The node and pool consoles through Django's test client: actions change rows and leave an audit trail;
the filters, the node page's queries, and the charts."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.models import AuditEvent
from inventory.models import Node, Pool, Taint
from operations.selectors import node_allocatable_gpus, node_atoms
from reservations.models import DeviceBooking, PoolCapacityRollup
from tests.support.admin import messages_of
from tests.support.factories import AllocationFactory, DeviceFactory, NodeFactory, ReservationFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def onlooker(db: Any) -> Client:
    """Staff who may view the fleet but not operate it."""
    user = User.objects.create_user("onlooker", password="pw-onlooker-1", is_staff=True)
    codenames = ["view_node", "view_pool", "view_device", "view_reservation", "view_poolcapacityrollup"]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def operate(client: Client, op: str, nodes: list[Node], **data: str) -> Any:
    url = reverse("admin:inventory_node_operate", args=[op])
    return client.post(url, {"ids": ",".join(n.pk for n in nodes), **data}, follow=True)


def test_cordon_from_the_node_page_cordons_the_node_and_says_how_many_gpus_left(
    operator: Client, gpu_node: Node
) -> None:
    page = operator.get(reverse("admin:inventory_node_operate", args=["cordon"]) + f"?ids={gpu_node.pk}")
    assert page.status_code == 200
    assert gpu_node.hostname in page.content.decode()

    response = operate(operator, "cordon", [gpu_node], reason="xid 79 on GPU 3", next="node")

    gpu_node.refresh_from_db()
    assert gpu_node.cordoned
    assert gpu_node.cordon_reason == "xid 79 on GPU 3"
    # Back to the node page, its key quoted as the admin quotes it in every link.
    assert response.redirect_chain[-1][0] == reverse("admin:inventory_node_change", args=[quote(gpu_node.pk)])
    assert messages_of(response) == [
        "Cordoned 1 node; 8 GPUs left allocatable (gpu-a-001: schedulable → maintenance)."
    ]
    event = AuditEvent.objects.get(subject_type="node", subject_id=gpu_node.pk, action="node.cordon")
    assert event.actor == "admin:admin"
    assert event.reason == "xid 79 on GPU 3"


def test_cordon_needs_a_reason(operator: Client, gpu_node: Node) -> None:
    response = operate(operator, "cordon", [gpu_node], reason="")
    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    gpu_node.refresh_from_db()
    assert not gpu_node.cordoned
    assert not AuditEvent.objects.filter(subject_id=gpu_node.pk).exists()


def test_bulk_cordon_from_the_list_goes_through_the_reason_page_and_counts_rows(
    operator: Client, owned_pool: Pool
) -> None:
    nodes = [NodeFactory(pool=owned_pool) for _ in range(3)]
    for node in nodes:
        DeviceFactory.create_batch(2, node=node)
    already = nodes[0]
    Node.objects.filter(pk=already.pk).update(cordoned=True, cordon_reason="earlier")

    changelist = reverse("admin:inventory_node_changelist")
    response = operator.post(
        changelist, {"action": "op_cordon", "_selected_action": [n.pk for n in nodes]}, follow=False
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert f'action="{reverse("admin:inventory_node_operate", args=["cordon"])}"' in page
    assert all(n.hostname in page for n in nodes)
    assert Node.objects.filter(cordoned=True).count() == 1

    response = operate(operator, "cordon", nodes, reason="rack r01 power work")

    assert Node.objects.filter(pk__in=[n.pk for n in nodes], cordoned=True).count() == 3
    assert Node.objects.get(pk=already.pk).cordon_reason == "earlier"
    assert messages_of(response)[0].startswith("Cordoned 2 nodes (1 already so); 4 GPUs left allocatable")
    assert AuditEvent.objects.filter(action="node.cordon").count() == 2


def test_uncordon_brings_the_gpus_back(operator: Client, gpu_node: Node) -> None:
    Node.objects.filter(pk=gpu_node.pk).update(cordoned=True, cordon_reason="test")
    response = operate(operator, "uncordon", [gpu_node], reason="")
    gpu_node.refresh_from_db()
    assert not gpu_node.cordoned
    assert "8 GPUs joined allocatable" in messages_of(response)[0]
    assert AuditEvent.objects.filter(subject_id=gpu_node.pk, action="node.uncordon").exists()


def test_taint_and_untaint_keep_the_node_counter_and_the_audit_trail(
    operator: Client, gpu_node: Node
) -> None:
    response = operate(
        operator,
        "taint",
        [gpu_node],
        key="gpu.example.com/xid",
        value="79",
        effect="NoSchedule",
        reason="xid",
    )
    gpu_node.refresh_from_db()
    assert gpu_node.noschedule_taints == 1
    assert Taint.objects.get(node=gpu_node).effect == "NoSchedule"
    assert "8 GPUs left allocatable" in messages_of(response)[0]

    response = operate(operator, "untaint", [gpu_node], key="gpu.example.com/xid", reason="fixed")
    gpu_node.refresh_from_db()
    assert gpu_node.noschedule_taints == 0
    assert not Taint.objects.filter(node=gpu_node).exists()
    actions = list(AuditEvent.objects.filter(subject_id=gpu_node.pk).values_list("action", flat=True))
    assert sorted(actions) == ["node.taint", "node.untaint"]


def test_maintenance_on_and_off(operator: Client, gpu_node: Node) -> None:
    operate(operator, "maintenance-on", [gpu_node], reason="firmware upgrade")
    gpu_node.refresh_from_db()
    assert gpu_node.maintenance
    assert gpu_node.maintenance_reason == "firmware upgrade"
    operate(operator, "maintenance-off", [gpu_node], reason="")
    gpu_node.refresh_from_db()
    assert not gpu_node.maintenance
    actions = set(AuditEvent.objects.filter(subject_id=gpu_node.pk).values_list("action", flat=True))
    assert actions == {"node.maintenance.on", "node.maintenance.off"}


def test_device_health_from_the_node_page(operator: Client, gpu_node: Node) -> None:
    device = gpu_node.devices.order_by("uid").first()
    assert device is not None
    url = reverse("admin:inventory_node_device_health", args=[device.pk])
    assert operator.get(url + "?healthy=0").status_code == 200

    response = operator.post(url, {"healthy": "0", "reason": "ECC errors"}, follow=True)

    device.refresh_from_db()
    assert not device.healthy
    assert f"Marked {device.uid} unhealthy; 1 GPU left allocatable." in messages_of(response)
    assert AuditEvent.objects.filter(
        subject_type="device", subject_id=device.uid, action="device.unhealthy"
    ).exists()
    assert node_allocatable_gpus(node=gpu_node) == 7


def test_node_page_shows_the_predicate_atoms_bookings_and_trail(operator: Client, gpu_node: Node) -> None:
    Node.objects.filter(pk=gpu_node.pk).update(cordoned=True, cordon_reason="bad fan")
    device = gpu_node.devices.order_by("uid").first()
    assert device is not None
    allocation = AllocationFactory(node=gpu_node, reservation=ReservationFactory(pool=gpu_node.pool))
    now = timezone.now()
    DeviceBooking.objects.create(
        device=device,
        allocation=allocation,
        during=DateTimeTZRange(now - timedelta(hours=1), now + timedelta(hours=1)),
    )
    AuditEvent.objects.create(
        actor="someone", action="node.cordon", subject_type="node", subject_id=gpu_node.pk
    )

    response = operator.get(reverse("admin:inventory_node_change", args=[gpu_node.pk]))

    html = response.content.decode()
    assert response.status_code == 200
    assert "✖ FAIL" in html and "not cordoned" in html and "bad fan" in html
    assert "bucket-maintenance" in html
    assert allocation.reservation_id in html
    assert device.uid in html
    assert 'id="op-uncordon"' in html and 'id="op-cordon"' not in html
    assert "someone" in html


def test_node_atoms_group_mig_instances_under_their_gpu_in_two_queries(
    gpu_node: Node, django_assert_num_queries: Any
) -> None:
    parent = DeviceFactory(node=gpu_node, uid="GPU-mig-parent", bookable=False)
    for g in range(3):
        DeviceFactory(node=gpu_node, uid=f"GPU-mig-parent/gi{g}/ci0", device_class="gpu.mig", parent=parent)
    with django_assert_num_queries(2):
        gpus, others = node_atoms(node=gpu_node)
    by_uid = {row.device.uid: row for row in gpus}
    assert [c.device.uid for c in by_uid["GPU-mig-parent"].children] == [
        f"GPU-mig-parent/gi{g}/ci0" for g in range(3)
    ]
    assert len(gpus) == 9
    assert others == []


def test_rebuild_now_fills_the_pool_rollup(operator: Client, gpu_node: Node) -> None:
    pool = gpu_node.pool
    response = operator.post(reverse("admin:inventory_pool_rebuild", args=[pool.pk]), follow=True)
    row = PoolCapacityRollup.objects.get(pool=pool, resource="gpu")
    assert row.allocatable == 8
    assert response.status_code == 200
    assert "Rebuilt the capacity rollup" in messages_of(response)[0]
    assert AuditEvent.objects.filter(
        subject_type="pool", subject_id=pool.pk, action="pool.rollup.rebuild"
    ).exists()
    html = response.content.decode()
    assert 'class="capacity-bar"' in html
    assert "timeline-chart" in html


def test_staff_without_the_permission_can_look_but_not_act(onlooker: Client, gpu_node: Node) -> None:
    page = onlooker.get(reverse("admin:inventory_node_change", args=[gpu_node.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="no-operate"' in html
    assert 'id="op-cordon"' not in html
    assert "set unhealthy" not in html

    listing = onlooker.get(reverse("admin:inventory_node_changelist"))
    assert "op_cordon" not in listing.content.decode()

    refused = onlooker.post(
        reverse("admin:inventory_node_operate", args=["cordon"]), {"ids": gpu_node.pk, "reason": "sneaky"}
    )
    assert refused.status_code == 403
    refused = onlooker.post(reverse("admin:inventory_pool_rebuild", args=[gpu_node.pool_id]))
    assert refused.status_code == 403
    gpu_node.refresh_from_db()
    assert not gpu_node.cordoned
    assert not AuditEvent.objects.exists()


def test_bucket_and_schedulable_filters_use_the_bucket_sql(operator: Client, owned_pool: Pool) -> None:
    ready = NodeFactory(pool=owned_pool, hostname="ready-1")
    cordoned = NodeFactory(pool=owned_pool, hostname="cordoned-1", cordoned=True)
    unreachable = NodeFactory(pool=owned_pool, hostname="lost-1", connectivity="disconnected")
    url = reverse("admin:inventory_node_changelist")

    def shown(**params: str) -> set[str]:
        return {n.hostname for n in operator.get(url, params).context["cl"].result_list}

    assert shown(bucket="maintenance") == {cordoned.hostname}
    assert shown(bucket="unreachable") == {unreachable.hostname}
    assert shown(schedulable="yes") == {ready.hostname}
    assert shown(schedulable="no") == {cordoned.hostname, unreachable.hostname}


def test_node_page_costs_the_same_number_of_queries_as_atoms_grow(
    operator: Client, gpu_node: Node, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    url = reverse("admin:inventory_node_change", args=[gpu_node.pk])
    with CaptureQueriesContext(connection) as small:
        assert operator.get(url).status_code == 200
    allocation = AllocationFactory(node=gpu_node, reservation=ReservationFactory(pool=gpu_node.pool))
    now = timezone.now()
    for parent_index in range(4):
        parent = DeviceFactory(node=gpu_node, uid=f"GPU-p{parent_index}", bookable=False)
        for g in range(7):
            atom = DeviceFactory(
                node=gpu_node, uid=f"GPU-p{parent_index}/gi{g}/ci0", device_class="gpu.mig", parent=parent
            )
            DeviceBooking.objects.create(
                device=atom, allocation=allocation, during=DateTimeTZRange(now, now + timedelta(hours=1))
            )
    with django_assert_max_num_queries(len(small.captured_queries)):
        assert operator.get(url).status_code == 200


def test_capacity_bar_reads_without_colour() -> None:
    from capacity import charts

    row = PoolCapacityRollup(
        total=64,
        allocatable=56,
        allocated=24,
        reserved=8,
        provisioning=0,
        unhealthy=1,
        maintenance=7,
        unreachable=0,
    )
    row.available = 24
    svg = str(charts.rollup_bar_svg(row=row))
    # Every non-empty segment has a pattern fill, a title with its value, and the summary says it in words.
    for key, value in (
        ("allocated", 24),
        ("reserved", 8),
        ("available", 24),
        ("maintenance", 7),
        ("unhealthy", 1),
    ):
        assert f'class="seg-{key}"' in svg
        assert f"<title>{key}: {value}</title>" in svg
    assert 'class="seg-provisioning"' not in svg
    assert (
        "24 allocated · 8 reserved · 24 available of 56 allocatable · 7 maintenance · 1 unhealthy (64 total)"
        in svg
    )


def test_timeline_chart_draws_one_column_per_bucket_with_its_numbers() -> None:
    from capacity import charts

    start = 1_790_000_000_000
    buckets = [
        {"start": start + i * 3_600_000, "end": start + (i + 1) * 3_600_000, "booked": i, "free": 8 - i}
        for i in range(4)
    ]
    svg = str(charts.timeline_svg(timeline={"allocatable": 8, "buckets": buckets}))
    assert svg.count('class="tl-booked"') == 4
    assert svg.count('class="tl-free"') == 4
    assert ": 3 booked</title>" in svg and ": 5 free</title>" in svg
    assert "allocatable 8" in svg
    assert "booked GPUs (hatched)" in svg and "free GPUs (dotted)" in svg


def test_timeline_chart_shades_a_maintenance_window_clipped_to_its_range() -> None:
    from datetime import UTC, datetime

    from capacity import charts
    from reservations.maintenance.windows import WindowRef

    start = datetime(2030, 1, 1, tzinfo=UTC)
    buckets = [
        {
            "start": int((start + timedelta(hours=i)).timestamp() * 1000),
            "end": int((start + timedelta(hours=i + 1)).timestamp() * 1000),
            "booked": 1,
            "free": 7,
        }
        for i in range(4)
    ]
    inside = WindowRef(
        "mw_1", "firmware", start + timedelta(hours=1), start + timedelta(hours=2), ("n1", "n2")
    )
    # Starts before the chart: its band begins at the chart's left edge.
    early = WindowRef("mw_2", "psu", start - timedelta(hours=3), start + timedelta(minutes=30), ("n3",))
    outside = WindowRef("mw_3", "later", start + timedelta(hours=9), start + timedelta(hours=10), ("n3",))
    svg = str(
        charts.timeline_svg(timeline={"allocatable": 8, "buckets": buckets}, windows=[inside, early, outside])
    )
    assert svg.count('class="tl-window"') == 2
    assert "maintenance window: firmware on 2 nodes, 01-01 01:00 to 01-01 02:00" in svg
    assert ">psu</text>" in svg and "later" not in svg
    assert "maintenance window (shaded)" in svg
    # The band of the window from 01:00 to 02:00 is a quarter of the plot, from its quarter mark.
    band = svg.split('class="tl-window" ', 1)[1]
    x, width = (float(v) for v in re.findall(r'(?:x|width)="([0-9.]+)"', band)[:2])
    assert (round(x - 44, 1), round(width, 1)) == (201.0, 201.0)
    # Without windows the chart has neither bands nor their legend.
    plain = str(charts.timeline_svg(timeline={"allocatable": 8, "buckets": buckets}))
    assert "tl-window" not in plain and "maintenance window" not in plain


def test_editing_a_node_resource_moves_the_pools_scalar_capacity_at_once(
    operator: Client, owned_pool: Pool
) -> None:
    from reservations.rollups.recount import rollup_rebuild, rollup_recount
    from tests.support.placement import make_node

    node = make_node(owned_pool, resources={"vcpu": 100})
    rollup_rebuild(pool_id=owned_pool.pk)
    vcpu = PoolCapacityRollup.objects.get(pool=owned_pool, resource="vcpu")
    assert vcpu.allocatable == 100
    # As an operator does it: the list, the row's link, the form.
    listing = operator.get(reverse("admin:inventory_noderesource_changelist"), {"q": node.hostname})
    (row_link,) = [
        link
        for link in links_in(listing.content.decode())
        if "/admin/inventory/noderesource/" in link and "/change/" in link
    ]
    page = operator.get(row_link)
    assert page.status_code == 200
    saved = operator.post(row_link, {"allocatable": 100, "ratio": "1.5"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    # No rebuild ran: the save moved the pool's vcpu in its own transaction.
    vcpu.refresh_from_db()
    assert vcpu.allocatable == 150
    assert rollup_recount(pool_ids=[owned_pool.pk])[(owned_pool.pk, "vcpu")]["allocatable"] == 150
    event = AuditEvent.objects.get(action="node.resource", subject_id=node.pk)
    assert event.data["ratio"] == 1.5 and event.actor.startswith("admin:")


def links_in(page: str) -> list[str]:
    import re

    return re.findall(r'href="([^"]+)"', page)
