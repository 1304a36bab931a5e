"""``python -m workers.agent init | register | run | sweep``: the provider node's command line."""

from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from protocol.wire import registration_message, sign_template
from workers.agent import asks as node_asks
from workers.agent import capabilities
from workers.agent.identity import Credentials, IdentityError, credentials_path, init_key, load_key
from workers.agent.transfer import reasons as _reasons
from workers.agent.trust import DEFAULT_MAX_GAS_PRICE, insecure_server, register_tx_problem


class CommandError(Exception):
    """A command cannot go on: printed as it is, one line, and the command exits 1."""


def _json_object(response: httpx.Response, step: str) -> dict[str, Any]:
    """The JSON object an API endpoint answers, or a CommandError naming what came instead
    (a login page, a proxy's error page: the server URL is not the platform's)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        kind = response.headers.get("content-type", "").split(";")[0] or "no content type"
        raise CommandError(
            f"{step}: {response.url} answered HTTP {response.status_code} with {kind}, not the platform's API;"
            " is the server URL right?"
        )
    return body


def _client(server: str, **kwargs: Any) -> httpx.Client:
    try:
        return httpx.Client(base_url=server, timeout=30, **kwargs)
    except httpx.InvalidURL as exc:
        raise CommandError(f"{server} is not a valid server URL: {exc}") from None


def cmd_init(args: argparse.Namespace) -> int:
    key = init_key(Path(args.key))
    print(f"Wrote {args.key} (mode 0600). Keep it on this node; it never leaves it.")
    print(f"Worker address: {key.address}")
    return 0


def _api_error(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    return f"HTTP {response.status_code}: {body}"


def warn_if_insecure(server: str) -> None:
    warning = insecure_server(server)
    if warning:
        print(warning, file=sys.stderr)


def cmd_register(args: argparse.Namespace) -> int:
    key_path = Path(args.key)
    key = load_key(key_path)
    creds_path = credentials_path(key_path)  # refused before the token is spent, not after
    public_key = key.public_key.hex()
    server = args.server.rstrip("/")
    with _client(server) as http:
        warn_if_insecure(server)
        try:
            response = http.post(
                "/api/v1/workers/challenge/", json={"registration_token": args.token, "public_key": public_key}
            )
            if response.status_code != 200:
                print(f"Could not get a challenge: {_api_error(response)}", file=sys.stderr)
                return 1
            body = _json_object(response, "Could not get a challenge")
            challenge = body.get("challenge")
            if not isinstance(challenge, str) or not challenge.isascii():
                raise CommandError(f"Could not get a challenge: the platform's answer holds none: {body}")
            register_tx: Any = body.get("register_tx")
            problem = register_tx_problem(register_tx, key.address)
            if problem is not None:
                print(
                    f"Not registered: the platform sent a REGISTER_WORKER transaction this node will not sign"
                    f" ({problem}): {register_tx}",
                    file=sys.stderr,
                )
                return 1
            signature = key.sign(registration_message(challenge, public_key)).hex()
            register_tx_signature = sign_template(register_tx, key).hex()
            response = http.post(
                "/api/v1/workers/register/",
                json={
                    "registration_token": args.token,
                    "public_key": public_key,
                    "signature": signature,
                    "capabilities": capabilities.detect(),
                    "name": args.name or "",
                    "register_tx_signature": register_tx_signature,
                },
            )
        except httpx.HTTPError as exc:
            print(f"Could not reach {server}: {exc}", file=sys.stderr)
            return 1
    if response.status_code not in (200, 201):
        print(f"Registration refused: {_api_error(response)}", file=sys.stderr)
        return 1
    body = _json_object(response, "Registration")
    fields = {name: body.get(name) for name in ("id", "address", "token")}
    if not all(isinstance(value, str | int) and value != "" for value in fields.values()):
        raise CommandError(f"Registration answered without the worker's id, address and token: {body}")
    if body["address"] != key.address:
        raise CommandError(f"The platform registered {body['address']}, not this key's address {key.address}.")
    broker_url = body.get("broker_url") or ""
    if not isinstance(broker_url, str) or (broker_url and not broker_url.startswith(("amqp://", "amqps://"))):
        raise CommandError("Registration answered with a broker URL that is not amqp:// or amqps://; nothing saved.")
    creds = Credentials(
        server=server,
        worker_id=str(body["id"]),
        address=key.address,
        token=str(body["token"]),
        chain_id=register_tx["chain_id"],
        broker_url=broker_url,
    )
    try:
        creds.save(creds_path)
    except IdentityError as exc:
        raise CommandError(
            f"Registered, but the worker's token was not saved ({exc}); fix that and register again with a new token."
        ) from None
    verb = "Registered" if body.get("created") else "Re-registered"
    print(f"{verb} worker {body.get('name') or ''} ({key.address}); credentials in {creds_path}.")
    return 0


SWEEP_PATH = "/api/v1/workers/me/sweep/"


def _credits(units: int) -> str:
    """Base units as credits, exactly (never through a float)."""
    text = f"{Decimal(units).scaleb(-9):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _sweep_refusal(step: str, response: httpx.Response) -> str:
    code = response.status_code
    if code in (401, 403):
        return (
            f"{step}: the platform refused this worker's token (HTTP {code}): {_reasons(response)}\n"
            "A suspended worker must be resumed on its page first; a retired one can no longer sweep."
        )
    if code == 409:
        return f"{step}: not now (HTTP 409): {_reasons(response)}"
    return f"{step} (HTTP {code}): {_reasons(response)}"


def cmd_sweep(args: argparse.Namespace) -> int:
    """Fetch the sweep TRANSFER, show it, sign it with the node's key, submit it."""
    key_path = Path(args.key)
    key = load_key(key_path)
    creds = Credentials.load(credentials_path(key_path))
    if creds.address != key.address:
        raise IdentityError(f"{credentials_path(key_path)} belongs to {creds.address}, not this key")
    server = (args.server or creds.server).rstrip("/")
    headers = {"Authorization": f"Worker {creds.token}"}
    with _client(server, headers=headers) as http:
        warn_if_insecure(server)
        try:
            response = http.get(SWEEP_PATH)
            if response.status_code != 200:
                print(_sweep_refusal("Nothing swept", response), file=sys.stderr)
                return 1
            template = _json_object(response, "Nothing swept")
            if _sweep_template_problem(template, key.address, creds.chain_id):
                print(f"Nothing swept: the platform sent an unexpected transaction: {template}", file=sys.stderr)
                return 1
            print(
                f"Sweep {_credits(int(template['amount']))} credits (fee {_credits(int(template['fee']))})"
                f" from {template['from']} to your account {template['to']} (nonce {template['nonce']})."
            )
            if args.dry_run:
                print("Dry run: nothing signed or sent.")
                return 0
            if not args.yes and not _confirm("Sign and send this transfer? [y/N] "):
                print("Nothing swept: not confirmed (pass --yes to sweep without asking).", file=sys.stderr)
                return 1
            signature = sign_template(template, key)
            signed = {**template, "public_key": key.public_key.hex(), "signature": signature.hex()}
            response = http.post(SWEEP_PATH, json=signed)
        except httpx.HTTPError as exc:
            print(f"Could not reach {server}: {exc}", file=sys.stderr)
            return 1
    if response.status_code not in (200, 202):
        print(_sweep_refusal("Sweep refused", response), file=sys.stderr)
        return 1
    body = _json_object(response, "The sweep was sent, but its answer is unreadable")
    print(f"Swept: transaction {body.get('hash')} is {body.get('status')}; the credits are in your wallet.")
    return 0


