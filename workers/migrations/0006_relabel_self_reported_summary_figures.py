"""Relabel the GFLOP/s figure of synthetic tasks finished before 0005: their summary's
``gflops`` is the figure the node reported about itself, which task pages now label
"platform-timed" (since 0005 ``gflops`` is the platform's own timing and the node's figure
is ``reported_gflops``). Such a figure moves to ``reported_gflops``.

A summary is from before 0005 when its task finished before 0005 was applied (all of
them when both are applied in one run), and it has no ``reported_gflops`` of its own."""

from django.db import migrations
from django.db.migrations.recorder import MigrationRecorder


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    task_model = apps.get_model("marketplace", "Task")
    applied = (
        MigrationRecorder(schema_editor.connection)
        .migration_qs.filter(app="workers", name="0005_reset_self_reported_benchmarks")
        .values_list("applied", flat=True)
        .first()
    )
    rows = task_model.objects.filter(kind="synthetic", finished_at__isnull=False)
    if applied is not None:
        rows = rows.filter(finished_at__lt=applied)
    for task in rows.only("pk", "result_summary").iterator():
        summary = task.result_summary
        if isinstance(summary, dict) and "gflops" in summary and "reported_gflops" not in summary:
            summary["reported_gflops"] = summary.pop("gflops")
            task_model.objects.filter(pk=task.pk).update(result_summary=summary)


class Migration(migrations.Migration):
    dependencies = [
        ("workers", "0005_reset_self_reported_benchmarks"),
        ("marketplace", "0002_datasetupload"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
