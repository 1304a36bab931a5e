from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    verbose_name = "Workers"

    def ready(self) -> None:
        from ledger.hooks import register_assignment_checker, register_transfer_checker
        from workers.assignments.ledger_hooks import check_assignment, check_node_transfer

        register_assignment_checker(check_assignment)
        register_transfer_checker(check_node_transfer)

        from marketplace import work
        from workers import work as workers_work

        work.install(workers_work)

        from marketplace import kinds
        from workers import verification

        kinds.install_verifiers(verification.load(), verification.STATED_BARS)

        from marketplace.signals import task_cancelling
        from workers.assignments.lifecycle import on_task_cancelling

        task_cancelling.connect(on_task_cancelling, dispatch_uid="workers.end_jobs_of_cancelled_task")

        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save

        from workers.identity.services import on_user_saved

        post_save.connect(on_user_saved, sender=get_user_model(), dispatch_uid="workers.close_deactivated_nodes")
