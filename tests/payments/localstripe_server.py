"""localstripe (the fake Stripe server from PyPI) for the tests, bound to 127.0.0.1.

Run as ``python -m tests.payments.localstripe_server PORT``. Besides what localstripe
implements (customers, PaymentIntents, test cards, signed webhooks), this adds the few
things the payments app calls that it lacks, as small in-memory fakes with Stripe's
shapes: Connect accounts, account links and transfers, Checkout Sessions, and a
stand-in for Stripe.js (``/_config/proofwork/stripe.js``) whose confirmCardPayment
confirms the PaymentIntent with the typed card. Its state lives in memory only.
"""

from __future__ import annotations

import json
import random
import string
import sys
import time
from typing import Any

from aiohttp import web
from localstripe import resources
from localstripe.errors import UserError
from localstripe.server import app, get_post_data, json_response

# localstripe pickles its store to /tmp/localstripe.pickle after every write: a file
# every localstripe on this machine shares. Keep each run's state to itself.
resources.Store.dump_to_disk = lambda self: None

ACCOUNTS: dict[str, dict[str, Any]] = {}
TRANSFERS: dict[str, dict[str, Any]] = {}
IDEMPOTENT: dict[str, dict[str, Any]] = {}
SESSIONS: dict[str, dict[str, Any]] = {}


def _id(prefix: str) -> str:
    return prefix + "".join(random.choices(string.ascii_letters + string.digits, k=16))


