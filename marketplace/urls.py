"""Browser pages."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from marketplace import forms, views

urlpatterns = [
    path("", views.home, name="home"),
    # Accounts
    path("accounts/signup/", views.signup, name="signup"),
    path(
        "accounts/login/",
        views.LoginView.as_view(authentication_form=forms.LoginForm),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password/",
        auth_views.PasswordChangeView.as_view(form_class=forms.PasswordChangeForm),
        name="password_change",
    ),
    path("accounts/password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("accounts/password/reset/", views.PasswordResetView.as_view(), name="password_reset"),
    path("accounts/password/reset/sent/", views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path(
        "accounts/password/reset/<uidb64>/<token>/",
        views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "accounts/password/reset/complete/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
    path("account/", views.account, name="account"),
    path("account/tokens/", views.token_create, name="token-create"),
    path("account/tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    # Tasks
    path("tasks/", views.my_tasks, name="my-tasks"),
    path("tasks/new/", views.task_new, name="task-new"),
    path("tasks/new/<slug:kind>/", views.task_post, name="task-post"),
    path("tasks/new/<slug:kind>/check/", views.task_check, name="task-check"),
    path("tasks/compare/", views.task_compare, name="task-compare"),
    path("tasks/<uuid:pk>/", views.task_detail, name="task-detail"),
    path("tasks/<uuid:pk>/results.zip", views.task_results_zip, name="task-results-zip"),
    path("tasks/<uuid:pk>/results/<str:name>", views.task_result_file, name="task-result-file"),
    path("tasks/<uuid:pk>/cancel/", views.task_cancel, name="task-cancel"),
    path("tasks/<uuid:pk>/publish/", views.task_publish, name="task-publish"),
    # Datasets
    path("datasets/", views.datasets, name="datasets"),
    path("datasets/<uuid:pk>/", views.dataset_detail, name="dataset-detail"),
    path("datasets/<uuid:pk>/delete/", views.dataset_delete, name="dataset-delete"),
]
