"""Issuing node-agent tokens scoped to a pool or a node: the service, `issue_token` and the admin page.

What a scope allows at the API is tested with the views (tests/operations/test_node_agent_scope.py).
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse

from core.authentication import token_digest
from core.decisions import INVENTORY_REPORT, NodeScope, decide_node_scope, has_permission
from core.errors import InvalidInput, PermissionDenied
from core.models import ApiToken, AuditEvent, Principal, RoleBinding
from core.services import token_issue
from tests.support.commands import child_env_on_this_database, run_command, run_python

POOL = "pool_01k00000000000000000000aaa"
NODE = "node_01k00000000000000000000bbb"


def issue(*args: str) -> tuple[str, str]:
    err = io.StringIO()
    return run_command(
        "issue_token", "--platform", "--role", "node-agent", *args, stderr=err
    ).strip(), err.getvalue()


def scope_of(secret: str) -> list[tuple[str, str | None, str, str]]:
    token = ApiToken.objects.get(digest=token_digest(secret))
    bindings = RoleBinding.objects.filter(principal=token.principal)
    return list(bindings.values_list("role", "tenant_id", "scope_pool_id", "scope_node_id"))


@pytest.mark.django_db
def test_issue_token_binds_a_node_agent_to_a_pool() -> None:
    secret, details = issue("--pool", POOL, "--name", "rack-12")
    assert scope_of(secret) == [("node-agent", None, POOL, "")]
    assert f"pool {POOL}" in details and secret not in details
    event = AuditEvent.objects.get(action="token.issue")
    assert event.data["scopePoolId"] == POOL and event.data["scopeNodeId"] is None


@pytest.mark.django_db
def test_issue_token_binds_a_node_agent_to_a_node() -> None:
    secret, details = issue("--node", NODE)
    assert scope_of(secret) == [("node-agent", None, "", NODE)]
    assert f"node {NODE}" in details


@pytest.mark.django_db
def test_issue_token_gives_every_node_only_when_asked_to() -> None:
    secret, details = issue("--all-nodes")
    assert scope_of(secret) == [("node-agent", None, "", "")]
    assert "every node" in details
    with pytest.raises(CommandError, match="--pool, --node or --all-nodes"):
        issue()
    assert ApiToken.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ("--platform", "--role", "operator", "--pool", POOL),
        ("--platform", "--role", "operator", "--all-nodes"),
        ("--tenant", "acme", "--role", "viewer", "--node", NODE),
        ("--platform", "--role", "node-agent", "--pool", POOL, "--node", NODE),
        ("--platform", "--role", "node-agent", "--pool", POOL, "--all-nodes"),
        ("--platform", "--role", "node-agent", "--pool", "h100-east"),
        ("--platform", "--role", "node-agent", "--pool", NODE),
        ("--platform", "--role", "node-agent", "--node", POOL),
        ("--platform", "--role", "node-agent", "--node", NODE + "\n"),
    ],
)
def test_issue_token_refuses_a_scope_that_means_nothing(args: tuple[str, ...]) -> None:
    from tests.support.factories import TenantFactory

    TenantFactory.create(id="acme")
    with pytest.raises(CommandError):
        run_command("issue_token", *args, stderr=io.StringIO())
    assert not ApiToken.objects.exists()
    assert not Principal.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_issue_token_as_a_subprocess_prints_a_pool_scoped_token() -> None:
    env = child_env_on_this_database()
    args = ("manage.py", "issue_token", "--platform", "--role", "node-agent", "--pool", POOL)
    result = run_python(*args, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert scope_of(result.stdout.strip()) == [("node-agent", None, POOL, "")]
    refused = run_python(
        "manage.py", "issue_token", "--platform", "--role", "node-agent", env=env, timeout=60
    )
    assert refused.returncode != 0 and refused.stdout == ""
    assert "--all-nodes" in refused.stderr


@pytest.mark.django_db
def test_the_service_refuses_scopes_on_other_roles_and_two_scopes_at_once() -> None:
    with pytest.raises(InvalidInput):
        token_issue(tenant_id=None, role="operator", scope_pool_id=POOL)
    with pytest.raises(InvalidInput):
        token_issue(tenant_id=None, role="node-agent", scope_pool_id=POOL, scope_node_id=NODE)
    with pytest.raises(InvalidInput):
        token_issue(tenant_id=None, role="node-agent", scope_node_id="node_short")
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_the_database_refuses_a_scope_on_anything_but_a_platform_node_agent() -> None:
    principal = Principal.objects.create(name="hand-made")
    for fields in (
        {"role": "operator", "scope_pool_id": POOL},
        {"role": "node-agent", "scope_pool_id": POOL, "scope_node_id": NODE},
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            RoleBinding.objects.create(principal=principal, **fields)


@pytest.mark.django_db
def test_one_principal_may_hold_several_scopes_and_reaches_their_union() -> None:
    token, _ = token_issue(tenant_id=None, role="node-agent", scope_pool_id=POOL)
    other = "pool_01k00000000000000000000ccc"
    token_issue(tenant_id=None, role="node-agent", scope_node_id=NODE, principal=token.principal)
    token_issue(tenant_id=None, role="node-agent", scope_pool_id=other, principal=token.principal)
    token_issue(tenant_id=None, role="node-agent", scope_pool_id=other, principal=token.principal)
    assert RoleBinding.objects.filter(principal=token.principal).count() == 3
    # The principal as read from the database (no bindings attached by authentication).
    principal = Principal.objects.get(pk=token.principal_id)
    scope = decide_node_scope(principal=principal, permissions=(INVENTORY_REPORT,))
    assert scope == NodeScope(everywhere=False, pool_ids=frozenset({POOL, other}), node_ids=frozenset({NODE}))
    assert scope.covers(node_id="node_01k00000000000000000000zzz", pool_id=other)
    assert scope.covers(node_id=NODE, pool_id="pool_01k00000000000000000000zzz")
    assert not scope.covers(
        node_id="node_01k00000000000000000000zzz", pool_id="pool_01k00000000000000000000zzz"
    )


@pytest.mark.django_db
def test_a_scoped_binding_never_counts_as_a_platform_wide_permission() -> None:
    scoped, _ = token_issue(tenant_id=None, role="node-agent", scope_node_id=NODE)
    wide, _ = token_issue(tenant_id=None, role="node-agent")
    assert not has_permission(principal=scoped.principal, permission=INVENTORY_REPORT, tenant_id=None)
    assert has_permission(principal=wide.principal, permission=INVENTORY_REPORT, tenant_id=None)
    assert decide_node_scope(principal=wide.principal, permissions=(INVENTORY_REPORT,)).everywhere
    viewer = Principal.objects.create(name="nobody")
    with pytest.raises(PermissionDenied):
        decide_node_scope(principal=viewer, permissions=(INVENTORY_REPORT,))


# --- the admin's issue page -------------------------------------------------------------------


def admin_issue(operator: Client, **fields: str) -> str:
    form = {"role": "node-agent", "tenant": "", "name": "", "expires_in_days": "", **fields}
    response = operator.post(reverse("admin:core_apitoken_issue"), form)
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_admin_issues_pool_and_node_scoped_agent_tokens(operator: Client) -> None:
    page = admin_issue(operator, name="rack-12", scope_pool=POOL)
    secret = ApiToken.objects.get(name="rack-12")
    assert scope_of_token(secret) == ("", POOL) and "Copy this token now" in page
    assert f"for the nodes of pool {POOL} only" in page
    admin_issue(operator, name="host-7", scope_node=NODE)
    assert scope_of_token(ApiToken.objects.get(name="host-7")) == (NODE, "")
    admin_issue(operator, name="all", all_nodes="on")
    assert scope_of_token(ApiToken.objects.get(name="all")) == ("", "")


def scope_of_token(token: ApiToken) -> tuple[str, str]:
    binding = RoleBinding.objects.get(principal=token.principal)
    return binding.scope_node_id, binding.scope_pool_id


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"scope_pool": POOL, "scope_node": NODE},
        {"scope_pool": POOL, "all_nodes": "on"},
        {"scope_pool": "h100-east"},
        {"role": "operator", "scope_node": NODE},
        {"role": "operator", "all_nodes": "on"},
    ],
)
def test_the_admin_refuses_an_agent_without_one_clear_scope(operator: Client, fields: dict[str, str]) -> None:
    page = admin_issue(operator, **fields)
    assert "errornote" in page or "errorlist" in page
    assert not ApiToken.objects.exists()
