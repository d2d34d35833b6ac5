"""A taint key is matched whole: `"evil\\n"` is no key (Python's `$` also matches before a final newline)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.errors import InvalidInput
from inventory.models import Node, Taint
from inventory.services import nodes as operations
from tests.support.api import invalid_fields, post_json

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("key", ["evil\n", "\nevil", "evil\n\n", "ev il"])
def test_a_taint_key_with_a_newline_is_refused_by_the_service(gpu_node: Node, key: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        operations.node_taint(node=gpu_node, key=key, value="", effect="NoSchedule", reason="", actor="t")
    assert caught.value.details[0]["field"] == "key"
    assert not Taint.objects.filter(node=gpu_node).exists()


def test_a_taint_key_with_a_trailing_newline_is_invalid_input_through_the_api(
    operator_client: APIClient, gpu_node: Node
) -> None:
    body = {"nodeId": gpu_node.pk, "key": "evil\n", "effect": "NoSchedule"}
    assert invalid_fields(*post_json(operator_client, "nodes/taint", body)) == {"key"}
    assert not Taint.objects.filter(node=gpu_node).exists()
    body["key"] = "evil"
    status, _ = post_json(operator_client, "nodes/taint", body)
    assert status == 200 and Taint.objects.filter(node=gpu_node, key="evil").exists()
