"""``python -m workers.agent run``: the node's Celery app, its broker login and ``run_node``.

The node consumes only its own queue ``w.<address>`` (JSON messages carrying an
assignment id), one job at a time, acknowledging late, logged in to the platform's node
broker (RabbitMQ) as its own broker user, which may read that queue and nothing else
(docs/node-broker.md). Late acks redeliver a job lost with the process only where the
broker keeps unacknowledged messages (RabbitMQ, once the connection is gone; Redis, after
its visibility timeout); the filesystem broker deletes a message file as it is received,
so there a lost job is gone. Either way, a restarted node first asks the platform to
abandon whatever it still had running, so those jobs are reassigned at once instead of at
their deadline. Each message runs one job (``jobs.Node.run_assignment``).

Heartbeats start only once the Celery consumer is connected to its broker (the
``worker_ready`` signal), and stop whenever it loses that connection (a consumer step,
``broker_presence``): a node that cannot reach its broker never looks online, so the
platform offers it nothing it would not see.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from amqp.exceptions import AccessRefused, NotAllowed
from celery import Celery, bootsteps
from celery.exceptions import CPendingDeprecationWarning, WorkerShutdown
from celery.signals import worker_init, worker_ready
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from kombu import Queue
from kombu.transport import resolve_transport

from workers.agent import asks as node_asks
from workers.agent import capabilities, fsbroker, runners, trust, verify_job
from workers.agent.identity import Credentials, credentials_path, load_key
from workers.agent.jobs import Node
from workers.agent.reporter import Reporter

log = logging.getLogger("workers.agent")
DEFAULT_BROKER_FOLDER = "var/celery/out"  # the platform's, from the checkout's root (embedded mode)


def shutting_down() -> bool:
    """Whether the Celery worker was told to stop (Ctrl-C, SIGTERM): its signal handlers
    only set these flags, which its loop reads between messages."""
    return worker_state.should_stop is not None or worker_state.should_terminate is not None


_BLUEPRINT_RUNNING = bootsteps.RUN  # type: ignore[attr-defined]  # missing from celery-types


def broker_presence(reporter: Reporter) -> type[bootsteps.StartStopStep]:
    """A consumer step that tells ``reporter`` whether the node holds its broker connection.

    Celery starts the consumer's steps once it is connected and consuming (this one after
    ``Tasks``, the queue's consumer) and stops them all when the connection is lost, before
    it reconnects; while the broker stays away, the steps are not started again. With the
    solo pool a running job blocks the consumer, so a loss is seen only between jobs,
    never in the middle of one (whose progress keeps flowing).
    """

    class BrokerPresence(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, consumer: Any) -> None:
            reporter.broker_back()

        def stop(self, consumer: Any) -> None:
            # A restart after a lost connection stops the steps with the blueprint still
            # running; a shutdown closes it first (and run_node stops the reporter then).
            if consumer.blueprint.state == _BLUEPRINT_RUNNING:
                reporter.broker_lost()

    return BrokerPresence


def amqp_tls(broker: str, ca: str | None) -> dict[str, Any] | None:
    """TLS options for an amqps:// broker: the server's certificate checked against the
    system's CAs, or ``ca`` alone, and its host name against the URL's; None for others."""
    if not broker.startswith("amqps://"):
        return None
    context: dict[str, Any] = {"check_hostname": True}
    if ca:
        context["cafile"] = ca
    return {"context": context, "server_hostname": urlsplit(broker).hostname}


LOGIN_RETRY_MAX = 30.0  # seconds between logins the broker refuses, at most
LOGIN_GONE = 78  # exit status (EX_CONFIG) once the broker no longer knows the node's login


class PatientConsumer(Consumer):
    """Celery's consumer, waiting longer and longer (up to LOGIN_RETRY_MAX) between logins
    the broker refuses, instead of trying about five times a second.

    RabbitMQ refuses a node's login while the node is suspended or its owner's account
    deactivated (NOT_ALLOWED: no access to the vhost): Celery treats that as a lost
    connection and would reconnect at once. Waits end early when the node is told to stop.
    A login the broker no longer knows (ACCESS_REFUSED: the node was retired, or its key
    registered again, which gave it a new password) never comes back: the node says so
    and exits with LOGIN_GONE.
    """

    refusals = 0

    def connect(self) -> Any:
        try:
            connection = super().connect()
        except AccessRefused:
            log.error(
                "the broker no longer knows this node's login: the node was retired, or its key registered"
                " again (start the agent again to use the new login in worker.json); stopping"
            )
            raise WorkerShutdown(LOGIN_GONE) from None
        self.refusals = 0
        return connection

    def on_connection_error_before_connected(self, exc: Exception) -> None:
        super().on_connection_error_before_connected(exc)
        if not isinstance(exc, AccessRefused | NotAllowed):
            return
        self.refusals += 1
        delay = min(2.0**self.refusals, LOGIN_RETRY_MAX)
        log.warning(
            "the broker refuses this node's login: it is suspended or retired, or was registered again"
            " elsewhere (a new login); trying again in %.0f s",
            delay,
        )
        until = time.monotonic() + delay
        while time.monotonic() < until and not shutting_down():
            time.sleep(0.2)


def make_app(broker: str, queue: str, broker_folder: str | None = None, broker_ca: str | None = None) -> Celery:
    """The node's Celery app: JSON only, its own queue, late acks, one job at a time.

    On RabbitMQ the node's broker user may only read its own queue, which the platform
    declared: the app declares nothing (``no_declare``), and the features that need more
    (remote control, events, and gossip, mingle and heartbeats: ``run_node``) are off.
    """
    app = Celery("proofwork-agent", broker=broker)
    options: dict[str, Any] = {}
    amqp = broker.split("://", 1)[0] in ("amqp", "amqps")
    if broker.startswith("filesystem://"):
        folder = broker_folder or DEFAULT_BROKER_FOLDER
        control = str(Path(folder).parent / "control")
        options = {
            "data_folder_in": folder,
            "data_folder_out": folder,
            "control_folder": control,
            "store_processed": False,
            "polling_interval": 0.1,  # as the platform's (config/settings.py): 1 s by default
        }
    if options:
        app.conf.broker_transport = fsbroker.TRANSPORT  # whole message files (fsbroker.py)
    elif broker.split("://", 1)[0] in ("redis", "rediss"):
        # A job may run past Redis's default visibility timeout (an hour): it would be
        # delivered again. A node that died gives its job up when it starts (abandon).
        options = {"visibility_timeout": 24 * 3600}
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_queues=[Queue(queue, routing_key=queue, no_declare=amqp)],
        task_default_queue=queue,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        broker_use_ssl=amqp_tls(broker, broker_ca),
        worker_hijack_root_logger=False,
        worker_consumer="workers.agent.app:PatientConsumer",
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        # A job keeps running when the broker connection drops: the platform, not the
        # broker, decides whether it is stopped (over the node's socket, job-control.md).
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


def run_node(
    key_path: Path,
    *,
    broker: str | None,
    server: str | None,
    broker_folder: str | None = None,
    broker_ca: str | None = None,
    max_gas_price: int = trust.DEFAULT_MAX_GAS_PRICE,
    asks: list[dict[str, str]] | None = None,
) -> int:
    """Run the node until it is told to stop. ``broker`` None: the node's own broker login
    from registration (``worker.json``). ``asks`` (``--ask``) are sent before it takes a
    job; refused, the node does not start."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The app sets worker_cancel_long_running_tasks_on_connection_loss itself (make_app);
    # Celery warns about its default on every lost connection all the same.
    warnings.filterwarnings("ignore", category=CPendingDeprecationWarning, module="celery.worker.consumer.consumer")
    key = load_key(key_path)
    creds = Credentials.load(credentials_path(key_path))
    if creds.address != key.address:
        print(f"error: {credentials_path(key_path)} belongs to {creds.address}, not this key", file=sys.stderr)
        return 2
    if broker is None:
        if not creds.broker_url:
            print(
                f"error: {credentials_path(key_path)} holds no broker login (the platform runs its embedded broker):"
                " pass --broker filesystem:// --broker-folder <the platform's var/celery/out>",
                file=sys.stderr,
            )
            return 2
        broker = creds.broker_url
    problem = broker_problem(broker, broker_folder, broker_ca)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        node = Node(key, creds, server or creds.server, max_gas_price=max_gas_price)
    except httpx.InvalidURL as exc:
        print(f"error: {server or creds.server} is not a valid server URL: {exc}", file=sys.stderr)
        return 2
    node.stopping = shutting_down
    for url in {broker, creds.broker_url} - {""}:  # an overridden login is a secret all the same
        node.secrets.extend(broker_secrets(url))
    if warning := trust.insecure_server(node.server):
        print(warning, file=sys.stderr)
    if not creds.chain_id:
        log.warning("%s records no chain id (registered by an older agent): register again to pin it", key_path)
    if asks:
        # The platform takes an ask only for a kind the node offers: its capabilities first.
        node.report_capabilities(capabilities.detect())
        problem = node_asks.send_asks(node, asks)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        log.info("asks set: %s", node_asks.describe(asks))
    queue = f"w.{key.address}"
    app = make_app(broker, queue, broker_folder, broker_ca)

    def on_ready(**_: Any) -> None:
        # Celery sends this once the consumer is connected to the broker and subscribed to
        # the queue, before its loop takes the first message: only now may the node look
        # online, and anything an earlier run left running is given up first.
        node.report_capabilities(capabilities.detect())
        node.abandon_running()
        if not node.stopping():  # told to stop meanwhile: it must not look online on its way out
            node.reporter.start()

    workers: list[Any] = []

    def on_init(sender: Any, **_: Any) -> None:
        workers.append(sender)

    worker_init.connect(on_init)
    worker_ready.connect(on_ready)
    app.steps["consumer"].add(broker_presence(node.reporter))

    @app.task(name="agent.run_assignment", bind=True, acks_late=True)
    def run_assignment(self: Any, assignment_id: str) -> str:
        try:
            return node.run_assignment(str(assignment_id))
        except runners.UnsupportedKind as exc:
            log.error("%s", exc)
            return "unsupported"

    @app.task(name="agent.verify_segments", bind=True, acks_late=True)
    def verify_segments(self: Any, job_id: str) -> str:
        # Another provider's training segments to re-execute (verify_job.py); a job this
        # node cannot do is left to expire, and the platform re-executes it itself.
        try:
            return verify_job.run(node, node.key, str(job_id))
        except Exception:
            log.exception("verification job %s failed", job_id)
            return "failed"

    where = urlsplit(broker)
    shown = f"{where.scheme}://{where.hostname or ''}{f':{where.port}' if where.port else ''}{where.path}"
    print(f"Worker {key.address} consuming {queue} from {shown}; reporting to {node.server}", flush=True)
    # Gossip, mingle and worker heartbeats are broadcasts between Celery workers (exchanges
    # a node's broker user may not declare nor write to); a node talks to no other worker.
    quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    try:
        app.worker_main(
            ["worker", "--pool", "solo", "--loglevel", "INFO", "-Q", queue, "-n", f"{key.address[:16]}@%h", *quiet]
        )
    finally:
        worker_ready.disconnect(on_ready)
        worker_init.disconnect(on_init)
        node.reporter.stop()
    # worker_main drops the worker's exit status: the worker's own is returned, so a process
    # manager sees an unrecoverable error as a failure (and restarts the node), not as 0.
    return int(workers[0].exitcode or 0) if workers else 1


