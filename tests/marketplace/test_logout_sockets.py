"""Logging out closes that browser's live sockets: ``/ws/dashboard/`` and ``/ws/tasks/<id>/``
join a group of their session, and ending the session (logout, or signing in as someone
else over it) sends ``session.ended``, which closes them with 4401. Another browser of the
same user keeps its sockets.

Set-up runs synchronously (fixtures, services); only the socket conversations are async,
run with async_to_sync so no asyncio plugin is needed.
"""

from __future__ import annotations

import logging
import re
from importlib import import_module
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import login
from django.contrib.sessions.models import Session
from django.test import Client, RequestFactory
from django.urls import reverse

from config.asgi import application
from ledger.units import UNITS_PER_CREDIT
from marketplace import services
from marketplace.events import session_group
from tests.factories import PASSWORD, post_task
from tests.marketplace.test_consumers import ORIGIN, session_cookie
from tests.sockets import open_or_refused

pytestmark = pytest.mark.django_db(transaction=True)

CLOSED_BY_LOGOUT = {"type": "websocket.close", "code": 4401}


def browser_socket(path: str, cookie: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, path, headers=[ORIGIN, *cookie])


def session_key(cookie: list[tuple[bytes, bytes]]) -> str:
    """The session key a ``session_cookie`` header carries."""
    name, _, value = cookie[0][1].decode().partition("=")
    assert name == settings.SESSION_COOKIE_NAME
    return value


def browser(cookie: list[tuple[bytes, bytes]]) -> Client:
    """The test client as the browser that holds this session cookie (its sockets' too)."""
    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = session_key(cookie)
    return client


def test_the_session_group_is_named_from_a_hash_of_the_key() -> None:
    key = "k" * 32
    group = session_group(key)
    assert re.fullmatch(r"[a-zA-Z0-9_.-]{1,99}", group)
    assert key not in group
    assert group == session_group(key) != session_group("j" * 32)


def test_logging_out_closes_that_browsers_dashboard_and_task_tabs(bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    cookie = session_cookie("bob")
    dashboard = browser_socket("/ws/dashboard/", cookie)
    task_tab = browser_socket(f"/ws/tasks/{task.pk}/", cookie)
    reopened = browser_socket("/ws/dashboard/", cookie)

    async def conversation() -> tuple[int, list[dict[str, Any]], tuple[bool, Any]]:
        assert (await dashboard.connect())[0]
        assert (await task_tab.connect())[0]
        response = await database_sync_to_async(browser(cookie).post)(reverse("logout"))
        closed = [await tab.receive_output(timeout=5) for tab in (dashboard, task_tab)]
        again = await open_or_refused(reopened)  # what a reconnect after the logout would get
        for tab in (dashboard, task_tab, reopened):
            await tab.disconnect()
        return response.status_code, closed, again

    status, closed, again = async_to_sync(conversation)()
    assert status == 302
    assert closed == [CLOSED_BY_LOGOUT, CLOSED_BY_LOGOUT]
    assert again == (False, 4403)
    assert not Session.objects.filter(session_key=session_key(cookie)).exists()


def test_another_browser_of_the_same_user_stays_live(bob: Any) -> None:
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    shared, own = session_cookie("bob"), session_cookie("bob")  # two browsers, two sessions
    shared_tab = browser_socket("/ws/dashboard/", shared)
    own_dashboard = browser_socket("/ws/dashboard/", own)
    own_task_tab = browser_socket(f"/ws/tasks/{task.pk}/", own)

    async def conversation() -> tuple[dict[str, Any], bool, dict[str, Any], dict[str, Any]]:
        for tab in (shared_tab, own_dashboard, own_task_tab):
            assert (await tab.connect())[0]
        await database_sync_to_async(browser(shared).post)(reverse("logout"))
        closed = await shared_tab.receive_output(timeout=5)
        quiet = await own_dashboard.receive_nothing(timeout=0.3) and await own_task_tab.receive_nothing(timeout=0.1)
        await database_sync_to_async(services.cancel_task)(bob, task.pk)
        on_dashboard = await own_dashboard.receive_json_from(timeout=5)
        on_task_page = await own_task_tab.receive_json_from(timeout=5)
        for tab in (shared_tab, own_dashboard, own_task_tab):
            await tab.disconnect()
        return closed, quiet, on_dashboard, on_task_page

    closed, quiet, on_dashboard, on_task_page = async_to_sync(conversation)()
    assert closed == CLOSED_BY_LOGOUT
    assert quiet
    assert (on_dashboard["type"], on_dashboard["task_id"], on_dashboard["status"]) == (
        "dashboard.task",
        str(task.pk),
        "cancelled",
    )
    assert (on_task_page["type"], on_task_page["status"]) == ("task.status", "cancelled")
    assert Session.objects.filter(session_key=session_key(own)).exists()


def test_signing_in_as_someone_else_over_a_session_closes_its_sockets(alice: Any, bob: Any) -> None:
    """``login()`` over another user's session flushes it without ``user_logged_out``; the
    cookie the browser sent still names it. Our login page redirects a signed-in user, so
    ``login()`` is called here as any view that signs in calls it, on bob's browser's request."""
    cookie = session_cookie("bob")
    dashboard = browser_socket("/ws/dashboard/", cookie)

    def sign_in_as_alice() -> None:
        request = RequestFactory().post(reverse("login"))
        request.COOKIES[settings.SESSION_COOKIE_NAME] = session_key(cookie)
        request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key(cookie))
        login(request, alice, backend="django.contrib.auth.backends.ModelBackend")
        request.session.save()

    async def conversation() -> dict[str, Any]:
        assert (await dashboard.connect())[0]
        await database_sync_to_async(sign_in_as_alice)()
        closed: dict[str, Any] = await dashboard.receive_output(timeout=5)
        await dashboard.disconnect()
        return closed

    assert async_to_sync(conversation)() == CLOSED_BY_LOGOUT
    assert not Session.objects.filter(session_key=session_key(cookie)).exists()


