from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView

from ledger.api import views

urlpatterns = [
    path("blocks/", views.BlockList.as_view(), name="ledger-blocks"),
    path("blocks/<int:height>/", views.BlockDetail.as_view(), name="ledger-block"),
    path("blocks/<int:height>/transactions/", views.BlockTransactions.as_view(), name="ledger-block-transactions"),
    path("transactions/", views.TransactionSubmit.as_view(), name="ledger-submit"),
    path("transactions/<str:hash>/", views.TransactionDetail.as_view(), name="ledger-transaction"),
    path("transactions/<str:hash>/proof", views.TransactionProof.as_view(), name="ledger-proof"),
    # With a slash, as every other ledger URL ends: redirected to the one above.
    path("transactions/<str:hash>/proof/", RedirectView.as_view(pattern_name="ledger-proof", permanent=True)),
    path("accounts/<str:address>/", views.AccountDetail.as_view(), name="ledger-account"),
    path(
        "accounts/<str:address>/transactions/",
        views.AccountTransactions.as_view(),
        name="ledger-account-transactions",
    ),
    path("wallet/", views.Wallet.as_view(), name="ledger-wallet"),
]
