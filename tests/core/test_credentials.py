"""Tokens: only a digest is stored; unknown, revoked and expired tokens are UNAUTHENTICATED; `issue_token`."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError
from rest_framework.test import APIClient

from core.authentication import TOKEN_PREFIX, token_digest
from core.clock import compute_now, set_clock_offset
from core.errors import InvalidInput
from core.models import ApiToken, AuditEvent, RoleBinding, Tenant
from core.services import token_issue, token_revoke
from tests.support.api import bearer_client, post_json
from tests.support.commands import run_command
from tests.support.envelope import error_without_request_id


def summary_as(client: APIClient, tenant_id: str = "acme") -> tuple[int, dict]:
    return post_json(client, "capacity/summary", {"tenantId": tenant_id})


@pytest.mark.django_db
def test_token_issue_stores_only_the_digest_of_the_plaintext(owner_tenant: Tenant) -> None:
    token, secret = token_issue(tenant_id=owner_tenant.id, role="viewer", name="dashboard")

    assert secret.startswith(TOKEN_PREFIX)
    row = ApiToken.objects.get(pk=token.pk)
    assert row.digest == token_digest(secret)
    stored = [str(value) for value in ApiToken.objects.filter(pk=token.pk).values().get().values()]
    assert secret not in stored
    assert all(secret not in str(event.data) for event in AuditEvent.objects.all())
    assert RoleBinding.objects.filter(principal=row.principal, role="viewer", tenant=owner_tenant).exists()


@pytest.mark.django_db
def test_each_issued_token_is_different(owner_tenant: Tenant) -> None:
    secrets = {token_issue(tenant_id=owner_tenant.id, role="viewer")[1] for _ in range(5)}
    assert len(secrets) == 5


@pytest.mark.django_db
def test_an_issued_token_authenticates(owner_tenant: Tenant) -> None:
    _, secret = token_issue(tenant_id=owner_tenant.id, role="viewer")
    status, body = summary_as(bearer_client(secret))
    assert status == 200
    assert body["tenantId"] == "acme"


@pytest.mark.django_db
def test_a_revoked_token_is_unauthenticated(owner_tenant: Tenant) -> None:
    token, secret = token_issue(tenant_id=owner_tenant.id, role="viewer")
    token_revoke(token=token)

    status, body = summary_as(bearer_client(secret))
    assert status == 401
    assert body["error"]["code"] == "UNAUTHENTICATED"
    assert token.revoked_at is not None


@pytest.mark.django_db
def test_revoking_twice_keeps_the_first_revocation(owner_tenant: Tenant) -> None:
    token, _ = token_issue(tenant_id=owner_tenant.id, role="viewer")
    token_revoke(token=token)
    first = token.revoked_at
    token_revoke(token=token)
    assert token.revoked_at == first
    assert AuditEvent.objects.filter(action="token.revoke", subject_id=token.pk).count() == 1


@pytest.mark.django_db
def test_an_expired_token_is_unauthenticated_by_the_database_clock(owner_tenant: Tenant) -> None:
    _, secret = token_issue(tenant_id=owner_tenant.id, role="viewer", expires_in_seconds=3600)
    client = bearer_client(secret)
    assert summary_as(client)[0] == 200

    # Move compute_now() past the expiry for this transaction only.
    set_clock_offset(timedelta(hours=2), local=True)
    status, body = summary_as(client)
    assert status == 401
    assert body["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "header",
    ["Bearer bc_not-a-real-token", "Bearer", "Token bc_abc", "Bearer a b", "bearer bc_abc"],
)
def test_unknown_or_malformed_credentials_are_unauthenticated(owner_tenant: Tenant, header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    status, body = summary_as(client)
    assert status == 401
    assert error_without_request_id(body) == {
        "error": {"code": "UNAUTHENTICATED", "message": "a valid bearer token is required", "details": []}
    }


@pytest.mark.django_db
def test_token_issue_refuses_a_tenant_binding_for_platform_roles(owner_tenant: Tenant) -> None:
    for role in ("operator", "node-agent"):
        with pytest.raises(InvalidInput):
            token_issue(tenant_id=owner_tenant.id, role=role)
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_token_issue_refuses_a_platform_viewer_or_member() -> None:
    for role in ("viewer", "member"):
        with pytest.raises(InvalidInput):
            token_issue(tenant_id=None, role=role)


@pytest.mark.django_db
def test_token_issue_refuses_an_unknown_tenant_or_role() -> None:
    with pytest.raises(InvalidInput):
        token_issue(tenant_id="nobody", role="viewer")
    with pytest.raises(InvalidInput):
        token_issue(tenant_id=None, role="admin")


@pytest.mark.django_db
def test_a_platform_viewer_binding_made_by_hand_grants_no_tenant(owner_tenant: Tenant) -> None:
    token, secret = token_issue(tenant_id=None, role="operator")
    RoleBinding.objects.filter(principal=token.principal).update(role="viewer")
    status, body = summary_as(bearer_client(secret))
    assert status == 403
    assert body["error"]["code"] == "PERMISSION_DENIED"


def run_issue_token(*args: str) -> tuple[str, str]:
    err = io.StringIO()
    return run_command("issue_token", *args, stderr=err).strip(), err.getvalue()


@pytest.mark.django_db
def test_issue_token_command_prints_a_working_token_once(owner_tenant: Tenant) -> None:
    secret, details = run_issue_token("--tenant", "acme", "--role", "viewer", "--name", "grafana")

    assert secret.startswith(TOKEN_PREFIX)
    assert secret not in details
    token = ApiToken.objects.get(digest=token_digest(secret))
    assert token.name == "grafana"
    assert token.expires_at is None
    assert summary_as(bearer_client(secret))[0] == 200


@pytest.mark.django_db
def test_issue_token_command_sets_the_expiry_from_a_duration(owner_tenant: Tenant) -> None:
    secret, _ = run_issue_token("--tenant", "acme", "--role", "member", "--expires", "30d")
    token = ApiToken.objects.get(digest=token_digest(secret))
    assert token.expires_at is not None
    remaining = token.expires_at - compute_now()
    assert timedelta(days=30) - timedelta(minutes=5) < remaining <= timedelta(days=30)


@pytest.mark.django_db
def test_issue_token_command_allows_expiries_beyond_a_year(owner_tenant: Tenant) -> None:
    secret, _ = run_issue_token("--tenant", "acme", "--role", "viewer", "--expires", "730d")
    token = ApiToken.objects.get(digest=token_digest(secret))
    assert token.expires_at is not None
    assert token.expires_at - compute_now() > timedelta(days=700)


@pytest.mark.django_db
def test_issue_token_command_binds_operators_to_the_platform() -> None:
    secret, _ = run_issue_token("--platform", "--role", "operator")
    token = ApiToken.objects.get(digest=token_digest(secret))
    bindings = RoleBinding.objects.filter(principal=token.principal)
    assert list(bindings.values_list("role", "tenant_id")) == [("operator", None)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ("--platform", "--role", "viewer"),
        ("--platform", "--role", "member"),
        ("--tenant", "acme", "--role", "operator"),
        ("--tenant", "acme", "--role", "node-agent"),
        ("--tenant", "nobody", "--role", "viewer"),
        ("--tenant", "acme", "--role", "viewer", "--expires", "soon"),
        ("--tenant", "acme", "--role", "viewer", "--expires", "3650d"),
    ],
)
def test_issue_token_command_refuses_wrong_bindings_and_expiries(
    owner_tenant: Tenant, args: tuple[str, ...]
) -> None:
    with pytest.raises(CommandError):
        run_issue_token(*args)
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_use_is_recorded_at_most_once_a_minute(owner_tenant: Tenant) -> None:
    token, secret = token_issue(tenant_id=owner_tenant.id, role="viewer")
    client = bearer_client(secret)
    assert token.last_used_at is None

    summary_as(client)
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    summary_as(client)
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first

    set_clock_offset(timedelta(minutes=5), local=True)
    summary_as(client)
    later = ApiToken.objects.get(pk=token.pk).last_used_at
    assert later is not None and later > first
