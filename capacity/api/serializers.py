"""Input and output of the capacity read methods (`summary`, `byPool`, and `pools/capacity`)."""

from __future__ import annotations

from rest_framework import serializers

from capacity.selectors import SUMMED_FIELDS
from core.api import StrictSerializer, pool_id_field, tenant_id_field
from ledger.models import ROLLUP_COUNTS


def _counts(names: tuple[str, ...], **help_texts: str) -> dict[str, serializers.Field]:
    """An integer field per count, in the order of `names` (the selector's), described by `help_texts`."""
    return {name: serializers.IntegerField(help_text=help_texts.get(name)) for name in names}


class SummaryInput(StrictSerializer):
    tenantId = tenant_id_field()


class ByPoolInput(StrictSerializer):
    tenantId = tenant_id_field()
    poolId = pool_id_field()


class RollupRowSerializer(serializers.Serializer):
    """One pool and resource; `total` = `allocatable` + the four buckets."""

    # Declared here, not as class attributes, so that the counts are the ones
    # the selector answers (`ROLLUP_COUNTS`, in the contract's order).
    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            "poolId": serializers.CharField(),
            "resource": serializers.CharField(),
            **_counts(ROLLUP_COUNTS, available="max(0, allocatable - allocated - reserved); conservative"),
            "updatedAt": serializers.IntegerField(help_text="milliseconds since the epoch"),
        }


class FragmentationGroupSerializer(serializers.Serializer):
    value = serializers.CharField(help_text="the label's value; empty for nodes without the label")
    nodes = serializers.IntegerField(help_text="schedulable nodes with healthy atoms of the class")
    nodesFree = serializers.IntegerField(help_text="of those, nodes with none of those atoms booked now")
    wholeNodeGang = serializers.IntegerField(
        help_text="of the free ones, nodes with eight or more whole GPUs: the largest gang of whole"
        " 8-GPU nodes that fits now (in a MIG or time-slice pool, every free node)"
    )
    strandedAtoms = serializers.IntegerField(help_text="free atoms on partly booked nodes")


class FragmentationSerializer(serializers.Serializer):
    topologyKey = serializers.CharField(help_text="the node label the groups are by (`fabric`)")
    deviceClass = serializers.CharField(help_text="the pool's GPU atom class: gpu, gpu.mig or gpu.slot")
    groups = FragmentationGroupSerializer(many=True)


class ByPoolOutput(serializers.Serializer):
    poolId = serializers.CharField()
    rows = RollupRowSerializer(many=True)
    atRiskReservations = serializers.IntegerField(
        help_text="live reservations of the pool marked at risk by BookingRepair (every tenant's)"
    )
    fragmentation = FragmentationSerializer()


class SummaryPoolSerializer(serializers.Serializer):
    poolId = serializers.CharField()
    name = serializers.CharField()
    ownerTenantId = serializers.CharField()
    offered = serializers.BooleanField()
    archived = serializers.BooleanField()
    gpuModel = serializers.CharField(allow_null=True)
    sharing = serializers.CharField()
    capacity = RollupRowSerializer(many=True)


class GpuTotalsSerializer(serializers.Serializer):
    # What `byGpuModel` sums from each pool's `gpu` row (`SUMMED_FIELDS`). A
    # comment, not a docstring: the OpenAPI document would show a docstring.
    def get_fields(self) -> dict[str, serializers.Field]:
        return _counts(SUMMED_FIELDS)


class SummaryOutput(serializers.Serializer):
    tenantId = serializers.CharField()
    pools = SummaryPoolSerializer(many=True)
    byGpuModel = serializers.DictField(
        child=GpuTotalsSerializer(), help_text="`gpu` rows summed per GPU model; `other` when none"
    )
