"""Workers registered before capability features ran agents (< 0.2.0) that draw the
synthetic kind's matrices with SHAKE128 only. Their capabilities now say so, so the
scheduler offers them only tasks they compute correctly; an upgraded agent reports what
it offers when it starts (``/workers/me/capabilities/``)."""

from django.db import migrations

LEGACY_FEATURES = ["poc:shake128"]  # as workers.services.LEGACY_FEATURES, frozen here


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    worker_model = apps.get_model("workers", "Worker")
    for worker in worker_model.objects.only("pk", "capabilities").iterator():
        caps = worker.capabilities
        if isinstance(caps, dict) and "features" not in caps:
            caps["features"] = list(LEGACY_FEATURES)
            worker_model.objects.filter(pk=worker.pk).update(capabilities=caps)


class Migration(migrations.Migration):
    dependencies = [("workers", "0006_relabel_self_reported_summary_figures")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
