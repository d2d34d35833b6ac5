# One tenant's reservations by end: hourly usage of the hours not closed yet starts from them.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("reservations", "0008_tenant_pool_live_index")]
    operations = [migrations.AddIndex("reservation", models.Index(fields=["tenant", "ends_at"], name="reservation_tenant_ends"))]
