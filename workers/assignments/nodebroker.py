"""The node broker: where untrusted provider nodes take their jobs from.

With ``PROOFWORK_NODE_BROKER_URL`` set, node queues live on a RabbitMQ vhost of their
own. Through RabbitMQ's management HTTP API the platform gives each node a broker user
named for its address with a random password, declares its durable queue ``w.<address>``
and lets that user read (consume) that one queue and nothing else: no configure
permission (it declares and deletes nothing), no write permission (it publishes and binds
nowhere). The platform publishes jobs with its own user, which may write to the default
exchange only. Registering again rotates the node's password; suspending the node or
deactivating its owner revokes its permissions and closes its connections; resuming
restores them; retiring deletes its user and its queue (docs/node-broker.md).

Without a node broker, node queues are on the filesystem broker under ``var/`` (make run's
local agent): the platform's own Redis is never a node's broker.
"""

from __future__ import annotations

import logging
import re
import secrets
import ssl
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit
from uuid import UUID

import httpx
from amqp.exceptions import AMQPError
from celery import Celery
from django.conf import settings
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError

from config.celery import enqueue
from workers.models import Worker

log = logging.getLogger(__name__)

JOB_TASK = "agent.run_assignment"
API_TIMEOUT = 10.0
# Permission patterns are regular expressions matched against whole resource names.
NOTHING = "^$"
DEFAULT_EXCHANGE = "^amq\\.default$"  # the default exchange's name in RabbitMQ's permissions
# A node's user limits: the agent holds one connection with a few channels; a restart or a
# reconnect may overlap its old one for a moment. Past them the broker refuses the login or
# the channel, so one node cannot use up the broker's file descriptors and memory for all.
MAX_CONNECTIONS = 8
MAX_CHANNELS = 32
_vhost_ready: set[str] = set()
_publisher: Celery | None = None


class NodeBrokerError(RuntimeError):
    """The node broker's management API failed or could not be reached."""


def configured() -> bool:
    """Whether node queues are on RabbitMQ (else on the filesystem broker, embedded)."""
    return bool(settings.NODE_BROKER_URL)


def vhost() -> str:
    """The vhost of node queues: the path of ``NODE_BROKER_URL``."""
    return unquote(urlsplit(str(settings.NODE_BROKER_URL)).path[1:])


def queue_name(address: str) -> str:
    """A node's own queue (``Worker.queue``)."""
    return f"w.{address}"


def read_own_queue(address: str) -> dict[str, str]:
    """A node user's permissions: read (consume, get, purge) its own queue; nothing else."""
    return {"configure": NOTHING, "write": NOTHING, "read": f"^{re.escape(queue_name(address))}$"}


def node_url(address: str, password: str) -> str:
    """The broker URL a node logs in with: the public address, its user and password."""
    public = urlsplit(str(settings.NODE_BROKER_PUBLIC_URL))
    netloc = f"{quote(address, safe='')}:{quote(password, safe='')}@{public.netloc}"
    return urlunsplit((public.scheme, netloc, public.path, public.query, ""))


# --- The management API ------------------------------------------------------------


def _client() -> httpx.Client:
    verify: Any = settings.NODE_BROKER_CA or True
    if settings.NODE_BROKER_CA:
        verify = ssl.create_default_context(cafile=settings.NODE_BROKER_CA)
    return httpx.Client(
        base_url=str(settings.NODE_BROKER_API_URL).rstrip("/") + "/api",
        auth=(settings.NODE_BROKER_API_USER, settings.NODE_BROKER_API_PASSWORD),
        timeout=API_TIMEOUT,
        verify=verify,
    )


def _call(
    http: httpx.Client, method: str, path: str, body: dict[str, Any] | None = None, *, missing_ok: bool = False
) -> httpx.Response:
    """One management API request; NodeBrokerError unless it succeeded (or, with
    ``missing_ok``, found nothing to delete)."""
    try:
        response = http.request(method, path, json=body, headers={"X-Reason": "proofwork: node access changed"})
    except httpx.HTTPError as exc:
        raise NodeBrokerError(f"{method} {path}: the node broker's management API is unreachable ({exc})") from None
    if response.status_code < 300 or (missing_ok and response.status_code == 404):
        return response
    raise NodeBrokerError(f"{method} {path}: HTTP {response.status_code} {response.text[:200]}")


