"""Offerings in the admin: which tenants a pool is offered to (their limits are the quota rows)."""

from __future__ import annotations

from django.contrib import admin

from ledger.models import Offering


@admin.register(Offering)
class OfferingAdmin(admin.ModelAdmin):
    list_display = ("pool", "tenant", "created_at")
    list_filter = (("tenant", admin.RelatedOnlyFieldListFilter),)
    list_select_related = ("pool", "tenant")
    search_fields = ("pool__name", "pool__id", "tenant__id")
    autocomplete_fields = ("pool", "tenant")
