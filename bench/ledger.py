"""Ledger benchmark on PostgreSQL: admit and seal N signed SUBMIT_RESULT transactions.

Prints tx/s for mempool admission, sealing, end to end (admission + sealing), the
verify_chain replay rate, and the time to read pages of a 50,000-row address history.
Signing is not timed: workers sign on their own machines.
Runs in a throwaway database (``bench_<name>`` beside the one DATABASE_URL names),
created, migrated and dropped here, so it never touches real data.

Run: .venv/bin/python bench/ledger.py [--n 20000] [--workers 100] [--batch 2000] [--block-txs N] [--verify-processes N]
on BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/proofwork_bench), or on
DATABASE_URL when that names PostgreSQL.
Target: ≥ 3,000 tx/s end to end on two cores. The last line is one JSON object.
Many accounts, many blocks (what the state tree is for): --workers 20000 --block-txs 200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
    # A `make run` install is on SQLite; the benchmark measures PostgreSQL, as bench/api.py does.
    os.environ["DATABASE_URL"] = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/proofwork_bench"
    )

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Q  # noqa: E402

from ledger import custody, gas, hooks  # noqa: E402
from ledger.api.views import AddressHistory, visible_transactions  # noqa: E402
from ledger.mempool import Submission, admit, admit_batches  # noqa: E402
from ledger.models import Transaction, TxStatus  # noqa: E402
from ledger.replay import verify_chain  # noqa: E402
from ledger.sealer import ensure_genesis, seal_all  # noqa: E402
from protocol import encoding  # noqa: E402
from protocol.encoding import ComputeResult, Tx  # noqa: E402
from protocol.keys import KeyPair, from_seed  # noqa: E402
from protocol.signing import sign_compute_result, sign_tx  # noqa: E402

TARGET_TX_PER_S = 3_000.0
CREDIT = 10**9


def _tx(pair: KeyPair, tx_type: str, to: str, amount: int, nonce: int, payload: dict[str, Any]) -> Submission:
    price = settings.LEDGER_GAS_PRICE
    unsigned = Tx(
        chain_id=settings.LEDGER_CHAIN_ID,
        type=tx_type,
        sender=pair.address,
        recipient=to,
        amount=amount,
        fee=gas.fee_for(tx_type, price),
        nonce=nonce,
        gas_price=price,
        gas_limit=gas.gas_limit(tx_type),
        payload=payload,
    )
    tx, signature = sign_tx(unsigned, pair)
    return Submission(tx, signature)


def prepare(n: int, workers: int) -> list[Submission]:
    """Fund the workers (deposits, sealed) and pre-sign n SUBMIT_RESULT transactions."""
    pairs = [from_seed((1_000_000 + i).to_bytes(32, "big")) for i in range(workers)]
    treasury = custody.treasury_keys()
    per_worker = -(-n // workers)
    deposits = [
        _tx(
            treasury,
            encoding.DEPOSIT,
            p.address,
            per_worker * gas.fee_for(encoding.SUBMIT_RESULT, settings.LEDGER_GAS_PRICE) + CREDIT,
            i,
            {},
        )
        for i, p in enumerate(pairs)
    ]
    rows = admit(deposits)
    assert all(r.status == TxStatus.PENDING for r in rows), rows[0].reason_detail
    seal_all()
    subs: list[Submission] = []
    for k in range(n):
        pair = pairs[k % workers]
        nonce = k // workers
        result = sign_compute_result(
            ComputeResult(
                task_id=str(uuid.uuid4()),
                worker_address=pair.address,
                result_hash=os.urandom(32).hex(),
                proof={"rows": [k % 97, k % 89, k % 83], "root": os.urandom(32).hex()},
                nonce=nonce,
            ),
            pair,
        )
        subs.append(_tx(pair, encoding.SUBMIT_RESULT, pair.address, 0, nonce, {"compute_result": result.to_json()}))
    return subs


def calibrate() -> float:
    """Microseconds per ed25519 verification on this machine now (about 50 on an idle
    modern core): the yardstick for how loaded the machine was during the run."""
    pair = from_seed(bytes(32))
    message = b"x" * 300
    signature = pair.sign(message)
    from protocol.keys import verify

    start = time.perf_counter()
    for _ in range(2_000):
        verify(pair.public_key, message, signature)
    return (time.perf_counter() - start) / 2_000 * 1e6


def run(n: int, workers: int, batch: int) -> dict[str, Any]:
    # The workers app is not in this process: every (task, worker) pair counts as assigned.
    hooks.register_assignment_checker(lambda task_id, address: None)
    settings.LEDGER_MEMPOOL_SEAL_TRIGGER = 10**9  # the benchmark seals by itself
    ensure_genesis()
    print(f"preparing {n} signed SUBMIT_RESULT transactions from {workers} workers…", flush=True)
    subs = prepare(n, workers)
    base_txs = Transaction.objects.filter(status=TxStatus.SEALED).count()

    if settings.LEDGER_VERIFY_PROCESSES > 1:
        # Start the verification pool before timing: a platform process starts it once.
        from ledger.batchverify import PARALLEL_MIN, verify_many

        pair = from_seed(bytes(32))
        verify_many([(pair.public_key, b"warm", pair.sign(b"warm"))] * PARALLEL_MIN)
    verify_us_before = calibrate()
    t0 = time.perf_counter()
    # Batch after batch, each in its own transaction, as admit() would; the pool checks
    # the next batch's signatures while this one is written.
    for rows in admit_batches(subs[i : i + batch] for i in range(0, n, batch)):
        refused = [r for r in rows if r.status != TxStatus.PENDING]
        assert not refused, f"{len(refused)} refused, e.g. {refused[0].reason}: {refused[0].reason_detail}"
    admit_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    blocks = seal_all(max_blocks=10_000)
    seal_s = time.perf_counter() - t1
    assert sum(b.tx_count for b in blocks) == n

    summary = verify_chain()
    replayed = summary.transactions
    assert replayed == n + base_txs

    figures = {
        "n": n,
        "workers": workers,
        "batch": batch,
        "blocks": len(blocks),
        "seal_ms_per_block": round(seal_s / len(blocks) * 1000, 1),
        "admission_tx_s": round(n / admit_s),
        "sealing_tx_s": round(n / seal_s),
        "end_to_end_tx_s": round(n / (admit_s + seal_s)),
        "verify_chain_tx_s": round(replayed / summary.seconds),
        "target_end_to_end_tx_s": TARGET_TX_PER_S,
        "ed25519_verify_us": round((verify_us_before + calibrate()) / 2, 1),
        "verify_processes": settings.LEDGER_VERIFY_PROCESSES,
    }
    figures["meets_target"] = figures["end_to_end_tx_s"] >= TARGET_TX_PER_S
    return figures


HISTORY_ROWS = 50_000


def history_ms() -> dict[str, float]:
    """Milliseconds to read page 1 and page 400 (100 a page) of a 50,000-row address
    history (sent, received and to itself by turns, one row in two of the oldest 100,000)
    behind 100,000 newer rows of others: an address gone quiet, whose every page the
    plain ``sender OR recipient`` query (timed beside) reaches by reading past them."""
    owner, other = from_seed(b"h" * 32).address, from_seed(b"o" * 32).address
    insert = """
        INSERT INTO ledger_transaction (hash, chain_id, type, sender, recipient, amount, fee, nonce,
            gas_price, gas_limit, payload, public_key, signature, status, reason, reason_detail, created_at)
        SELECT md5(%(salt)s || g) || md5(g || %(salt)s), 'bench', 'TRANSFER', {sender}, {recipient},
            1, 0, g, 0, 0, '{{}}'::jsonb, repeat('0', 64), repeat('0', 128), 'sealed', '', '', now()
        FROM generate_series(1, %(n)s) AS g ORDER BY g
    """
    mine = "CASE WHEN mod(g, 2) = 0 AND mod(g / 2, 3) <> {} THEN %(owner)s ELSE %(other)s END"
    with connection.cursor() as cursor:  # unsigned rows: the chain was verified above
        params: dict[str, Any] = {"owner": owner, "other": other, "n": 2 * HISTORY_ROWS}
        cursor.execute(insert.format(sender=mine.format(1), recipient=mine.format(0)), {**params, "salt": "mine"})
        cursor.execute(insert.format(sender="%(other)s", recipient="%(other)s"), {**params, "salt": "newer"})
        cursor.execute("VACUUM ANALYZE ledger_transaction")
    history = AddressHistory(owner)
    deep = history.page(1, offset=399 * 100)[0].pk + 1  # the cursor of page 400
    plain = visible_transactions().filter(Q(sender=owner) | Q(recipient=owner)).order_by("-id")

    def best_ms(read: Any) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            assert len(read()) == 101
            times.append(time.perf_counter() - start)
        return round(min(times) * 1000, 2)

    return {
        "history_page1_ms": best_ms(lambda: history.page(101)),
        "history_page400_ms": best_ms(lambda: history.page(101, past=deep)),
        "plain_or_page1_ms": best_ms(lambda: list(plain[:101])),
        "plain_or_page400_ms": best_ms(lambda: list(plain.filter(id__lt=deep)[:101])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--block-txs", type=int, default=None, help="LEDGER_MAX_BLOCK_TXS (default: the setting)")
    parser.add_argument(
        "--verify-processes",
        type=int,
        default=None,
        help="LEDGER_VERIFY_PROCESSES (default: the setting, one per CPU core unless set)",
    )
    args = parser.parse_args()
    if args.block_txs is not None:
        settings.LEDGER_MAX_BLOCK_TXS = args.block_txs
    if args.verify_processes is not None:
        settings.LEDGER_VERIFY_PROCESSES = args.verify_processes
    if connection.vendor != "postgresql":
        sys.exit("bench/ledger.py measures PostgreSQL: set BENCH_DATABASE_URL=postgres://…")
    db = settings.DATABASES["default"]
    # Never the test database pytest --reuse-db keeps: a name of its own.
    db.setdefault("TEST", {})["NAME"] = f"bench_{db['NAME']}"
    test_db = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        print(f"database {test_db} (throwaway)", flush=True)
        figures = run(args.n, args.workers, args.batch)
        figures.update(history_ms())
    finally:
        connection.creation.destroy_test_db(settings.DATABASES["default"]["NAME"], verbosity=0)
    print(f"admission   {figures['admission_tx_s']:>8,} tx/s")
    print(
        f"sealing     {figures['sealing_tx_s']:>8,} tx/s  ({figures['blocks']} blocks,"
        f" {figures['seal_ms_per_block']} ms a block)"
    )
    print(
        f"end to end  {figures['end_to_end_tx_s']:>8,} tx/s  (target ≥ {TARGET_TX_PER_S:,.0f}:"
        f" {'met' if figures['meets_target'] else 'NOT met'})"
    )
    print(f"verify_chain {figures['verify_chain_tx_s']:>7,} tx/s replayed")
    print(
        f"machine load yardstick: one ed25519 verification took {figures['ed25519_verify_us']} µs"
        " (about 50 µs on an idle core; a SUBMIT_RESULT needs two)"
    )
    print(
        f"history of {HISTORY_ROWS:,} rows: page 1 {figures['history_page1_ms']} ms, page 400"
        f" {figures['history_page400_ms']} ms (sender OR recipient: {figures['plain_or_page1_ms']} ms,"
        f" {figures['plain_or_page400_ms']} ms)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
