"""Input and output of pool and offering management (`pools/*` but `pools/capacity`, `offerings/*`)."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from core.api import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictRegexField,
    StrictSerializer,
    pool_id_field,
    tenant_id_field,
)
from inventory.choices import ALL_RESOURCES, Sharing
from inventory.services.pools import POOL_NAME_RE
from ledger.models import QuotaMode

LIST_MAX = 500
LIST_DEFAULT = 100
LABELS_MAX = 64
QUOTA_MAX = 1 << 40
LABEL_KEY_REGEX = r"^[A-Za-z0-9._/-]{1,63}$"
TOPOLOGY_KEY_REGEX = r"^\S{1,128}$"


class LabelsField(serializers.DictField):
    """`{"region": "eu-west"}`: at most 64 labels, keys as node labels, values strings of at most 256."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=StrictCharField(max_length=256, allow_blank=True), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, str]:
        value: dict[str, str] = super().to_internal_value(data)
        if len(value) > LABELS_MAX:
            raise serializers.ValidationError(f"at most {LABELS_MAX} labels")
        bad = sorted(key for key in value if re.fullmatch(LABEL_KEY_REGEX, key) is None)
        if bad:
            raise serializers.ValidationError(f"label key {bad[0]!r} must match {LABEL_KEY_REGEX}")
        return value


class QuotaField(serializers.DictField):
    """`{"gpu": 16, "vcpu": 512}`: a limit per known resource (0 to 2^40); `null` removes one (update)."""

    def __init__(self, *, allow_remove: bool, **kwargs: Any) -> None:
        self.allow_remove = allow_remove
        super().__init__(
            child=StrictIntegerField(min_value=0, max_value=QUOTA_MAX, allow_null=allow_remove), **kwargs
        )

    def to_internal_value(self, data: Any) -> dict[str, int | None]:
        if isinstance(data, dict):
            unknown = sorted(key for key in data if key not in ALL_RESOURCES)
            if unknown:
                raise serializers.ValidationError(
                    f"unknown resource {unknown[0]} (one of {', '.join(ALL_RESOURCES)})"
                )
        value: dict[str, int | None] = super().to_internal_value(data)
        return value


class PoolCreateInput(StrictSerializer):
    ownerTenantId = tenant_id_field(source="owner_id")
    name = StrictRegexField(POOL_NAME_RE.pattern, max_length=128)
    gpuModel = StrictCharField(
        max_length=64, required=False, allow_blank=True, default="", source="gpu_model"
    )
    sharing = serializers.ChoiceField(choices=Sharing.values, required=False, default=Sharing.EXCLUSIVE)
    slotsPerGpu = StrictIntegerField(min_value=1, max_value=64, required=False, source="slots_per_gpu")
    noticeSeconds = StrictIntegerField(
        min_value=0, max_value=86400, required=False, default=30, source="notice_seconds"
    )
    labels = LabelsField(required=False, default=dict)
    gangTopologyKey = StrictRegexField(
        TOPOLOGY_KEY_REGEX, max_length=128, required=False, default="", source="gang_topology_key"
    )


class PoolInput(StrictSerializer):
    poolId = pool_id_field()


class PoolUpdateInput(PoolInput):
    name = StrictRegexField(POOL_NAME_RE.pattern, max_length=128, required=False)
    gpuModel = StrictCharField(max_length=64, required=False, allow_blank=True, source="gpu_model")
    sharing = serializers.ChoiceField(choices=Sharing.values, required=False)
    slotsPerGpu = StrictIntegerField(
        min_value=1, max_value=64, required=False, allow_null=True, source="slots_per_gpu"
    )
    noticeSeconds = StrictIntegerField(min_value=0, max_value=86400, required=False, source="notice_seconds")
    labels = LabelsField(required=False)
    # "" goes back to the default (`fabric`).
    gangTopologyKey = StrictRegexField(
        TOPOLOGY_KEY_REGEX, max_length=128, required=False, allow_blank=True, source="gang_topology_key"
    )


class PoolListInput(StrictSerializer):
    ownerTenantId = tenant_id_field(source="owner_id", required=False)
    archived = StrictBooleanField(required=False, allow_null=True, default=None)
    limit = StrictIntegerField(min_value=1, max_value=LIST_MAX, required=False, default=LIST_DEFAULT)
    cursor = pool_id_field(source=None, required=False)


class PoolOutput(serializers.Serializer):
    poolId = serializers.CharField()
    ownerTenantId = serializers.CharField()
    name = serializers.CharField()
    gpuModel = serializers.CharField()
    sharing = serializers.CharField()
    slotsPerGpu = serializers.IntegerField(allow_null=True)
    noticeSeconds = serializers.IntegerField()
    labels = serializers.DictField(child=serializers.CharField())
    gangTopologyKey = serializers.CharField()
    archived = serializers.BooleanField()
    archivedAt = serializers.IntegerField(allow_null=True)
    apiChangedAt = serializers.IntegerField(allow_null=True)


class PoolListOutput(serializers.Serializer):
    pools = PoolOutput(many=True)
    nextCursor = serializers.CharField(allow_null=True)


class OfferingInput(StrictSerializer):
    poolId = pool_id_field()
    tenantId = tenant_id_field()


class OfferingCreateInput(OfferingInput):
    quota = QuotaField(allow_remove=False, required=False, default=dict)
    quotaMode = serializers.ChoiceField(choices=QuotaMode.values, required=False, source="quota_mode")


class OfferingUpdateInput(OfferingInput):
    quota = QuotaField(allow_remove=True, required=False, default=dict)
    quotaMode = serializers.ChoiceField(choices=QuotaMode.values, required=False, source="quota_mode")


class OfferingListInput(StrictSerializer):
    tenantId = tenant_id_field(required=False)
    poolId = pool_id_field(required=False)


class QuotaRowOutput(serializers.Serializer):
    resource = serializers.CharField()
    max = serializers.IntegerField()
    used = serializers.IntegerField()
    # A plain string here (`counter` or `concurrent`): the input's `quotaMode` documents the choice.
    mode = serializers.CharField(help_text="counter or concurrent")


class OfferingOutput(serializers.Serializer):
    poolId = serializers.CharField()
    poolName = serializers.CharField()
    ownerTenantId = serializers.CharField()
    tenantId = serializers.CharField()
    quota = QuotaRowOutput(many=True)


class OfferingListOutput(serializers.Serializer):
    offerings = OfferingOutput(many=True)


class WithdrawnOutput(serializers.Serializer):
    poolId = serializers.CharField()
    tenantId = serializers.CharField()
    withdrawn = serializers.BooleanField()
