"""API latency and throughput: task create and task list, 32 concurrent clients,
against the real ASGI server (daphne) on PostgreSQL.

    .venv/bin/python bench/api.py [--requests 1600] [--clients 32]

Uses BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/proofwork_bench),
which it drops and recreates. Ends with one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def recreate_database(url: str) -> None:
    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return out.stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_phase(base: str, token: str, clients: int, total: int, make_request) -> tuple[list[float], float, int]:
    latencies: list[float] = []
    errors = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)

    async def client() -> None:
        nonlocal errors
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=30) as http:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                response = await make_request(http, i)
                latencies.append(time.perf_counter() - t0)
                if response.status_code >= 400:
                    errors += 1
                    if errors <= 2:
                        print(f"  error {response.status_code}: {response.text[:300]}", flush=True)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - start, errors


async def bench(base: str, token: str, clients: int, total: int) -> dict[str, dict[str, float]]:
    async def create(http: httpx.AsyncClient, i: int) -> httpx.Response:
        body = {"kind": "synthetic", "title": f"bench {i}", "budget": "1", "spec": {"n": 512}}
        return await http.post("/api/v1/tasks/", json=body)

    async def listing(http: httpx.AsyncClient, i: int) -> httpx.Response:
        return await http.get("/api/v1/tasks/", params={"status": "open", "page": 1 + i % 5})

    results = {}
    for name, fn in (("task_create", create), ("task_list", listing)):
        await run_phase(base, token, clients, clients * 2, fn)  # warm-up
        latencies, elapsed, errors = await run_phase(base, token, clients, total, fn)
        results[name] = {
            "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "p95_ms": round(percentile(latencies, 0.95) * 1000, 1),
            "rps": round(total / elapsed, 1),
            "errors": errors,
        }
        print(
            f"{name:12s} p50 {results[name]['p50_ms']:7.1f} ms  p95 {results[name]['p95_ms']:7.1f} ms  "
            f"{results[name]['rps']:7.1f} req/s  errors {errors}",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()

    db_url = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/proofwork_bench")
    recreate_database(db_url)
    env = {**os.environ, "DATABASE_URL": db_url, "PROOFWORK_LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    manage(env, "migrate", "--noinput", "-v0")
    # Every create escrows its budget: fund the bench user for all of them (warm-up included).
    budget_credits = 2 * (args.requests + 2 * args.clients)
    token = (
        manage(
            env,
            "shell",
            "-c",
            "from marketplace.models import User; from marketplace import services; "
            "from ledger import services as ledger; from ledger.sealer import seal_all; "
            "u = User.objects.create_user('bench', password='bench-password-123'); "
            f"ledger.deposit(u, {budget_credits} * 10**9, 'bench:funding'); seal_all(); "
            "print(services.create_api_token(u, 'bench')[1])",
        )
        .strip()
        .splitlines()[-1]
    )

    port = free_port()
    server = subprocess.Popen(
        [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "w"),  # noqa: SIM115
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(f"{base}/api/v1/kinds/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        print(f"daphne on {base}, PostgreSQL, {args.clients} concurrent clients, {args.requests} requests per phase")
        results = asyncio.run(bench(base, token, args.clients, args.requests))
    finally:
        server.terminate()
        server.wait(timeout=10)
    summary = {
        "bench": "api",
        "clients": args.clients,
        "create_p50_ms": results["task_create"]["p50_ms"],
        "create_p95_ms": results["task_create"]["p95_ms"],
        "create_rps": results["task_create"]["rps"],
        "list_p50_ms": results["task_list"]["p50_ms"],
        "list_p95_ms": results["task_list"]["p95_ms"],
        "list_rps": results["task_list"]["rps"],
        "errors": results["task_create"]["errors"] + results["task_list"]["errors"],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
