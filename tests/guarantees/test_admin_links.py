"""Every row of every admin list opens its page, reached as an operator reaches it: by clicking.

The changelists quote primary keys in their links (`node_01…` becomes
`node_5F01…`); a custom view that looks the raw string up answers 404 while a
test that builds the URL with `reverse()` passes. So these tests never build a
change URL: they read the links off the pages and follow them.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from core.services import audit_record, token_issue
from fleets.load import fleet_load
from inventory.models import Pool
from reservations.rollups.recount import rollup_rebuild_all
from reservations.services import reservation_create
from tests.support.admin import links_of
from tests.support.paths import ROOT
from tests.support.placement import gpu_request

# How many rows of each list are followed: enough to meet every kind of row.
ROWS_PER_LIST = 5


@pytest.fixture
def fleet_with_history(db: object) -> None:
    """The demo fleet with rollups, a reservation, a token and an audit trail: a row in every list."""
    fleet_load(data=json.loads((ROOT / "fleets" / "demo.json").read_text()))
    rollup_rebuild_all()
    pool = Pool.objects.filter(sharing="exclusive", archived_at__isnull=True).order_by("name").first()
    assert pool is not None
    reservation_create(request=gpu_request(pool, 1), actor="t")
    token_issue(tenant_id=pool.owner_id, role="member", name="links")
    node = pool.nodes.first()
    assert node is not None
    audit_record(actor="t", action="node.cordon", subject_type="node", subject_id=node.pk)


def changelists() -> list[str]:
    return [
        f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist" for model in admin.site._registry
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("changelist", changelists())
def test_every_row_of_the_list_opens_its_page(
    operator: Client, fleet_with_history: None, changelist: str
) -> None:
    page = operator.get(reverse(changelist))
    assert page.status_code == 200
    links = links_of(page.content.decode())[:ROWS_PER_LIST]
    for link in links:
        response = operator.get(link)
        assert response.status_code == 200, f"{link} from {changelist}: {response.status_code}"


@pytest.mark.django_db
def test_the_node_and_pool_lists_have_rows_to_click(operator: Client, fleet_with_history: None) -> None:
    # The lists with custom consoles must not pass the test above by being empty.
    for changelist in ("admin:inventory_node_changelist", "admin:inventory_pool_changelist"):
        links = links_of(operator.get(reverse(changelist)).content.decode())
        assert links, changelist
        assert all("_5F" in link for link in links if "/change/" in link), links


@pytest.mark.django_db
def test_the_links_on_a_node_page_open_too(operator: Client, fleet_with_history: None) -> None:
    """From the node list to a node, then every console link on it (pool, reservations, health)."""
    node_links = links_of(operator.get(reverse("admin:inventory_node_changelist")).content.decode())
    node_page = operator.get(node_links[0]).content.decode()

    class _AllLinks(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.links: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            href = dict(attrs).get("href") or ""
            console = href.startswith(("/admin/inventory/", "/admin/reservations/reservation/"))
            if tag == "a" and console:
                self.links.append(href)

    parser = _AllLinks()
    parser.feed(node_page)
    assert parser.links
    for link in parser.links:
        assert operator.get(link).status_code == 200, link


@pytest.mark.django_db
def test_the_node_and_pool_lists_show_their_ids_to_copy(operator: Client, fleet_with_history: None) -> None:
    from inventory.models import Node

    nodes = operator.get(reverse("admin:inventory_node_changelist")).content.decode()
    first = Node.objects.order_by("hostname").first()
    assert first is not None
    assert f'<code style="user-select: all; white-space: nowrap">{first.pk}</code>' in nodes
    pools = operator.get(reverse("admin:inventory_pool_changelist")).content.decode()
    assert all(pool.pk in pools for pool in Pool.objects.all())