def broker_secrets(broker: str) -> list[str]:
    """The broker URL and its password: never streamed to a task's log."""
    try:
        password = urlsplit(broker).password
    except ValueError:
        password = None
    return [broker, *([password] if password else [])]


def broker_problem(broker: str, broker_folder: str | None, broker_ca: str | None = None) -> str | None:
    """Why ``run`` cannot use this broker, said in one line before Celery starts (Celery
    would print a traceback). The URL itself is not repeated: it may hold a password."""
    scheme = broker.split("://", 1)[0] if "://" in broker else ""
    if not scheme:
        return "--broker is not a broker URL (amqps://user:password@host/vhost, or filesystem:// in embedded mode)"
    if broker_ca is not None and not Path(broker_ca).is_file():
        return f"--broker-ca: {broker_ca} is not a file"
    try:
        resolve_transport(scheme)
    except KeyError:
        return f"--broker: there is no {scheme}:// broker transport (amqps://, amqp://, filesystem://)"
    except ImportError as exc:
        return f"--broker: the {scheme}:// transport needs a module that is not installed ({exc})"
    if scheme == "filesystem":
        folder = Path(broker_folder or DEFAULT_BROKER_FOLDER)
        if not folder.is_dir():
            return f"the broker folder {folder} does not exist (--broker-folder: the platform's var/celery/out)"
    return None
