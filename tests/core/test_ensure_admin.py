"""`ensure_admin`: the login `make run` prints is created once and printed the same every time."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from django.contrib.auth import authenticate

from tests.support.commands import run_command


@pytest.mark.django_db
def test_it_creates_the_admin_once_and_prints_the_same_login_again(settings, tmp_path: Path) -> None:
    settings.BASE_DIR = tmp_path
    first = run_command("ensure_admin", url="http://127.0.0.1:8123/admin/")
    password = first.rsplit("password: ", 1)[1].strip()

    assert first.startswith("Admin: http://127.0.0.1:8123/admin/  user: admin")
    assert authenticate(username="admin", password=password) is not None
    assert (tmp_path / ".admin-login").read_text().strip() == password
    assert stat.S_IMODE((tmp_path / ".admin-login").stat().st_mode) == 0o600
    assert run_command("ensure_admin", url="http://127.0.0.1:8123/admin/") == first
