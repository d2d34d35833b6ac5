# The tenants' model moves to `core`; its table and rows stay as they are. The foreign keys
# already point at `inventory_tenant`: only the model they name changes, and the model goes
# from this app's state.
from django.db import migrations, models
from django.db.models.deletion import CASCADE, PROTECT

from core.migration_helpers import state_only


class Migration(migrations.Migration):
    # Every other reference to inventory.Tenant is moved before the model goes.
    dependencies = [("core", "0002_tenant_moves_to_core"), ("inventory", "0002_node_operate_permission"), ("capacity", "0002_counters_move_to_ledger"), ("reservations", "0004_tenant_in_core")]
    operations = [
        state_only(
            migrations.AlterField("node", "owner", models.ForeignKey(blank=True, help_text="The owner of a tenant-owned node.", null=True, on_delete=PROTECT, related_name="owned_nodes", to="core.tenant")),
            migrations.AlterField("project", "tenant", models.ForeignKey(on_delete=CASCADE, related_name="projects", to="core.tenant")),
            migrations.AlterField("offering", "tenant", models.ForeignKey(on_delete=CASCADE, related_name="offerings", to="core.tenant")),
            migrations.AlterField("pool", "owner", models.ForeignKey(on_delete=PROTECT, related_name="owned_pools", to="core.tenant")),
            migrations.DeleteModel("Tenant"),
        ),
    ]
