"""Planning maintenance in a real browser: select nodes in the list, see the impact, confirm, see the window.

Headless Chromium from the distribution, driven by Selenium (`tests.support.browser`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from core.clock import compute_now
from inventory.models import Pool
from reservations.models import MaintenanceWindow
from tests.operations.test_admin_browser import follow, login, screenshot
from tests.support.api import post_json, reservation_body
from tests.support.placement import make_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_operator_plans_maintenance_from_the_node_list_and_sees_it_on_the_gantt_chart(
    browser: WebDriver, live_server: Any, owner_client: APIClient, owned_pool: Pool
) -> None:
    first, second = make_node(owned_pool, hostname="gpu-m-001"), make_node(owned_pool, hostname="gpu-m-002")
    start = compute_now().replace(second=0, microsecond=0) + timedelta(hours=1)
    # Eight GPUs on each node inside the window: with both nodes down they can go nowhere.
    created = []
    for key in ("in-window-1", "in-window-2"):
        at = int((start + timedelta(hours=1)).timestamp() * 1000)
        status, answer = post_json(
            owner_client, "reservations/create", reservation_body(owned_pool, "acme", key, gpus=8, start=at)
        )
        assert status == 201, answer
        created.append(answer["id"])

    User.objects.create_superuser("oncall", "oncall@example.com", "pw-oncall-1")
    login(browser, live_server, "oncall", "pw-oncall-1")
    follow(browser, By.CSS_SELECTOR, "a[href$='/admin/inventory/node/']")
    for node in (first, second):
        browser.find_element(By.CSS_SELECTOR, f"input.action-select[value='{node.pk}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_visible_text(
        "Plan maintenance for the selected nodes…"
    )
    follow(browser, By.CSS_SELECTOR, "button[name=index]")

    browser.find_element(By.NAME, "starts_at").send_keys(start.strftime("%Y-%m-%d %H:%M"))
    browser.find_element(By.NAME, "ends_at").send_keys(
        (start + timedelta(hours=4)).strftime("%Y-%m-%d %H:%M")
    )
    browser.find_element(By.NAME, "reason").send_keys("firmware")
    follow(browser, By.ID, "maintenance-plan")

    impact = browser.find_element(By.ID, "maintenance-impact").text
    assert all(reservation_id in impact for reservation_id in created) and "2 cannot move" in impact
    assert "acme" in browser.find_element(By.ID, "impact-tenants").text
    assert not MaintenanceWindow.objects.exists()
    screenshot(browser, "maintenance-impact")
    follow(browser, By.ID, "maintenance-confirm")

    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    window = MaintenanceWindow.objects.get()
    assert f"Scheduled maintenance window 'firmware' on {first.pk}, {second.pk} from " in message
    assert window.pk in message and "2 at risk" in message

    follow(browser, By.LINK_TEXT, first.hostname)
    gantt = browser.find_element(By.ID, "node-gantt")
    (bar,) = gantt.find_elements(By.CSS_SELECTOR, "rect.gantt-window")
    assert window.pk in bar.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    labels = [
        t.get_attribute("textContent")
        for t in gantt.find_elements(By.CSS_SELECTOR, "text.gantt-window-label")
    ]
    assert labels == ["firmware"]
    # The reservation that cannot move keeps its eight atoms, outlined at risk; the window holds
    # each atom's time before and after it.
    assert len(gantt.find_elements(By.CSS_SELECTOR, "rect.gantt-bar.gantt-at-risk")) == 8
    assert len(gantt.find_elements(By.CSS_SELECTOR, "rect.gantt-maintenance")) == 16
    screenshot(browser, "maintenance-gantt")

    # The node's pool, by its link: the timeline shades the window.
    follow(browser, By.CSS_SELECTOR, "#node-state a[href*='/admin/inventory/pool/']")
    (band,) = browser.find_elements(By.CSS_SELECTOR, "#pool-timeline rect.tl-window")
    assert "maintenance window: firmware on 2 nodes" in band.find_element(By.TAG_NAME, "title").get_attribute(
        "textContent"
    )
    screenshot(browser, "maintenance-timeline")
