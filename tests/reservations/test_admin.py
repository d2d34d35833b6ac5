"""The reservations admin: a release with a reason, and the list's filters."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.models import Reservation
from tests.support.admin import messages_of
from tests.support.factories import ReservationFactory

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
