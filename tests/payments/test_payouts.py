"""Payouts: a provider links a Connect account, requests a payout, an admin approves
it in the admin panel, PAYOUT burns the credits and the transfer goes to localstripe; a
refused or reversed transfer restores them. Connect events are signed with the test secret."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger import services as ledger
from ledger.models import Transaction
from ledger.units import UNITS_PER_CREDIT
from payments import services
from payments.models import ConnectedAccount, PayoutRequest
from tests.factories import UserFactory
from tests.payments.conftest import event
from tests.payments.helpers import chain_agrees

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Any, db: Any) -> Any:
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    return client


def link(provider_client: Any, ls: Any, deliver: Any, *, onboard: bool = True) -> ConnectedAccount:
    """Link a Connect account through the API and, optionally, finish onboarding at
    Stripe (localstripe's helper) and deliver the account.updated event."""
    response = provider_client.post("/api/v1/payments/account/", {}, format="json")
    assert response.status_code == 201, response.content
    account = ConnectedAccount.objects.get()
    assert response.json()["url"].endswith(f"/onboard/{account.account_id}")
    if onboard:
        state = ls.post(f"/_config/proofwork/accounts/{account.account_id}/enable").json()
        assert deliver(event("account.updated", state)).json()["outcome"] == "updated"
        account.refresh_from_db()
    return account


def approve(admin_client: Any, payout: PayoutRequest, capture: Any) -> Any:
    with capture(execute=True):
        return admin_client.post(
            "/admin/payments/payoutrequest/",
            {
                "action": "approve",
                "_selected_action": [str(payout.pk)],
                "confirm": "yes",
                "reason": "Checked the account.",
            },
            follow=True,
        )


def test_provider_is_paid_out_after_admin_approval(
    alice: Any,
    alice_client: Any,
    admin_client: Any,
    ls: Any,
    deliver: Any,
    eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    # Not linked yet: the request names the destination.
    response = alice_client.post("/api/v1/payments/payouts/", {"amount": "60"}, format="json")
    assert response.status_code == 400
    assert "destination" in response.json()
    account = link(alice_client, ls, deliver, onboard=False)
    assert not account.payouts_enabled
    assert "destination" in alice_client.post("/api/v1/payments/payouts/", {"amount": "60"}, format="json").json()
    # Onboarding done at Stripe; account.updated tells us.
    state = ls.post(f"/_config/proofwork/accounts/{account.account_id}/enable").json()
    assert deliver(event("account.updated", state)).json()["outcome"] == "updated"
    assert alice_client.get("/api/v1/payments/account/").json()["payouts_enabled"] is True

    before = ledger.balance(alice)
    response = alice_client.post("/api/v1/payments/payouts/", {"amount": "60"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "requested"
    payout = PayoutRequest.objects.get()
    assert (payout.units, payout.amount, payout.destination) == (60 * UNITS_PER_CREDIT, 6000, account.account_id)
    assert ledger.balance(alice) == before  # nothing moves before approval
    assert "status" in alice_client.post("/api/v1/payments/payouts/", {"amount": "60"}, format="json").json()

    page = approve(admin_client, payout, django_capture_on_commit_callbacks)
    assert "approved" in page.content.decode()
    payout.refresh_from_db()
    assert payout.status == "paid"
    assert payout.transfer_id.startswith("tr_")
    assert payout.payout_tx is not None
    assert payout.payout_tx.type == "PAYOUT"
    assert ledger.balance(alice) == before - 60 * UNITS_PER_CREDIT - services.payout_fee()
    # Approving again does nothing.
    page = approve(admin_client, payout, django_capture_on_commit_callbacks)
    assert "not requested" in page.content.decode()
    assert Transaction.objects.filter(type="PAYOUT").count() == 1

    alice_client.force_login(alice)
    wallet = alice_client.get("/wallet/").content.decode()
    assert "Paid" in wallet
    assert payout.transfer_id in wallet
    assert payout.payout_tx.hash[:12] in wallet
    summary = chain_agrees()
    assert summary.payouts == 60 * UNITS_PER_CREDIT


def test_a_refused_transfer_restores_the_credits(
    alice: Any,
    alice_client: Any,
    admin_client: Any,
    ls: Any,
    deliver: Any,
    eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    account = link(alice_client, ls, deliver, onboard=False)
    # We believe the account can be paid (a forged-free but stale account.updated), Stripe does not.
    services.update_account(account.account_id, payouts_enabled=True, details_submitted=True)
    before = ledger.balance(alice)
    payout = services.request_payout(alice, 50 * UNITS_PER_CREDIT)
    approve(admin_client, payout, django_capture_on_commit_callbacks)
    payout.refresh_from_db()
    assert payout.status == "failed"
    assert "capabilities" in payout.failure_message
    assert payout.restore_tx is not None
    assert payout.restore_tx.type == "DEPOSIT"
    assert ledger.balance(alice) == before - services.payout_fee()  # the credits are back; the gas was spent
    chain_agrees()


def test_a_reversed_transfer_restores_the_credits_once(
    alice: Any, alice_client: Any, ls: Any, deliver: Any, eager_celery: None, django_capture_on_commit_callbacks: Any
) -> None:
    link(alice_client, ls, deliver)
    payout = services.request_payout(alice, 50 * UNITS_PER_CREDIT)
    with django_capture_on_commit_callbacks(execute=True):
        services.approve_payout(payout.pk, None)
    payout.refresh_from_db()
    assert payout.status == "paid"
    after_payout = ledger.balance(alice)
    transfer = {"id": payout.transfer_id, "object": "transfer", "amount": 5000, "amount_reversed": 1000}
    assert deliver(event("transfer.reversed", transfer)).json()["outcome"] == "ignored: partial reversal"
    evt = event("transfer.reversed", {**transfer, "amount_reversed": 5000, "reversed": True})
    assert deliver(evt).json()["outcome"] == "restored"
    assert deliver(evt).json()["outcome"] == "duplicate"
    assert deliver(event("transfer.reversed", {**transfer, "amount_reversed": 5000})).json()["outcome"] == (
        "ignored: not sent"
    )
    payout.refresh_from_db()
    assert payout.status == "failed"
    assert ledger.balance(alice) == after_payout + 50 * UNITS_PER_CREDIT
    chain_agrees()


@pytest.mark.parametrize(
    ("amount", "field", "message"),
    [
        ("49.99", "amount", "smallest payout is 50"),
        ("5000", "amount", "this payout needs"),
        ("50.001", "amount", "whole number"),
        ("abc", "amount", "valid number"),
        ("-60", "amount", "positive"),
    ],
)
def test_bad_payout_requests_name_the_field(
    alice_client: Any, ls: Any, deliver: Any, amount: str, field: str, message: str
) -> None:
    link(alice_client, ls, deliver)
    response = alice_client.post("/api/v1/payments/payouts/", {"amount": amount}, format="json")
    assert response.status_code == 400
    assert message in " ".join(response.json()[field]), response.json()
    assert not PayoutRequest.objects.exists()


def test_credits_spent_before_approval_make_the_approval_fail_cleanly(
    alice: Any,
    bob: Any,
    alice_client: Any,
    admin_client: Any,
    ls: Any,
    deliver: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    link(alice_client, ls, deliver)
    payout = services.request_payout(alice, 900 * UNITS_PER_CREDIT)
    ledger.transfer(alice, ledger.ensure_user_account(bob).address, 500 * UNITS_PER_CREDIT, reference="spent")
    page = approve(admin_client, payout, django_capture_on_commit_callbacks)
    assert "no longer has these credits" in page.content.decode()
    payout.refresh_from_db()
    assert payout.status == "requested"
    assert not Transaction.objects.filter(type="PAYOUT").exists()


def test_admin_can_reject(alice: Any, alice_client: Any, admin_client: Any, ls: Any, deliver: Any) -> None:
    link(alice_client, ls, deliver)
    payout = services.request_payout(alice, 50 * UNITS_PER_CREDIT)
    action = {"action": "reject", "_selected_action": [str(payout.pk)]}
    asked = admin_client.post("/admin/payments/payoutrequest/", action)
    assert "Reason:" in asked.content.decode()
    payout.refresh_from_db()
    assert payout.status == "requested"  # the confirmation page changed nothing
    admin_client.post(
        "/admin/payments/payoutrequest/", {**action, "confirm": "yes", "reason": "Bank details mismatch."}
    )
    payout.refresh_from_db()
    assert payout.status == "rejected"
    # The provider reads who refused and why, never the operator's account name.
    assert payout.failure_message == "Rejected by an operator: Bank details mismatch."
    client = Client()
    client.force_login(alice)
    assert "Rejected by an operator: Bank details mismatch." in client.get("/wallet/").content.decode()


def test_payout_form_on_the_wallet(alice: Any, client: Any, ls: Any, deliver: Any, alice_client: Any) -> None:
    link(alice_client, ls, deliver)
    client.force_login(alice)
    assert 'id="payout-form"' in client.get("/wallet/").content.decode()
    page = client.post("/payments/payout/", {"amount": "75"}, follow=True).content.decode()
    assert "Payout of 75 credits requested" in page
    assert PayoutRequest.objects.get().units == 75 * UNITS_PER_CREDIT
    page = client.post("/payments/payout/", {"amount": "10"}, follow=True).content.decode()
    assert "smallest payout is 50" in page
    # Beyond the decimal context ('1e999999999' overflowed: a 500) or merely absurd
    # ('1e999990' took 25 s of CPU to convert): refused at once, nothing requested.
    for absurd in ("1e999999999", "1e999990", "-1e999990"):
        response = client.post("/payments/payout/", {"amount": absurd}, follow=True)
        assert response.status_code == 200
        assert "amount: an amount has at most 30 digits before the decimal point" in response.content.decode()
    assert PayoutRequest.objects.count() == 1


def test_connect_return_page_refreshes_the_account(alice: Any, client: Any, ls: Any) -> None:
    client.force_login(alice)
    response = client.post("/payments/connect/")
    assert response.status_code == 302
    account = ConnectedAccount.objects.get(user=alice)
    assert response["Location"].endswith(f"/onboard/{account.account_id}")
    ls.post(f"/_config/proofwork/accounts/{account.account_id}/enable")
    page = client.get("/payments/connect/return/", follow=True).content.decode()
    assert "can receive payouts" in page
    account.refresh_from_db()
    assert account.payouts_enabled
