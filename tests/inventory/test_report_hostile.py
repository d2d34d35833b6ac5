"""Hostile node reports: NUL and lone surrogates, trailing newlines, and VF counts no NIC has.

A report comes in through the API (`inventory/report`, whose parser checks
every string once) or through a fleet file; `report_parse` checks its own
strings too, so a report handed over already parsed is held to the same rule.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.errors import MAX_ERROR_DETAILS, InvalidInput
from inventory.models import Device, Node
from inventory.reports import MAX_VFS_PER_NIC, MAX_VFS_PER_NODE, report_parse
from reservations.nodes.reports import node_report_apply
from tests.support.api import invalid_fields, post_raw, status_and_body
from tests.support.envelope import error_details
from tests.support.factories import NodeFactory
from tests.support.reports import gpu, report

NUL = "\x00"
LONE = "\ud800"


def refused_fields(data: Any) -> dict[str, str]:
    with pytest.raises(InvalidInput) as caught:
        report_parse(data=data)
    return {d["field"]: d["message"] for d in caught.value.details}


def with_gpu(**change: Any) -> dict[str, Any]:
    body = report("gpu-a-001", [gpu(0)])
    body["gpus"][0].update(change)
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(with_gpu(product=f"NVIDIA H100{NUL}"), "gpus[0].product", id="nul-product"),
        pytest.param(with_gpu(product=f"NVIDIA {LONE}"), "gpus[0].product", id="surrogate-product"),
        pytest.param(with_gpu(uuid="GPU-test-1\n"), "gpus[0].uuid", id="newline-uuid"),
        pytest.param(with_gpu(pciBusId="00000000:18:00.0\n"), "gpus[0].pciBusId", id="newline-pci"),
        pytest.param({**report("gpu-a-001\n", [])}, "hostname", id="newline-hostname"),
        pytest.param({**report("gpu-a-001", []), f"x{NUL}": 1}, "x\\u0000", id="nul-key"),
        pytest.param({**report("gpu-a-001", []), LONE: 1}, "\\ud800", id="surrogate-key"),
    ],
)
def test_nul_surrogates_and_trailing_newlines_are_refused_by_the_report_parser(
    body: dict[str, Any], field: str
) -> None:
    fields = refused_fields(body)
    assert field in fields, fields
    # Every field name the error carries can be written as UTF-8.
    json.dumps(fields, ensure_ascii=False).encode("utf-8")


def test_a_gpu_uuid_with_a_trailing_newline_never_becomes_a_second_device() -> None:
    body = report("gpu-a-001", [gpu(0)])
    twin = {**gpu(0), "uuid": gpu(0)["uuid"] + "\n", "pciBusId": "00000000:30:00.0"}
    body["gpus"].append(twin)
    assert "gpus[1].uuid" in refused_fields(body)


def test_a_nic_has_at_most_256_vfs() -> None:
    body = report("gpu-a-001", [])
    body["nics"] = [{"pf": "mlx5_0", "vfs": [f"0000:3b:{d:02x}.{f}" for d in range(33) for f in range(8)]}]
    assert len(body["nics"][0]["vfs"]) == MAX_VFS_PER_NIC + 8
    assert refused_fields(body) == {"nics[0].vfs": f"must have at most {MAX_VFS_PER_NIC} items"}
    body["nics"][0]["vfs"] = body["nics"][0]["vfs"][:MAX_VFS_PER_NIC]
    assert len(report_parse(data=body).nics[0].vfs) == MAX_VFS_PER_NIC


def all_vfs(nics: int, per_nic: int) -> list[dict[str, Any]]:
    """`nics` NICs of `per_nic` VFs each, every VF its own PCI address."""
    return [
        {"pf": f"mlx5_{n}", "vfs": [f"{n:02x}:{i // 8:02x}.{i % 8}" for i in range(per_nic)]}
        for n in range(nics)
    ]


def test_a_node_has_at_most_2048_vfs_in_all() -> None:
    body = report("gpu-a-001", [])
    body["nics"] = all_vfs(9, MAX_VFS_PER_NIC)
    assert 8 * MAX_VFS_PER_NIC == MAX_VFS_PER_NODE
    assert refused_fields(body) == {"nics[8].vfs": f"a node has at most {MAX_VFS_PER_NODE} VFs in all"}
    body["nics"] = all_vfs(8, MAX_VFS_PER_NIC)
    assert sum(len(nic.vfs) for nic in report_parse(data=body).nics) == MAX_VFS_PER_NODE


# --- Through the API --------------------------------------------------------------------------


@pytest.fixture
def reported_node(db: Any) -> Node:
    node = NodeFactory(hostname="gpu-a-001")
    node_report_apply(node=node, report=report(node.hostname, [gpu(0)]), actor="t")
    return node


def send_report(client: APIClient, node: Node, body: dict[str, Any]) -> tuple[int, Any]:
    raw = json.dumps({"nodeId": node.pk, "report": body}, ensure_ascii=True, separators=(",", ":"))
    return status_and_body(post_raw(client, "inventory/report", raw))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"product": f"NVIDIA H100{NUL}"}, "report.gpus[0].product"),
        ({"product": f"NVIDIA {LONE}"}, "report.gpus[0].product"),
        ({"uuid": "GPU-test-1\n"}, "report.gpus[0].uuid"),
        ({f"numa{NUL}Node": 0}, "report.gpus[0].numa\\u0000Node"),
    ],
)
def test_a_hostile_report_through_the_api_is_invalid_input_and_changes_nothing(
    operator_client: APIClient, reported_node: Node, change: dict[str, Any], field: str
) -> None:
    before = sorted(Device.objects.filter(node=reported_node).values_list("uid", flat=True))
    status, body = send_report(operator_client, reported_node, with_gpu(**change))
    assert field in invalid_fields(status, body)
    assert sorted(Device.objects.filter(node=reported_node).values_list("uid", flat=True)) == before


@pytest.mark.django_db
def test_a_report_of_65536_vfs_is_refused_with_a_small_answer(
    operator_client: APIClient, reported_node: Node
) -> None:
    before = Device.objects.filter(node=reported_node).count()
    body = report(reported_node.hostname, [gpu(0)])
    body["nics"] = all_vfs(64, 1024)
    status, answer = send_report(operator_client, reported_node, body)
    fields = invalid_fields(status, answer)
    assert "report.nics[0].vfs" in fields
    details = error_details(answer)
    assert len(details) == MAX_ERROR_DETAILS + 1
    assert details[-1] == {"field": "body", "message": "and 44 more"}
    # The request id comes after the cap, never counted in it nor cut.
    assert len(answer["error"]["details"]) == MAX_ERROR_DETAILS + 2
    assert Device.objects.filter(node=reported_node).count() == before
