from django.db import migrations

# 0014 turned `Run.thread`'s own index off (db_index=False). Django's AlterField then drops
# every index on the column alone that is not one of Meta.indexes, and the partial unique index
# of the constraint `one_running_run_per_thread` (thread_id WHERE status = 'running') was one:
# on PostgreSQL the constraint was gone from the database while the migration state still had
# it. Without it two runs of one thread could be running at once if claims raced, and every
# "does this thread run something" check (the claim, a thread's status after each run's end or
# cancel) walked the running runs' lease index, dead entries included, for each thread asked
# about. SQLite rebuilds the table on AlterField and kept it. This creates it where it is
# missing; the state is unchanged.
NAME = "one_running_run_per_thread"


def _present(schema_editor, model) -> bool:
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(
            cursor, model._meta.db_table
        )
    return NAME in constraints


def _create(apps, schema_editor):
    model = apps.get_model("runs", "Run")
    if _present(schema_editor, model):
        return
    (constraint,) = (c for c in model._meta.constraints if c.name == NAME)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT thread_id FROM runs_run WHERE status = 'running' AND thread_id IS NOT NULL"
            " GROUP BY thread_id HAVING count(*) > 1 LIMIT 10"
        )
        clashes = [str(row[0]) for row in cursor.fetchall()]
    if clashes:
        raise RuntimeError(
            f"cannot restore {NAME}: these threads have more than one running run: "
            f"{', '.join(clashes)}. Stop the workers, cancel all but one running run of each "
            "(POST /api/threads/{thread_id}/runs/{run_id}/cancel), and migrate again."
        )
    schema_editor.add_constraint(model, constraint)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0015_lease_held_check'),
    ]

    # Backwards: nothing to undo (0014 should not have dropped it).
    operations = [migrations.RunPython(_create, migrations.RunPython.noop, elidable=False)]
