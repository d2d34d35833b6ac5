
import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

from core.migration_helpers import rename_content_type, rename_content_type_back


class Migration(migrations.Migration):

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('core', '0001_initial'),
    ]

    # The tenants table keeps its name and rows; only the model moves to `core`.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Tenant',
                    fields=[
                        ('id', models.CharField(max_length=128, primary_key=True, serialize=False, validators=[django.core.validators.RegexValidator('^[A-Za-z0-9._:-]{1,128}$')])),
                        ('name', models.CharField(blank=True, max_length=200)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': 'inventory_tenant',
                    },
                ),
                migrations.AlterField(
                    model_name='rolebinding',
                    name='tenant',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='core.tenant'),
                ),
            ],
            database_operations=[
                migrations.RunPython(rename_content_type("inventory", "core", "tenant"), rename_content_type_back("inventory", "core", "tenant")),
            ],
        ),
    ]
