"""`capacity/preview` never offers an atom that is not bookable: a MIG-partitioned GPU's parent.

In an exclusive pool a node may still hold a GPU that was partitioned (its MIG
instances are the atoms; the GPU row itself is `bookable = false`). The placer
must count and offer only bookable atoms, or preview would answer "fits" on the
parent where create, whose locks check `bookable`, refuses.
"""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from inventory.models import Pool
from tests.support.api import post_json
from tests.support.factories import partitioned_gpu
from tests.support.placement import make_node

MIG_PARTS = {"gi1/ci0": {"migProfile": "3g.40gb"}, "gi2/ci0": {"migProfile": "3g.40gb"}}


def _body(pool: Pool, count: int, key: str) -> dict[str, Any]:
    return {
        "tenantId": pool.owner_id,
        "poolId": pool.pk,
        "devices": [{"class": "gpu", "count": count}],
        "duration": "1h",
        "idempotencyKey": key,
    }


def _node_with_a_partitioned_gpu(pool: Pool, whole: int) -> str:
    node = make_node(pool, gpus=whole)
    parent, _ = partitioned_gpu(node, f"GPU-{node.hostname}-mig", "gpu.mig", MIG_PARTS)
    return parent.uid


def test_preview_offers_only_the_whole_gpus_never_a_partitioned_parent(
    owned_pool: Pool, owner_client: APIClient
) -> None:
    parent = _node_with_a_partitioned_gpu(owned_pool, whole=2)
    status, answer = post_json(owner_client, "capacity/preview", _body(owned_pool, 2, "b-1"))
    assert status == 200, answer
    assert answer["fits"] is True, answer
    offered = {atom for candidate in answer["candidates"] for atom in candidate["atoms"]}
    assert parent not in offered
    assert len(offered) == 2


def test_preview_and_create_agree_when_only_the_parent_would_make_it_fit(
    owned_pool: Pool, owner_client: APIClient
) -> None:
    _node_with_a_partitioned_gpu(owned_pool, whole=1)
    status, answer = post_json(owner_client, "capacity/preview", _body(owned_pool, 2, "b-2"))
    assert status == 200, answer
    assert answer["fits"] is False, answer
    assert answer["candidates"] == []
    status, refused = post_json(owner_client, "reservations/create", _body(owned_pool, 2, "b-2"))
    assert status == 409, refused
    assert refused["error"]["code"] == "NO_CAPACITY"
