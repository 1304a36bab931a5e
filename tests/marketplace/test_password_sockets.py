"""A password change closes the user's live sockets, as Django signs out their sessions.

Django signs out every other session of a user whose password changed on that session's
next request (its auth hash no longer matches); an open ``/ws/dashboard/`` or
``/ws/tasks/<id>/`` socket makes no request, so it is told: it closes with 4401. The
browser that changed its password on the password page stays signed in, and its sockets
stay open. A change made elsewhere (the admin, the shell) closes every socket of the user.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.urls import reverse

from marketplace.units import UNITS_PER_CREDIT
from tests.factories import PASSWORD, post_task
from tests.marketplace.test_consumers import session_cookie
from tests.marketplace.test_logout_sockets import CLOSED_BY_LOGOUT, browser, browser_socket
from tests.sockets import open_or_refused

pytestmark = pytest.mark.django_db(transaction=True)

NEW_PASSWORD = "another-horse-battery-staple"
CHANGE = {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}


def test_changing_the_password_closes_the_other_browsers_sockets_only(bob: Any, alice: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    here, there, alices = session_cookie("bob"), session_cookie("bob"), session_cookie("alice")
    own = [browser_socket("/ws/dashboard/", here), browser_socket(f"/ws/tasks/{task.pk}/", here)]
    other = [browser_socket("/ws/dashboard/", there), browser_socket(f"/ws/tasks/{task.pk}/", there)]
    bystander = browser_socket("/ws/dashboard/", alices)
    changer = browser(here)

    async def conversation() -> tuple[int, list[Any], list[bool]]:
        for tab in (*own, *other, bystander):
            assert (await tab.connect())[0]
        response = await database_sync_to_async(changer.post)(reverse("password_change"), CHANGE)
        closed = [await tab.receive_output(timeout=5) for tab in other]
        still_open = [await tab.receive_nothing(timeout=0.5) for tab in (*own, bystander)]
        for tab in (*own, *other, bystander):
            await tab.disconnect()
        return response.status_code, closed, still_open

    status, closed, still_open = async_to_sync(conversation)()
    assert status == 302
    assert closed == [CLOSED_BY_LOGOUT, CLOSED_BY_LOGOUT]
    assert still_open == [True, True, True]
    # As Django's own check says over HTTP: the other browser is signed out, this one is not.
    assert browser(there).get(reverse("account")).status_code == 302
    assert changer.get(reverse("account")).status_code == 200


def test_a_password_set_outside_the_page_closes_every_socket_of_the_user(bob: Any) -> None:
    """The admin's password form and ``changepassword`` call ``set_password`` and ``save``:
    no browser made the change, so none stays signed in."""
    tabs = [browser_socket("/ws/dashboard/", session_cookie("bob")) for _ in range(2)]

    def set_password() -> None:
        bob.set_password(NEW_PASSWORD)
        bob.save()

    async def conversation() -> list[Any]:
        for tab in tabs:
            assert (await tab.connect())[0]
        await database_sync_to_async(set_password)()
        closed = [await tab.receive_output(timeout=5) for tab in tabs]
        for tab in tabs:
            await tab.disconnect()
        return closed

    assert async_to_sync(conversation)() == [CLOSED_BY_LOGOUT, CLOSED_BY_LOGOUT]


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
