"""The node broker as a malicious node sees it: RabbitMQ, with only what registration gave.

Against the real RabbitMQ named by PROOFWORK_NODE_BROKER_URL and its management API (CI
starts both, .ci/run); without them these tests skip. A node registers through the real
API; then, holding nothing but the broker URL of its registration answer, it tries what
it must not do, with the real AMQP client, and RabbitMQ refuses it (ACCESS_REFUSED, 403).
Suspending, resuming, retiring and registering again change what that login can do at
once, open connections included.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import amqp
import pytest
from amqp.exceptions import AccessRefused, ConnectionForced, NotAllowed
from django.conf import settings
from rest_framework.test import APIClient

from protocol import keys
from protocol.keys import KeyPair
from protocol.wire import registration_message, sign_template
from tests.factories import CAPS
from workers.assignments import nodebroker
from workers.identity import services
from workers.models import RegistrationToken, Worker

needs_rabbitmq = pytest.mark.skipif(
    not settings.NODE_BROKER_URL,
    reason="no node broker: set PROOFWORK_NODE_BROKER_URL and PROOFWORK_NODE_BROKER_API_* (RabbitMQ; .ci/run does)",
)


def connect(url: str) -> amqp.Connection:
    """An AMQP connection logged in with a broker URL's user and password."""
    parts = urlsplit(url)
    conn = amqp.Connection(
        host=f"{parts.hostname}:{parts.port or 5672}",
        userid=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        virtual_host=unquote(parts.path[1:]),
        ssl=parts.scheme == "amqps",
        connect_timeout=5,
    )
    conn.connect()
    return conn


def register_node(client: APIClient, owner: Any, key: KeyPair | None = None) -> tuple[KeyPair, dict[str, Any]]:
    """Register a node through the real API: (its key, the registration answer)."""
    key = key or keys.generate()
    _, raw = services.create_registration_token(owner)
    pub = key.public_key.hex()
    offer = client.post("/api/v1/workers/challenge/", {"registration_token": raw, "public_key": pub}).json()
    response = client.post(
        "/api/v1/workers/register/",
        {
            "registration_token": raw,
            "public_key": pub,
            "signature": key.sign(registration_message(offer["challenge"], pub)).hex(),
            "capabilities": CAPS,
            "register_tx_signature": sign_template(offer["register_tx"], key).hex(),
        },
    )
    assert response.status_code in (200, 201), response.content
    return key, response.json()


@pytest.fixture
def node_broker(db: Any) -> Iterator[None]:
    """RabbitMQ for these tests; the broker users and queues they make are removed after."""
    yield
    for address in Worker.objects.values_list("address", flat=True):
        with contextlib.suppress(nodebroker.NodeBrokerError):
            nodebroker.remove_node(address)


def refused(action: Callable[[amqp.channel.Channel], Any], url: str) -> AccessRefused:
    """Run ``action`` on a fresh channel of the node's login; the broker's refusal.

    A publish is answered only by the channel's closing, so the connection is read until
    it says so (or for two seconds, which fails the test).
    """
    conn = connect(url)
    try:
        action(conn.channel())
        conn.drain_events(timeout=2)
    except AccessRefused as exc:
        return exc
    finally:
        conn.collect()
    pytest.fail("the broker did not refuse it")


