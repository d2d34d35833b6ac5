"""The reservations admin: a release with a reason, the list's filters, and each allocation's placement."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.models import Reservation
from tests.support.admin import links_of, messages_of
from tests.support.factories import AllocationFactory, NodeFactory, ReservationFactory

pytestmark = pytest.mark.django_db


def test_release_action_releases_with_the_reason(operator: Client, gpu_node: Node) -> None:
    reservation = ReservationFactory(pool=gpu_node.pool, tenant=gpu_node.pool.owner, state="active")
    changelist = reverse("admin:reservations_reservation_changelist")
    form = operator.post(changelist, {"action": "release_reservations", "_selected_action": [reservation.pk]})
    assert form.status_code == 200
    assert "Release reservations" in form.content.decode()

    response = operator.post(
        changelist,
        {
            "action": "release_reservations",
            "_selected_action": [reservation.pk],
            "apply": "1",
            "reason": "abuse",
        },
        follow=True,
    )
    reservation.refresh_from_db()
    assert reservation.state == "released"
    assert reservation.release_reason == "abuse"
    event = AuditEvent.objects.get(subject_type="reservation", subject_id=reservation.pk)
    assert (event.action, event.reason, event.actor) == ("reservation.release", "abuse", "admin:admin")
    assert "Released 1 reservation" in messages_of(response)[0]


def test_reservation_list_filters_by_pool_tenant_and_state(operator: Client, owned_pool: Pool) -> None:
    mine = ReservationFactory(pool=owned_pool, tenant=owned_pool.owner, state="active")
    other = ReservationFactory(state="released")
    url = reverse("admin:reservations_reservation_changelist")
    html = operator.get(url, {"pool__id__exact": owned_pool.pk}).content.decode()
    assert mine.pk in html and other.pk not in html
    html = operator.get(url, {"state": "released"}).content.decode()
    assert other.pk in html and mine.pk not in html
    html = operator.get(url, {"tenant__id__exact": owned_pool.owner_id}).content.decode()
    assert mine.pk in html and other.pk not in html
    assert Reservation.objects.count() == 2


def test_the_reservation_page_shows_where_each_node_put_the_workload(
    operator: Client, gpu_node: Node
) -> None:
    reservation = ReservationFactory(pool=gpu_node.pool, tenant=gpu_node.pool.owner, state="active")
    placed = {"cpus": [*range(16), 32, 33], "numaNodes": [0], "gpuLocal": True}
    AllocationFactory(reservation=reservation, node=gpu_node, placement=placed)
    other = NodeFactory(pool=gpu_node.pool, hostname="gpu-a-002")
    AllocationFactory(reservation=reservation, node=other)
    listing = operator.get(reverse("admin:reservations_reservation_changelist")).content.decode()
    (link,) = [href for href in links_of(listing) if href.endswith("/change/")]
    page = operator.get(link)
    assert page.status_code == 200
    html = page.content.decode()
    assert reservation.pk in html
    assert "CPUs 0-15,32-33 · NUMA 0 · local to its GPUs" in html
    # A node that has not said where it put the workload (or has no agent) shows that.
    assert "not reported" in html
