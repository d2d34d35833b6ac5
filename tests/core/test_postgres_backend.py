"""The service's backend (`core.postgres`): statements bound on the server and prepared, and a health
check that sends nothing over a healthy idle connection yet still drops one the server closed."""

from __future__ import annotations

import select
from typing import Any

import environ
import pytest
from django.conf import settings
from django.db import connection, connections

from config.database import PREPARE_THRESHOLD, database_config
from tests.support.driver import sent_to_the_server


def test_the_service_binds_on_the_server_and_prepares_unless_pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    monkeypatch.delenv("DATABASE_OFFLINE", raising=False)
    monkeypatch.delenv("DATABASE_POOLER", raising=False)
    direct = database_config(environ.Env(), settings.BASE_DIR)
    assert direct["ENGINE"] == "core.postgres"
    assert direct["OPTIONS"]["server_side_binding"] is True
    assert direct["OPTIONS"]["prepare_threshold"] == PREPARE_THRESHOLD
    # Through a transaction pooler nothing may be prepared, whatever the order the settings are applied in.
    monkeypatch.setenv("DATABASE_POOLER", "transaction")
    pooled = database_config(environ.Env(), settings.BASE_DIR)
    assert pooled["ENGINE"] == "core.postgres"
    assert pooled["OPTIONS"]["server_side_binding"] is False
    assert pooled["OPTIONS"]["prepare_threshold"] is None


@pytest.mark.django_db
def test_a_statement_run_past_the_threshold_is_prepared_on_the_server() -> None:
    if not connection.settings_dict["OPTIONS"].get("prepare_threshold"):
        pytest.fail("the test settings must prepare statements, as the service does")
    for _ in range(PREPARE_THRESHOLD + 1):
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM inventory_pool WHERE id = %s", ["prepared-probe"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("inventory_pool WHERE id = $1" in text for text in prepared), prepared


def _other_connection() -> Any:
    other = connections.create_connection("default")
    other.ensure_connection()
    other.health_check_done = False  # as at the start of a request
    return other


@pytest.mark.django_db(transaction=True)
def test_a_healthy_idle_connection_is_checked_without_a_round_trip() -> None:
    other = _other_connection()
    try:
        with sent_to_the_server() as sent:
            other.close_if_health_check_failed()
        assert sent == []
        assert other.connection is not None
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_closed_is_dropped_before_it_is_used() -> None:
    other = _other_connection()
    try:
        pid = other.connection.info.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        # The server's goodbye reaches the socket.
        poller = select.poll()
        poller.register(other.connection.fileno(), select.POLLIN)
        assert poller.poll(5000)
        other.close_if_health_check_failed()
        assert other.connection is None
        with other.cursor() as cursor:  # and the next statement opens a new one
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != pid
    finally:
        other.close()
