from django.db import migrations

# PostgreSQL only: a check a statement can make of its own fenced write. A run's end with held
# writes (runs/services/finish.py) sends them, the end's statement and the COMMIT in one round
# trip; when the end's fence matches no row (the lease was lost, the run cancelled or deleted)
# the statement must fail, so that the COMMIT that follows it is not run and the held writes
# roll back with the transaction. A volatile function: called at execution, never folded.
LEASE_HELD = """
CREATE OR REPLACE FUNCTION runs_lease_held(fenced bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF fenced = 0 THEN
        RAISE EXCEPTION 'lease lost: the fenced write matched no run'
            USING ERRCODE = 'RSL01';
    END IF;
    RETURN true;
END
$$;
"""
LEASE_HELD_DROP = "DROP FUNCTION IF EXISTS runs_lease_held(bigint);"


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(LEASE_HELD)


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(LEASE_HELD_DROP)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0014_fewer_indexes'),
    ]

    operations = [migrations.RunPython(_create, _drop, elidable=False)]
