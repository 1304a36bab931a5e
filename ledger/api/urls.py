from __future__ import annotations

from django.urls import path

from ledger.api import views

urlpatterns = [
    path("blocks/", views.BlockList.as_view(), name="ledger-blocks"),
    path("blocks/<int:height>/", views.BlockDetail.as_view(), name="ledger-block"),
    path("transactions/", views.TransactionSubmit.as_view(), name="ledger-submit"),
    path("transactions/<str:hash>/", views.TransactionDetail.as_view(), name="ledger-transaction"),
    path("transactions/<str:hash>/proof", views.TransactionProof.as_view(), name="ledger-proof"),
    path("accounts/<str:address>/", views.AccountDetail.as_view(), name="ledger-account"),
    path("wallet/", views.Wallet.as_view(), name="ledger-wallet"),
]
