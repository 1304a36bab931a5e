// Buying credits on the wallet page: the API creates a PaymentIntent, Stripe.js confirms
// it with the card (card data goes to Stripe, never to us), and the page waits for the
// webhook to credit the payment. Without Stripe.js the form still offers Checkout.
(function () {
  "use strict";
  const form = document.getElementById("buy-form");
  if (!form) return;
  const status = document.getElementById("buy-status");
  const say = (text) => { status.textContent = text; };
  if (typeof window.Stripe !== "function") {
    say("The card form could not load (Stripe.js is unreachable).");
    return;
  }
  const stripe = window.Stripe(form.dataset.publishableKey);
  const card = stripe.elements().create("card");
  card.mount("#card-element");
  const csrf = form.querySelector("[name=csrfmiddlewaretoken]").value;

  async function api(url, options) {
    const response = await fetch(url, {
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf, Accept: "application/json" },
      ...options,
    });
    const body = await response.json().catch(() => ({}));
    return { ok: response.ok, body };
  }

  function firstError(body) {
    for (const [field, messages] of Object.entries(body || {})) {
      const text = Array.isArray(messages) ? messages.join(" ") : String(messages);
      return field === "detail" ? text : `${field}: ${text}`;
    }
    return "The payment could not be started.";
  }

  async function waitForCredit(paymentId) {
    for (let i = 0; i < 60; i++) {
      const { ok, body } = await api(`${form.dataset.api}${paymentId}/`, { method: "GET" });
      if (ok && body.status === "succeeded") {
        say(`Paid: ${body.credits} credits added.`);
        window.location.reload();
        return;
      }
      if (ok && body.status === "failed") {
        say(`Payment failed: ${body.failure_message}`);
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    say("Paid; the credits appear once Stripe confirms the payment. Reload in a moment.");
  }

  form.addEventListener("submit", async (event) => {
    if (event.submitter && event.submitter.name === "checkout") return; // plain POST to Checkout
    event.preventDefault();
    const button = document.getElementById("buy-submit");
    button.disabled = true;
    say("Starting the payment…");
    try {
      const credits = parseInt(form.elements.credits.value, 10);
      const { ok, body } = await api(form.dataset.api, {
        method: "POST",
        body: JSON.stringify({ credits: Number.isNaN(credits) ? null : credits }),
      });
      if (!ok) {
        say(firstError(body));
        return;
      }
      say("Confirming with your bank…");
      const result = await stripe.confirmCardPayment(body.client_secret, { payment_method: { card } });
      if (result.error) {
        say(`Payment failed: ${result.error.message || "the card was declined"}`);
        return;
      }
      say("Payment confirmed; waiting for the credits…");
      await waitForCredit(body.payment.id);
    } finally {
      button.disabled = false;
    }
  });
})();
