"""A password change closes the user's live sockets, as Django signs out their sessions.

Django signs out every other session of a user whose password changed on that session's
next request (its auth hash no longer matches); an open ``/ws/dashboard/`` or
``/ws/tasks/<id>/`` socket makes no request, so it is told to: it closes with 4000 and the
page reconnects. The reconnect passes the session check only for a browser still signed
in: the one that changed the password, with the new cookie it was given. Another browser,
or a copy of the old cookie, is refused (4403).
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.urls import reverse

from ledger.units import UNITS_PER_CREDIT
from tests.factories import PASSWORD, post_task
from tests.marketplace.test_consumers import session_cookie
from tests.marketplace.test_logout_sockets import browser, browser_socket
from tests.sockets import open_or_refused

pytestmark = pytest.mark.django_db(transaction=True)

NEW_PASSWORD = "another-horse-battery-staple"
CHANGE = {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
RECONNECT = {"type": "websocket.close", "code": 4000}


def test_a_password_change_lets_back_only_the_browser_that_made_it(bob: Any, alice: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    here, there, alices = session_cookie("bob"), session_cookie("bob"), session_cookie("alice")
    bobs = [
        browser_socket("/ws/dashboard/", here),
        browser_socket(f"/ws/tasks/{task.pk}/", here),
        browser_socket("/ws/dashboard/", there),
        browser_socket(f"/ws/tasks/{task.pk}/", there),
    ]
    bystander = browser_socket("/ws/dashboard/", alices)
    changer = browser(here)

    def new_cookie() -> list[tuple[bytes, bytes]]:
        key = changer.cookies[settings.SESSION_COOKIE_NAME].value
        return [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={key}".encode())]

    async def conversation() -> tuple[int, list[Any], bool, list[Any]]:
        for tab in (*bobs, bystander):
            assert (await tab.connect())[0]
        response = await database_sync_to_async(changer.post)(reverse("password_change"), CHANGE)
        closed = [await tab.receive_output(timeout=5) for tab in bobs]
        untouched = await bystander.receive_nothing(timeout=0.5)
        for tab in (*bobs, bystander):
            await tab.disconnect()
        # What each page's reconnect gets: the changer's browser now sends its new cookie.
        reconnects = []
        for cookie in (new_cookie(), here, there):
            tab = browser_socket("/ws/dashboard/", cookie)
            reconnects.append(await open_or_refused(tab))
            await tab.disconnect()
        return response.status_code, closed, untouched, reconnects

    status, closed, untouched, reconnects = async_to_sync(conversation)()
    assert status == 302
    assert closed == [RECONNECT] * 4
    assert untouched
    # The changer is back; a copy of its old cookie and the other browser are not.
    assert reconnects == [(True, None), (False, 4403), (False, 4403)]
    assert changer.get(reverse("account")).status_code == 200
    assert browser(there).get(reverse("account")).status_code == 302


def test_a_password_set_outside_the_page_signs_every_socket_out(bob: Any) -> None:
    """The admin's password form and ``changepassword`` call ``set_password`` and ``save``:
    no browser made the change, so none is let back."""
    cookies = [session_cookie("bob") for _ in range(2)]
    tabs = [browser_socket("/ws/dashboard/", cookie) for cookie in cookies]

    def set_password() -> None:
        bob.set_password(NEW_PASSWORD)
        bob.save()

    async def conversation() -> tuple[list[Any], list[Any]]:
        for tab in tabs:
            assert (await tab.connect())[0]
        await database_sync_to_async(set_password)()
        closed = [await tab.receive_output(timeout=5) for tab in tabs]
        for tab in tabs:
            await tab.disconnect()
        again = [await open_or_refused(browser_socket("/ws/dashboard/", cookie)) for cookie in cookies]
        return closed, again

    closed, again = async_to_sync(conversation)()
    assert closed == [RECONNECT, RECONNECT]
    assert again == [(False, 4403), (False, 4403)]


def test_saving_the_user_without_a_new_password_closes_nothing(bob: Any) -> None:
    tab = browser_socket("/ws/dashboard/", session_cookie("bob"))

    def save_other_fields() -> None:
        bob.first_name = "Robert"
        bob.save()
        bob.save(update_fields=["last_login"])

    async def conversation() -> bool:
        assert (await tab.connect())[0]
        await database_sync_to_async(save_other_fields)()
        open_after = await tab.receive_nothing(timeout=0.5)
        await tab.disconnect()
        return open_after

    assert async_to_sync(conversation)()


def test_a_reconnect_with_the_signed_out_session_is_refused(bob: Any) -> None:
    cookie = session_cookie("bob")

    def set_password() -> None:
        bob.set_password(NEW_PASSWORD)
        bob.save()

    set_password()
    assert async_to_sync(open_or_refused)(browser_socket("/ws/dashboard/", cookie)) == (False, 4403)


def test_a_password_change_while_a_tab_connects_leaves_it_closed(bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket read its user (and their password's hash) as it connected; the change
    lands before it joins the user's group, so the change's event cannot reach it: the
    socket checks the session against the password itself once it has joined."""
    layer = get_channel_layer()
    assert layer is not None
    group_add = layer.group_add
    changed: list[bool] = []

    def set_password() -> None:
        bob.set_password(NEW_PASSWORD)
        bob.save()

    async def change_first(group: str, channel: str) -> None:
        if group.startswith("signins.") and not changed:
            await database_sync_to_async(set_password)()
            changed.append(True)
        await group_add(group, channel)

    monkeypatch.setattr(layer, "group_add", change_first)
    tab = browser_socket("/ws/dashboard/", session_cookie("bob"))

    async def conversation() -> tuple[bool, int | None]:
        result = await open_or_refused(tab)
        await tab.disconnect()
        return result

    assert async_to_sync(conversation)() == (False, 4403)
    assert changed == [True]