def _sweep_template_problem(template: dict[str, Any], address: str, chain_id: str) -> bool:
    """Whether the sweep's TRANSFER is not one this node may show and sign: from this
    address, every field typed as the platform sends it, on the chain it registered on."""
    numbers = ("amount", "fee", "nonce", "gas_price", "gas_limit")
    return (
        template.get("from") != address
        or template.get("type") != "TRANSFER"
        or not all(type(template.get(k)) is int and template[k] >= 0 for k in numbers)
        or not all(isinstance(template.get(k), str) for k in ("to", "chain_id"))
        or not isinstance(template.get("payload", {}), dict)
        or bool(chain_id and template["chain_id"] != chain_id)
    )


def _confirm(question: str) -> bool:
    """Ask on the terminal; no answer (no terminal, end of input) is a no."""
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_run(args: argparse.Namespace) -> int:
    from workers.agent.app import run_node

    return run_node(
        Path(args.key),
        broker=args.broker,
        server=args.server,
        broker_folder=args.broker_folder,
        broker_ca=args.broker_ca,
        max_gas_price=args.max_gas_price,
        asks=args.ask,
    )


def cmd_ask(args: argparse.Namespace) -> int:
    """Send the node's asks now, without running it; exit 1 when the platform refuses them."""
    from workers.agent.transfer import PlatformClient

    key_path = Path(args.key)
    key = load_key(key_path)
    creds = Credentials.load(credentials_path(key_path))
    if creds.address != key.address:
        raise IdentityError(f"{credentials_path(key_path)} belongs to {creds.address}, not this key")
    server = (args.server or creds.server).rstrip("/")
    try:
        client = PlatformClient(server, creds.token)
    except httpx.InvalidURL as exc:
        raise CommandError(f"{server} is not a valid server URL: {exc}") from None
    warn_if_insecure(server)
    with client.http:
        problem = node_asks.send_asks(client, args.ask)
    if problem is not None:
        raise CommandError(f"Asks not set: {problem}")
    print(f"Asks set: {node_asks.describe(args.ask)}.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.agent", description="Proofwork provider node.")
    parser.add_argument("--key", default="worker.pem", help="key file (default: ./worker.pem)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="generate this node's ed25519 key file").set_defaults(func=cmd_init)
    register = sub.add_parser("register", help="register this node with a one-time token")
    register.add_argument("--server", required=True, help="platform URL, e.g. http://127.0.0.1:8000")
    register.add_argument("--token", required=True, help="registration token from /workers/register")
    register.add_argument("--name", default="", help="a name for this worker")
    register.set_defaults(func=cmd_register)
    run = sub.add_parser("run", help="take and run jobs")
    run.add_argument("--server", default=None, help="platform URL (default: from registration)")
    run.add_argument(
        "--broker",
        default=None,
        help="broker URL (default: this node's own, from registration; filesystem:// for an embedded platform)",
    )
    run.add_argument("--broker-folder", default=None, help="folder of the filesystem broker (embedded mode)")
    run.add_argument("--broker-ca", default=None, help="CA certificate file for an amqps:// broker with a private CA")
    run.add_argument(
        "--max-gas-price",
        type=int,
        default=DEFAULT_MAX_GAS_PRICE,
        help=f"refuse to sign a result whose gas price is higher (default: {DEFAULT_MAX_GAS_PRICE} units per gas)",
    )
    run.add_argument(
        "--ask",
        action="append",
        type=node_asks.parse_ask,
        default=[],
        metavar="KIND=PER_TFLOP[/MIN]",
        help="this node's price for a kind, in credits (repeatable; sent at start; none: the platform's reference)",
    )
    run.set_defaults(func=cmd_run)
    ask = sub.add_parser("ask", help="set this node's prices on the platform without running it")
    ask.add_argument(
        "ask",
        nargs="+",
        type=node_asks.parse_ask,
        metavar="KIND=PER_TFLOP[/MIN]",
        help="a price for a kind, in credits per TFLOP and the least per job, e.g. synthetic=0.5/0.2",
    )
    ask.add_argument("--server", default=None, help="platform URL (default: from registration)")
    ask.set_defaults(func=cmd_ask)
    sweep = sub.add_parser("sweep", help="move this worker's earnings to your account (signed here)")
    sweep.add_argument("--server", default=None, help="platform URL (default: from registration)")
    sweep.add_argument("--dry-run", action="store_true", help="show the transfer without signing or sending it")
    sweep.add_argument("--yes", action="store_true", help="sign and send without asking for confirmation")
    sweep.set_defaults(func=cmd_sweep)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except IdentityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