def _base(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def create_account(request: web.Request) -> web.Response:
    data = await get_post_data(request) or {}
    account = {
        "id": _id("acct_"),
        "object": "account",
        "type": data.get("type", "express"),
        "email": data.get("email"),
        "metadata": data.get("metadata") or {},
        "charges_enabled": False,
        "payouts_enabled": False,
        "details_submitted": False,
        "created": int(time.time()),
    }
    ACCOUNTS[account["id"]] = account
    return json_response(account)


def _account(account_id: str) -> dict[str, Any]:
    if account_id not in ACCOUNTS:
        raise UserError(404, f"No such account: '{account_id}'", {"code": "resource_missing"})
    return ACCOUNTS[account_id]


async def retrieve_account(request: web.Request) -> web.Response:
    return json_response(_account(request.match_info["id"]))


async def create_account_link(request: web.Request) -> web.Response:
    data = await get_post_data(request) or {}
    account = _account(str(data.get("account", "")))
    return json_response(
        {
            "object": "account_link",
            "url": f"{_base(request)}/_config/proofwork/onboard/{account['id']}",
            "created": int(time.time()),
            "expires_at": int(time.time()) + 300,
        }
    )


async def finish_onboarding(request: web.Request) -> web.Response:
    """Test helper: what the provider finishing Stripe's onboarding does."""
    account = _account(request.match_info["id"])
    account.update(payouts_enabled=True, details_submitted=True, charges_enabled=True)
    return json_response(account)


async def create_transfer(request: web.Request) -> web.Response:
    key = request.headers.get("Idempotency-Key", "")
    if key and key in IDEMPOTENT:
        return json_response(IDEMPOTENT[key])
    data = await get_post_data(request) or {}
    account = _account(str(data.get("destination", "")))
    if not account["payouts_enabled"]:
        raise UserError(
            400,
            "Your destination account needs to have at least one of the following capabilities enabled: transfers",
            {"code": "insufficient_capabilities_for_transfer"},
        )
    transfer = {
        "id": _id("tr_"),
        "object": "transfer",
        "amount": int(data["amount"]),
        "amount_reversed": 0,
        "currency": data["currency"],
        "destination": account["id"],
        "metadata": data.get("metadata") or {},
        "reversed": False,
        "created": int(time.time()),
    }
    TRANSFERS[transfer["id"]] = transfer
    if key:
        IDEMPOTENT[key] = transfer
    return json_response(transfer)


async def create_checkout_session(request: web.Request) -> web.Response:
    data = await get_post_data(request) or {}
    items = data.get("line_items") or []
    total = sum(int(i["price_data"]["unit_amount"]) * int(i.get("quantity", 1)) for i in items)
    session = {
        "id": _id("cs_test_"),
        "object": "checkout.session",
        "mode": data.get("mode"),
        "amount_total": total,
        "currency": items[0]["price_data"]["currency"] if items else None,
        "metadata": data.get("metadata") or {},
        "client_reference_id": data.get("client_reference_id"),
        "payment_intent": None,
        "payment_status": "unpaid",
        "status": "open",
        "success_url": data.get("success_url"),
        "cancel_url": data.get("cancel_url"),
    }
    session["url"] = f"{_base(request)}/_config/proofwork/checkout/{session['id']}"
    SESSIONS[str(session["id"])] = session
    return json_response(session)


async def confirm_card(request: web.Request) -> web.Response:
    """What Stripe.js confirmCardPayment does: the card goes to Stripe, which confirms
    the PaymentIntent the client secret names. Declined cards answer 402."""
    data = json.loads(await request.text())
    secret = str(data.get("client_secret", ""))
    pi = resources.PaymentIntent._api_retrieve(secret.split("_secret_")[0])
    if pi.client_secret != secret:
        raise UserError(401, "Unauthorized")
    card = data.get("card") or {}
    pm = resources.PaymentMethod(
        type="card",
        card={
            "number": str(card.get("number", "")),
            "exp_month": card.get("exp_month", 12),
            "exp_year": card.get("exp_year", 2030),
            "cvc": str(card.get("cvc", "123")),
        },
    )
    pi.payment_method = pm.id
    pi._confirm(on_failure_now=pi._report_failure)
    return json_response(pi._export())


STRIPE_JS = """
// Stand-in for Stripe.js served by the test Stripe: a card form and confirmCardPayment.
(function () {
  const base = new URL(document.currentScript.src).origin;
  window.Stripe = function () {
    return {
      elements() {
        return {
          create() {
            const inputs = {};
            return {
              mount(selector) {
                const root = document.querySelector(selector);
                for (const [name, label] of [["number", "Card number"], ["exp", "MM / YY"], ["cvc", "CVC"]]) {
                  const input = document.createElement("input");
                  input.name = "card-" + name;
                  input.setAttribute("aria-label", label);
                  input.placeholder = label;
                  root.appendChild(input);
                  inputs[name] = input;
                }
              },
              _value() {
                const [month, year] = (inputs.exp.value || "12/30").split("/").map((s) => s.trim());
                return { number: inputs.number.value.replace(/\\s/g, ""), exp_month: month, exp_year: "20" + year, cvc: inputs.cvc.value };
              },
            };
          },
        };
      },
      async confirmCardPayment(clientSecret, data) {
        const response = await fetch(base + "/_config/proofwork/confirm", {
          method: "POST",
          body: JSON.stringify({ client_secret: clientSecret, card: data.payment_method.card._value() }),
        });
        const body = await response.json();
        return response.ok ? { paymentIntent: body } : { error: body.error };
      },
    };
  };
})();
"""


async def stripe_js(request: web.Request) -> web.Response:
    return web.Response(text=STRIPE_JS, content_type="application/javascript")


app.router.add_post("/v1/accounts", create_account)
app.router.add_get("/v1/accounts/{id}", retrieve_account)
app.router.add_post("/v1/account_links", create_account_link)
app.router.add_post("/v1/transfers", create_transfer)
app.router.add_post("/v1/checkout/sessions", create_checkout_session)
app.router.add_post("/_config/proofwork/accounts/{id}/enable", finish_onboarding)
app.router.add_post("/_config/proofwork/confirm", confirm_card)
app.router.add_get("/_config/proofwork/stripe.js", stripe_js)


if __name__ == "__main__":
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
