"""Market benchmark on PostgreSQL: one scheduling pass over 10,000 waiting tasks and 1,000
online nodes with mixed asks, bids and needs (docs/market.md).

A pass reads the book (every waiting task, with the jobs it had, and every free online
node with its asks) and decides the matches by the rule. The steady state a user lives in
is a busy market: most nodes hold a job and a pass finds the few that came free since
the last one (``--free``, 100 by default). Reported separately: the same pass with every
node free (a platform starting up), and the cost of offering each match through the
scheduler (row locks, the Assignment, the node's message), which grows with the matches,
not the book. Before timing, the fast matcher's decisions are checked against the plain
reference (``match_reference``) on a small case and on the timed book itself.

Runs in a throwaway database (``bench_<name>`` beside the one DATABASE_URL names).
Run: .venv/bin/python bench/market.py [--tasks 10000] [--nodes 1000] [--free 100] [--passes 7]
on BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/proofwork_bench), or on
DATABASE_URL when that names PostgreSQL. Target: a pass ≤ 200 ms. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("PROOFWORK_LOG_LEVEL", "WARNING")
if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
    os.environ["DATABASE_URL"] = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/proofwork_bench"
    )

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from marketplace import pricing  # noqa: E402
from marketplace.kinds import KINDS  # noqa: E402
from marketplace.models import Task, TaskStatus, User  # noqa: E402
from workers.assignments import market_pass, nodebroker  # noqa: E402
from workers.market.matching import match, match_reference  # noqa: E402
from workers.models import Ask, Assignment, Worker  # noqa: E402

TARGET_MS = 200.0
CREDIT = 10**9
GIB = 2**30


def populate(tasks: int, nodes: int, busy: int, rng: random.Random) -> None:
    """Providers with nodes of mixed capabilities and asks; requesters with waiting tasks of
    mixed sizes, generators, reputations, replication and bids; ``busy`` nodes holding a job."""
    now = timezone.now()
    owners = User.objects.bulk_create([User(username=f"provider{i}") for i in range(max(1, nodes // 4))])
    requesters = User.objects.bulk_create([User(username=f"requester{i}") for i in range(200)])
    kinds = list(KINDS)
    workers = []
    for i in range(nodes):
        offered = ["synthetic", *rng.sample(kinds, 2)]
        workers.append(
            Worker(
                owner=rng.choice(owners),
                name=f"node{i}",
                address=f"cpc1bench{i:08d}",
                public_key=f"{i:064x}",
                token_hash=f"{i:064x}",
                capabilities={
                    "kinds": sorted(set(offered)) if rng.random() < 0.9 else ["cube_training"],
                    "features": rng.choice([["poc:aes256ctr"], ["poc:aes256ctr", "poc:shake128"], []]),
                    "ram_bytes": rng.choice([4, 8, 16, 64]) * GIB,
                    "gpu_memory_bytes": rng.choice([0, 0, 24, 80]) * GIB,
                },
                reputation=rng.choice([10, 30, 50, 70, 90, 100]),
                benchmark_gflops=rng.choice([None, 20.0, 80.0, 400.0]),
                last_heartbeat_at=now,
            )
        )
    Worker.objects.bulk_create(workers)
    floor = pricing.floor_price()
    Ask.objects.bulk_create(
        [
            Ask(
                worker=w,
                kind="synthetic",
                per_tflop=rng.choice([0, 5, 50, 500]) * 10**6,
                minimum=floor * rng.choice([1, 2, 5]),
            )
            for w in workers
            if rng.random() < 0.7  # the rest ask the reference
        ]
    )
    synthetic = KINDS["synthetic"]
    rows = []
    for i in range(tasks + busy):
        spec = synthetic.validate_spec(
            {
                "n": rng.choice([64, 256, 1024, 2048, 4096]),
                "count": rng.choice([1, 2, 4, 8]),
                "generator": rng.choice(["aes256ctr", "aes256ctr", "shake128"]),
            }
        )
        replication = rng.choice([1, 1, 1, 2, 3])
        bid = rng.choice([floor * 11 // 10, floor * 2, floor * 6, 5 * CREDIT, 50 * CREDIT])
        rows.append(
            Task(
                owner=rng.choice(requesters),
                title=f"t{i}",
                kind="synthetic",
                spec=spec,
                budget=bid * replication,
                price_estimate=synthetic.estimate_price(spec),
                bid=bid,
                work_tflop=synthetic.tflop(spec),
                memory_bytes=synthetic.resources(spec).memory_bytes,
                features=sorted(synthetic.features(spec)),
                min_reputation=rng.choice([0, 0, 0, 50, 80]),
                replication=replication,
                status=TaskStatus.OPEN,
                opened_at=now - timedelta(seconds=rng.randint(0, 86_400)),
            )
        )
    Task.objects.bulk_create(rows, batch_size=2000)
    # The busy nodes hold a job each, on tasks that then have all they need.
    held = rows[tasks:]
    jobs = []
    for task, worker in zip(held, workers[:busy], strict=False):
        Task.objects.filter(pk=task.pk).update(replication=1, status=TaskStatus.RUNNING)
        jobs.append(
            Assignment(
                task=task,
                worker=worker,
                state=Assignment.State.RUNNING,
                seed_block_hash="0" * 64,
                deadline=now + timedelta(hours=1),
                price=floor,
            )
        )
    # Some waiting tasks lost a node before: exclusions and retakes in the book.
    for task in rng.sample(rows[:tasks], tasks // 20):
        jobs.append(
            Assignment(
                task=task,
                worker=rng.choice(workers),
                state=Assignment.State.EXPIRED,
                seed_block_hash="0" * 64,
                deadline=now,
                settled_at=now - timedelta(minutes=5),
            )
        )
    Assignment.objects.bulk_create(jobs, batch_size=2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def timed_pass(passes: int) -> dict[str, Any]:
    """Read the book and decide, ``passes`` times (a pass changes nothing until applied)."""
    reads, decisions, totals = [], [], []
    book = None
    matches: list[Any] = []
    for _ in range(passes):
        with market_pass.paused_gc():  # as offer_waiting runs a pass
            t0 = time.perf_counter()
            book = market_pass.read_book()
            t1 = time.perf_counter()
            matches = market_pass.decide(book)
            t2 = time.perf_counter()
        reads.append((t1 - t0) * 1000)
        decisions.append((t2 - t1) * 1000)
        totals.append((t2 - t0) * 1000)
    assert book is not None
    return {
        "pass_ms": round(statistics.median(totals), 1),
        "read_ms": round(statistics.median(reads), 1),
        "match_ms": round(statistics.median(decisions), 1),
        "orders": len(book.orders),
        "free_nodes": len(book.nodes),
        "matches": len(matches),
        "book": book,
        "match_list": matches,
    }


def same_as_reference(book: Any) -> bool:
    cap = pricing.largest_price_under
    return match(book.orders, book.nodes, cap) == match_reference(book.orders, book.nodes, cap)


def small_case_agrees(rng: random.Random) -> bool:
    """The fast matcher and the reference on 300 orders and 60 nodes drawn from the book."""
    book = market_pass.read_book()
    orders = rng.sample(book.orders, min(300, len(book.orders)))
    nodes = rng.sample(book.nodes, min(60, len(book.nodes)))
    cap = pricing.largest_price_under
    return match(orders, nodes, cap) == match_reference(orders, nodes, cap)


def apply_ms(matches: list[Any]) -> float:
    """Offer the pass's matches through the scheduler; ms per job offered."""
    nodebroker.publish_job = lambda *a, **k: None  # no node broker here
    t0 = time.perf_counter()
    offered = market_pass.offer(matches)
    elapsed = (time.perf_counter() - t0) * 1000
    return round(elapsed / max(offered, 1), 2)


