"""Signals the marketplace sends to apps that depend on it (it imports none of them)."""

from django.dispatch import Signal

# Sent inside cancel_task's transaction, with the task row locked (keyword ``task``), before
# the task becomes cancelled and its escrow is refunded. A receiver ends the work it holds
# for the task, or refuses the cancellation by raising IllegalTransition with its reason.
task_cancelling = Signal()
