"""A database made by the old migrations migrates forward without losing a row.

`Tenant` moved from `inventory` to `core`, `Offering` from `inventory` to
`ledger`, `QuotaUsage` from `capacity` to `ledger`, and `PoolCapacityRollup`
from `capacity` to `ledger` and then to `reservations`, by state-only migrations
(`SeparateDatabaseAndState`): the tables keep their names and rows, and only
the content types are relabelled. This test builds the old state on the test
database (migrating back to the leaves of before the move), fills it through
the historical models of that state, migrates forward to today's leaves, and
checks that every row is still there with the same values, that today's
models read them, and that the content types (and the permissions on them)
carry the new app labels.

It runs outside a test transaction (migrations are DDL), and always leaves the
database migrated to the latest state: other tests reuse it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.apps.registry import Apps
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.migrations.executor import MigrationExecutor

from operations.invariants import check_node_atom_counts, check_pool_fabric_counts

pytestmark = pytest.mark.django_db(transaction=True)

# The leaves of the graph before the models moved (the migrations of that
# commit); `ledger` did not exist yet.
OLD_LEAVES: list[tuple[str, str | None]] = [
    ("core", "0001_initial"),
    ("inventory", "0002_node_operate_permission"),
    ("capacity", "0001_initial"),
    ("reservations", "0003_booking_device_ends_index"),
    ("ledger", None),
]

# The moved models' content types: old (app, model) -> new app.
MOVED = {
    ("inventory", "tenant"): "core",
    ("inventory", "offering"): "ledger",
    # To `ledger` first, then on to `reservations` beside the bookings it counts.
    ("capacity", "poolcapacityrollup"): "reservations",
    ("capacity", "quotausage"): "ledger",
}

T0 = datetime(2030, 1, 1, 8, 0, tzinfo=UTC)


def latest_leaves(executor: MigrationExecutor) -> list[tuple[str, str]]:
    return sorted(executor.loader.graph.leaf_nodes())


def migrate(targets: list[Any]) -> MigrationExecutor:
    """Migrate the test database to `targets` with a fresh loader (it reads what is applied)."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection)


@pytest.fixture
def old_state() -> Iterator[Apps]:
    """The test database migrated back to before the move; forward again at the end, whatever happens."""
    latest = latest_leaves(MigrationExecutor(connection))
    try:
        executor = migrate(OLD_LEAVES)
        yield executor.loader.project_state([node for node in OLD_LEAVES if node[1]]).apps
    finally:
        executor = migrate(latest)
        assert not executor.migration_plan(latest), "the database must end at the latest migrations"
        ContentType.objects.clear_cache()


def assert_content_types_labelled_as_before() -> None:
    """The backward migration gave the moved models' content types their old labels back.

    The rows keep their ids, so the permissions that refer to them survive both ways.
    """
    for (old_app, model), new_app in MOVED.items():
        assert ContentType.objects.filter(app_label=old_app, model=model).count() == 1, (old_app, model)
        assert not ContentType.objects.filter(app_label=new_app, model=model).exists(), (new_app, model)
    ContentType.objects.clear_cache()


