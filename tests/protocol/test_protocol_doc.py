"""docs/protocol.md's worked examples are the protocol: every one is checked here.

Each fenced ``example:NAME`` or ``layout:NAME`` block of the document is parsed and
checked three ways, so that neither the document nor the code can change alone, and they
cannot drift apart together either:

- against the code: ``protocol/`` computes the same bytes, hashes, addresses, roots and
  (deterministic) ed25519 signatures from the example's inputs;
- against independent implementations written here from the specifications alone:
  SHA-256 from hashlib, bech32 from BIP-173, Merkle trees and audit paths from RFC 6962's
  recursive definitions, ed25519 from RFC 8032 §6, and each layout row's bytes from the
  encoding rule the document states (``struct``);
- against the platform: the example chain, admitted and sealed by the real mempool and
  sealer under the example's keys (only the sealer's clock is fixed, to the example's
  timestamp), gives the document's block hashes, signatures and roots, and the chain
  audit and the offline proof check pass over it.

Every value of every block must be checked by some rule: a line the test does not read
fails it, so the document cannot carry an unchecked number.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from protocol import bech32, encoding, keys, merkle
from protocol.encoding import ComputeResult, Header, Tx
from protocol.signing import verify_compute_result, verify_tx
from protocol.wire import REGISTER_DOMAIN, registration_message

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
FENCE = re.compile(r"^```(example|layout):([a-z0-9-]+)\n(.*?)^```$", re.M | re.S)


# ---------------------------------------------------------------- the document's blocks


@dataclass
class Example:
    """An ``example:`` block: ``key value`` lines (repeatable keys), each read at most as
    often as it appears; ``unread()`` lists what no check looked at."""

    name: str
    entries: list[tuple[str, str]]
    read: set[int] = field(default_factory=set)

    def all(self, key: str) -> list[str]:
        found = [(i, v) for i, (k, v) in enumerate(self.entries) if k == key]
        self.read.update(i for i, _ in found)
        return [v for _, v in found]

    def one(self, key: str) -> str:
        values = self.all(key)
        assert len(values) == 1, f"{self.name}: {key} appears {len(values)} times"
        return values[0]

    def maybe(self, key: str) -> str | None:
        values = self.all(key)
        return values[0] if values else None

    def hex(self, key: str) -> bytes:
        text = self.one(key)
        assert re.fullmatch(r"([0-9a-f]{2})*", text), f"{self.name}: {key} is not lower-case hex"
        return bytes.fromhex(text)

    def json(self, key: str) -> Any:
        return json.loads(self.one(key))

    def unread(self) -> list[str]:
        return [k for i, (k, _) in enumerate(self.entries) if i not in self.read]


@dataclass
class Row:
    label: str
    parts: list[bytes]  # the length prefix and the value, or the magic tag alone
    meaning: str


def parse_example(name: str, body: str) -> Example:
    entries: list[tuple[str, str]] = []
    for line in body.splitlines():
        if not line.strip():
            continue
        if line[0] == " ":  # a continuation of the previous value (wrapped hex)
            key, value = entries[-1]
            entries[-1] = (key, value + line.strip())
            continue
        key, _, value = line.partition(" ")
        entries.append((key, value.strip()))
    return Example(name, entries)


def parse_layout(body: str) -> list[Row]:
    rows = []
    for line in body.splitlines():
        label, hexes, meaning = (cell.strip() for cell in line.split(" | "))
        rows.append(Row(label, [bytes.fromhex(h) for h in hexes.split()], meaning))
    return rows


def read_doc() -> tuple[dict[str, Example], dict[str, list[Row]]]:
    text = DOC.read_text()
    examples: dict[str, Example] = {}
    layouts: dict[str, list[Row]] = {}
    for kind, name, body in FENCE.findall(text):
        target: dict[str, Any] = examples if kind == "example" else layouts
        assert name not in target, f"two {kind} blocks are named {name}"
        target[name] = parse_example(name, body) if kind == "example" else parse_layout(body)
    # A block the pattern missed (a typo in its fence) would go unchecked.
    assert text.count("```example:") == len(examples)
    assert text.count("```layout:") == len(layouts)
    return examples, layouts


@pytest.fixture(scope="module")
def doc() -> tuple[dict[str, Example], dict[str, list[Row]]]:
    return read_doc()


def seed_of(examples: dict[str, Example], signer: str) -> bytes:
    return bytes.fromhex(dict(examples[f"key-{signer}"].entries)["seed"])


# ---------------------------------------------------- independent implementations


# BIP-173, from the specification's reference text.
BECH32_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def bip173_polymod(values: list[int]) -> int:
    gen = [0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3]
    chk = 1
    for v in values:
        b = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ v
        for i in range(5):
            chk ^= gen[i] if ((b >> i) & 1) else 0
    return chk


def bip173_hrp_expand(hrp: str) -> list[int]:
    return [ord(x) >> 5 for x in hrp] + [0] + [ord(x) & 31 for x in hrp]


def bip173_checksum(hrp: str, data: list[int]) -> list[int]:
    polymod = bip173_polymod(bip173_hrp_expand(hrp) + data + [0, 0, 0, 0, 0, 0]) ^ 1
    return [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]


def bip173_words(data: bytes) -> list[int]:
    """convertbits(data, 8, 5, pad=True)."""
    acc = bits = 0
    out = []
    for value in data:
        acc = (acc << 8) | value
        bits += 8
        while bits >= 5:
            bits -= 5
            out.append((acc >> bits) & 31)
    if bits:
        out.append((acc << (5 - bits)) & 31)
    return out


def bip173_decode_ok(text: str) -> bool:
    """BIP-173's decoder rules that matter here: one case only, a valid checksum."""
    if text.lower() != text and text.upper() != text:
        return False
    text = text.lower()
    pos = text.rfind("1")
    data = [BECH32_CHARSET.find(c) for c in text[pos + 1 :]]
    return -1 not in data and bip173_polymod(bip173_hrp_expand(text[:pos]) + data) == 1


