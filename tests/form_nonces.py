"""Submitting a once-only form as a browser does: with the nonce its page was rendered with."""

from __future__ import annotations

import re
from typing import Any

from django.test import Client

NONCE = re.compile(r'<input type="hidden" name="form_nonce" value="([^"]+)">')


def nonce_in(response: Any) -> str:
    """The form nonce a rendered page carries."""
    match = NONCE.search(response.content.decode())
    assert match, "the page carries a form nonce"
    return match.group(1)


def form_nonce(client: Client, page: str) -> str:
    """GET ``page`` and read the nonce of its form, as a browser's form would send it."""
    response = client.get(page)
    assert response.status_code == 200
    return nonce_in(response)


def submit(client: Client, page: str, action: str, data: dict[str, str] | None = None) -> Any:
    """Open ``page`` and POST its form to ``action`` with ``data`` and the page's nonce."""
    return client.post(action, {**(data or {}), "form_nonce": form_nonce(client, page)})