def fill_old_database(apps: Apps) -> dict[str, Any]:
    """A small fleet written through the old state's historical models."""
    tenant_model = apps.get_model("inventory", "Tenant")
    assert tenant_model._meta.db_table == "inventory_tenant"
    acme = tenant_model.objects.create(id="acme", name="Acme Corp")
    beta = tenant_model.objects.create(id="beta", name="Beta Labs")

    pool = apps.get_model("inventory", "Pool").objects.create(
        id="pool-migr", owner=acme, name="h100-east", gpu_model="H100"
    )
    apps.get_model("inventory", "Offering").objects.create(pool=pool, tenant=beta)
    project = apps.get_model("inventory", "Project").objects.create(id="prj-migr", tenant=beta, name="train")
    node = apps.get_model("inventory", "Node").objects.create(
        id="node-migr", hostname="gpu-migr-001", pool=pool, trust="tenant-owned", owner=acme
    )
    apps.get_model("inventory", "NodeResource").objects.create(
        node=node, resource="vcpu", allocatable=64, allocated=16
    )
    devices = [
        apps.get_model("inventory", "Device").objects.create(
            uid=f"GPU-migr-{index}", node=node, device_class="gpu", attributes={"gpuModel": "H100"}
        )
        for index in range(4)
    ]

    reservation = apps.get_model("reservations", "Reservation").objects.create(
        id="rsv-migr",
        tenant=beta,
        pool=pool,
        project=project,
        request={"gpus": 2},
        request_digest="d" * 64,
        idempotency_key="key-1",
        starts_at=T0,
        ends_at=T0 + timedelta(hours=4),
        state="active",
    )
    allocation = apps.get_model("reservations", "Allocation").objects.create(
        id="alc-migr", reservation=reservation, node=node, resources={"vcpu": 16}
    )
    booking_model = apps.get_model("reservations", "DeviceBooking")
    bookings = {
        devices[0].id: DateTimeTZRange(T0, T0 + timedelta(hours=4), "[)"),
        devices[1].id: DateTimeTZRange(T0, T0 + timedelta(hours=2), "[)"),  # released early
    }
    for device_id, during in bookings.items():
        booking_model.objects.create(device_id=device_id, allocation=allocation, during=during)
    # An open-ended layout-change booking: no allocation, no end.
    booking_model.objects.create(device=devices[3], purpose="layout-change", during=DateTimeTZRange(T0, None))

    quota_model = apps.get_model("capacity", "QuotaUsage")
    assert quota_model._meta.db_table == "quota_usage"
    quota_model.objects.create(pool=pool, tenant=beta, resource="gpu", used=2, max=8)
    quota_model.objects.create(pool=pool, tenant=beta, resource="vcpu", used=16, max=128)

    rollup_model = apps.get_model("capacity", "PoolCapacityRollup")
    assert rollup_model._meta.db_table == "pool_capacity_rollup"
    rollup_model.objects.create(
        pool=pool, resource="gpu", total=4, allocatable=3, allocated=2, reserved=0, unhealthy=1
    )
    rollup_model.objects.create(pool=pool, resource="vcpu", total=64, allocatable=64, allocated=16)

    principal = apps.get_model("core", "Principal").objects.create(id="prn-migr", name="ops@beta")
    binding = apps.get_model("core", "RoleBinding").objects.create(
        principal=principal, role="member", tenant=beta
    )
    return {"bookings": bookings, "binding_id": binding.pk, "devices": [d.id for d in devices]}


# Every table the moved models own or point at, read whole and compared.
TABLES = (
    "inventory_tenant",
    "inventory_pool",
    "inventory_offering",
    "inventory_project",
    "inventory_node",
    "inventory_noderesource",
    "inventory_device",
    "reservations_reservation",
    "reservations_allocation",
    "device_bookings",
    "quota_usage",
    "pool_capacity_rollup",
    "core_principal",
    "core_rolebinding",
    "django_content_type",
    "auth_permission",
    "auth_group_permissions",
)


