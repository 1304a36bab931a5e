"""The market's columns on a task: its bid, and what it asks of a node read once from its
spec. A task posted before the market bids what it would have paid then: its price
estimate, bounded by its budget's share per replica."""

from django.db import migrations, models


def fill(apps, schema_editor):
    from marketplace.kinds import KINDS

    Task = apps.get_model("marketplace", "Task")
    for task in Task.objects.all().iterator():
        task.bid = max(1, min(task.price_estimate, task.budget // max(task.replication, 1)))
        kind = KINDS.get(task.kind)
        if kind is not None:
            try:
                task.work_tflop = kind.tflop(task.spec)
                task.memory_bytes = kind.resources(task.spec).memory_bytes
                task.features = sorted(kind.features(task.spec))
            except (KeyError, TypeError, ValueError):
                pass  # a spec the platform can no longer read: its task is never matched
        task.save(update_fields=["bid", "work_tflop", "memory_bytes", "features"])


class Migration(migrations.Migration):
    # After the workers app's migrations of its time too: a database migrated back to one
    # of those (tests/workers/test_migrations.py) then has tasks as they were, without a bid.
    dependencies = [
        ("marketplace", "0005_public_listing_orders_by_budget_on_an_index"),
        ("workers", "0011_assignment_challenge"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="bid",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="work_tflop",
            field=models.FloatField(default=0.0, help_text="The kind's work measure: estimated TFLOPs."),
        ),
        migrations.AddField(
            model_name="task",
            name="memory_bytes",
            field=models.BigIntegerField(default=0, help_text="Memory a node needs for it."),
        ),
        migrations.AddField(
            model_name="task",
            name="features",
            field=models.JSONField(blank=True, default=list, help_text="Agent features a node needs for it."),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="task",
            name="bid",
            field=models.BigIntegerField(
                help_text="Most the requester pays per replica, the platform's fee included, in base units: "
                "a node is offered the task only when its ask plus the fee fits (docs/market.md)."
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(fields=["status", "-bid", "opened_at"], name="marketplace_status_dc3a1e_idx"),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(condition=models.Q(bid__gt=0), name="task_bid_positive"),
        ),
    ]
