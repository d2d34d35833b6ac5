# The tenants' model moves here from `inventory`; the table keeps its name and rows.
from django.core.validators import RegexValidator
from django.db import migrations, models
from django.db.models.deletion import CASCADE

from core.migration_helpers import rename_content_type, rename_content_type_back, state_only

MOVED = ("inventory", "core", "tenant")


class Migration(migrations.Migration):
    dependencies = [("contenttypes", "0002_remove_content_type_name"), ("core", "0001_initial")]
    operations = [
        state_only(
            migrations.CreateModel(
                "Tenant",
                [("id", models.CharField(max_length=128, primary_key=True, serialize=False, validators=[RegexValidator("^[A-Za-z0-9._:-]{1,128}$")])), ("name", models.CharField(blank=True, max_length=200)), ("created_at", models.DateTimeField(auto_now_add=True))],
                options={"db_table": "inventory_tenant"},
            ),
            migrations.AlterField("rolebinding", "tenant", models.ForeignKey(blank=True, null=True, on_delete=CASCADE, related_name="+", to="core.tenant")),
        ),
        migrations.RunPython(rename_content_type(*MOVED), rename_content_type_back(*MOVED)),
    ]
