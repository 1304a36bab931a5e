"""The demo's logins, one place for the commands that create them (``demo``,
``demo_provider``) and the one that prints them once the site answers (``demo_banner``)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoLogin:
    """A demo account: who it is for, and the username and password it is created with."""

    role: str
    username: str
    password: str


def requester() -> DemoLogin:
    """The demo requester (``PROOFWORK_DEMO_USER`` / ``PROOFWORK_DEMO_PASSWORD``)."""
    return DemoLogin(
        "requester",
        os.environ.get("PROOFWORK_DEMO_USER", "demo"),
        os.environ.get("PROOFWORK_DEMO_PASSWORD", "demo-password-123"),
    )


def provider() -> DemoLogin:
    """The demo provider, owner of the local agent (``PROOFWORK_DEMO_PROVIDER`` /
    ``PROOFWORK_DEMO_PROVIDER_PASSWORD``)."""
    return DemoLogin(
        "provider",
        os.environ.get("PROOFWORK_DEMO_PROVIDER", "provider"),
        os.environ.get("PROOFWORK_DEMO_PROVIDER_PASSWORD", "provider-password-123"),
    )
