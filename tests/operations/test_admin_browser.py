"""The operator admin in a real browser: headless Chromium from the distribution, driven by Selenium.

The browser and its driver come from the system packages (`chromium`,
`chromium-driver`); nothing is downloaded at test time. Screenshots of the node
and pool pages land in `test-output/screenshots/` for a human to look at.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from inventory.models import Device, Node, Pool
from reservations.models import DeviceBooking
from tests.support.browser import absent
from tests.support.factories import (
    AllocationFactory,
    DeviceFactory,
    NodeFactory,
    NodeResourceFactory,
    PoolFactory,
    ReservationFactory,
    TaintFactory,
    TenantFactory,
    partitioned_gpu,
)
from tests.support.paths import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = ROOT / "test-output" / "screenshots"


@pytest.fixture
def fleet(db: Any) -> tuple[Pool, Node]:
    """A pool with two schedulable eight-GPU hosts, one with a MIG-partitioned GPU."""
    owner = TenantFactory(id="acme", name="Acme Corp")
    pool = PoolFactory(owner=owner, name="h100-east", gpu_model="H100")
    node = NodeFactory(pool=pool, hostname="gpu-a-001")
    for index in range(7):
        DeviceFactory(
            node=node,
            uid=f"GPU-a001-{index}",
            attributes={"gpuModel": "H100", "vramGiB": 80, "numaNode": index // 4},
        )
    instances = {f"gi{g}/ci0": {"migProfile": "3g.40gb", "memoryGiB": 40, "numaNode": 1} for g in (1, 2)}
    partitioned_gpu(node, "GPU-a001-7", "gpu.mig", instances, attributes={"gpuModel": "H100", "numaNode": 1})
    NodeResourceFactory(node=node, resource="vcpu", allocatable=224, allocated=64)
    NodeResourceFactory(node=node, resource="memoryGiB", allocatable=2016, allocated=512)
    TaintFactory(
        node=node, key="gpu.example.com/fan", value="slow", effect="PreferNoSchedule", reason="fan 3 at 40%"
    )
    other = NodeFactory(pool=pool, hostname="gpu-a-002")
    DeviceFactory.create_batch(8, node=other)
    # Two GPUs booked now for two hours and one from tomorrow, so the pages show bookings.
    now = timezone.now()
    running = AllocationFactory(node=node, reservation=ReservationFactory(pool=pool, tenant=owner))
    later = AllocationFactory(
        node=node, reservation=ReservationFactory(pool=pool, tenant=owner, state="scheduled")
    )
    for uid in ("GPU-a001-0", "GPU-a001-1"):
        DeviceBooking.objects.create(
            device=Device.objects.get(uid=uid),
            allocation=running,
            during=DateTimeTZRange(now - timedelta(minutes=30), now + timedelta(hours=2)),
        )
    DeviceBooking.objects.create(
        device=Device.objects.get(uid="GPU-a001-0"),
        allocation=later,
        during=DateTimeTZRange(now + timedelta(hours=6), now + timedelta(hours=12)),
    )
    return pool, node


def follow(browser: WebDriver, by: str, value: str) -> None:
    """Click a link or button and wait until the page it leaves is gone.

    Without the wait, the next lookup can find an element of the old page (one
    the new page also has) and go stale mid-assertion when the new page lands.
    """
    page = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(by, value).click()
    WebDriverWait(browser, 10).until(lambda _: _left(page))


def _left(page: WebElement) -> bool:
    """`staleness_of`, for every way ChromeDriver says the element's document is gone.

    Besides `StaleElementReferenceException`, some ChromeDriver builds answer an
    element of a document being replaced with "Node with given id does not belong to
    the document" (an unknown error).
    """
    try:
        page.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def login(browser: WebDriver, live_server: Any, username: str, password: str) -> None:
    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys(password)
    follow(browser, By.CSS_SELECTOR, "input[type=submit]")
    assert browser.find_element(By.ID, "user-tools")


def screenshot(browser: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # A full-height capture: the node page is longer than one screen.
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, max(900, int(height) + 40))
    browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    browser.set_window_size(1400, 1800)


def gpu_row_maintenance_label(browser: WebDriver, live_server: Any, pool: Pool) -> str:
    browser.get(f"{live_server.url}/admin/inventory/pool/{pool.pk}/change/")
    return browser.find_element(By.CSS_SELECTOR, "#rollup-rows tr.rollup-gpu").text


def test_operator_cordons_a_node_and_sees_the_pool_bar_change_at_once(
    browser: WebDriver, live_server: Any, fleet: tuple[Pool, Node]
) -> None:
    pool, node = fleet
    User.objects.create_superuser("oncall", "oncall@example.com", "pw-oncall-1")
    login(browser, live_server, "oncall", "pw-oncall-1")

    # Rebuild first: the bar shows 17 allocatable GPU atoms and nothing in maintenance.
    browser.get(f"{live_server.url}/admin/inventory/pool/{pool.pk}/change/")
    follow(browser, By.ID, "rebuild-now")
    assert "Rebuilt the capacity rollup" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert absent(browser, By.CSS_SELECTOR, "#rollup-rows tr.rollup-gpu rect.seg-maintenance")
    assert browser.find_elements(By.CSS_SELECTOR, "#rollup-rows tr.rollup-gpu rect.seg-available")

    # The node page: every predicate term passes, then cordon with a reason.
    browser.get(f"{live_server.url}/admin/inventory/node/{node.pk}/change/")
    assert "schedulable" in browser.find_element(By.CSS_SELECTOR, "#node-state .bucket-badge").text
    assert absent(browser, By.CSS_SELECTOR, "#node-state .term.fail")
    assert "GPU-a001-7/gi2/ci0" in browser.find_element(By.ID, "node-atoms").text
    follow(browser, By.ID, "op-cordon")
    browser.find_element(By.NAME, "reason").send_keys("xid 79 on GPU 3, RMA opened")
    screenshot(browser, "cordon-reason")
    follow(browser, By.ID, "operate-submit")

    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "Cordoned 1 node; 9 GPU atoms left allocatable [7 gpu, 2 gpu.mig]" in message
    assert "maintenance" in browser.find_element(By.CSS_SELECTOR, "#node-state .bucket-badge").text
    failing = browser.find_elements(By.CSS_SELECTOR, "#node-state .term.fail")
    assert [" ".join(t.text.split()) for t in failing] == [
        "✖ FAIL not cordoned — xid 79 on GPU 3, RMA opened"
    ]
    assert "node.cordon" in browser.find_element(By.ID, "node-audit").text
    assert browser.find_elements(By.ID, "op-uncordon") and absent(browser, By.ID, "op-cordon")
    screenshot(browser, "node-page")

    # The cordon moved the pool's numbers at once: the gpu bar has a maintenance
    # segment of 7 whole GPUs (the two MIG instances are counted in the gpu.mig row)
    # before any rebuild, and a rebuild agrees.
    browser.get(f"{live_server.url}/admin/inventory/pool/{pool.pk}/change/")
    maintenance = browser.find_element(By.CSS_SELECTOR, "#rollup-rows tr.rollup-gpu rect.seg-maintenance")
    assert maintenance.find_element(By.TAG_NAME, "title").get_attribute("textContent") == "maintenance: 7"
    follow(browser, By.ID, "rebuild-now")
    assert "Rebuilt the capacity rollup" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    maintenance = browser.find_element(By.CSS_SELECTOR, "#rollup-rows tr.rollup-gpu rect.seg-maintenance")
    assert maintenance.find_element(By.TAG_NAME, "title").get_attribute("textContent") == "maintenance: 7"
    assert browser.find_element(By.ID, "pool-timeline").find_elements(By.CSS_SELECTOR, "svg.timeline-chart")
    screenshot(browser, "pool-page")

    browser.get(f"{live_server.url}/admin/inventory/pool/")
    assert browser.find_elements(By.CSS_SELECTOR, "#result_list svg.capacity-bar rect.seg-maintenance")
    screenshot(browser, "pool-list")
    browser.get(f"{live_server.url}/admin/inventory/node/")
    screenshot(browser, "node-list")


def test_staff_without_the_permission_sees_no_action(
    browser: WebDriver, live_server: Any, fleet: tuple[Pool, Node]
) -> None:
    pool, node = fleet
    user = User.objects.create_user("looker", password="pw-looker-1", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_node", "view_pool"]))
    login(browser, live_server, "looker", "pw-looker-1")

    browser.get(f"{live_server.url}/admin/inventory/node/{node.pk}/change/")
    assert browser.find_element(By.ID, "no-operate").is_displayed()
    assert absent(browser, By.CSS_SELECTOR, "#node-actions a.button")
    assert absent(browser, By.PARTIAL_LINK_TEXT, "set unhealthy")

    browser.get(f"{live_server.url}/admin/inventory/node/")
    assert node.hostname in browser.find_element(By.ID, "result_list").text
    assert absent(browser, By.CSS_SELECTOR, "select[name=action]")

    browser.get(f"{live_server.url}/admin/inventory/pool/{pool.pk}/change/")
    assert "Nodes of this pool" in browser.find_element(By.ID, "pool-capacity").text
    assert absent(browser, By.ID, "rebuild-now")
