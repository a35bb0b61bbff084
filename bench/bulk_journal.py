#!/usr/bin/env python3
"""Fast bulk writer for crash-recovery journals (benchmark fixtures).

Writes a journal in the on-disk format of docs/format.md, written from
docs/format.md alone: it imports nothing from the product, so a bug in the
product's encoder cannot hide behind a matching bug here.

What it produces in ``DATA_DIR``:

* ``journal.sqlite3`` in WAL mode with the tables ``metadata(key, value)``
  (``journal_id``, ``schema``) and ``events(seq, payload, previous, hash)``,
  and the six append-only triggers (docs/format.md §Tables), created after the
  bulk insert so the per-row ``events_append_only`` check does not slow it down
  (the finished schema is the same);
* ``initialized``: canonical ``{"journal_id": ..., "schema": ...}`` + newline;
* ``head.json``: canonical ``{"count", "head", "journal_id", "schema"}``.

The history is a realistic mix of closed operations, so the gate is open at
the end (no operation is pending or uncertain):

* most operations: ``started`` then ``returned`` (reason ``returned``);
* some: ``started``, ``uncertain`` (``exception`` / ``error_response`` /
  ``cancelled``), then ``resolved`` by an operator;
* a few: ``started`` then ``resolved`` directly (the worker died while the
  call was pending and an operator settled it).

Every operation takes two or three events, so any count except 1 can be
written exactly.

Speed: payloads are rendered from fixed-key templates (keys already in
sorted order, values that need no escaping), which produces exactly
``C(payload)`` of docs/format.md §Canonical encoding without calling ``json.dumps`` per event;
the first events of every run are cross-checked against ``json.dumps``.
All rows go in through one ``executemany`` in one transaction.  About 1M
events in well under a minute on a slow machine.

Usage::

    python bench/bulk_journal.py DATA_DIR --events 1000000 [--seed 7]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import sys
import time
import uuid
from json.encoder import encode_basestring  # C(x) of a str, ensure_ascii=False
from typing import Any, Dict, Iterator, List, Tuple

SCHEMA = "hermes.crash-recovery.v1"
DB_NAME = "journal.sqlite3"
HEAD_NAME = "head.json"
MARKER_NAME = "initialized"

SQL_CREATE_METADATA = "CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
SQL_CREATE_EVENTS = ("CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
                     "previous TEXT NOT NULL, hash TEXT NOT NULL)")
# The append-only triggers of docs/format.md §Tables: no row of either table can
# be changed or removed through SQLite, and events are only added at the end.
# A journal without them is accepted, but the product re-creates them (with a
# WARNING) on its first append, which would change the schema mid-benchmark.
_APPEND_ONLY = "SELECT RAISE(ABORT, 'crash-recovery: the journal is append-only'); END"
TRIGGERS = (
    ("CREATE TRIGGER events_append_only BEFORE INSERT ON events WHEN "
     "NEW.seq IS NOT (SELECT coalesce(max(seq), 0) + 1 FROM events) BEGIN " + _APPEND_ONLY),
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN " + _APPEND_ONLY,
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN " + _APPEND_ONLY,
    "CREATE TRIGGER metadata_no_insert BEFORE INSERT ON metadata BEGIN " + _APPEND_ONLY,
    "CREATE TRIGGER metadata_no_update BEFORE UPDATE ON metadata BEGIN " + _APPEND_ONLY,
    "CREATE TRIGGER metadata_no_delete BEFORE DELETE ON metadata BEGIN " + _APPEND_ONLY,
)

# How many operations (out of 1000) take each shape.  The rest are
# started -> returned.
UNCERTAIN_THEN_RESOLVED_PER_MILLE = 40
PENDING_THEN_RESOLVED_PER_MILLE = 10

TOOL_CALLS: List[Tuple[str, Dict[str, Any]]] = [
    ("send_payment", {"amount": 125, "currency": "EUR", "to": "acct-4711"}),
    ("book_flight", {"destination": "LIS", "passenger": "Ada Lovelace", "date": "2025-03-14"}),
    ("post_message", {"channel": "#ops", "text": "deploy finished \u2713"}),
    ("terminal", {"command": "git push origin main"}),
    ("write_file", {"path": "/srv/report.md", "content": "# Weekly report\n..."}),
    ("send_email", {"to": "ops@example.org", "subject": "Invoice 2025-017"}),
]
RESPONSES: List[Any] = [
    {"status": "ok", "id": "pay-0001"},
    "Booked: confirmation ABC123",
    {"ok": True, "ts": "1712345678.000100"},
    {"exit_code": 0, "output": "Everything up-to-date"},
]
ERROR_RESPONSE: Any = {"status": "failed", "error": "upstream timeout"}
EVIDENCE = [
    "payment provider ledger shows transfer pay-0001 settled",
    "airline reservation system has no booking for this passenger and date",
    "channel history contains the message once",
]


# ---------------------------------------------------------------- encoding --

def canonical_text(value: Any) -> str:
    """C(x) of docs/format.md §Canonical encoding as text (hash its UTF-8 bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def sha256_hex(text: str) -> str:
    """Lower-case hex SHA-256 of the UTF-8 encoding of ``text``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def genesis_hash(journal_id: str) -> str:
    """H0 = SHA256(C({"schema": SCHEMA, "journal_id": journal_id}))."""
    return sha256_hex(canonical_text({"schema": SCHEMA, "journal_id": journal_id}))


def event_hash(previous: str, payload_text: str) -> str:
    """Hi = SHA256(C({"previous": H(i-1), "payload": p_i})).

    Sorted keys put ``payload`` before ``previous``; ``encode_basestring`` is
    exactly what ``json.dumps(..., ensure_ascii=False)`` emits for a str.
    """
    envelope = '{"payload":' + encode_basestring(payload_text) + ',"previous":"' + previous + '"}'
    return hashlib.sha256(envelope.encode("utf-8")).hexdigest()


def checkpoint_text(journal_id: str, count: int, head: str) -> str:
    """Canonical head.json content (docs/format.md §Checkpoint)."""
    return canonical_text({"schema": SCHEMA, "journal_id": journal_id,
                           "count": count, "head": head})


# --------------------------------------------------------------- payloads --
# Templates with keys in sorted order; every substituted value is a plain
# ASCII identifier, hex digest, integer or a pre-encoded JSON string.

STARTED_TEMPLATE = ('{{"args_hash":"{args_hash}","fingerprint":"{fingerprint}",'
                    '"kind":"started","operation_id":"{operation_id}",'
                    '"schema":"' + SCHEMA + '","session_id":"{session_id}",'
                    '"timestamp_ns":{timestamp_ns},"tool":"{tool}",'
                    '"tool_call_id":"{tool_call_id}"}}')
CLOSING_TEMPLATE = ('{{"kind":"{kind}","operation_id":"{operation_id}",'
                    '"reason":"{reason}","result_hash":"{result_hash}",'
                    '"schema":"' + SCHEMA + '","timestamp_ns":{timestamp_ns}}}')
RESOLVED_TEMPLATE = ('{{"evidence":{evidence_json},"kind":"resolved",'
                     '"operation_id":"{operation_id}","outcome":"{outcome}",'
                     '"schema":"' + SCHEMA + '","timestamp_ns":{timestamp_ns}}}')


def operation_shapes(event_count: int, rng: random.Random) -> Iterator[int]:
    """Yield the number of events (2 or 3) of each operation; they sum to event_count."""
    if event_count == 1:
        raise ValueError("a journal with every operation closed needs 0 or >= 2 events")
    remaining = event_count
    while remaining:
        if remaining in (2, 4):
            shape = 2
        elif remaining in (3, 5):
            shape = 3
        else:
            draw = rng.randrange(1000)
            shape = 3 if draw < UNCERTAIN_THEN_RESOLVED_PER_MILLE else 2
            if draw >= 1000 - PENDING_THEN_RESOLVED_PER_MILLE:
                shape = -2  # started then resolved directly
        yield shape
        remaining -= abs(shape)


def payload_texts(event_count: int, seed: int, start_ns: int) -> Iterator[str]:
    """Yield ``event_count`` canonical payload strings of closed operations."""
    rng = random.Random(seed)
    # Operation ids: a random UUID prefix per journal plus a counter in the
    # last group -- unique within the journal, valid UUID strings, cheap.
    prefix = str(uuid.UUID(int=rng.getrandbits(128), version=4))[:24]
    calls = [(tool, canonical_text({"tool": tool, "args": args}), canonical_text(args))
             for tool, args in TOOL_CALLS]
    call_hashes = [(tool, sha256_hex(fp_text), sha256_hex(args_text))
                   for tool, fp_text, args_text in calls]
    response_hashes = [sha256_hex(canonical_text(response)) for response in RESPONSES]
    error_hash = sha256_hex(canonical_text(ERROR_RESPONSE))
    null_hash = sha256_hex(canonical_text(None))
    evidence_json = [encode_basestring(text) for text in EVIDENCE]
    timestamp_ns = start_ns
    operation_number = 0
    for shape in operation_shapes(event_count, rng):
        operation_number += 1
        operation_id = f"{prefix}{operation_number:012x}"
        tool, fingerprint, args_hash = call_hashes[operation_number % len(call_hashes)]
        timestamp_ns += 1_000_000
        yield STARTED_TEMPLATE.format(
            args_hash=args_hash, fingerprint=fingerprint, operation_id=operation_id,
            session_id=f"session-{operation_number // 50}", timestamp_ns=timestamp_ns,
            tool=tool, tool_call_id=f"call-{operation_number:08d}")
        timestamp_ns += 250_000_000
        if shape == 2:
            yield CLOSING_TEMPLATE.format(
                kind="returned", operation_id=operation_id, reason="returned",
                result_hash=response_hashes[operation_number % len(response_hashes)],
                timestamp_ns=timestamp_ns)
            continue
        if shape == 3:
            reason = ("exception", "error_response", "cancelled")[operation_number % 3]
            yield CLOSING_TEMPLATE.format(
                kind="uncertain", operation_id=operation_id, reason=reason,
                result_hash=error_hash if reason == "error_response" else null_hash,
                timestamp_ns=timestamp_ns)
            timestamp_ns += 60_000_000_000
        outcome = "completed" if operation_number % 2 else "not_applied"
        yield RESOLVED_TEMPLATE.format(
            evidence_json=evidence_json[operation_number % len(evidence_json)],
            operation_id=operation_id, outcome=outcome, timestamp_ns=timestamp_ns)


def event_rows(journal_id: str, payloads: Iterator[str],
               summary: Dict[str, Any]) -> Iterator[Tuple[int, str, str, str]]:
    """Chain payloads into (seq, payload, previous, hash) rows.

    The first rows are cross-checked against ``json.dumps`` (canonical form)
    so a template drift fails loudly.  ``summary`` receives count/head/bytes.
    """
    previous = genesis_hash(journal_id)
    seq = 0
    payload_chars = 0
    for seq, payload in enumerate(payloads, start=1):
        if seq <= 16:
            if canonical_text(json.loads(payload)) != payload:
                raise AssertionError(f"template is not canonical at seq {seq}: {payload}")
            if event_hash(previous, payload) != sha256_hex(
                    canonical_text({"previous": previous, "payload": payload})):
                raise AssertionError("fast event hash disagrees with C()")
        current = event_hash(previous, payload)
        payload_chars += len(payload)
        yield seq, payload, previous, current
        previous = current
    summary["count"] = seq
    summary["head"] = previous
    summary["payload_chars"] = payload_chars


# ---------------------------------------------------------------- writing --

def fsync_directory(path: str) -> None:
    """fsync a directory so renames/creations in it are durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_file_durably(path: str, text: str) -> None:
    """Write text to a temp file, fsync, os.replace over path, fsync the directory."""
    temporary = path + ".tmp-bulk"
    with open(temporary, "w", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
    fsync_directory(os.path.dirname(path) or ".")


def write_journal(data_dir: str, event_count: int, *, seed: int = 7,
                  journal_id: str | None = None, triggers: bool = True) -> Dict[str, Any]:
    """Create a valid journal with ``event_count`` events in ``data_dir``.

    ``data_dir`` may exist but must not contain a journal, marker or
    checkpoint.  ``triggers``: create the append-only triggers (False writes a
    journal as older versions did).  Returns a summary: journal_id, count,
    head, seconds, payload_chars, database bytes.
    """
    began = time.perf_counter()
    os.makedirs(data_dir, exist_ok=True)
    database_path = os.path.join(data_dir, DB_NAME)
    for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", HEAD_NAME, MARKER_NAME):
        if os.path.exists(os.path.join(data_dir, name)):
            raise FileExistsError(os.path.join(data_dir, name))
    rng = random.Random(seed)
    journal_id = journal_id or str(uuid.UUID(int=rng.getrandbits(128), version=4))
    summary: Dict[str, Any] = {"journal_id": journal_id}
    connection = sqlite3.connect(database_path, isolation_level=None)
    try:
        # Bulk load without a rollback journal (a crash here just leaves a
        # useless fixture), then switch the file to WAL as docs/format.md requires.
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-65536")
        connection.execute("BEGIN")
        connection.execute(SQL_CREATE_METADATA)
        connection.execute(SQL_CREATE_EVENTS)
        connection.executemany("INSERT INTO metadata(key, value) VALUES (?, ?)",
                               [("journal_id", journal_id), ("schema", SCHEMA)])
        payloads = payload_texts(event_count, seed, start_ns=1_700_000_000_000_000_000)
        connection.executemany(
            "INSERT INTO events(seq, payload, previous, hash) VALUES (?, ?, ?, ?)",
            event_rows(journal_id, payloads, summary))
        if triggers:
            for sql in TRIGGERS:
                connection.execute(sql)
        connection.execute("COMMIT")
        summary.setdefault("count", 0)
        summary.setdefault("head", genesis_hash(journal_id))
        summary.setdefault("payload_chars", 0)
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"could not switch journal to WAL (got {mode!r})")
        connection.execute("PRAGMA synchronous=FULL")
    finally:
        connection.close()
    with open(database_path, "rb+") as database_file:
        os.fsync(database_file.fileno())
    marker_text = canonical_text({"journal_id": journal_id, "schema": SCHEMA}) + "\n"
    write_file_durably(os.path.join(data_dir, MARKER_NAME), marker_text)
    write_file_durably(os.path.join(data_dir, HEAD_NAME),
                       checkpoint_text(journal_id, summary["count"], summary["head"]))
    summary["database_bytes"] = os.path.getsize(database_path)
    summary["seconds"] = time.perf_counter() - began
    return summary


def main(argv: List[str] | None = None) -> int:
    """CLI: write a journal and print its summary as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="directory to create the journal in (must hold none)")
    parser.add_argument("--events", type=int, required=True, help="number of events (0 or >= 2)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (journal id, mix)")
    parser.add_argument("--no-triggers", action="store_true",
                        help="omit the append-only triggers (a journal of an older version)")
    options = parser.parse_args(argv)
    summary = write_journal(options.data_dir, options.events, seed=options.seed,
                            triggers=not options.no_triggers)
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
