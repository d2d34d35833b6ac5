"""The node list's "Plan maintenance" action through Django's test client, as the list's form posts it.

The action asks for the window, shows what `nodes/planMaintenance` says
scheduling would do (writing nothing), and books it on Confirm; bad input is a
form error that writes nothing. The pool page's timeline marks the window.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from core.clock import compute_now
from core.models import AuditEvent
from inventory.models import Node, Pool
from reservations.models import DeviceBooking, MaintenanceWindow, Reservation
from tests.support.admin import messages_of
from tests.support.api import post_json, reservation_body
from tests.support.placement import make_node

ACTION_LABEL = "Plan maintenance for the selected nodes…"
PLAN_URL = "admin:inventory_node_plan_maintenance"


def minute(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")


def action_name(page: str) -> str:
    """The value of the list's action option an operator picks by its label."""
    (value,) = re.findall(rf'<option value="([^"]+)">{re.escape(ACTION_LABEL)}</option>', page)
    return value


def choose_action(operator: Client, nodes: list[Node]) -> Any:
    """The node list, its action picked for `nodes`, as its form posts it."""
    listing = operator.get(reverse("admin:inventory_node_changelist"))
    body = {"action": action_name(listing.content.decode()), "_selected_action": [n.pk for n in nodes]}
    return operator.post(reverse("admin:inventory_node_changelist"), body)


def fields(nodes: list[Node], start: datetime, end: datetime, reason: str = "firmware") -> dict[str, str]:
    return {
        "ids": ",".join(n.pk for n in nodes),
        "starts_at": minute(start),
        "ends_at": minute(end),
        "reason": reason,
    }


def create(client: APIClient, pool: Pool, key: str, start: datetime, gpus: int = 8) -> str:
    body = reservation_body(pool, "acme", key, gpus=gpus, start=int(start.timestamp() * 1000))
    status, created = post_json(client, "reservations/create", body)
    assert status == 201, created
    return str(created["id"])


def nodes_of(reservation_id: str) -> set[str]:
    reservation = Reservation.objects.get(pk=reservation_id)
    return set(reservation.allocations.filter(released=False).values_list("node_id", flat=True))


@pytest.fixture
def three_nodes(owned_pool: Pool) -> list[Node]:
    return [make_node(owned_pool, hostname=f"mx-{i}") for i in range(3)]


@pytest.mark.django_db
def test_the_action_shows_the_impact_then_confirm_books_the_window(
    operator: Client, owner_client: APIClient, owned_pool: Pool, three_nodes: list[Node]
) -> None:
    start = compute_now().replace(second=0, microsecond=0) + timedelta(hours=1)
    moving = create(owner_client, owned_pool, "moving", start + timedelta(hours=1))
    (held,) = nodes_of(moving)
    free = [n for n in three_nodes if n.pk != held]
    # The window takes the reservation's node and one free one: the third is where it goes.
    chosen = sorted([Node.objects.get(pk=held), free[0]], key=lambda n: n.hostname)

    form_page = choose_action(operator, chosen)
    assert form_page.status_code == 200
    page = form_page.content.decode()
    assert 'name="starts_at"' in page and 'name="ends_at"' in page and 'name="reason"' in page
    assert all(n.hostname in page for n in chosen)

    audits = AuditEvent.objects.count()
    impact = operator.post(reverse(PLAN_URL), fields(chosen, start, start + timedelta(hours=4)))
    assert impact.status_code == 200
    text = impact.content.decode()
    section = text.split('id="maintenance-impact"', 1)[1]
    nodes_table = section.split('id="impact-nodes"', 1)[1].split("</table>", 1)[0]
    assert moving in nodes_table and f"→ {free[1].pk}" in nodes_table
    tenants = section.split('id="impact-tenants"', 1)[1].split("</table>", 1)[0]
    assert "<td>acme</td><td>0</td><td>1</td><td>0</td>" in tenants
    # Lowest available GPUs during the window: 16 free of 24 with the nodes, none without them.
    pools = section.split('id="impact-pools"', 1)[1].split("</table>", 1)[0]
    assert f"<td>{owned_pool.pk}</td><td>gpu</td><td>16</td><td>0</td>" in pools
    assert 'id="maintenance-confirm"' in text
    # The impact page wrote nothing.
    assert not MaintenanceWindow.objects.exists() and AuditEvent.objects.count() == audits
    assert nodes_of(moving) == {held}

    # Confirm posts the same window back, with the page's hidden fields.
    hidden = dict(
        re.findall(
            r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"',
            text.split('id="maintenance-form"', 1)[1],
        )
    )
    assert hidden["reason"] == "firmware" and hidden["ids"] == ",".join(n.pk for n in chosen)
    done = operator.post(reverse(PLAN_URL), {**hidden, "confirm": "Confirm"}, follow=True)
    (message,) = messages_of(done)
    window = MaintenanceWindow.objects.get()
    assert message.startswith(
        f"Scheduled maintenance window 'firmware' on {chosen[0].pk}, {chosen[1].pk} from "
    )
    assert f"({window.pk}): 1 moved, 0 at risk, 0 running" in message
    assert sorted(window.members.values_list("node_id", flat=True)) == sorted(n.pk for n in chosen)
    assert window.created_by == "admin:admin"
    assert nodes_of(moving) == {free[1].pk}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start_hours", "end_hours", "field", "error"),
    [
        (2, 1, "ends_at", "must be after From"),
        (2, 2, "ends_at", "must be after From"),
        (-3, 2, "starts_at", "must not be in the past"),
    ],
)
def test_bad_times_are_a_form_error_and_write_nothing(
    operator: Client, gpu_node: Node, start_hours: int, end_hours: int, field: str, error: str
) -> None:
    now = compute_now().replace(second=0, microsecond=0)
    choose_action(operator, [gpu_node])
    for confirm in ({}, {"confirm": "Confirm"}):
        body = fields([gpu_node], now + timedelta(hours=start_hours), now + timedelta(hours=end_hours))
        response = operator.post(reverse(PLAN_URL), {**body, **confirm})
        assert response.status_code == 200
        assert error in " ".join(response.context["form"].errors[field])
        assert 'id="maintenance-impact"' not in response.content.decode()
    assert not MaintenanceWindow.objects.exists()
    assert not DeviceBooking.objects.filter(purpose="maintenance").exists()


