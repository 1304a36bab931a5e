"""Synthetic tasks posted before the spec had a ``generator`` were computed, and must be
verified, with the first generator (SHAKE128). Their stored spec now says so explicitly
(training.poc reads a spec without the field the same way, for jobs already in flight).

Reverse is a no-op: code from before the field ignores it, and generates with SHAKE128,
which is right for every task this migration touched."""

from django.db import migrations


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    task_model = apps.get_model("marketplace", "Task")
    for task in task_model.objects.filter(kind="synthetic").only("pk", "spec").iterator():
        spec = task.spec
        if isinstance(spec, dict) and "generator" not in spec:
            spec["generator"] = "shake128"
            task_model.objects.filter(pk=task.pk).update(spec=spec)


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0002_datasetupload")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
