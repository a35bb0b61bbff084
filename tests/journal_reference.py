"""A second reading of the on-disk format, written from docs/format.md alone.

The tests use it to look at journals without going through the product: it
never imports crash-recovery.  It has three parts:

* :func:`read_rows` / :func:`snapshot_rows`: the tables as SQLite stores them,
  read from a private copy (so no ``-wal``/``-shm`` appears in the data
  directory and nothing is checkpointed);
* :func:`verify`: an independent check of a journal (chain, payload shapes,
  transitions, checkpoint) returning a :class:`Report`;
* :class:`JournalBuilder`: writes journals by hand with raw sqlite3, valid or
  deliberately broken.

Hazard: reading ``journal.sqlite3`` with plain ``open()`` drops every POSIX lock
this *process* holds on it (including a live SQLite connection's).  Close
in-process journals before calling these, or call them from a subprocess.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

SCHEMA = "hermes.crash-recovery.v1"
DATABASE = "journal.sqlite3"
CHECKPOINT = "head.json"
MARKER = "initialized"
HEX = set("0123456789abcdef")
OPEN_STATES = ("pending", "uncertain")
# docs/format.md §Tables: the schema objects a journal may hold.  The triggers
# are optional (journals from before they existed) but nothing else is allowed.
SCHEMA_OBJECTS = {("table", "metadata"), ("table", "events"),
                  ("index", "sqlite_autoindex_metadata_1")}
TRIGGERS = {"events_append_only", "events_no_update", "events_no_delete", "metadata_no_insert",
            "metadata_no_update", "metadata_no_delete"}
REASONS = {"returned": ("returned", "not_run", "not_run_host_refused"),
           "uncertain": ("exception", "cancelled", "error_response", "lost_in_crash"),
           "late_outcome": ("returned", "error_response", "exception", "cancelled")}


# docs/format.md §Canonical encoding: the limits of C(x).
MAX_NESTING = 512
MAX_VALUES = 1_000_000
MAX_BYTES = 64 * 1024 * 1024
MAX_DIGITS = 4300


_SCALAR_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_DIGITS_BOUND = 10 ** MAX_DIGITS


class NotCanonical(ValueError):
    """A value C(x) refuses (docs/format.md §Canonical encoding)."""


def canonical(value: Any) -> str:
    """C(x) of docs/format.md §Canonical encoding: json.dumps once the value
    is within the documented limits; raises :class:`NotCanonical`."""
    budget = {"values": 0, "bytes": 0}
    _within_limits(value, 1, set(), budget)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _within_limits(value: Any, depth: int, ancestors: set, budget: Dict[str, int]) -> None:
    """Recursive reading of the limits (depth <= MAX_NESTING keeps it shallow):
    counts every value and byte of C(value) as it goes, stopping at a limit."""
    budget["values"] += 1
    if budget["values"] > MAX_VALUES:
        raise NotCanonical("more values than MAX_VALUES")
    if isinstance(value, (dict, list, tuple)):
        if depth > MAX_NESTING:
            raise NotCanonical("nested deeper than MAX_NESTING")
        if id(value) in ancestors:
            raise NotCanonical("contains itself")
        children = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
        budget["bytes"] += 2 + max(len(children) - 1, 0)  # brackets and commas
        ancestors.add(id(value))
        for key, child in children:
            if isinstance(value, dict):
                if not isinstance(key, str):
                    raise NotCanonical("a key is not text")
                budget["bytes"] += _scalar_size(key) + 1  # the key and its colon
            _within_limits(child, depth + 1, ancestors, budget)
        ancestors.discard(id(value))
    elif value is None or isinstance(value, (str, int, float)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _DIGITS_BOUND:
            raise NotCanonical("an integer of more than MAX_DIGITS digits")
        budget["bytes"] += _scalar_size(value)
    else:
        raise NotCanonical(f"{type(value).__name__} is not a JSON value")
    if budget["bytes"] > MAX_BYTES:
        raise NotCanonical("more bytes than MAX_BYTES")


def _scalar_size(value: Any) -> int:
    """UTF-8 bytes of one scalar's JSON text."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = int(value)  # json writes int subclasses as plain integers
    try:
        return len(_SCALAR_ENCODER.encode(value).encode("utf-8"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise NotCanonical(str(exc)) from None


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def hash_of(value: Any) -> str:
    return sha256(canonical(value))


def genesis(journal_id: str, schema: str = SCHEMA) -> str:
    return hash_of({"schema": schema, "journal_id": journal_id})


def link(previous: str, payload_text: str) -> str:
    return hash_of({"previous": previous, "payload": payload_text})


def is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX


def is_uuid(value: Any) -> bool:
    try:
        uuid.UUID(value)
    except (TypeError, ValueError, AttributeError):
        return False
    return True


# ------------------------------------------------------------------ reading --

def read_rows(data_dir: str) -> Dict[str, Any]:
    """``{"tables", "schema_objects", "metadata", "rows"}`` from a private copy
    of the database (and its WAL).  Raises ``sqlite3.Error``/``OSError``."""
    with tempfile.TemporaryDirectory(prefix="cr-reference-") as work:
        copy = os.path.join(work, DATABASE)
        shutil.copyfile(os.path.join(data_dir, DATABASE), copy)
        if os.path.exists(os.path.join(data_dir, DATABASE + "-wal")):
            shutil.copyfile(os.path.join(data_dir, DATABASE + "-wal"), copy + "-wal")
        connection = sqlite3.connect(copy)
        try:
            objects = connection.execute(
                "SELECT type, name FROM sqlite_master ORDER BY type, name").fetchall()
            tables = {name for kind, name in objects if kind == "table"}
            found: Dict[str, Any] = {"tables": tables, "schema_objects": objects}
            if "metadata" in tables:
                found["metadata"] = connection.execute("SELECT key, value FROM metadata").fetchall()
            if "events" in tables:
                found["rows"] = connection.execute(
                    "SELECT seq, payload, previous, hash FROM events ORDER BY seq").fetchall()
            return found
        finally:
            connection.close()


def snapshot_rows(data_dir: str) -> List[tuple]:
    """Every event row ``(seq, payload, previous, hash)``."""
    return list(read_rows(data_dir).get("rows", []))


# ------------------------------------------------------------------ checking --

@dataclass
class Report:
    """What :func:`verify` found.  ``operations``: id -> dict with ``state``,
    ``tool``, ``reason``, ``outcome``, ``events`` (kinds) and more."""
    ok: bool = False
    errors: List[str] = field(default_factory=list)
    journal_id: Optional[str] = None
    schema: Optional[str] = None
    genesis: Optional[str] = None
    count: int = 0
    head: Optional[str] = None
    hashes: List[str] = field(default_factory=list)
    events: List[Dict[str, Any]] = field(default_factory=list)
    operations: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    checkpoint: Any = None
    created_ns: Optional[int] = None

    def state_of(self, operation_id: str) -> Optional[str]:
        record = self.operations.get(operation_id)
        return record["state"] if record else None

    def unresolved(self) -> List[str]:
        """Open operation ids in start order."""
        return [op for op, record in self.operations.items() if record["state"] in OPEN_STATES]

    def kinds(self) -> List[str]:
        return [event["kind"] for event in self.events]

    def summary(self) -> Optional[Dict[str, Any]]:
        if self.journal_id is None or self.head is None:
            return None
        return {"schema": self.schema, "journal_id": self.journal_id, "count": self.count,
                "head": self.head}

    def hash_at(self, count: int) -> Optional[str]:
        return self.hashes[count] if 0 <= count < len(self.hashes) else None


def _payload_errors(value: Any, schema: str) -> List[str]:
    """Problems of one decoded payload (docs/format.md §Events)."""
    if not isinstance(value, dict):
        return ["not an object"]
    errors = []
    if value.get("schema") != schema:
        errors.append("schema")
    stamp = value.get("timestamp_ns")
    if not (isinstance(stamp, int) and not isinstance(stamp, bool) and stamp >= 0):
        errors.append("timestamp_ns")
    kind = value.get("kind")
    if kind != "archived" and not isinstance(value.get("operation_id"), str):
        errors.append("operation_id")
    if kind == "started":
        if not is_uuid(value.get("operation_id")):
            errors.append("operation_id not a UUID")
        if not (isinstance(value.get("tool"), str) and value["tool"]):
            errors.append("tool")
        if not (is_hex64(value.get("fingerprint")) and is_hex64(value.get("args_hash"))):
            errors.append("fingerprint/args_hash")
        for key in ("session_id", "tool_call_id"):
            if key not in value or not (value[key] is None or isinstance(value[key], str)):
                errors.append(key)
        window = value.get("lost_window")
        if window is not None and not (
                isinstance(window, dict) and isinstance(window.get("before_ns"), int)
                and (window.get("after_ns") is None or isinstance(window["after_ns"], int))
                and window.get("after_source", "last_verified_event") in (
                    "last_verified_event", "journal_created", "marker_written")):
            errors.append("lost_window")
    elif kind in REASONS:
        if not is_hex64(value.get("result_hash")):
            errors.append("result_hash")
        if value.get("reason") not in REASONS[kind]:
            errors.append("reason")
    elif kind in ("resolved", "acknowledged"):
        if kind == "resolved" and value.get("outcome") not in ("completed", "not_applied"):
            errors.append("outcome")
        if not (isinstance(value.get("evidence"), str) and value["evidence"].strip()):
            errors.append("evidence")
    elif kind == "archived":
        archive = value.get("archive")
        if not (isinstance(archive, dict) and is_uuid(archive.get("journal_id"))
                and isinstance(archive.get("count"), int) and is_hex64(archive.get("head"))
                and isinstance(archive.get("file"), str)):
            errors.append("archive")
    else:
        errors.append(f"unknown kind {kind!r}")
    return errors


def _apply(report: Report, seq: int, event: Dict[str, Any]) -> Optional[str]:
    """Apply one event to the operation states; an error text or None."""
    kind = event["kind"]
    if kind == "archived":
        return None if seq == 1 else "archived anchor after the first event"
    op = event["operation_id"]
    record = report.operations.get(op)
    if kind == "started":
        if record is not None:
            return f"started reuses {op}"
        report.operations[op] = {"state": "pending", "tool": event["tool"],
                                 "session_id": event["session_id"],
                                 "tool_call_id": event["tool_call_id"],
                                 "timestamp_ns": event["timestamp_ns"], "reason": None,
                                 "outcome": None, "evidence": None, "late": None,
                                 "events": [kind], "started_seq": seq}
        return None
    if record is None:
        return f"{kind} for unknown operation {op}"
    if kind in ("returned", "uncertain"):
        if record["state"] != "pending":
            return f"{kind} for {record['state']} operation"
        record.update(state=kind, reason=event["reason"])
    elif kind == "resolved":
        if record["state"] not in OPEN_STATES:
            return f"resolved for {record['state']} operation"
        record.update(state="resolved", outcome=event["outcome"], evidence=event["evidence"])
    elif kind == "late_outcome":
        if record["state"] != "resolved" or record["late"] is not None:
            return "late_outcome for an operation not resolved, or a second one"
        record["late"] = event["reason"]
    elif kind == "acknowledged":
        if record["late"] in (None, "acknowledged"):
            return "acknowledged without a late outcome"
        record["late"] = "acknowledged"
    record["events"].append(kind)
    return None


def verify(data_dir: str, *, require_head: bool = True) -> Report:
    """Check the journal in ``data_dir`` without changing anything."""
    report = Report()
    try:
        found = read_rows(data_dir)
    except (OSError, sqlite3.Error) as exc:
        report.errors.append(f"unreadable: {exc}")
        return report
    foreign = [f"{kind} {name}" for kind, name in found["schema_objects"]
               if (kind, name) not in SCHEMA_OBJECTS and not (kind == "trigger" and name in TRIGGERS)]
    if foreign:
        report.errors.append(f"schema objects not in docs/format.md: {foreign}")
    if not {"metadata", "events"} <= found["tables"]:
        report.errors.append(f"tables {sorted(found['tables'])}")
        return report
    metadata = dict(found["metadata"])
    report.journal_id, report.schema = metadata.get("journal_id"), metadata.get("schema")
    if report.schema != SCHEMA or not is_uuid(report.journal_id):
        report.errors.append("metadata")
        return report
    created = metadata.get("created_ns")  # written since this row existed: digits, ns
    if created is not None and not (isinstance(created, str) and created.isascii()
                                    and created.isdigit()):
        report.errors.append(f"metadata created_ns {created!r} is not an integer")
    report.created_ns = int(created) if created is not None and not report.errors else None
    previous = report.genesis = genesis(report.journal_id)
    report.hashes = [previous]
    for index, (seq, payload, stored_previous, stored_hash) in enumerate(found["rows"], start=1):
        where = f"seq {seq}"
        if seq != index:
            report.errors.append(f"{where}: expected seq {index}")
        if stored_previous != previous:
            report.errors.append(f"{where}: broken link")
        if not isinstance(payload, str) or stored_hash != link(previous, payload):
            report.errors.append(f"{where}: hash mismatch")
        try:
            event = json.loads(payload)
        except (TypeError, ValueError):
            report.errors.append(f"{where}: not JSON")
            event = None
        if event is not None:
            problems = _payload_errors(event, report.schema)
            if problems:
                report.errors.append(f"{where}: {', '.join(problems)}")
            else:
                report.events.append(dict(event, _seq=seq))
                problem = _apply(report, seq, event)
                if problem:
                    report.errors.append(f"{where}: {problem}")
        previous = stored_hash
        report.hashes.append(previous)
    report.count, report.head = len(found["rows"]), previous
    try:
        with open(os.path.join(data_dir, CHECKPOINT), encoding="utf-8") as stream:
            report.checkpoint = json.load(stream)
        if report.checkpoint != report.summary():
            report.errors.append(f"{CHECKPOINT} {report.checkpoint} != {report.summary()}")
    except FileNotFoundError:
        if require_head:
            report.errors.append(f"{CHECKPOINT} missing")
    except (OSError, ValueError) as exc:
        report.errors.append(f"{CHECKPOINT} unreadable: {exc}")
    report.ok = not report.errors
    return report


def check_ancestor(report: Report, checkpoint: Any) -> List[str]:
    """Why ``checkpoint`` is not an ancestor of the verified journal ([] if it is)."""
    if not isinstance(checkpoint, dict) or set(checkpoint) != {"schema", "journal_id", "count",
                                                                "head"}:
        return ["not a checkpoint"]
    if (checkpoint["schema"], checkpoint["journal_id"]) != (report.schema, report.journal_id):
        return ["another journal"]
    count = checkpoint["count"]
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= report.count:
        return [f"count {count!r} out of range"]
    return [] if checkpoint["head"] == report.hash_at(count) else ["head differs"]


# ------------------------------------------------------------------ building --

def execute_sql(data_dir: str, statement: str, parameters: tuple = (), *,
                keep_triggers: bool = False) -> None:
    """Run one statement on the journal database and commit: a third party's
    edit.  Unless ``keep_triggers``, it first drops every trigger, as a
    determined editor would (the append-only triggers refuse edits)."""
    connection = sqlite3.connect(os.path.join(data_dir, DATABASE), isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        if not keep_triggers:
            for (name,) in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
                connection.execute(f'DROP TRIGGER "{name}"')
        connection.execute(statement, parameters)
        connection.execute("COMMIT")
    finally:
        connection.close()


class JournalBuilder:
    """Write a journal in the documented format by hand (raw sqlite3).

    ``JournalBuilder(data_dir)`` creates the database (WAL mode), metadata,
    marker and ``head.json``; each append updates ``head.json`` unless
    ``write_head=False``.  Override arguments write broken rows on purpose.
    """

    def __init__(self, data_dir: str, journal_id: Optional[str] = None, *, schema: str = SCHEMA,
                 marker: bool = True, wal: bool = True, write_head: bool = True):
        self.data_dir = os.fspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.journal_id = journal_id or str(uuid.uuid4())
        self.schema = schema
        self.auto_head = write_head
        self.database = os.path.join(self.data_dir, DATABASE)
        if os.path.exists(self.database):
            raise FileExistsError(self.database)
        connection = sqlite3.connect(self.database)
        try:
            if wal:
                connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            connection.execute("CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT "
                               "NULL, previous TEXT NOT NULL, hash TEXT NOT NULL)")
            connection.executemany("INSERT INTO metadata(key, value) VALUES (?, ?)",
                                   [("journal_id", self.journal_id), ("schema", schema)])
            connection.commit()
        finally:
            connection.close()
        self.hashes = [genesis(self.journal_id, schema)]
        if marker:
            with open(os.path.join(self.data_dir, MARKER), "w", encoding="utf-8") as stream:
                stream.write(canonical({"journal_id": self.journal_id, "schema": schema}) + "\n")
        if write_head:
            self.write_head()

    @property
    def count(self) -> int:
        return len(self.hashes) - 1

    @property
    def head(self) -> str:
        return self.hashes[-1]

    def checkpoint(self, count: Optional[int] = None) -> Dict[str, Any]:
        count = self.count if count is None else count
        return {"schema": self.schema, "journal_id": self.journal_id, "count": count,
                "head": self.hashes[count]}

    def write_head(self, count: Optional[int] = None, path: Optional[str] = None) -> Dict[str, Any]:
        checkpoint = self.checkpoint(count)
        target = path or os.path.join(self.data_dir, CHECKPOINT)
        with open(target + ".builder", "w", encoding="utf-8") as stream:
            stream.write(canonical(checkpoint))
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(target + ".builder", target)
        return checkpoint

    def sql(self, statement: str, parameters: tuple = ()) -> None:
        execute_sql(self.data_dir, statement, parameters)

    def append_payload_text(self, text: str, *, seq: Optional[int] = None,
                            previous: Optional[str] = None, hash_: Optional[str] = None) -> int:
        """Append ``text`` as stored (no re-encoding)."""
        previous = self.head if previous is None else previous
        stored_hash = link(previous, text) if hash_ is None else hash_
        seq = self.count + 1 if seq is None else seq
        self.sql("INSERT INTO events(seq, payload, previous, hash) VALUES (?, ?, ?, ?)",
                 (seq, text, previous, stored_hash))
        self.hashes.append(stored_hash)
        if self.auto_head:
            self.write_head()
        return seq

    def append(self, fields: Dict[str, Any]) -> Dict[str, Any]:
        payload = {"schema": self.schema, "timestamp_ns": time.time_ns(), **fields}
        self.append_payload_text(canonical(payload))
        return payload

    def started(self, tool: str = "book_flight", args: Any = None, *,
                session_id: Optional[str] = "session-1", tool_call_id: Optional[str] = None,
                operation_id: Optional[str] = None) -> str:
        args = {"destination": "LIS", "passenger": "Ada"} if args is None else args
        op = operation_id or str(uuid.uuid4())
        self.append({"kind": "started", "operation_id": op, "tool": tool,
                     "fingerprint": hash_of({"tool": tool, "args": args}),
                     "args_hash": hash_of(args), "session_id": session_id,
                     "tool_call_id": tool_call_id or "call-" + op[:8]})
        return op

    def returned(self, op: str, result: Any = "ok", reason: str = "returned") -> None:
        self.append({"kind": "returned", "operation_id": op, "result_hash": hash_of(result),
                     "reason": reason})

    def uncertain(self, op: str, result: Any = None, reason: str = "exception") -> None:
        self.append({"kind": "uncertain", "operation_id": op, "result_hash": hash_of(result),
                     "reason": reason})

    def resolved(self, op: str, outcome: str = "completed",
                 evidence: str = "receipt #42 checked") -> None:
        self.append({"kind": "resolved", "operation_id": op, "outcome": outcome,
                     "evidence": evidence})


def standard_journal(data_dir: str) -> Dict[str, Any]:
    """A valid journal with one returned, one resolved and one uncertain
    operation: ``{"builder", "returned", "resolved", "uncertain"}``."""
    builder = JournalBuilder(data_dir)
    done = builder.started("send_payment", {"amount": 10, "to": "acct-1"}, tool_call_id="call-a")
    builder.returned(done, {"status": "ok", "id": "pay-1"})
    fixed = builder.started("book_flight", {"destination": "OPO"}, tool_call_id="call-b")
    builder.uncertain(fixed, reason="exception")
    builder.resolved(fixed, "not_applied", "airline booking log shows no reservation")
    open_op = builder.started("post_message", {"channel": "#ops", "text": "hi"},
                              tool_call_id="call-c")
    builder.uncertain(open_op, {"status": "failed"}, reason="error_response")
    return {"builder": builder, "returned": done, "resolved": fixed, "uncertain": open_op}