@pytest.mark.django_db
def test_a_refusal_of_the_service_names_the_window_already_there(operator: Client, gpu_node: Node) -> None:
    start = compute_now().replace(second=0, microsecond=0) + timedelta(hours=1)
    body = fields([gpu_node], start, start + timedelta(hours=2))
    operator.post(reverse(PLAN_URL), {**body, "confirm": "Confirm"})
    (first,) = MaintenanceWindow.objects.all()
    again = operator.post(
        reverse(PLAN_URL), fields([gpu_node], start + timedelta(hours=1), start + timedelta(hours=3))
    )
    assert again.status_code == 200
    errors = " ".join(again.context["form"].non_field_errors())
    assert f"maintenance window 'firmware' on {gpu_node.pk}" in errors and first.pk in errors
    assert MaintenanceWindow.objects.count() == 1


@pytest.mark.django_db
def test_only_operators_reach_the_plan_page(client: Client, gpu_node: Node) -> None:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("looker", password="pw-looker-1", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_node"]))
    client.force_login(user)
    start = compute_now() + timedelta(hours=1)
    listing = client.get(reverse("admin:inventory_node_changelist")).content.decode()
    assert ACTION_LABEL not in listing
    response = client.post(
        reverse(PLAN_URL), {**fields([gpu_node], start, start + timedelta(hours=1)), "confirm": "1"}
    )
    assert response.status_code == 403
    assert not MaintenanceWindow.objects.exists()


@pytest.mark.django_db
def test_the_pool_timeline_marks_a_window_in_its_range(
    operator: Client, owned_pool: Pool, gpu_node: Node
) -> None:
    start = compute_now().replace(second=0, microsecond=0) + timedelta(hours=1)
    operator.post(
        reverse(PLAN_URL), {**fields([gpu_node], start, start + timedelta(hours=2)), "confirm": "1"}
    )
    assert MaintenanceWindow.objects.exists()
    page = operator.get(reverse("admin:inventory_pool_change", args=[owned_pool.pk])).content.decode()
    chart = page.split('class="timeline-chart"', 1)[1].split("</svg>", 1)[0]
    assert chart.count('class="tl-window"') == 1
    assert "maintenance window: firmware on 1 node," in chart
    assert 'class="tl-window-label"' in chart and ">firmware</text>" in chart
    assert "maintenance window (shaded)" in chart


@pytest.mark.django_db
def test_the_plan_page_refuses_a_post_without_the_csrf_token(admin_user: Any, gpu_node: Node) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    start = compute_now() + timedelta(hours=1)
    response = client.post(
        reverse(PLAN_URL), {**fields([gpu_node], start, start + timedelta(hours=1)), "confirm": "1"}
    )
    assert response.status_code == 403
    assert not MaintenanceWindow.objects.exists()
