"""Reads on a replica (core.replica, config.routers) and the pooler's settings (config.database).

With no replica configured nothing changes; with one, only the listed read
methods of a tenant that did not write recently run on it, and a read the
replica fails is answered by the primary. The real replica is exercised by
tests/cluster (`make soak-cluster`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import environ
import pytest
from django.db import OperationalError
from django.test import Client

from config.database import database_config, extra_aliases
from config.routers import ReplicaRouter
from core import replica
from core.ratelimit import writes_count
from inventory.models import Pool


def test_without_a_replica_nothing_is_routed_and_healthz_says_nothing() -> None:
    router = ReplicaRouter()
    assert router.db_for_read(Pool) is None
    assert router.db_for_write(Pool) is None
    assert router.allow_migrate("default", "inventory") is True
    assert router.allow_migrate("replica", "inventory") is False
    assert replica.replica_state() is None
    assert replica.replica_health() is None
    assert not replica.replica_read_allowed(method="capacity/summary", tenant_id="acme")


@pytest.mark.django_db
def test_healthz_has_no_replica_part_without_a_replica() -> None:
    body = Client().get("/healthz").json()
    assert "replica" not in body


@pytest.mark.django_db
def test_a_tenant_that_wrote_is_marked_for_read_your_writes() -> None:
    writes_count(token_id="tok_reader", tenant_id="acme")
    assert replica.tenant_wrote_recently("acme")
    assert not replica.tenant_wrote_recently("beta")


def test_lsn_positions_compare_as_integers() -> None:
    assert replica.lsn_int("0/16B3748") == 0x16B3748
    assert replica.lsn_int("1/0") > replica.lsn_int("0/FFFFFFFF")


def test_the_pooler_and_the_extra_aliases_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:6432/postgres")
    monkeypatch.setenv("DATABASE_POOLER", "transaction")
    monkeypatch.setenv("DATABASE_REPLICA_URL", "postgres://postgres@127.0.0.1:5433/postgres")
    monkeypatch.setenv("DATABASE_DIRECT_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    monkeypatch.delenv("DATABASE_OFFLINE", raising=False)
    env = environ.Env()
    default = database_config(env, replica.settings.BASE_DIR)
    assert default["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert default["OPTIONS"]["prepare_threshold"] is None
    aliases = extra_aliases(env)
    assert set(aliases) == {"replica", "direct"}
    assert aliases["replica"]["PORT"] == 5433
    assert aliases["replica"]["TEST"] == {"MIRROR": "default"}
    assert aliases["replica"]["OPTIONS"]["connect_timeout"] == 2


def test_without_the_variables_there_is_no_pooler_setting_and_no_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("DATABASE_POOLER", "DATABASE_REPLICA_URL", "DATABASE_DIRECT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    env = environ.Env()
    assert "DISABLE_SERVER_SIDE_CURSORS" not in database_config(env, replica.settings.BASE_DIR)
    assert extra_aliases(env) == {}


class FakeReplica:
    """A configured replica in a given state; records which handler runs went to it."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, *, lag: float | None = 0.0, wrote: bool = False
    ) -> None:
        self.runs: list[bool] = []
        self.on_replica = False
        monkeypatch.setattr(replica, "replica_configured", lambda: True)
        monkeypatch.setattr(replica, "_state", replica.ReplicaState(True, lag, "", 1e18))
        monkeypatch.setattr(replica, "tenant_wrote_recently", lambda tenant_id: wrote)
        monkeypatch.setattr(replica, "_on_replica", self._on_replica)
        monkeypatch.setattr(replica, "_close_replica", lambda: None)

    @contextmanager
    def _on_replica(self) -> Iterator[None]:
        self.on_replica = True
        try:
            yield
        finally:
            self.on_replica = False

    def handler(self, fail_on_replica: bool = False) -> Any:
        def handle(view: Any, request: Any) -> str:
            self.runs.append(self.on_replica)
            if fail_on_replica and self.on_replica:
                raise OperationalError("the replica went away")
            return "answer"

        return replica.replica_aware(handle)


def _request(method: str, tenant: str = "acme") -> Any:
    return SimpleNamespace(path=f"/api/compute/{method}", data={"tenantId": tenant})


def test_a_listed_read_runs_on_a_replica_that_keeps_up(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeReplica(monkeypatch)
    handler = fake.handler()
    for method in (
        "capacity/summary",
        "capacity/byPool",
        "pools/capacity",
        "capacity/timeline",
        "usage/hourly",
    ):
        assert handler(None, _request(method)) == "answer"
    assert fake.runs == [True] * 5


def test_every_other_method_runs_on_the_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeReplica(monkeypatch)
    handler = fake.handler()
    for method in ("capacity/preview", "reservations/get", "reservations/list", "reservations/create"):
        handler(None, _request(method))
    assert fake.runs == [False] * 4


def test_a_tenant_that_wrote_recently_reads_the_primary(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeReplica(monkeypatch, wrote=True)
    fake.handler()(None, _request("capacity/summary"))
    assert fake.runs == [False]


def test_a_replica_past_the_lag_bound_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeReplica(monkeypatch, lag=replica.max_lag_seconds() + 1)
    fake.handler()(None, _request("capacity/summary"))
    assert fake.runs == [False]


def test_a_read_the_replica_fails_is_answered_by_the_primary_and_the_replica_marked_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeReplica(monkeypatch)
    assert fake.handler(fail_on_replica=True)(None, _request("capacity/byPool")) == "answer"
    assert fake.runs == [True, False]
    state = replica._state
    assert state is not None and not state.usable
