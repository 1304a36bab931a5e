"""Browser pages, split by concern. Views parse input, call one service, render."""

from __future__ import annotations

from marketplace.views.accounts import (
    LoginView,
    PasswordResetConfirmView,
    PasswordResetDoneView,
    PasswordResetView,
    account,
    locked_out,
    signup,
    token_create,
    token_revoke,
)
from marketplace.views.datasets import dataset_delete, dataset_detail, datasets
from marketplace.views.runs import task_compare, task_results_zip
from marketplace.views.tasks import (
    home,
    my_tasks,
    task_cancel,
    task_check,
    task_detail,
    task_new,
    task_post,
    task_publish,
    task_result_file,
)

__all__ = [
    "LoginView",
    "PasswordResetConfirmView",
    "PasswordResetDoneView",
    "PasswordResetView",
    "account",
    "dataset_delete",
    "dataset_detail",
    "datasets",
    "home",
    "locked_out",
    "my_tasks",
    "signup",
    "task_cancel",
    "task_check",
    "task_compare",
    "task_detail",
    "task_new",
    "task_post",
    "task_publish",
    "task_result_file",
    "task_results_zip",
    "token_create",
    "token_revoke",
]