def snapshot(columns: dict[str, list[str]] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of `TABLES`: all their columns, or (after the migrations) the `columns` they had before.

    Columns added since are not compared; what they hold is checked on its own.
    """
    rows = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            names = ", ".join(f'"{c}"' for c in columns[table]) if columns else "*"
            cursor.execute(f"SELECT {names} FROM {table} ORDER BY 1")
            rows[table] = cursor.fetchall()
    return rows


def column_names() -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        return {
            table: [c.name for c in connection.introspection.get_table_description(cursor, table)]
            for table in TABLES
        }


def relabelled(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """django_content_type (id, app_label, model) rows as they should read after the move."""
    return [(pk, MOVED.get((app, model), app), model) for pk, app, model in rows]


def grant_the_old_permissions_to_operators() -> None:
    """An operator group with the moved models' permissions, as the admin granted them under old labels."""
    old_permissions = Permission.objects.filter(
        content_type__app_label__in=["inventory", "capacity"],
        content_type__model__in=["tenant", "offering", "quotausage", "poolcapacityrollup"],
    )
    assert old_permissions.count() == 16  # add, change, delete, view x 4 models
    operators = Group.objects.create(name="migration operators")
    operators.permissions.set(old_permissions)


def assert_every_row_kept_and_only_the_labels_changed(
    before: dict[str, list[tuple[Any, ...]]],
    after: dict[str, list[tuple[Any, ...]]],
    content_type_ids: dict[tuple[str, str], int],
) -> None:
    """Every row of every table, byte for byte; only the content types' labels changed (same ids)."""
    for table in TABLES:
        expected = relabelled(before[table]) if table == "django_content_type" else before[table]
        assert after[table] == expected, table
    for (old_app, model), new_app in MOVED.items():
        assert not ContentType.objects.filter(app_label=old_app, model=model).exists()
        assert (
            ContentType.objects.get(app_label=new_app, model=model).pk == content_type_ids[(old_app, model)]
        )


def assert_todays_models_read_the_rows(filled: dict[str, Any]) -> None:
    """Today's models read the rows `fill_old_database` wrote through the ORM, under the new labels."""
    from core.models import RoleBinding, Tenant
    from inventory.models import Node, Pool
    from ledger.models import Offering, QuotaUsage
    from reservations.models import DeviceBooking, PoolCapacityRollup, Reservation

    assert ContentType.objects.get_for_model(Tenant).natural_key() == ("core", "tenant")
    assert ContentType.objects.get_for_model(QuotaUsage).natural_key() == ("ledger", "quotausage")
    assert ContentType.objects.get_for_model(PoolCapacityRollup).natural_key() == (
        "reservations",
        "poolcapacityrollup",
    )
    assert ContentType.objects.get_for_model(Offering).natural_key() == ("ledger", "offering")

    assert {(t.id, t.name) for t in Tenant.objects.filter(id__in=["acme", "beta"])} == {
        ("acme", "Acme Corp"),
        ("beta", "Beta Labs"),
    }
    pool = Pool.objects.select_related("owner").get(id="pool-migr")
    assert isinstance(pool.owner, Tenant) and pool.owner.id == "acme"
    assert Node.objects.get(id="node-migr").owner_id == "acme"

    binding = RoleBinding.objects.select_related("tenant").get(pk=filled["binding_id"])
    assert isinstance(binding.tenant, Tenant)
    assert (binding.tenant.id, binding.principal_id, binding.role) == ("beta", "prn-migr", "member")
    # Bindings made before node-agent scopes existed are not narrowed (so an old agent keeps its reach).
    assert (binding.scope_pool_id, binding.scope_node_id) == ("", "")

    quotas = {
        q.resource: (q.tenant_id, q.pool_id, q.used, q.max)
        for q in QuotaUsage.objects.select_related("tenant").filter(pool_id="pool-migr")
    }
    assert quotas == {"gpu": ("beta", "pool-migr", 2, 8), "vcpu": ("beta", "pool-migr", 16, 128)}
    assert isinstance(QuotaUsage.objects.get(pool_id="pool-migr", resource="gpu").tenant, Tenant)
    assert list(
        Tenant.objects.get(id="beta").quotas.order_by("resource").values_list("resource", "used")
    ) == [
        ("gpu", 2),
        ("vcpu", 16),
    ]

    rollups = {
        r.resource: (r.total, r.allocatable, r.allocated, r.reserved, r.available, r.unhealthy)
        for r in PoolCapacityRollup.objects.filter(pool_id="pool-migr")
    }
    assert rollups == {"gpu": (4, 3, 2, 0, 1, 1), "vcpu": (64, 64, 16, 0, 48, 0)}
    assert list(pool.rollups.values_list("resource", flat=True)) == ["gpu", "vcpu"]

    reservation = Reservation.objects.select_related("tenant").get(id="rsv-migr")
    assert isinstance(reservation.tenant, Tenant) and reservation.tenant.id == "beta"
    assert (reservation.starts_at, reservation.ends_at, reservation.state) == (
        T0,
        T0 + timedelta(hours=4),
        "active",
    )
    bookings = {
        b.device_id: b.during for b in DeviceBooking.objects.filter(allocation__reservation_id="rsv-migr")
    }
    assert bookings == filled["bookings"]
    layout = DeviceBooking.objects.get(device_id=filled["devices"][3])
    assert (layout.purpose, layout.allocation_id, layout.during) == (
        "layout-change",
        None,
        DateTimeTZRange(T0, None, "[)"),
    )


def assert_the_operators_permissions_name_the_new_labels() -> None:
    """The operators' permissions now name the new labels (same rows, same ids)."""
    granted = set(
        Group.objects.get(name="migration operators").permissions.values_list(
            "content_type__app_label", "codename"
        )
    )
    assert granted == {
        (app, f"{action}_{model}")
        for (_, model), app in MOVED.items()
        for action in ("add", "change", "delete", "view")
    }


def test_old_database_migrates_forward_without_losing_rows(old_state: Apps) -> None:
    assert_content_types_labelled_as_before()
    grant_the_old_permissions_to_operators()

    filled = fill_old_database(old_state)
    before = snapshot()
    old_columns = column_names()
    content_type_ids = {key: ContentType.objects.get(app_label=key[0], model=key[1]).pk for key in MOVED}

    executor = migrate(latest_leaves(MigrationExecutor(connection)))
    assert not executor.migration_plan(latest_leaves(executor))
    ContentType.objects.clear_cache()
    after = snapshot(old_columns)

    assert_every_row_kept_and_only_the_labels_changed(before, after, content_type_ids)
    assert_todays_models_read_the_rows(filled)
    assert_the_operators_permissions_name_the_new_labels()
    # The counts that later migrations keep by trigger were filled from the rows already there.
    assert check_node_atom_counts() == []
    assert check_pool_fabric_counts() == []