def _q(name: str) -> str:
    return quote(name, safe="")


def ensure_vhost(http: httpx.Client) -> None:
    """Create the vhost of node queues and the platform's publishing user (once per process).

    The publishing user may write to the default exchange only: it reaches every node's
    queue by routing key and can declare, bind or read nothing. The administrator gets
    full permissions on the vhost: the management API declares and deletes queues as it.
    """
    name = vhost()
    if name in _vhost_ready:
        return
    platform = urlsplit(str(settings.NODE_BROKER_URL))
    _call(http, "PUT", f"/vhosts/{_q(name)}", {"description": "Proofwork provider nodes' queues"})
    _call(
        http,
        "PUT",
        f"/users/{_q(unquote(platform.username or ''))}",
        {"password": unquote(platform.password or ""), "tags": ""},
    )
    _call(
        http,
        "PUT",
        f"/permissions/{_q(name)}/{_q(unquote(platform.username or ''))}",
        {"configure": NOTHING, "write": DEFAULT_EXCHANGE, "read": NOTHING},
    )
    _call(
        http,
        "PUT",
        f"/permissions/{_q(name)}/{_q(settings.NODE_BROKER_API_USER)}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    _vhost_ready.add(name)


def provision_node(address: str, *, may_consume: bool) -> str:
    """Give the node a fresh broker password and its durable queue; returns its broker URL.

    Any earlier password stops working and the connections made with it are closed (a
    node registering again may be replacing a leaked copy). ``may_consume`` False (a
    suspended worker registering again) leaves it without permissions until resumed.
    Raises NodeBrokerError when the broker cannot be told.
    """
    password = secrets.token_urlsafe(32)
    with _client() as http:
        ensure_vhost(http)
        _call(http, "PUT", f"/users/{_q(address)}", {"password": password, "tags": ""})
        for limit, value in (("max-connections", MAX_CONNECTIONS), ("max-channels", MAX_CHANNELS)):
            _call(http, "PUT", f"/user-limits/{_q(address)}/{limit}", {"value": value})
        _call(
            http,
            "PUT",
            f"/queues/{_q(vhost())}/{_q(queue_name(address))}",
            {"durable": True, "auto_delete": False, "arguments": {}},
        )
        if may_consume:
            _call(http, "PUT", f"/permissions/{_q(vhost())}/{_q(address)}", read_own_queue(address))
        else:
            _call(http, "DELETE", f"/permissions/{_q(vhost())}/{_q(address)}", missing_ok=True)
        _close_connections(http, address)
    return node_url(address, password)


def revoke_node(address: str) -> None:
    """Take the node's permissions away and close its open connections at once.

    Its login is then refused (it has no access to the vhost) until ``restore_node``.
    """
    with _client() as http:
        _call(http, "DELETE", f"/permissions/{_q(vhost())}/{_q(address)}", missing_ok=True)
        _close_connections(http, address)


def restore_node(address: str) -> None:
    """Give a resumed node back its permission to read its own queue.

    A node whose broker user is gone (registered while no node broker was configured)
    needs to register again; that is logged, not raised.
    """
    with _client() as http:
        if _call(http, "GET", f"/users/{_q(address)}", missing_ok=True).status_code == 404:
            log.warning("node %s has no broker user: it must register again to take jobs", address)
            return
        _call(http, "PUT", f"/permissions/{_q(vhost())}/{_q(address)}", read_own_queue(address))


def remove_node(address: str) -> None:
    """Delete a retired node's broker user and its queue, and close its connections."""
    with _client() as http:
        _call(http, "DELETE", f"/permissions/{_q(vhost())}/{_q(address)}", missing_ok=True)
        _close_connections(http, address)
        _call(http, "DELETE", f"/users/{_q(address)}", missing_ok=True)
        _call(http, "DELETE", f"/queues/{_q(vhost())}/{_q(queue_name(address))}", missing_ok=True)


def _close_connections(http: httpx.Client, address: str) -> None:
    # RabbitMQ checks permissions when a connection opens and caches them per channel:
    # an open connection keeps consuming after a revocation until it is closed.
    _call(http, "DELETE", f"/connections/username/{_q(address)}", missing_ok=True)


def sync_node(worker_id: UUID | str) -> None:
    """Make the node's broker access match its worker row: retired → removed; suspended,
    or of a deactivated account → revoked; active → restored. Raises NodeBrokerError."""
    if not configured():
        return
    worker = Worker.objects.select_related("owner").filter(pk=worker_id).first()
    if worker is None:
        return
    if worker.state == Worker.State.RETIRED:
        remove_node(worker.address)
    elif worker.state == Worker.State.ACTIVE and worker.owner.is_active:
        restore_node(worker.address)
    else:
        revoke_node(worker.address)


def sync_node_soon(worker_id: UUID | str) -> None:
    """``sync_node`` now (after the commit that changed the worker); when the broker
    cannot be told, log it and leave it to a retried task on the control queue. The
    worker's API token is refused from the commit on either way."""
    if not configured():
        return
    try:
        sync_node(worker_id)
    except NodeBrokerError as exc:
        log.error("node broker access of worker %s not updated (%s); retrying in the background", worker_id, exc)
        enqueue("workers.sync_node_broker", str(worker_id))


# --- Publishing jobs ----------------------------------------------------------------


def publisher() -> Celery:
    """The Celery app that sends jobs to node queues: the node broker as the platform's
    publishing user, or the filesystem broker under var/ when none is configured."""
    global _publisher
    if _publisher is None:
        _publisher = _make_publisher()
    return _publisher


def _make_publisher() -> Celery:
    # Not the current app: shared tasks (the platform's own, on Redis) must never be sent
    # through this one.
    options: dict[str, Any]
    if configured():
        app = Celery("proofwork-nodes", broker=settings.NODE_BROKER_URL, set_as_current=False)
        # Confirmed publishes: a job the broker did not take raises here, not silently.
        options = {"confirm_publish": True}
        from workers.agent.app import amqp_tls  # the node's own TLS rule: one definition

        app.conf.broker_use_ssl = amqp_tls(str(settings.NODE_BROKER_URL), settings.NODE_BROKER_CA or None)
    else:
        folder = str(settings.NODE_QUEUE_DIR)
        app = Celery("proofwork-nodes", broker="filesystem://", set_as_current=False)
        app.conf.broker_transport = "workers.agent.fsbroker:Transport"
        options = {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "control_folder": str(settings.CELERY_BROKER_DIR / "control"),
            "store_processed": False,
        }
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        broker_transport_options=options,
    )
    return app


# What a publish raises when the broker is away or refuses it.
PUBLISH_ERRORS: tuple[type[BaseException], ...] = (OperationalError, AMQPError, OSError)


def publish_job(address: str, assignment_id: str) -> None:
    """Send one job to the node's queue: JSON, the assignment id only, to the default
    exchange with the queue's name as routing key (the platform declared the queue)."""
    name = queue_name(address)
    queue = Queue(name, Exchange(""), routing_key=name, no_declare=True)
    # Celery takes a Queue here as well as a name (its stubs say a name only).
    publisher().send_task(JOB_TASK, args=[assignment_id], queue=queue, serializer="json")  # type: ignore[arg-type]


VERIFY_TASK = "agent.verify_segments"


def publish_verification(address: str, job_id: str) -> None:
    """Send a verification job (workers.assignments.delegation) to the node's queue, as
    ``publish_job`` sends a job: JSON, the verification job's id only."""
    name = queue_name(address)
    queue = Queue(name, Exchange(""), routing_key=name, no_declare=True)
    publisher().send_task(VERIFY_TASK, args=[job_id], queue=queue, serializer="json")  # type: ignore[arg-type]
