"""Clear every worker's benchmark: until now it was the figure the node reported about
itself, shown as "verified". From here on it is timed by the platform (workers/verifiers.py,
``achieved_gflops``) and fills in again with the worker's next verified synthetic task."""

from django.db import migrations


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    apps.get_model("workers", "Worker").objects.update(benchmark_gflops=None)


class Migration(migrations.Migration):
    dependencies = [("workers", "0004_assignment_verify_sent_at")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
