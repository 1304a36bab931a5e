"""Put back the unique index on the hash of admitted transactions.

0002 took ``db_index=True`` off ``Transaction.hash``; on PostgreSQL Django then drops
every plain btree index on that column that is not in ``Meta.indexes``, and the partial
unique index behind the ``ledger_tx_hash_unique`` constraint is one of them. The model
state still lists the constraint, so makemigrations sees nothing to do: without this
migration PostgreSQL neither enforces the constraint nor has an index for the mempool's
duplicate check, which then reads the whole table. SQLite rebuilt the table from the
model state and kept it, hence the check before adding it.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

NAME = "ledger_tx_hash_unique"


def restore(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    model = apps.get_model("ledger", "Transaction")
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        present = connection.introspection.get_constraints(cursor, model._meta.db_table)
    if NAME in present:
        return
    (constraint,) = [c for c in model._meta.constraints if c.name == NAME]
    schema_editor.add_constraint(model, constraint)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0003_reversal_tx_type"),
    ]

    operations = [
        migrations.RunPython(restore, migrations.RunPython.noop, elidable=False),
    ]
