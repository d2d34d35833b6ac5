"""`NOTIFY auth_changed` on any change that can take a signed-in token's rights away (core.auth_cache)."""

from django.db import migrations

SQL = """
CREATE FUNCTION core_auth_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('auth_changed', TG_TABLE_NAME);
    RETURN NULL;
END $$;

CREATE TRIGGER core_apitoken_auth_changed
    AFTER UPDATE OF revoked_at, expires_at, digest, principal_id OR DELETE ON core_apitoken
    FOR EACH STATEMENT EXECUTE FUNCTION core_auth_changed();
CREATE TRIGGER core_principal_auth_changed AFTER UPDATE OR DELETE ON core_principal
    FOR EACH STATEMENT EXECUTE FUNCTION core_auth_changed();
CREATE TRIGGER core_rolebinding_auth_changed AFTER INSERT OR UPDATE OR DELETE ON core_rolebinding
    FOR EACH STATEMENT EXECUTE FUNCTION core_auth_changed();
"""

REVERSE_SQL = """
DROP TRIGGER core_rolebinding_auth_changed ON core_rolebinding;
DROP TRIGGER core_principal_auth_changed ON core_principal;
DROP TRIGGER core_apitoken_auth_changed ON core_apitoken;
DROP FUNCTION core_auth_changed();
"""


class Migration(migrations.Migration):
    dependencies = [("core", "0005_metrics_role")]

    operations = [migrations.RunSQL(SQL, REVERSE_SQL)]
