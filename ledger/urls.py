"""Explorer and wallet pages."""

from __future__ import annotations

from django.urls import path

from ledger import views

urlpatterns = [
    path("explorer/", views.explorer, name="explorer"),
    path("explorer/search/", views.explorer_search, name="explorer-search"),
    path("explorer/blocks/<int:height>/", views.block_detail, name="explorer-block"),
    path("explorer/tx/<str:tx_hash>/", views.tx_detail, name="explorer-tx"),
    path("explorer/address/<str:address>/", views.address_detail, name="explorer-address"),
    path("wallet/", views.wallet, name="wallet"),
]