def run(tasks: int, nodes: int, free: int, passes: int) -> dict[str, Any]:
    rng = random.Random(20261127)
    started = time.perf_counter()
    populate(tasks, nodes, nodes - free, rng)
    setup_s = time.perf_counter() - started
    small_ok = small_case_agrees(rng)
    steady = timed_pass(passes)
    steady_ok = same_as_reference(steady["book"])
    per_offer = apply_ms(steady["match_list"])
    # Every node free: the platform starting with a full book.
    with transaction.atomic():
        Assignment.objects.filter(state__in=[Assignment.State.RUNNING, Assignment.State.OFFERED]).update(
            state=Assignment.State.EXPIRED, settled_at=timezone.now()
        )
        cold = timed_pass(max(3, passes // 2))
        transaction.set_rollback(True)
    return {
        "tasks_waiting": steady["orders"],
        "nodes_online": nodes,
        "steady_free_nodes": steady["free_nodes"],
        "steady_pass_ms": steady["pass_ms"],
        "steady_read_ms": steady["read_ms"],
        "steady_match_ms": steady["match_ms"],
        "steady_matches": steady["matches"],
        "offer_ms_per_job": per_offer,
        "all_free_pass_ms": cold["pass_ms"],
        "all_free_read_ms": cold["read_ms"],
        "all_free_match_ms": cold["match_ms"],
        "all_free_matches": cold["matches"],
        "same_as_reference_small": small_ok,
        "same_as_reference_steady": steady_ok,
        "setup_s": round(setup_s, 1),
        "target_pass_ms": TARGET_MS,
        "meets_target": steady["pass_ms"] <= TARGET_MS and small_ok and steady_ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--free", type=int, default=100, help="nodes free at the steady-state pass")
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/market.py measures PostgreSQL: set BENCH_DATABASE_URL=postgres://…")
    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = f"bench_{db['NAME']}"
    test_db = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        print(f"database {test_db} (throwaway)", flush=True)
        figures = run(args.tasks, args.nodes, args.free, args.passes)
    finally:
        connection.creation.destroy_test_db(settings.DATABASES["default"]["NAME"], verbosity=0)
    print(
        f"steady pass: {figures['steady_pass_ms']} ms (read {figures['steady_read_ms']}, match"
        f" {figures['steady_match_ms']}) over {figures['tasks_waiting']:,} waiting tasks and"
        f" {figures['steady_free_nodes']} free of {figures['nodes_online']:,} online nodes:"
        f" {figures['steady_matches']} matches (target ≤ {TARGET_MS:.0f} ms:"
        f" {'met' if figures['meets_target'] else 'NOT met'})"
    )
    print(
        f"all nodes free: {figures['all_free_pass_ms']} ms (read {figures['all_free_read_ms']}, match"
        f" {figures['all_free_match_ms']}), {figures['all_free_matches']} matches"
    )
    print(f"offering a match through the scheduler: {figures['offer_ms_per_job']} ms a job")
    print(
        f"same decisions as the reference: small case {figures['same_as_reference_small']},"
        f" the steady book {figures['same_as_reference_steady']}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
