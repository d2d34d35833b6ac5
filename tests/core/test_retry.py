"""A node operation that PostgreSQL picks as a deadlock's victim runs again, and then succeeds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.db.models import QuerySet
from rest_framework.test import APIClient

from inventory.models import Node, Pool
from inventory.services.nodes import node_uncordon
from tests.support.api import post_json
from tests.support.placement import make_node


class Deadlock(Exception):
    sqlstate = "40P01"


@pytest.mark.django_db(transaction=True)
def test_an_uncordon_that_lost_a_deadlock_runs_again_and_uncordons(
    owned_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(owned_pool)
    Node.objects.filter(pk=node.pk).update(cordoned=True, cordon_reason="xid 79")
    update = QuerySet.update
    lost: list[int] = []

    def first_loses(self: QuerySet[Any], **kwargs: Any) -> int:
        if self.model is Node and not lost:
            lost.append(1)
            raise OperationalError("deadlock detected") from Deadlock()
        return update(self, **kwargs)

    monkeypatch.setattr(QuerySet, "update", first_loses)
    node_uncordon(node=Node.objects.get(pk=node.pk), actor="test")
    assert lost == [1] and not Node.objects.get(pk=node.pk).cordoned


@pytest.mark.django_db(transaction=True)
def test_another_database_error_is_not_run_again(owned_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    node = make_node(owned_pool)
    Node.objects.filter(pk=node.pk).update(cordoned=True, cordon_reason="xid 79")
    calls: list[int] = []

    def fails(self: QuerySet[Any], **kwargs: Any) -> int:
        calls.append(1)
        raise OperationalError("server closed the connection")

    monkeypatch.setattr(QuerySet, "update", fails)
    with pytest.raises(OperationalError):
        node_uncordon(node=Node.objects.get(pk=node.pk), actor="test")
    assert calls == [1]


class _Lost(Exception):
    sqlstate = "40P01"


@pytest.mark.django_db(transaction=True)
def test_an_uncordon_over_the_api_that_lost_a_deadlock_runs_again_and_uncordons(
    owned_pool: Pool, operator_client: APIClient
) -> None:
    # Through `operations.services`, whose transaction holds the inventory's: the retry is its.
    node = make_node(owned_pool)
    Node.objects.filter(pk=node.pk).update(cordoned=True, cordon_reason="xid 79")
    lost: list[str] = []

    def first_loses(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith('UPDATE "inventory_node" SET "cordoned"') and not lost:
            lost.append(sql)
            raise OperationalError("deadlock detected") from _Lost()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(first_loses):
        status, body = post_json(operator_client, "nodes/uncordon", {"nodeId": node.pk})
    assert len(lost) == 1
    assert status == 200, body
    assert not Node.objects.get(pk=node.pk).cordoned
