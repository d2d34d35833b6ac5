"""A headless Chromium from the distribution, driven by Selenium: the `browser` fixture's browser.

The browser and its driver come from the system packages (`chromium`,
`chromium-driver`); nothing is downloaded at test time.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMEDRIVER = "/usr/bin/chromedriver"
# How long a lookup waits for its element to appear (what a page's script adds after it loads).
IMPLICIT_WAIT_SECONDS = 5

CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1400,1800",
)


def headless_chromium() -> Iterator[WebDriver]:
    """The driver for as long as the generator runs; quit when it is closed."""
    missing = [
        path for path in (CHROMEDRIVER, shutil.which("chromium")) if not path or not Path(path).exists()
    ]
    if missing:
        # CI sets REQUIRE_BROWSER=1 (`.ci/run` installs the packages), so there the
        # browser tests can never silently not run; elsewhere they are skipped, saying why.
        message = "needs Chromium and its driver: apt-get install chromium chromium-driver"
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(f"REQUIRE_BROWSER=1 but the browser is missing; {message}")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    binary = shutil.which("chromium")
    if binary:
        options.binary_location = binary
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(IMPLICIT_WAIT_SECONDS)
    try:
        yield driver
    finally:
        driver.quit()


def absent(driver: WebDriver, by: str, value: str) -> bool:
    """Whether the loaded page has no such element, answered at once.

    `find_elements` waits the whole implicit wait for an element that is not
    there, so every absence it confirms costs 5 s. Call this once the page is
    known to be whole (after `get`, a followed link, or a present element): the
    admin's pages and charts are rendered by the server, so what is missing
    then does not come later.
    """
    driver.implicitly_wait(0)
    try:
        return not driver.find_elements(by, value)
    finally:
        driver.implicitly_wait(IMPLICIT_WAIT_SECONDS)
