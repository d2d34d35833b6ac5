"""The token issue form refuses what the token row cannot hold: a form error, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from core.models import ApiToken

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "n" * 201}, "name"),
        ({"expires_in_days": "10000000"}, "expires_in_days"),
        ({"expires_in_days": "1831"}, "expires_in_days"),
        ({"expires_in_days": "9" * 400}, "expires_in_days"),
        ({"role": "member", "tenant": "t" * 129}, "tenant"),
        ({"name": "ci\x00"}, "name"),
    ],
)
def test_the_token_issue_form_refuses_what_no_token_can_hold(
    operator: Client, change: dict[str, str], field: str
) -> None:
    data: dict[str, Any] = {"role": "operator", "tenant": "", "name": "ci", "expires_in_days": "", **change}
    response = operator.post(reverse("admin:core_apitoken_issue"), data)
    assert response.status_code == 200
    assert response.context["form"].errors.get(field), response.context["form"].errors
    assert "secret" not in response.context
    assert not ApiToken.objects.exists()


def test_the_longest_name_and_expiry_the_form_allows_issue_a_token(operator: Client) -> None:
    data = {"role": "operator", "tenant": "", "name": "n" * 200, "expires_in_days": "1830"}
    response = operator.post(reverse("admin:core_apitoken_issue"), data)
    assert response.status_code == 200 and response.context["secret"]
    token = ApiToken.objects.get()
    assert token.name == "n" * 200 and token.expires_at is not None
