# State only: `inventory_offering` moves from `inventory` to `ledger` as it is (the table, its rows
# and constraints untouched), with its content type and so its permissions.

from django.db import migrations, models
from django.db.models.deletion import CASCADE

from core.migration_helpers import rename_content_type, rename_content_type_back, state_only

MOVED = ("inventory", "ledger", "offering")


class Migration(migrations.Migration):
    dependencies = [("core", "0004_workerjob"), ("inventory", "0006_offering_moves"), ("ledger", "0003_rollup_moves"), ("contenttypes", "0002_remove_content_type_name")]
    operations = [
        state_only(
            migrations.CreateModel(
                name="Offering",
                fields=[
                    ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                    ("created_at", models.DateTimeField(auto_now_add=True)), ("pool", models.ForeignKey(on_delete=CASCADE, related_name="offerings", to="inventory.pool")),
                    ("tenant", models.ForeignKey(on_delete=CASCADE, related_name="offerings", to="core.tenant")),
                ],
                options={"db_table": "inventory_offering", "constraints": [models.UniqueConstraint(fields=("pool", "tenant"), name="offering_unique_pool_tenant")]},
            )
        ),
        migrations.RunPython(rename_content_type(*MOVED), rename_content_type_back(*MOVED)),
    ]
