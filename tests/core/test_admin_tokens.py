"""The token admin: a secret shown once at issue, revoking, and a role that needs a tenant."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from core.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db


def test_issue_token_shows_the_secret_once_and_revoke_stops_it(operator: Client) -> None:
    response = operator.post(
        reverse("admin:core_apitoken_issue"),
        {"role": "operator", "tenant": "", "name": "ci", "expires_in_days": ""},
    )
    assert response.status_code == 200
    secret = response.context["secret"]
    token = ApiToken.objects.get(name="ci")
    assert secret.startswith(token.prefix)
    assert secret in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    assert secret not in operator.get(reverse("admin:core_apitoken_change", args=[token.pk])).content.decode()

    operator.post(
        reverse("admin:core_apitoken_changelist"),
        {"action": "revoke_tokens", "_selected_action": [token.pk], "apply": "1"},
    )
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(
        subject_type="token", subject_id=token.pk, action="token.revoke"
    ).exists()


def test_token_issue_for_a_tenant_role_without_a_tenant_shows_the_error(operator: Client) -> None:
    response = operator.post(reverse("admin:core_apitoken_issue"), {"role": "viewer", "tenant": ""})
    assert response.status_code == 200
    assert "needs a tenant" in response.content.decode()
    assert not ApiToken.objects.exists()
