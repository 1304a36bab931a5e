"""Bulk row updates: one UPDATE … FROM unnest(…) on PostgreSQL, bulk_update elsewhere.

Django's bulk_update writes a CASE expression per field, which PostgreSQL plans slowly
for thousands of rows; unnest keeps sealing a 10,000-transaction block to one statement.
``overlapped`` lets PostgreSQL run such statements while this process computes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import cast

from django.db import connection
from django.db.models import Max

from ledger.models import Account, Block, Transaction

_ACCOUNT_TYPES = {
    "available": "bigint",
    "next_nonce": "bigint",
    "balance": "bigint",
    "nonce": "bigint",
    "public_key": "text",
    "kind": "text",
}


def update_accounts(accounts: Sequence[Account], fields: list[str]) -> None:
    """Write ``fields`` of these accounts (rows the caller has locked)."""
    if not accounts:
        return
    if connection.vendor != "postgresql":
        Account.objects.bulk_update(accounts, fields, batch_size=500)
        return
    table = Account._meta.db_table
    cols = ", ".join(f"{f} = u.{f}" for f in fields)
    arrays = ", ".join(f"%s::{_ACCOUNT_TYPES[f]}[]" for f in fields)
    names = ", ".join(fields)
    sql = f"UPDATE {table} AS a SET {cols} FROM unnest(%s::bigint[], {arrays}) AS u(id, {names}) WHERE a.id = u.id"  # noqa: S608 (column names come from the fixed table above)
    params: list[list[object]] = [[a.pk for a in accounts]]
    params += [[getattr(a, f) for a in accounts] for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@contextmanager
def overlapped() -> Iterator[None]:
    """Writes issued inside the block are sent to PostgreSQL at once and run there while
    this process goes on (psycopg's pipeline mode); the block's end waits for them and
    raises their first error (as django.db's exception), inside the caller's transaction,
    which must then roll back. Only for statements whose results nobody reads.
    Elsewhere each statement simply runs in turn."""
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield


def reserve_block_id() -> int:
    """The primary key the next block will be saved with, so that its transactions can
    point at it before the block row exists (the foreign key is checked at commit).
    Call with the sealer lock held."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [Block._meta.db_table])
            row = cursor.fetchone()
        assert row is not None
        return int(row[0])
    # SQLite: the sealer's IMMEDIATE transaction is the only writer.
    return int(Block.objects.aggregate(top=Max("id"))["top"] or 0) + 1


def mark_sealed(block_id: int, tx_ids: Sequence[int]) -> None:
    """Attach transactions to their block in the given order (index_in_block = position)."""
    if connection.vendor != "postgresql":
        rows = [Transaction(pk=pk, status="sealed", block_id=block_id, index_in_block=i) for i, pk in enumerate(tx_ids)]
        Transaction.objects.bulk_update(rows, ["status", "block", "index_in_block"], batch_size=500)
        return
    table = Transaction._meta.db_table
    sql = (
        f"UPDATE {table} AS t SET status = 'sealed', block_id = %s, index_in_block = u.idx "  # noqa: S608
        "FROM unnest(%s::bigint[], %s::int[]) AS u(id, idx) WHERE t.id = u.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [block_id, list(tx_ids), list(range(len(tx_ids)))])


_SEPARATOR = "\x1f"  # ASCII unit separator: never in a hash, refused in references
# Every column of the table in the model's order, and each row's values in that order:
# COPY takes them as they are, but for the payload, which it takes as JSON text.
_TX_FIELDS = Transaction._meta.concrete_fields
_TX_COLUMNS = [cast(str, f.column) for f in _TX_FIELDS]  # a concrete field always has one
_tx_values = attrgetter(*(f.attname for f in _TX_FIELDS))
_PAYLOAD = _TX_COLUMNS.index("payload")
COPY_MIN = 64


def taken(field: str, values: Sequence[str]) -> set[str]:
    """Which of ``values`` an admitted (not refused) transaction already has in
    ``field`` ("hash" or "reference"). On PostgreSQL the list travels as one string:
    psycopg escapes array elements one regex at a time, which costs more than the query."""
    if not values:
        return set()
    if connection.vendor != "postgresql" or any(_SEPARATOR in v for v in values):
        qs = Transaction.objects.filter(**{f"{field}__in": values}).exclude(status="refused")
        return {v for v in qs.values_list(field, flat=True) if v}
    table = Transaction._meta.db_table
    column = {"hash": "hash", "reference": "reference"}[field]
    sql = (
        f"SELECT {column} FROM {table} WHERE {column} = ANY(string_to_array(%s, %s)) "  # noqa: S608
        "AND status <> 'refused'"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [_SEPARATOR.join(values), _SEPARATOR])
        return {row[0] for row in cursor.fetchall()}


def insert_transactions(rows: Sequence[Transaction]) -> None:
    """Insert rows, setting their primary keys. Big batches on PostgreSQL take ids from
    the sequence in one query and go in with COPY, an order of magnitude cheaper than
    an INSERT built field by field; ids stay in admission order either way."""
    if not rows:
        return
    if connection.vendor != "postgresql" or len(rows) < COPY_MIN:
        Transaction.objects.bulk_create(rows, batch_size=2000)
        return
    table = Transaction._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [table, len(rows)]
        )
        ids = sorted(r[0] for r in cursor.fetchall())
        for row, pk in zip(rows, ids, strict=True):
            row.pk = pk
        raw = cursor.cursor
        with raw.copy(f"COPY {table} ({', '.join(_TX_COLUMNS)}) FROM STDIN") as copy:
            for r in rows:
                values = list(_tx_values(r))
                values[_PAYLOAD] = json.dumps(values[_PAYLOAD], separators=(",", ":"))
                copy.write_row(values)
    for r in rows:
        r._state.adding = False
        r._state.db = connection.alias
