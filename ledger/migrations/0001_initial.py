# `pool_capacity_rollup` and `quota_usage` were created by `capacity.0001_initial`; the ledger
# takes them over as they are: same operations, then the tenant moved to `core`.
from django.db import migrations, models
from django.db.models.deletion import CASCADE

from core.migration_helpers import rename_content_type, rename_content_type_back, state_only, taken_over

MOVED = ("capacity", "ledger", "poolcapacityrollup", "quotausage")


class Migration(migrations.Migration):
    initial = True
    dependencies = [("contenttypes", "0002_remove_content_type_name"), ("capacity", "0001_initial"), ("core", "0002_tenant_moves_to_core"), ("inventory", "0002_node_operate_permission")]
    operations = [
        state_only(
            *taken_over("capacity", "0001_initial"),
            migrations.AlterField("quotausage", "tenant", models.ForeignKey(on_delete=CASCADE, related_name="quotas", to="core.tenant")),
        ),
        migrations.RunPython(rename_content_type(*MOVED), rename_content_type_back(*MOVED)),
    ]