# RFC 6962 §2.1, as defined: MTH, and PATH(m, D[n]).
def rfc6962_mth(leaves: list[bytes]) -> bytes:
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + rfc6962_mth(leaves[:k]) + rfc6962_mth(leaves[k:])).digest()


def rfc6962_path(m: int, leaves: list[bytes]) -> list[bytes]:
    n = len(leaves)
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return [*rfc6962_path(m, leaves[:k]), rfc6962_mth(leaves[k:])]
    return [*rfc6962_path(m - k, leaves[k:]), rfc6962_mth(leaves[:k])]


# RFC 8032 §6, the Ed25519 reference code (key generation and signing).
ED_P = 2**255 - 19
ED_Q = 2**252 + 27742317777372353535851937790883648493
ED_D = -121665 * pow(121666, ED_P - 2, ED_P) % ED_P
ED_SQRT_M1 = pow(2, (ED_P - 1) // 4, ED_P)


def _ed_add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    p = ED_P
    aa, bb = (a[1] - a[0]) * (b[1] - b[0]) % p, (a[1] + a[0]) * (b[1] + b[0]) % p
    cc, dd = 2 * a[3] * b[3] * ED_D % p, 2 * a[2] * b[2] % p
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % p, g * h % p, f * g % p, e * h % p)


def _ed_mul(s: int, point: tuple[int, ...]) -> tuple[int, ...]:
    out: tuple[int, ...] = (0, 1, 1, 0)
    while s > 0:
        if s & 1:
            out = _ed_add(out, point)
        point = _ed_add(point, point)
        s >>= 1
    return out


