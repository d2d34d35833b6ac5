"""The admin and the deployment: staff login and CSRF, no admin session on the bearer API, and
`manage.py check --deploy` clean with production settings.

(The bearer API's own isolation, every method x pool x token: `test_isolation.py`.)
"""

from __future__ import annotations

import os
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inventory.models import Node
from tests.support.commands import run_python
from tests.support.factories import NodeFactory

CALLER = "acme"


@pytest.mark.django_db
def test_the_admin_needs_a_staff_login() -> None:
    client = Client()
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    User.objects.create_user(username="plain", password="a-long-password-1")
    assert client.login(username="plain", password="a-long-password-1")
    response = client.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_admin_posts_need_a_csrf_token() -> None:
    node = NodeFactory()
    User.objects.create_superuser(username="root", password="a-long-password-1", email="r@example.com")
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="root", password="a-long-password-1")
    response = client.post(
        "/admin/inventory/node/", {"action": "delete_selected", "_selected_action": [node.pk]}
    )
    assert response.status_code == 403
    assert Node.objects.filter(pk=node.pk).exists()
    # The login form itself is protected too.
    anonymous = Client(enforce_csrf_checks=True)
    assert anonymous.post("/admin/login/", {"username": "root", "password": "x"}).status_code == 403


@pytest.mark.django_db
def test_the_bearer_api_does_not_accept_an_admin_session() -> None:
    User.objects.create_superuser(username="root", password="a-long-password-1", email="r@example.com")
    client = Client()
    assert client.login(username="root", password="a-long-password-1")
    response = client.post(
        "/api/compute/capacity/summary", {"tenantId": CALLER}, content_type="application/json"
    )
    assert response.status_code == 401


def test_check_deploy_is_clean_with_production_settings() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DEBUG", "DJANGO_SETTINGS_MODULE")},
        "DEBUG": "0",
        "SECRET_KEY": uuid.uuid4().hex + uuid.uuid4().hex,
        "ALLOWED_HOSTS": "capacity.example.com",
        "SECURE_SSL_REDIRECT": "1",
        "SECURE_HSTS_SECONDS": "31536000",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
        "SECURE_HSTS_PRELOAD": "1",
    }
    result = run_python("manage.py", "check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
