"""The node commands (`cordon`, `uncordon`, `taint`, `untaint`): each one node action, audited.

Like the API and the admin, they go through `operations.services`, so the
pool's rollups move at once.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from inventory.models import Node
from reservations.models import PoolCapacityRollup
from reservations.rollups.recount import rollup_rebuild
from tests.support.commands import run_command
from tests.support.records import audit_trail


@pytest.mark.django_db
def test_commands_cordon_by_hostname_and_uncordon_by_id(gpu_node: Node) -> None:
    assert "cordoned" in run_command("cordon", "gpu-a-001", "--reason", "PSU swap", "--actor", "alice")
    row = Node.objects.get(pk=gpu_node.pk)
    assert (row.cordoned, row.cordoned_by) == (True, "alice")
    assert "already cordoned" in run_command("cordon", gpu_node.pk, "--reason", "again")

    assert "uncordoned" in run_command("uncordon", gpu_node.pk)
    assert not Node.objects.get(pk=gpu_node.pk).cordoned
    assert audit_trail(gpu_node) == ["node.cordon", "node.uncordon"]


@pytest.mark.django_db
def test_the_commands_move_the_rollups_at_once(gpu_node: Node) -> None:
    rollup_rebuild(pool_id=gpu_node.pool_id)

    run_command("cordon", "gpu-a-001", "--reason", "PSU swap")
    row = PoolCapacityRollup.objects.get(pool_id=gpu_node.pool_id, resource="gpu")
    assert (row.allocatable, row.maintenance) == (0, 8)

    run_command("uncordon", "gpu-a-001")
    run_command("taint", "gpu-a-001", "xid", "--effect", "NoSchedule", "--reason", "xid 79")
    row = PoolCapacityRollup.objects.get(pool_id=gpu_node.pool_id, resource="gpu")
    assert (row.allocatable, row.maintenance, row.unhealthy) == (0, 0, 8)


@pytest.mark.django_db
def test_commands_taint_and_untaint(gpu_node: Node) -> None:
    run_command("taint", "gpu-a-001", "xid", "--value", "79", "--effect", "NoSchedule", "--reason", "xid 79")
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 1
    run_command("untaint", "gpu-a-001", "xid")
    assert Node.objects.get(pk=gpu_node.pk).noschedule_taints == 0
    assert "has no taint" in run_command("untaint", "gpu-a-001", "xid")


@pytest.mark.django_db
def test_commands_refuse_an_unknown_node() -> None:
    with pytest.raises(CommandError):
        run_command("cordon", "no-such-host", "--reason", "r")
