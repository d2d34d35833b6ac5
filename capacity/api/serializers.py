"""Input and output of the capacity read methods (`summary`, `byPool`, and `pools/capacity`)."""

from __future__ import annotations

from rest_framework import serializers

from core.api import StrictSerializer, pool_id_field, tenant_id_field


class SummaryInput(StrictSerializer):
    tenantId = tenant_id_field()


class ByPoolInput(StrictSerializer):
    tenantId = tenant_id_field()
    poolId = pool_id_field()


class RollupRowSerializer(serializers.Serializer):
    """One pool and resource; `total` = `allocatable` + the four buckets."""

    poolId = serializers.CharField()
    resource = serializers.CharField()
    total = serializers.IntegerField()
    allocatable = serializers.IntegerField()
    allocated = serializers.IntegerField()
    reserved = serializers.IntegerField()
    available = serializers.IntegerField(help_text="max(0, allocatable - allocated - reserved); conservative")
    provisioning = serializers.IntegerField()
    unhealthy = serializers.IntegerField()
    maintenance = serializers.IntegerField()
    unreachable = serializers.IntegerField()
    updatedAt = serializers.IntegerField(help_text="milliseconds since the epoch")


class ByPoolOutput(serializers.Serializer):
    poolId = serializers.CharField()
    rows = RollupRowSerializer(many=True)


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
    total = serializers.IntegerField()
    allocatable = serializers.IntegerField()
    allocated = serializers.IntegerField()
    reserved = serializers.IntegerField()
    available = serializers.IntegerField()


class SummaryOutput(serializers.Serializer):
    tenantId = serializers.CharField()
    pools = SummaryPoolSerializer(many=True)
    byGpuModel = serializers.DictField(
        child=GpuTotalsSerializer(), help_text="`gpu` rows summed per GPU model; `other` when none"
    )
