"""The process's memory of signed-in tokens (`core.auth_cache`): no statement within the second, and
revocation still immediate when another replica revokes (its `NOTIFY auth_changed`).

"Another replica" is a connection of its own that commits a change this process's ORM never sees
(no signal), so only the notification can make this process forget. The memory's lifetime is
raised to a minute, so the revocation can only come from the notification, not from expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import override_settings

from core.auth_cache import MEMORY
from core.models import ApiToken
from core.services import token_issue
from inventory.models import Pool
from tests.support.api import bearer_client, post

pytestmark = pytest.mark.django_db(transaction=True)

# Well inside the minute the memory keeps a token for in these tests.
SEEN_WITHIN_SECONDS = 3.0


@contextmanager
def another_replica() -> Iterator[psycopg.Connection[Any]]:
    params = dict(connection.get_connection_params())
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        yield conn


def summary_status(secret: str) -> int:
    return int(post(bearer_client(secret), "capacity/summary", {"tenantId": "acme"}).status_code)


def eventually(condition: Callable[[], bool], seconds: float = SEEN_WITHIN_SECONDS) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def remembered(secret: str) -> bool:
    from core.authentication import token_digest

    return MEMORY.get(token_digest(secret)) is not None


@pytest.fixture
def secret(owned_pool: Pool) -> Iterator[str]:
    with override_settings(AUTH_CACHE_SECONDS=60.0):
        _, plaintext = token_issue(tenant_id="acme", role="member", name="remembered")
        # The listener connects on first use; until it listens, nothing is remembered.
        assert eventually(lambda: summary_status(plaintext) == 200 and remembered(plaintext))
        yield plaintext


def test_a_token_revoked_by_another_replica_is_refused_by_the_next_request(secret: str) -> None:
    with another_replica() as conn:
        conn.execute(
            "UPDATE core_apitoken SET revoked_at = now() WHERE digest = encode(sha256(%s), 'hex')",
            [secret.encode()],
        )
    assert eventually(lambda: summary_status(secret) == 401)


def test_a_role_taken_away_by_another_replica_is_seen_by_the_next_request(secret: str) -> None:
    token = ApiToken.objects.get(name="remembered")
    with another_replica() as conn:
        conn.execute("DELETE FROM core_rolebinding WHERE principal_id = %s", [token.principal_id])
    assert eventually(lambda: summary_status(secret) == 403)


def test_a_remembered_token_costs_no_statement_and_a_use_of_the_last_used_time_is_not_repeated(
    secret: str,
) -> None:
    sent: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        assert summary_status(secret) == 200
    assert not any("core_apitoken" in sql for sql in sent)


def test_a_token_that_expires_within_the_memorys_lifetime_is_read_every_time(secret: str) -> None:
    _, plaintext = token_issue(tenant_id="acme", role="member", name="short", expires_in_seconds=30)
    # Issuing forgets every token (its rows were saved, and its notification, which can come a
    # moment after the next request, forgets again); the long-lived one is remembered again ...
    assert summary_status(plaintext) == 200 and summary_status(plaintext) == 200
    assert eventually(lambda: summary_status(secret) == 200 and remembered(secret))
    # ... the short-lived one never is.
    assert summary_status(plaintext) == 200 and not remembered(plaintext)