def test_logging_out_after_a_password_change_closes_the_tabs_reconnected_after_it(bob: Any) -> None:
    """Changing the password cycles the session key (the cookie changes, the session goes
    on) and sends every tab of the user away to reconnect (4000, see
    test_password_sockets.py); the tabs that came back with the new cookie close when that
    browser logs out."""
    task = post_task(bob, budget=UNITS_PER_CREDIT)
    cookie = session_cookie("bob")
    client = browser(cookie)
    before = [browser_socket("/ws/dashboard/", cookie), browser_socket(f"/ws/tasks/{task.pk}/", cookie)]
    new_password = "another-horse-battery-staple"
    change = {"old_password": PASSWORD, "new_password1": new_password, "new_password2": new_password}

    def new_key() -> str:
        return str(client.cookies[settings.SESSION_COOKIE_NAME].value)

    async def conversation() -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        for tab in before:
            assert (await tab.connect())[0]
        assert (await database_sync_to_async(client.post)(reverse("password_change"), change)).status_code == 302
        sent_away = [await tab.receive_output(timeout=5) for tab in before]
        new_cookie = [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={new_key()}".encode())]
        after = [browser_socket("/ws/dashboard/", new_cookie), browser_socket(f"/ws/tasks/{task.pk}/", new_cookie)]
        for tab in after:
            assert (await tab.connect())[0]
        assert (await database_sync_to_async(client.post)(reverse("logout"))).status_code == 302
        closed = [await tab.receive_output(timeout=5) for tab in after]
        for tab in (*before, *after):
            await tab.disconnect()
        return new_key(), sent_away, closed

    key, sent_away, closed = async_to_sync(conversation)()
    assert key != session_key(cookie)  # the password change did cycle the key
    assert sent_away == [{"type": "websocket.close", "code": 4000}] * 2
    assert closed == [CLOSED_BY_LOGOUT] * 2


def test_a_logout_while_a_tab_connects_leaves_it_closed(bob: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket read its user from the session as it connected; the logout lands before it
    joins its session's group, so that logout's ``session.ended`` could not reach it."""
    cookie = session_cookie("bob")
    layer = get_channel_layer()
    assert layer is not None
    group_add = layer.group_add

    async def logout_first(group: str, channel: str) -> None:
        if group.startswith("session.") and not logged_out:
            logged_out.append(await database_sync_to_async(browser(cookie).post)(reverse("logout")))
        await group_add(group, channel)

    logged_out: list[Any] = []
    monkeypatch.setattr(layer, "group_add", logout_first)
    dashboard = browser_socket("/ws/dashboard/", cookie)

    async def conversation() -> tuple[bool, Any]:
        connected, code = await open_or_refused(dashboard)
        await dashboard.disconnect()
        return connected, code

    assert async_to_sync(conversation)() == (False, 4403)  # refused, as a reconnect would be
    assert logged_out[0].status_code == 302


def test_logout_succeeds_when_the_channel_layer_is_down(
    bob: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cookie = session_cookie("bob")

    async def down(group: str, message: dict[str, Any]) -> None:
        raise ConnectionError("channel layer unreachable")

    # Monkeypatched: the layer instance this test's logout will use (tests/conftest.py gives
    # every test fresh instances) refuses every group_send, as an unreachable Redis would.
    monkeypatch.setattr(get_channel_layer(), "group_send", down)
    with caplog.at_level(logging.ERROR, logger="marketplace.events"):
        response = browser(cookie).post(reverse("logout"))

    assert response.status_code == 302
    assert not Session.objects.filter(session_key=session_key(cookie)).exists()
    assert any("session.ended" in record.getMessage() for record in caplog.records)
    assert session_key(cookie) not in caplog.text  # the group is named from a hash