def _ed_base() -> tuple[int, int, int, int]:
    p = ED_P
    y = 4 * pow(5, p - 2, p) % p
    x2 = (y * y - 1) * pow(ED_D * y * y + 1, p - 2, p)
    x = pow(x2, (p + 3) // 8, p)
    if (x * x - x2) % p:
        x = x * ED_SQRT_M1 % p
    if x & 1:
        x = p - x
    return (x, y, 1, x * y % p)


def _ed_compress(point: tuple[int, ...]) -> bytes:
    zinv = pow(point[2], ED_P - 2, ED_P)
    x, y = point[0] * zinv % ED_P, point[1] * zinv % ED_P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _ed_expand(seed: bytes) -> tuple[int, bytes]:
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    return a, h[32:]


def rfc8032_public_key(seed: bytes) -> bytes:
    return _ed_compress(_ed_mul(_ed_expand(seed)[0], _ed_base()))


def rfc8032_sign(seed: bytes, message: bytes) -> bytes:
    a, prefix = _ed_expand(seed)
    public = _ed_compress(_ed_mul(a, _ed_base()))
    r = int.from_bytes(hashlib.sha512(prefix + message).digest(), "little") % ED_Q
    big_r = _ed_compress(_ed_mul(r, _ed_base()))
    h = int.from_bytes(hashlib.sha512(big_r + public + message).digest(), "little") % ED_Q
    return big_r + ((r + h * a) % ED_Q).to_bytes(32, "little")


# The document's encoding rule (section 4), applied to the JSON forms.
def doc_field(value: int | str | bytes) -> bytes:
    if isinstance(value, int):
        assert 0 <= value < 2**63
        return struct.pack(">IQ", 8, value)
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack(">I", len(raw)) + raw


def doc_canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def doc_encode_tx(t: dict[str, Any]) -> bytes:
    fields: list[Any] = [t["chain_id"], t["type"], t["from"], t["to"]]
    fields += [t[k] for k in ("amount", "fee", "nonce", "gas_price", "gas_limit")]
    fields += [doc_canonical_json(t["payload"]), bytes.fromhex(t["public_key"])]
    return b"CPCTX\x01" + b"".join(doc_field(f) for f in fields)


def doc_encode_header(h: dict[str, Any]) -> bytes:
    fields: list[Any] = [h["height"], bytes.fromhex(h["prev_hash"]), h["timestamp_us"], h["chain_id"]]
    fields += [h["proposer"], bytes.fromhex(h["proposer_key"])]
    fields += [bytes.fromhex(h[k]) for k in ("tx_root", "compute_root", "state_root")]
    fields += [h["tx_count"], h["gas_used"]]
    return b"CPCBLK\x01" + b"".join(doc_field(f) for f in fields)


def doc_encode_compute_result(c: dict[str, Any]) -> bytes:
    fields = [c["task_id"], c["worker_address"], c["result_hash"], doc_canonical_json(c["proof"]), c["nonce"]]
    return b"CPCCR\x01" + b"".join(doc_field(f) for f in fields)


# ------------------------------------------------------------------- the checks


def check_key(ex: Example, examples: dict[str, Example]) -> None:
    seed = ex.hex("seed")
    public = ex.hex("public_key")
    address = ex.one("address")
    pair = keys.from_seed(seed)
    assert (pair.public_key, pair.address) == (public, address)
    assert rfc8032_public_key(seed) == public
    digest = hashlib.sha256(public).digest()
    words = bip173_words(digest[:20])
    assert address == "cpc1" + "".join(BECH32_CHARSET[w] for w in words + bip173_checksum("cpc", words))
    if (sha := ex.maybe("sha256")) is not None:
        assert sha == digest.hex()
        assert ex.hex("payload") == digest[:20]
        assert [int(w) for w in ex.one("words").split()] == words
        assert [int(w) for w in ex.one("checksum").split()] == bip173_checksum("cpc", words)
        upper = ex.one("upper")
        assert upper == address.upper()
        assert bech32.decode_address(upper) == bech32.decode_address(address) == digest[:20]
        assert bip173_decode_ok(upper)
        assert bip173_decode_ok(address)


def check_canonical_json(ex: Example, examples: dict[str, Example]) -> None:
    value = ex.json("input")
    canonical = ex.one("canonical").encode()
    assert encoding.canonical_json(value) == canonical == doc_canonical_json(value)
    assert ex.hex("utf8") == canonical


def check_tx(ex: Example, examples: dict[str, Example]) -> None:
    seed = seed_of(examples, ex.one("signer"))
    body = ex.json("json")
    enc = ex.hex("encoding")
    tx = encoding.tx_from_json(body)
    # The JSON form the API and proofs write: the document's names, in its order.
    assert list(encoding.tx_to_json(tx).items()) == list(body.items())
    assert tx.encode() == enc == doc_encode_tx(body)
    assert ex.hex("hash") == tx.hash() == hashlib.sha256(enc).digest()
    signature = ex.hex("signature")
    assert keys.sign(seed, enc) == signature == rfc8032_sign(seed, enc)
    assert verify_tx(tx, signature)
    leaf = ex.hex("leaf")
    assert leaf == encoding.tx_leaf(tx.hash(), signature) == hashlib.sha256(enc).digest() + signature
    assert ex.hex("leaf_hash") == merkle.leaf_hash(leaf) == hashlib.sha256(b"\x00" + leaf).digest()


def check_compute_result(ex: Example, examples: dict[str, Example]) -> None:
    seed = seed_of(examples, ex.one("signer"))
    body = ex.json("json")
    enc = ex.hex("encoding")
    signature = ex.hex("signature")
    result = ComputeResult(**body, signature=signature)
    assert result.encode() == enc == doc_encode_compute_result(body)
    assert keys.sign(seed, enc) == signature == rfc8032_sign(seed, enc)
    assert verify_compute_result(result, keys.from_seed(seed).public_key)
    leaf = ex.hex("leaf")
    assert leaf == result.leaf() == enc + struct.pack(">I", 64) + signature
    assert ex.hex("leaf_hash") == merkle.leaf_hash(leaf) == hashlib.sha256(b"\x00" + leaf).digest()


def check_state_leaf(ex: Example, examples: dict[str, Example]) -> None:
    address, balance, nonce = ex.one("address"), int(ex.one("balance")), int(ex.one("nonce"))
    leaf = ex.hex("leaf")
    assert leaf == encoding.state_leaf(address, balance, nonce)
    assert leaf == b"CPCST\x01" + doc_field(address) + doc_field(balance) + doc_field(nonce)
    assert ex.hex("leaf_hash") == merkle.leaf_hash(leaf) == hashlib.sha256(b"\x00" + leaf).digest()


def check_merkle(ex: Example, examples: dict[str, Example]) -> None:
    leaves = [bytes.fromhex(h) for h in ex.all("leaf")]
    hashes = [merkle.leaf_hash(d) for d in leaves]
    assert [bytes.fromhex(h) for h in ex.all("leaf_hash")] == hashes
    assert hashes == [hashlib.sha256(b"\x00" + d).digest() for d in leaves]
    h = hashes
    assert ex.hex("node_01") == merkle.node_hash(h[0], h[1]) == rfc6962_mth(leaves[:2])
    assert ex.hex("node_23") == merkle.node_hash(h[2], h[3]) == rfc6962_mth(leaves[2:4])
    assert ex.hex("node_0123") == rfc6962_mth(leaves[:4])
    root = ex.hex("root")
    assert root == merkle.root(leaves) == rfc6962_mth(leaves)
    for key, _ in list(ex.entries):
        if key.startswith("path_"):
            m = int(key.removeprefix("path_"))
            path = [bytes.fromhex(p) for p in ex.all(key)]
            assert path == merkle.audit_path(hashes, m) == rfc6962_path(m, leaves)
            assert merkle.verify_inclusion(hashes[m], m, len(leaves), path, root)
    assert ex.hex("empty_root") == merkle.EMPTY_ROOT == rfc6962_mth([])


def check_registration(ex: Example, examples: dict[str, Example]) -> None:
    seed = seed_of(examples, ex.one("signer"))
    challenge, public_hex = ex.one("challenge"), ex.one("public_key")
    message = ex.hex("message")
    assert message == registration_message(challenge, public_hex)
    assert message == b"\n".join([b"proofwork/register-worker/v1", challenge.encode(), public_hex.encode()])
    assert REGISTER_DOMAIN == b"proofwork/register-worker/v1"
    assert challenge == hashlib.sha256(b"example challenge").hexdigest()  # as the document says
    assert keys.from_seed(seed).public_key.hex() == public_hex
    signature = ex.hex("signature")
    assert keys.sign(seed, message) == signature == rfc8032_sign(seed, message)


def check_header(ex: Example, examples: dict[str, Example]) -> None:
    seed = seed_of(examples, ex.one("signer"))
    body = ex.json("json")
    enc = ex.hex("encoding")
    header = Header(
        height=body["height"],
        prev_hash=bytes.fromhex(body["prev_hash"]),
        timestamp_us=body["timestamp_us"],
        chain_id=body["chain_id"],
        proposer=body["proposer"],
        proposer_key=bytes.fromhex(body["proposer_key"]),
        tx_root=bytes.fromhex(body["tx_root"]),
        compute_root=bytes.fromhex(body["compute_root"]),
        state_root=bytes.fromhex(body["state_root"]),
        tx_count=body["tx_count"],
        gas_used=body["gas_used"],
    )
    assert header.encode() == enc == doc_encode_header(body)
    assert ex.hex("hash") == header.hash() == hashlib.sha256(enc).digest()
    signature = ex.hex("signature")
    assert keys.sign(seed, enc) == signature == rfc8032_sign(seed, enc)
    assert keys.from_seed(seed).public_key == header.proposer_key
    assert bech32.address_from_public_key(header.proposer_key) == header.proposer
    # The block's contents, when the example lists them: each root recomputed from them.
    prev = ex.maybe("prev")
    if prev is None:  # genesis
        assert (header.height, header.prev_hash, header.tx_count, header.gas_used) == (0, bytes(32), 0, 0)
        assert header.tx_root == header.compute_root == header.state_root == rfc6962_mth([])
        return
    assert header.prev_hash == bytes.fromhex(dict(examples[prev].entries)["hash"])
    txs = [dict(examples[name].entries) for name in ex.all("tx")]
    tx_leaves = [bytes.fromhex(t["hash"]) + bytes.fromhex(t["signature"]) for t in txs]
    assert header.tx_root == rfc6962_mth(tx_leaves)
    assert header.tx_count == len(txs)
    assert header.gas_used == sum(json.loads(t["json"])["gas_limit"] for t in txs)
    results = [dict(examples[name].entries) for name in ex.all("compute")]
    assert header.compute_root == rfc6962_mth([bytes.fromhex(r["leaf"]) for r in results])
    submitted = [json.loads(t["json"]) for t in txs if json.loads(t["json"])["type"] == encoding.SUBMIT_RESULT]
    assert [s["payload"]["compute_result"]["signature"] for s in submitted] == [r["signature"] for r in results]
    accounts = [line.split() for line in ex.all("account")]
    assert accounts == sorted(accounts)
    state_leaves = [b"CPCST\x01" + doc_field(a) + doc_field(int(b)) + doc_field(int(n)) for a, b, n in accounts]
    assert header.state_root == rfc6962_mth(state_leaves)
    assert replay_state(txs, header.proposer) == {a: (int(b), int(n)) for a, b, n in accounts}


def replay_state(txs: list[dict[str, str]], proposer: str) -> dict[str, tuple[int, int]]:
    """The state after the block from the empty state, by the rules of the document's
    section 5 (no code of the ledger's)."""
    state: dict[str, list[int]] = {}
    for entry in txs:
        t = json.loads(entry["json"])
        sender = state.setdefault(t["from"], [0, 0])
        recipient = state.setdefault(t["to"], [0, 0])
        assert t["nonce"] == sender[1]
        assert t["fee"] == t["gas_limit"] * t["gas_price"]
        sender[1] += 1
        if t["type"] == encoding.DEPOSIT:
            recipient[0] += t["amount"]
            continue
        assert sender[0] >= t["amount"] + t["fee"]
        sender[0] -= t["amount"] + t["fee"]
        if t["type"] not in (encoding.PAYOUT, encoding.REVERSAL):
            recipient[0] += t["amount"]
        state.setdefault(proposer, [0, 0])[0] += t["fee"]
    return {a: (b, n) for a, (b, n) in state.items() if b or n}


CHECKS = [
    (re.compile(r"key-[a-z]+"), check_key),
    (re.compile(r"canonical-json"), check_canonical_json),
    (re.compile(r"tx-[a-z-]+"), check_tx),
    (re.compile(r"compute-result"), check_compute_result),
    (re.compile(r"state-leaf"), check_state_leaf),
    (re.compile(r"merkle"), check_merkle),
    (re.compile(r"registration"), check_registration),
    (re.compile(r"header-[a-z0-9]+"), check_header),
]


def test_the_document_has_its_examples(doc: tuple[dict[str, Example], dict[str, list[Row]]]) -> None:
    examples, layouts = doc
    assert {"key-alice", "canonical-json", "tx-transfer", "compute-result", "state-leaf", "merkle"} <= set(examples)
    assert {"registration", "header-genesis", "header-1"} <= set(examples)
    assert set(layouts) == {"tx-transfer", "compute-result", "state-leaf", "header-1"}


def example_names() -> Iterator[str]:
    yield from read_doc()[0]


@pytest.mark.parametrize("name", list(example_names()))
def test_each_example_matches_the_code_and_the_specifications(
    doc: tuple[dict[str, Example], dict[str, list[Row]]], name: str
) -> None:
    examples, _ = doc
    ex = examples[name]
    checks = [check for pattern, check in CHECKS if pattern.fullmatch(name)]
    assert len(checks) == 1, f"no rule checks the example {name}: add one"
    ex.read.clear()
    checks[0](ex, examples)
    assert not ex.unread(), f"{name}: {ex.unread()} are in the document but not checked"


@pytest.mark.parametrize("name", ["tx-transfer", "compute-result", "state-leaf", "header-1"])
def test_each_layout_row_encodes_its_meaning_and_the_rows_make_the_example(
    doc: tuple[dict[str, Example], dict[str, list[Row]]], name: str
) -> None:
    """Row by row, by section 4's rule alone: the magic tag and version, then a 4-byte
    length and the value the meaning column states. Joined, the rows are the bytes of
    the example of the same name."""
    examples, layouts = doc
    rows = layouts[name]
    magic, *fields = rows
    tag = re.fullmatch(r'"([A-Z]+)" 0x01', magic.meaning)
    assert tag is not None
    assert magic.label == "magic"
    assert magic.parts == [tag.group(1).encode() + b"\x01"]
    for row in fields:
        length, value = row.parts
        assert struct.unpack(">I", length) == (len(value),), row.label
        if row.meaning.startswith('"'):
            assert value == json.loads(row.meaning).encode(), row.label
        elif row.meaning.isdigit():
            assert value == struct.pack(">Q", int(row.meaning)), row.label
        elif row.meaning.startswith("{"):
            assert value == row.meaning.encode() == doc_canonical_json(json.loads(row.meaning)), row.label
        else:  # raw bytes (a key, a hash, a root): the meaning describes them
            assert len(value) == 32, row.label
    joined = b"".join(b"".join(row.parts) for row in rows)
    entries = dict(examples[name].entries)
    assert joined.hex() == entries.get("encoding", entries.get("leaf"))


# ------------------------------------------------------------ against the platform

EXAMPLE_SETTINGS = {
    "LEDGER_CHAIN_ID": "proofwork-dev-1",
    "LEDGER_GENESIS_TIME": "2026-01-01T00:00:00+00:00",
    "LEDGER_TREASURY_KEY": "11" * 32,
    "LEDGER_VALIDATOR_KEY": "00" * 32,
    "LEDGER_GAS_PRICE": 1000,
}
EXAMPLE_TASK = "3f2b8a9e-5c1d-4e7a-9b0f-2a6c8d4e1f00"


@pytest.fixture
def example_assignment() -> Iterator[None]:
    """The example's node holds an assignment for the example's task: the ledger asks its
    assignment hook before it admits a SUBMIT_RESULT (the workers app's tables are not
    what this test is about)."""
    from ledger import hooks

    def checker(task_id: uuid.UUID, worker_address: str) -> str | None:
        return None if str(task_id) == EXAMPLE_TASK else "no_assignment"

    previous = hooks.registered_assignment_checker()
    hooks.register_assignment_checker(checker)
    yield
    hooks.register_assignment_checker(previous)


@pytest.mark.django_db
@pytest.mark.usefixtures("example_assignment")
def test_the_platform_seals_the_example_chain_byte_for_byte(
    doc: tuple[dict[str, Example], dict[str, list[Row]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The document's four transactions, admitted by the real mempool and sealed by the
    real sealer with the document's keys: the genesis block and block 1 are the
    document's, hash and signature; the chain audit replays them; the served proof of
    the SUBMIT_RESULT verifies offline. The sealer's clock is the only thing fixed (to
    the document's timestamp): the header commits to it."""
    from ledger import sealer
    from ledger.mempool import Submission, admit
    from ledger.models import Block, Transaction
    from ledger.proofcheck import is_verified, verify_proof
    from ledger.proofs import build_proof, header_json
    from ledger.replay import verify_chain

    examples, _ = doc
    block_1 = dict(examples["header-1"].entries)
    fixed = datetime.fromtimestamp(json.loads(block_1["json"])["timestamp_us"] / 1e6, tz=UTC)
    monkeypatch.setattr(sealer, "timezone", types.SimpleNamespace(now=lambda: fixed))
    names = examples["header-1"].all("tx")
    with override_settings(**EXAMPLE_SETTINGS):
        sealer.ensure_genesis()  # the treasury's and the validator's accounts, and block 0
        subs = []
        for name in names:
            entries = dict(examples[name].entries)
            tx: Tx = encoding.tx_from_json(json.loads(entries["json"]))
            if tx.type == encoding.SUBMIT_RESULT:
                assert tx.payload["compute_result"]["task_id"] == EXAMPLE_TASK
            subs.append(Submission(tx, bytes.fromhex(entries["signature"])))
        # One at a time, as clients send them: alice's account is created by the deposit.
        rows = [row for sub in subs for row in admit([sub])]
        assert [r.status for r in rows] == ["pending"] * len(names), [r.reason_detail for r in rows]
        sealed = sealer.seal_block()
        assert sealed is not None
        genesis = Block.objects.get(height=0)
        expected_genesis = dict(examples["header-genesis"].entries)
        assert (genesis.hash, genesis.signature) == (expected_genesis["hash"], expected_genesis["signature"])
        assert (sealed.height, sealed.hash, sealed.signature) == (1, block_1["hash"], block_1["signature"])
        served = header_json(sealed)  # the header as the API's proofs give it
        assert {k: served[k] for k in json.loads(block_1["json"])} == json.loads(block_1["json"])
        hashes = list(
            Transaction.objects.filter(block=sealed).order_by("index_in_block").values_list("hash", flat=True)
        )
        assert hashes == [dict(examples[name].entries)["hash"] for name in names]
        assert verify_chain().head_hash == block_1["hash"]
        submit = Transaction.objects.get(block=sealed, type=encoding.SUBMIT_RESULT)
        proof = build_proof(submit)
        assert proof is not None
        checks = verify_proof(json.loads(json.dumps(proof)), keys.from_seed(bytes(32)).public_key)
        assert is_verified(checks), checks
        # Section 11: the public API gives a verifier every byte it needs.
        api = APIClient()
        block = api.get("/api/v1/ledger/blocks/1/").json()
        assert (block["hash"], block["signature"], block["state_root"]) == (
            block_1["hash"],
            block_1["signature"],
            json.loads(block_1["json"])["state_root"],
        )
        instant = datetime.fromisoformat(block["timestamp"].replace("Z", "+00:00"))
        assert (instant - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) == json.loads(block_1["json"])[
            "timestamp_us"
        ]
        listed = api.get("/api/v1/ledger/blocks/1/transactions/").json()["results"]
        for row, name in zip(listed, names, strict=True):
            entries = dict(examples[name].entries)
            signed_fields = json.loads(entries["json"])
            assert {k: row[k] for k in signed_fields} == signed_fields
            assert (row["hash"], row["signature"]) == (entries["hash"], entries["signature"])