def closed_within(conn: amqp.Connection, seconds: float) -> float:
    """Read the connection until the broker closes it; how long that took."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            continue
        except (ConnectionForced, ConnectionError):
            return time.monotonic() - start
    pytest.fail(f"the node's connection was still open after {seconds} s")


def consuming(url: str, address: str) -> amqp.Connection:
    conn = connect(url)
    conn.channel().basic_consume(nodebroker.queue_name(address), callback=lambda message: None)
    return conn


@needs_rabbitmq
def test_a_node_can_do_nothing_but_read_its_own_queue(alice: Any, bob: Any, node_broker: None) -> None:
    client = APIClient()
    key, body = register_node(client, alice)
    _, other = register_node(client, bob)
    url = body["broker_url"]
    own, theirs = f"w.{key.address}", f"w.{other['address']}"

    # Its own job arrives: the platform published it with its own user.
    nodebroker.publish_job(key.address, "job-for-this-node")
    conn = connect(url)
    message = conn.channel().basic_get(own, no_ack=True)
    conn.collect()
    assert message is not None
    assert json.loads(message.body)[0] == ["job-for-this-node"]

    attacks: dict[str, Callable[[amqp.channel.Channel], Any]] = {
        "publish to the platform queue": lambda ch: ch.basic_publish(
            amqp.Message("{}"), exchange="", routing_key="platform"
        ),
        "publish to the control queue": lambda ch: ch.basic_publish(
            amqp.Message("{}"), exchange="", routing_key="control"
        ),
        "publish into another node's queue": lambda ch: ch.basic_publish(
            amqp.Message("{}"), exchange="", routing_key=theirs
        ),
        "publish a job to itself": lambda ch: ch.basic_publish(amqp.Message("{}"), exchange="", routing_key=own),
        "publish to amq.direct": lambda ch: ch.basic_publish(
            amqp.Message("{}"), exchange="amq.direct", routing_key=own
        ),
        "publish to amq.fanout": lambda ch: ch.basic_publish(amqp.Message("{}"), exchange="amq.fanout", routing_key=""),
        "consume another node's queue": lambda ch: ch.basic_consume(theirs, callback=lambda m: None),
        "get from another node's queue": lambda ch: ch.basic_get(theirs),
        "purge another node's queue": lambda ch: ch.queue_purge(theirs),
        "delete another node's queue": lambda ch: ch.queue_delete(theirs),
        "delete its own queue": lambda ch: ch.queue_delete(own),
        "declare another queue": lambda ch: ch.queue_declare("platform", durable=True),
        "declare an exchange": lambda ch: ch.exchange_declare("celery.pidbox", "fanout"),
        "bind its queue to an exchange": lambda ch: ch.queue_bind(own, exchange="amq.fanout"),
        "bind another node's queue": lambda ch: ch.queue_bind(theirs, exchange="amq.direct", routing_key=own),
    }
    for name, attack in attacks.items():
        error = refused(attack, url)
        assert error.reply_code == 403, name

    # Nothing it was given names the platform's own brokers (Redis), nor another login.
    given = json.dumps(body)
    assert "redis" not in given
    for secret in (settings.REDIS_URL, settings.CELERY_BROKER_URL, settings.NODE_BROKER_URL):
        if secret and secret != "filesystem://":
            assert secret not in given
    assert urlsplit(url).username == key.address
    assert str(settings.NODE_BROKER_API_PASSWORD) not in given


@needs_rabbitmq
def test_a_node_cannot_flood_the_broker_with_connections_or_channels(alice: Any, node_broker: None) -> None:
    """The broker faces the internet and every node's login works on it: one node opening
    connections or channels without end would use up the broker's file descriptors and
    memory for all nodes. Its own user is capped; the next login or channel is refused."""
    _, body = register_node(APIClient(), alice)
    url = body["broker_url"]
    opened = [connect(url) for _ in range(nodebroker.MAX_CONNECTIONS)]
    try:
        with pytest.raises(NotAllowed):
            connect(url)
        for _ in range(nodebroker.MAX_CHANNELS):
            opened[0].channel()
        with pytest.raises(NotAllowed):
            opened[0].channel()
    finally:
        for conn in opened:
            with contextlib.suppress(Exception):
                conn.collect()


@needs_rabbitmq
def test_registering_again_rotates_the_password_and_closes_the_old_logins(alice: Any, node_broker: None) -> None:
    client = APIClient()
    key, first = register_node(client, alice)
    old = consuming(first["broker_url"], key.address)
    _, again = register_node(client, alice, key)
    assert again["created"] is False
    assert again["broker_url"] != first["broker_url"]
    assert closed_within(old, 5) < 5
    with pytest.raises(AccessRefused):
        connect(first["broker_url"])
    connect(again["broker_url"]).collect()


@needs_rabbitmq
def test_suspending_closes_the_nodes_connection_and_refuses_it_until_resumed(
    alice: Any, node_broker: None, django_capture_on_commit_callbacks: Any
) -> None:
    client = APIClient()
    key, body = register_node(client, alice)
    url = body["broker_url"]
    worker = Worker.objects.get(address=key.address)
    conn = consuming(url, key.address)
    with django_capture_on_commit_callbacks(execute=True):
        services.set_worker_state(alice, worker.pk, Worker.State.SUSPENDED)
    assert closed_within(conn, 5) < 5
    with pytest.raises(NotAllowed):  # no access to the vhost at all
        connect(url)

    with django_capture_on_commit_callbacks(execute=True):
        services.set_worker_state(alice, worker.pk, Worker.State.ACTIVE)
    nodebroker.publish_job(key.address, "after-resume")
    conn = connect(url)
    message = conn.channel().basic_get(f"w.{key.address}", no_ack=True)
    conn.collect()
    assert message is not None
    assert json.loads(message.body)[0] == ["after-resume"]


@needs_rabbitmq
def test_a_suspended_node_registering_again_gets_no_access_until_resumed(
    alice: Any, node_broker: None, django_capture_on_commit_callbacks: Any
) -> None:
    client = APIClient()
    key, _ = register_node(client, alice)
    worker = Worker.objects.get(address=key.address)
    with django_capture_on_commit_callbacks(execute=True):
        services.set_worker_state(alice, worker.pk, Worker.State.SUSPENDED)
    _, again = register_node(client, alice, key)
    with pytest.raises(NotAllowed):
        connect(again["broker_url"])
    with django_capture_on_commit_callbacks(execute=True):
        services.set_worker_state(alice, worker.pk, Worker.State.ACTIVE)
    connect(again["broker_url"]).collect()


@needs_rabbitmq
def test_a_retired_nodes_login_is_refused_and_its_connection_closed(
    alice: Any, node_broker: None, django_capture_on_commit_callbacks: Any
) -> None:
    client = APIClient()
    key, body = register_node(client, alice)
    worker = Worker.objects.get(address=key.address)
    conn = consuming(body["broker_url"], key.address)
    with django_capture_on_commit_callbacks(execute=True):
        services.set_worker_state(alice, worker.pk, Worker.State.RETIRED)
    assert closed_within(conn, 5) < 5
    with pytest.raises(AccessRefused):
        connect(body["broker_url"])


@needs_rabbitmq
def test_a_deactivated_accounts_nodes_lose_the_broker_until_it_is_reactivated(
    alice: Any, node_broker: None, django_capture_on_commit_callbacks: Any
) -> None:
    client = APIClient()
    _, body = register_node(client, alice)
    with django_capture_on_commit_callbacks(execute=True):
        alice.is_active = False
        alice.save(update_fields=["is_active"])
    with pytest.raises(NotAllowed):
        connect(body["broker_url"])
    with django_capture_on_commit_callbacks(execute=True):
        alice.is_active = True
        alice.save(update_fields=["is_active"])
    connect(body["broker_url"]).collect()


# --- When the broker's management API is down (no RabbitMQ needed) ---------------------------


@pytest.fixture
def broken_broker(settings: Any) -> None:
    """A node broker whose management API refuses connections (a closed port)."""
    settings.NODE_BROKER_URL = "amqp://platform:pw@127.0.0.1:1/proofwork-nodes"
    settings.NODE_BROKER_PUBLIC_URL = "amqp://127.0.0.1:1/proofwork-nodes"
    settings.NODE_BROKER_API_URL = "http://127.0.0.1:1"
    settings.NODE_BROKER_API_USER = "admin"
    settings.NODE_BROKER_API_PASSWORD = "admin"


@pytest.mark.django_db
def test_a_registration_the_broker_cannot_take_is_a_503_and_registers_nothing(alice: Any, broken_broker: None) -> None:
    client = APIClient()
    key = keys.generate()
    _, raw = services.create_registration_token(alice)
    pub = key.public_key.hex()
    offer = client.post("/api/v1/workers/challenge/", {"registration_token": raw, "public_key": pub}).json()
    body = {
        "registration_token": raw,
        "public_key": pub,
        "signature": key.sign(registration_message(offer["challenge"], pub)).hex(),
        "capabilities": CAPS,
        "register_tx_signature": sign_template(offer["register_tx"], key).hex(),
    }
    response = client.post("/api/v1/workers/register/", body)
    assert response.status_code == 503
    assert "node broker" in response.json()["detail"]
    assert not Worker.objects.filter(address=key.address).exists()
    # The token was not spent: the same registration goes through once the broker is back.
    assert RegistrationToken.objects.get(owner=alice).used_at is None


@pytest.mark.django_db
def test_a_suspension_the_broker_misses_still_refuses_the_node(
    alice: Any, broken_broker: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.factories import make_worker
    from workers import tasks

    retried: list[str] = []
    monkeypatch.setattr(tasks.sync_node_broker, "delay", retried.append)
    worker, token, _ = make_worker(alice)
    owner_client = APIClient()
    owner_client.force_authenticate(alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_client.post(f"/api/v1/workers/{worker.pk}/suspend/")
    assert response.status_code == 200, response.content
    assert retried == [str(worker.pk)]  # the revocation is retried on the control queue
    # Its token is refused from the commit on, whatever the broker heard.
    node = APIClient().post("/api/v1/workers/me/abandon/", {}, HTTP_AUTHORIZATION=f"Worker {token}")
    assert node.status_code in (401, 403)


# --- A real agent on the node broker -------------------------------------------------------


@needs_rabbitmq
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_agent_runs_jobs_from_its_own_login_and_loses_it_when_retired(
    alice: Any, bob: Any, tmp_path: Path
) -> None:
    from ledger import services as ledger
    from ledger.units import UNITS_PER_CREDIT
    from marketplace.models import Task, TaskStatus
    from tests.factories import post_task
    from tests.workers import processes as p
    from workers.agent.app import LOGIN_GONE
    from workers.agent.identity import Credentials, credentials_path
    from workers.assignments import scheduler
    from workers.models import Assignment

    ledger.deposit(bob, 10 * UNITS_PER_CREDIT, reference="test-deposit")
    with p.daphne(tmp_path) as url, p.platform_worker(tmp_path):
        key = p.register_agent(tmp_path, url, alice, "node")
        # Registration left the node's own broker login beside its key, private, and
        # nothing of the platform's Redis.
        creds_file = credentials_path(key)
        assert creds_file.stat().st_mode & 0o077 == 0
        assert "redis" not in creds_file.read_text()
        login = Credentials.load(creds_file).broker_url
        assert login.startswith(("amqp://", "amqps://"))
        worker = Worker.objects.get(owner=alice)
        log = tmp_path / "agent.log"

        def run_one() -> None:
            task = post_task(bob, "synthetic", {"n": 128}, budget=UNITS_PER_CREDIT)
            scheduler.schedule(task.pk)

            def settled() -> bool:
                return Task.objects.get(pk=task.pk).status in (TaskStatus.COMPLETED, TaskStatus.FAILED)

            p.wait_for(settled, 120, "task not settled", explain=lambda: log.read_text()[-3000:])
            assert Task.objects.get(pk=task.pk).status == TaskStatus.COMPLETED
            assert Assignment.objects.get(task=task).state == Assignment.State.ACCEPTED

        def online() -> bool:
            return Worker.objects.get(pk=worker.pk).is_online

        with p.spawn(p.agent_cmd(key, "run"), log, p.child_env()) as agent:  # no --broker: its own login
            p.wait_for(online, 60, "the agent never connected", explain=lambda: log.read_text()[-3000:])
            assert f"consuming w.{worker.address} from amqp" in log.read_text()
            run_one()
            # Celery's banner and connection messages, and the job's own log, hide the password.
            password = urlsplit(login).password
            assert password
            assert password not in log.read_text()
            assert not any(password in line for a in Assignment.objects.all() for line in a.log_tail)

            # Suspended: its connection is closed at once; resumed, it takes jobs again.
            lost = log.read_text().count("Connection to broker lost")
            services.set_worker_state(alice, worker.pk, Worker.State.SUSPENDED)
            p.wait_for(
                lambda: log.read_text().count("Connection to broker lost") > lost,
                5,
                "still connected",
                explain=lambda: log.read_text()[-6000:],
            )
            with pytest.raises(NotAllowed):
                connect(login)
            # Refused, the agent waits longer and longer between logins (not five a second).
            time.sleep(3)
            assert log.read_text().count("the broker refuses this node's login") <= 3
            services.set_worker_state(alice, worker.pk, Worker.State.ACTIVE)
            p.wait_for(online, 60, "the resumed agent never came back", explain=lambda: log.read_text()[-3000:])
            run_one()

            # Retired: its connection is closed, its login refused for good, and the agent
            # says so and stops (a process manager sees why in the exit status).
            services.set_worker_state(alice, worker.pk, Worker.State.RETIRED)
            with pytest.raises(AccessRefused):
                connect(login)
            p.wait_for(lambda: agent.poll() is not None, 15, "still running", explain=lambda: log.read_text()[-6000:])
            assert agent.returncode == LOGIN_GONE
            assert "the broker no longer knows this node's login" in log.read_text()
            assert "Unrecoverable error" not in log.read_text()
    worker.refresh_from_db()
    assert worker.jobs_done == 2
    nodebroker.remove_node(worker.address)


@pytest.mark.django_db
def test_a_job_the_node_broker_cannot_take_is_logged_and_the_pass_goes_on(
    alice: Any,
    bob: Any,
    broken_broker: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from tests.factories import make_worker, post_task
    from workers.assignments import scheduler
    from workers.models import Assignment

    monkeypatch.setattr(nodebroker, "_publisher", None)  # a publisher for the broken broker
    make_worker(alice)
    task = post_task(bob, "synthetic", {"n": 64})
    with (
        caplog.at_level("ERROR", logger="workers.assignments.scheduler"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        offered = scheduler.schedule(task.pk)
    assert len(offered) == 1
    assert Assignment.objects.get(task=task).state == Assignment.State.OFFERED
    assert "could not be sent" in caplog.text


# --- TLS (amqps) ---------------------------------------------------------------------------


def private_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate it signed for ``localhost``: (ca, cert, key)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test broker CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@contextlib.contextmanager
def tls_front(cert: Path, key: Path, upstream: tuple[str, int]) -> Iterator[int]:
    """RabbitMQ behind a TLS listener of its own (as ``listeners.ssl`` would serve it): the
    port. Each connection is decrypted here and passed on to the plain AMQP port."""
    import socket
    import ssl
    import threading

    from tests.workers.processes import free_port

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def serve(raw: socket.socket) -> None:
        try:
            client = context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()  # a client that refused our certificate
            return
        server = socket.create_connection(upstream)
        threading.Thread(target=pump, args=(client, server), daemon=True).start()
        pump(server, client)

    def accept() -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(raw,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield port
    finally:
        listener.close()


@needs_rabbitmq
def test_over_amqps_both_sides_check_the_brokers_certificate_against_the_private_ca(
    alice: Any, node_broker: None, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    from kombu import Connection

    from workers.agent import app as agent

    def amqp_tls(url: str, ca: str | None) -> dict[str, Any]:
        options = agent.amqp_tls(url, ca)  # what ``run --broker-ca`` gives Celery
        assert options is not None
        return options

    ca, cert, key = private_ca(tmp_path)
    plain = urlsplit(settings.NODE_BROKER_URL)
    _, body = register_node(APIClient(), alice)
    node = urlsplit(body["broker_url"])
    with tls_front(cert, key, (plain.hostname or "127.0.0.1", plain.port or 5672)) as port:
        # The platform publishes over amqps, trusting the private CA only.
        monkeypatch.setattr(nodebroker, "_publisher", None)
        settings.NODE_BROKER_URL = f"amqps://{plain.username}:{plain.password}@localhost:{port}{plain.path}"
        settings.NODE_BROKER_CA = str(ca)
        nodebroker.publish_job(str(node.username), "over-tls")

        # The node reads it over amqps with run's --broker-ca.
        login = f"amqps://{node.username}:{node.password}@localhost:{port}{node.path}"
        with Connection(login, ssl=amqp_tls(login, str(ca)), connect_timeout=5) as conn:
            channel: Any = conn.default_channel
            message = channel.basic_get(f"w.{node.username}", no_ack=True)
        assert message is not None
        assert json.loads(message.body)[0] == ["over-tls"]

        # Without the private CA (the system's CAs), the broker's certificate is refused.
        with pytest.raises(ssl.SSLCertVerificationError), Connection(login, ssl=amqp_tls(login, None)) as conn:
            conn.connect()
        # Nor may the name in the URL differ from the certificate's.
        elsewhere = login.replace("localhost", "127.0.0.1")
        with (
            pytest.raises(ssl.SSLCertVerificationError),
            Connection(elsewhere, ssl=amqp_tls(elsewhere, str(ca))) as conn,
        ):
            conn.connect()
