"""The crash-recovery journal: a hash-chained SQLite event log plus a checkpoint file.

SPEC §4-§7.  One data directory holds one journal:

* ``journal.sqlite3`` -- tables ``metadata(key, value)`` and
  ``events(seq, payload, previous, hash)``, WAL mode, ``synchronous=FULL``;
* ``head.json`` -- the checkpoint ``{"schema", "journal_id", "count", "head"}``;
* ``initialized`` -- the marker, canonical ``{"journal_id", "schema"}`` plus a newline.

Append protocol (SPEC §7), all under one ``BEGIN IMMEDIATE`` writer lock::

    1 verify   -> 2 INSERT (uncommitted) -> 3 checkpoint: temp write, fsync,
    os.replace over head.json, fsync of the directory -> 4 COMMIT

What a crash at each point leaves behind:

* before step 3's ``os.replace``: the INSERT is rolled back by SQLite and the old
  ``head.json`` still matches; a stale ``head.json.tmp`` is removed next time.
  The event never happened (for ``started``: downstream never ran).
* between ``os.replace`` and COMMIT: ``head.json`` is one event ahead of the
  database.  Verification reports ``checkpoint_ahead`` and every protected call
  is refused.  Nothing here repairs it (``operator_cli.py repair-checkpoint``
  is the operator's explicit, logged action).
* after COMMIT: the event is durable.

Verification cost: the first verification in a process reads the whole history.
Later ones in the same ``Journal`` trust the verified chain they cached, unless
``PRAGMA data_version`` shows that another connection committed, the database or
WAL file changed in any way since this journal's last transaction (a raw edit
SQLite cannot see; the page cache is dropped too), or ``full_verification=True``
-- then the whole history is verified again.  The marker and ``head.json`` are
checked on every verification (re-read whenever their file state changed).
An append also refuses when the WAL vanished under the open connection
(``wal_missing``).

Errors: every failure is a :class:`JournalError` with a short machine-readable
``code``; integrity failures are :class:`IntegrityError`.  ``sqlite3.Error``
never escapes this module (see :func:`_translate_sqlite_error`).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import sqlite3
import stat
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _json_string
from typing import Any, Callable, Iterator, Optional

SCHEMA = "hermes.crash-recovery.v1"
DATABASE_NAME = "journal.sqlite3"
CHECKPOINT_NAME = "head.json"
MARKER_NAME = "initialized"
# Fixed name: a temp file left by a killed writer is truncated and reused by the
# next append instead of accumulating.
CHECKPOINT_TEMP_NAME = "head.json.tmp"
WAL_SUFFIX = "-wal"
# The first 16 bytes of every SQLite 3 database file.
SQLITE_FILE_HEADER = b"SQLite format 3\x00"

# Seconds a writer waits for SQLite's writer lock before the call is refused.
# Admissions hold the lock for milliseconds, so waiting longer only delays a refusal.
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0
# Read-only verification re-reads head.json when it is ahead of the snapshot it
# verified, because live writers replace head.json before they COMMIT (SPEC §7)
# and keep appending while a long verification runs.  Attempts, pause in seconds.
READ_RETRY_ATTEMPTS = 20
READ_RETRY_PAUSE_SECONDS = 0.02
# Pause in seconds between attempts to switch a database another process is
# creating right now to WAL (bounded by the busy timeout).
WAL_RETRY_PAUSE_SECONDS = 0.01

STATE_PENDING = "pending"
STATE_UNCERTAIN = "uncertain"
OUTCOMES = ("completed", "not_applied")
# Reason labels of SPEC §5, per event kind.
REASONS = {
    "returned": ("returned",),
    "uncertain": ("exception", "cancelled", "error_response"),
}

SQLITE_MAX_INTEGER = 2**63 - 1
SQL_CREATE_METADATA = "CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
SQL_CREATE_EVENTS = ("CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
                     "previous TEXT NOT NULL, hash TEXT NOT NULL)")
SQL_INSERT_METADATA = "INSERT INTO metadata(key, value) VALUES (?, ?)"
SQL_SELECT_METADATA = "SELECT key, value FROM metadata"
SQL_SELECT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
SQL_SELECT_EVENTS_AFTER = "SELECT seq, payload, previous, hash FROM events WHERE seq > ? ORDER BY seq"
SQL_SELECT_HASH_AT = "SELECT hash FROM events WHERE seq = ?"
SQL_SELECT_JOURNAL_ID = "SELECT value FROM metadata WHERE key = 'journal_id'"
SQL_SELECT_EVENTS_BETWEEN = "SELECT seq, payload FROM events WHERE seq > ? AND seq <= ? ORDER BY seq"
SQL_SELECT_OPERATION_EVENTS = ("SELECT seq, payload FROM events WHERE seq > ? AND seq <= ? "
                               "AND instr(payload, ?) > 0 ORDER BY seq")
SQL_INSERT_EVENT = "INSERT INTO events(seq, payload, previous, hash) VALUES (?, ?, ?, ?)"


# ------------------------------------------------------------------ errors --

class JournalError(Exception):
    """Any failure of the journal.  ``code`` is a short machine-readable label.

    ``details`` is a JSON-safe dict with extra facts (counts, operation ids).
    """

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details

    def to_json(self) -> dict:
        """The error as a JSON-safe dict ``{"code", "message", **details}``."""
        return {"code": self.code, "message": self.message, **self.details}


class IntegrityError(JournalError):
    """The journal, the checkpoint or the marker failed verification (SPEC §7).

    Codes: ``hash_mismatch``, ``broken_link``, ``sequence_gap``, ``invalid_payload``,
    ``invalid_transition``, ``invalid_metadata``, ``schema_mismatch``,
    ``identity_mismatch``, ``marker_missing``, ``marker_corrupt``,
    ``checkpoint_missing``, ``checkpoint_empty``, ``checkpoint_corrupt``,
    ``checkpoint_foreign``, ``checkpoint_ahead``, ``journal_rolled_back``,
    ``checkpoint_behind``, ``checkpoint_mismatch``, ``missing_database``,
    ``database_replaced``, ``database_corrupt``, ``checkpoint_not_ancestor``,
    ``wal_missing`` (the ``-wal`` vanished under a live connection),
    ``stray_wal`` (a non-empty ``-wal`` beside a database file it does not
    belong to: empty, not SQLite, or another journal's).
    """


class JournalUnavailable(JournalError):
    """The journal cannot be used right now; nothing was changed.

    Codes: ``database_locked``, ``storage_unavailable``, ``wal_unavailable``,
    ``database_error``, ``journal_absent``.
    """


class AdmissionRefused(JournalError):
    """The request is valid but the journal's state refuses it.

    Codes: ``unresolved_operations`` (``details["operations"]`` lists them),
    ``unknown_operation``, ``operation_not_open``, ``operation_not_pending``,
    ``invalid_request``, ``invalid_checkpoint`` (a malformed external checkpoint).
    """


class EncodingError(JournalError, ValueError):
    """A value has no canonical JSON form (SPEC §6): NaN, infinities, non-JSON
    types, lone surrogates, non-string keys, or nesting too deep.  Code
    ``non_canonical_value``."""


# ------------------------------------------------------- canonical encoding --

def canonical_text(value: Any) -> str:
    """``C(x)`` of SPEC §6 as ``str``; raises :class:`EncodingError`.

    Only string keys are accepted: JSON turns ``1`` and ``"1"`` into the same key,
    so stringifying would let two different argument sets share one hash.
    Tuples are encoded as arrays, exactly like lists.
    """
    _reject_non_string_keys(value)
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # lone surrogates only fail here
    except (ValueError, TypeError, RecursionError) as exc:
        raise EncodingError("non_canonical_value",
                            f"value has no canonical JSON form ({type(exc).__name__}: "
                            f"{_short(str(exc))})") from None
    return text


def _reject_non_string_keys(value: Any) -> None:
    """Walk containers iteratively (deep nesting must not recurse here)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise EncodingError("non_canonical_value",
                                        f"object key of type {type(key).__name__} is not a string")
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def canonical_bytes(value: Any) -> bytes:
    """``C(x)`` of SPEC §6 as UTF-8 bytes; raises :class:`EncodingError`."""
    return canonical_text(value).encode("utf-8")


def sha256_hex(raw: bytes) -> str:
    """Lower-case hex SHA-256 of ``raw``."""
    return hashlib.sha256(raw).hexdigest()


def value_hash(value: Any) -> str:
    """``SHA256(C(value))``: ``args_hash`` and ``result_hash`` of SPEC §6."""
    return sha256_hex(canonical_bytes(value))


def fingerprint(tool: str, args: Any) -> str:
    """``SHA256(C({"tool": tool, "args": args}))`` (SPEC §6)."""
    return value_hash({"tool": tool, "args": args})


def genesis_hash(journal_id: str, schema: str = SCHEMA) -> str:
    """``H0 = SHA256(C({"schema", "journal_id"}))`` (SPEC §6)."""
    return value_hash({"schema": schema, "journal_id": journal_id})


def event_hash(previous: str, payload_text: str) -> str:
    """``Hi = SHA256(C({"previous": H(i-1), "payload": p_i}))`` (SPEC §6).

    Built by hand because this runs once per stored event during verification:
    the keys are already in sorted order ("payload" < "previous"), ``previous`` is
    hex and needs no escaping, and ``_json_string`` is ``json.dumps`` of a str with
    ``ensure_ascii=False``.  Raises ``UnicodeEncodeError`` for lone surrogates.
    """
    return hashlib.sha256(
        ('{"payload":%s,"previous":"%s"}' % (_json_string(payload_text), previous)).encode("utf-8")
    ).hexdigest()


def checkpoint_of(journal_id: str, count: int, head: str, schema: str = SCHEMA) -> dict:
    """The checkpoint dict of SPEC §7: ``{"schema", "journal_id", "count", "head"}``."""
    return {"schema": schema, "journal_id": journal_id, "count": count, "head": head}


def marker_text(journal_id: str, schema: str = SCHEMA) -> str:
    """Content of the ``initialized`` marker (SPEC §4)."""
    return canonical_text({"journal_id": journal_id, "schema": schema}) + "\n"


# The journal's own files are opened without following symlinks and without
# blocking: a symlink, FIFO, directory or device planted in the data directory
# must refuse the call -- never hang the host, never redirect a write.
_SAFE_OPEN_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
# head.json and the marker are ~200 bytes; anything near this size is not ours.
OWN_FILE_READ_LIMIT = 65536


def open_regular_file(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for the journal's own files: refuses a symlink (ELOOP) and a
    FIFO, directory or device (EINVAL) with ``OSError``; never blocks."""
    descriptor = os.open(path, flags | _SAFE_OPEN_FLAGS, mode)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return descriptor


def read_regular_file(path: str, limit: int = OWN_FILE_READ_LIMIT) -> bytes:
    """Up to ``limit`` + 1 bytes of a regular file (one more than allowed, so a
    caller can tell "too large").  Raises ``FileNotFoundError`` when absent and
    ``OSError`` as :func:`open_regular_file` does."""
    descriptor = open_regular_file(path, os.O_RDONLY)
    try:
        chunks, remaining = [], limit + 1
        while remaining > 0:
            chunk = os.read(descriptor, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# -------------------------------------------------------- fault injection --

_boundary_hook: Optional[Callable[[str, str], None]] = None

# Database paths this process holds SQLite connections to (path -> count).  POSIX
# record locks belong to the process and vanish when *any* descriptor of the file
# is closed, so a raw open()/close() of a database that another connection here
# has open would drop that connection's locks: another process closing its last
# connection then checkpoints and deletes the WAL under it.  Raw reads of the
# database file happen only while this process has no connection to it.
_OPEN_DATABASES: dict = {}
_OPEN_DATABASES_LOCK = threading.Lock()


def _remember_database(path: str) -> None:
    with _OPEN_DATABASES_LOCK:
        _OPEN_DATABASES[path] = _OPEN_DATABASES.get(path, 0) + 1


def _forget_database(path: str) -> None:
    with _OPEN_DATABASES_LOCK:
        remaining = _OPEN_DATABASES.get(path, 0) - 1
        if remaining > 0:
            _OPEN_DATABASES[path] = remaining
        else:
            _OPEN_DATABASES.pop(path, None)
# Boundary kinds of journal creation (the others are event kinds).
BOUNDARY_KIND_GENESIS = "genesis"
BOUNDARY_KIND_MARKER = "marker"


def set_boundary_hook(hook: Optional[Callable[[str, str], None]]) -> None:
    """Test seam: call ``hook(boundary, kind)`` at each durable boundary.

    Boundaries of an append: ``begin``, ``inserted``, ``checkpoint_written``,
    ``checkpoint_fsynced``, ``checkpoint_replaced``, ``directory_fsynced``,
    ``committed``; ``kind`` is the event kind being appended.  The guard adds
    ``downstream_returned`` (kind ``started``).  Creating a journal announces
    ``tables_committed`` and the checkpoint_* boundaries of the first
    ``head.json`` with kind ``genesis``, then those of the marker with kind
    ``marker``.  Crash tests install a hook that
    SIGKILLs the process; production never sets one.
    """
    global _boundary_hook
    _boundary_hook = hook


def reach_boundary(boundary: str, kind: str) -> None:
    """Announce a durable boundary to the test hook, if one is installed."""
    if _boundary_hook is not None:
        _boundary_hook(boundary, kind)


# -------------------------------------------------------------- state --

@dataclass(frozen=True)
class Operation:
    """One operation as rebuilt from its events (SPEC §5).

    ``started_ns`` is the ``timestamp_ns`` of ``started`` (ns since the epoch);
    ``last_seq`` the seq of its latest event; ``reason``/``outcome`` come from the
    latest ``returned``/``uncertain``/``resolved`` event (None before one).
    """
    operation_id: str
    state: str
    tool: str
    session_id: Optional[str]
    tool_call_id: Optional[str]
    args_hash: str
    fingerprint: str
    started_seq: int
    started_ns: int
    last_seq: int
    reason: Optional[str] = None
    outcome: Optional[str] = None

    def to_json(self) -> dict:
        """JSON-safe dict of every field."""
        return {
            "operation_id": self.operation_id, "state": self.state, "tool": self.tool,
            "session_id": self.session_id, "tool_call_id": self.tool_call_id,
            "args_hash": self.args_hash, "fingerprint": self.fingerprint,
            "started_seq": self.started_seq, "started_ns": self.started_ns,
            "last_seq": self.last_seq, "reason": self.reason, "outcome": self.outcome,
        }


@dataclass
class _Chain:
    """Verified summary of a journal prefix.

    Open (pending/uncertain) operations are kept as light records
    ``[started payload, started seq, state, reason, last seq]`` and turned into
    :class:`Operation` objects only on demand; closed ones are kept as ids so
    that reuse and late events are still caught without holding a million
    records in memory.
    """
    journal_id: str
    schema: str
    count: int
    head: str
    open: dict = field(default_factory=dict)      # operation_id -> open record (list)
    closed: set = field(default_factory=set)      # operation ids returned/resolved

    def checkpoint(self) -> dict:
        """The checkpoint dict (SPEC §7) of this verified prefix."""
        return checkpoint_of(self.journal_id, self.count, self.head, self.schema)

    def operation(self, operation_id: str) -> Optional[Operation]:
        """The open operation with that id, or None."""
        record = self.open.get(operation_id)
        if record is None:
            return None
        started, started_seq, state, reason, last_seq = record
        return Operation(operation_id=operation_id, state=state, tool=started["tool"],
                         session_id=started["session_id"], tool_call_id=started["tool_call_id"],
                         args_hash=started["args_hash"], fingerprint=started["fingerprint"],
                         started_seq=started_seq, started_ns=started["timestamp_ns"],
                         last_seq=last_seq, reason=reason)

    def operations(self) -> list:
        """Every open operation, oldest first."""
        return sorted((self.operation(operation_id) for operation_id in self.open),
                      key=lambda operation: operation.started_seq)


@dataclass(frozen=True)
class JournalStatus:
    """A verified view: ``checkpoint`` (SPEC §7 dict) and the open operations,
    oldest first."""
    checkpoint: dict
    unresolved: tuple

    def to_json(self) -> dict:
        """``{"checkpoint": {...}, "unresolved": [operation dicts]}``."""
        return {"checkpoint": self.checkpoint,
                "unresolved": [operation.to_json() for operation in self.unresolved]}


_HEX_DIGITS = "0123456789abcdef"
# The form uuid4() prints; other spellings uuid.UUID accepts take the slow path.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _is_hex64(value: Any) -> bool:
    """Lower-case SHA-256 hex.  (str.strip is ~20x faster than a per-character
    loop, and this runs for every stored event.)"""
    return isinstance(value, str) and len(value) == 64 and not value.strip(_HEX_DIGITS)


def _is_uuid(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if _CANONICAL_UUID.fullmatch(value):
        return True
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _optional_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _payload_problem(payload: Any, schema: str) -> Optional[str]:
    """Why a decoded payload is not a valid v1 event, or None (SPEC §5).
    Runs once per stored event: plain ``type() is`` checks, one lookup per field."""
    if type(payload) is not dict:
        return "payload is not a JSON object"
    get = payload.get
    if get("schema") != schema:
        return f"payload schema is {get('schema')!r}"
    stamp = get("timestamp_ns")
    if type(stamp) is not int or stamp < 0:  # type() also rejects bool
        return "timestamp_ns is not a non-negative integer"
    # A UUID check on `started` suffices: every later event must name an open
    # operation (else invalid_transition); non-text ids must not reach a dict.
    if type(get("operation_id")) is not str:
        return "operation_id is not a UUID"
    kind = get("kind")
    if kind == "started":
        if not _is_uuid(payload["operation_id"]):
            return "operation_id is not a UUID"
        tool = get("tool")
        if type(tool) is not str or not tool:
            return "started without a tool name"
        if not (_is_hex64(get("fingerprint")) and _is_hex64(get("args_hash"))):
            return "started without SHA-256 fingerprint/args_hash"
        if "session_id" not in payload or "tool_call_id" not in payload:
            return "started without session_id/tool_call_id"
        if not (_optional_text(payload["session_id"]) and _optional_text(payload["tool_call_id"])):
            return "session_id/tool_call_id is neither text nor null"
        return None
    reasons = REASONS.get(kind)
    if reasons is not None:
        if not _is_hex64(get("result_hash")):
            return f"{kind} without a SHA-256 result_hash"
        if get("reason") not in reasons:
            return f"{kind} with reason {get('reason')!r}"
        return None
    if kind == "resolved":
        if get("outcome") not in OUTCOMES:
            return f"resolved with outcome {get('outcome')!r}"
        evidence = get("evidence")
        if type(evidence) is not str or not evidence.strip():
            return "resolved without evidence"
        return None
    return f"unknown kind {kind!r}"


def _apply_event(chain: _Chain, seq: int, payload: dict) -> None:
    """Apply one valid payload to ``chain``; raise ``invalid_transition`` (SPEC §5)."""
    kind = payload["kind"]
    operation_id = payload["operation_id"]
    record = chain.open.get(operation_id)
    if kind == "started":
        if record is not None or operation_id in chain.closed:
            raise IntegrityError("invalid_transition",
                                 f"seq {seq}: started reuses operation id {operation_id}", seq=seq)
        chain.open[operation_id] = [payload, seq, STATE_PENDING, None, seq]
        return
    if record is None:
        where = "closed" if operation_id in chain.closed else "unknown"
        raise IntegrityError("invalid_transition",
                             f"seq {seq}: {kind} for {where} operation {operation_id}", seq=seq)
    if kind == "resolved":  # legal for pending and uncertain, i.e. every open operation
        del chain.open[operation_id]
        chain.closed.add(operation_id)
        return
    if record[2] != STATE_PENDING:
        raise IntegrityError("invalid_transition",
                             f"seq {seq}: {kind} for {record[2]} operation {operation_id}", seq=seq)
    if kind == "returned":
        del chain.open[operation_id]
        chain.closed.add(operation_id)
    else:
        record[2:] = [STATE_UNCERTAIN, payload["reason"], seq]


_DECODER = json.JSONDecoder()


def _decode_payload(text: str) -> Any:
    """``json.loads(text)``, or None when it is not JSON.  ``raw_decode`` first:
    it skips ``loads``' wrapper work, a measurable share of verification."""
    try:
        value, end = _DECODER.raw_decode(text)
        if end == len(text):
            return value
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _extend_chain(chain: _Chain, rows: Iterator[tuple]) -> None:
    """Verify rows ``(seq, payload, previous, hash)`` that follow ``chain`` and
    apply them in place.  Raises :class:`IntegrityError`; ``chain`` is then
    partially extended and must be discarded."""
    expected_seq = chain.count
    head = chain.head
    schema = chain.schema
    sha256 = hashlib.sha256
    quote = _json_string
    for seq, payload_text, previous, stored_hash in rows:
        expected_seq += 1
        if seq != expected_seq:
            raise IntegrityError("sequence_gap", f"expected seq {expected_seq}, found {seq}",
                                 seq=expected_seq)
        if previous != head:
            raise IntegrityError("broken_link",
                                 f"seq {seq}: previous does not equal the hash of seq {seq - 1}",
                                 seq=seq)
        if not isinstance(payload_text, str):
            raise IntegrityError("invalid_payload", f"seq {seq}: payload is not text", seq=seq)
        try:  # event_hash(), inlined: this loop runs once per stored event
            computed = sha256(('{"payload":%s,"previous":"%s"}' % (quote(payload_text), head))
                              .encode("utf-8")).hexdigest()
        except UnicodeEncodeError:
            raise IntegrityError("invalid_payload", f"seq {seq}: payload is not valid UTF-8",
                                 seq=seq) from None
        if computed != stored_hash:
            raise IntegrityError("hash_mismatch",
                                 f"seq {seq}: stored hash differs from the recomputed hash", seq=seq)
        payload = _decode_payload(payload_text)
        if payload is None:
            raise IntegrityError("invalid_payload", f"seq {seq}: payload is not JSON", seq=seq)
        problem = _payload_problem(payload, schema)
        if problem is not None:
            raise IntegrityError("invalid_payload", f"seq {seq}: {problem}", seq=seq)
        _apply_event(chain, seq, payload)
        head = stored_hash
        chain.count = seq
        chain.head = head


# ------------------------------------------------------- sqlite choke point --

def _translate_sqlite_error(exc: sqlite3.Error, action: str) -> JournalError:
    """The one place a ``sqlite3.Error`` becomes a :class:`JournalError`."""
    text = str(exc)
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        return JournalUnavailable("database_locked",
                                  f"{action}: the journal database stayed locked past the busy "
                                  f"timeout ({text})")
    if isinstance(exc, sqlite3.DatabaseError) and (
            "malformed" in lowered or "not a database" in lowered or "corrupt" in lowered):
        return IntegrityError("database_corrupt", f"{action}: {text}")
    if ("readonly" in lowered or "read-only" in lowered or "unable to open" in lowered
            or "disk i/o" in lowered or "disk is full" in lowered or "permission" in lowered):
        return JournalUnavailable("storage_unavailable", f"{action}: {text}")
    return JournalUnavailable("database_error", f"{action}: {type(exc).__name__}: {text}")


def _file_state(path: str) -> Optional[tuple]:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of a file, None when absent."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def _file_size(path: str) -> int:
    """Size in bytes, or -1 when the file does not exist or cannot be stat'ed."""
    try:
        state = _file_state(path)
    except OSError:
        return -1
    return -1 if state is None else state[2]


def _storage_error(exc: OSError, action: str) -> JournalUnavailable:
    where = f" ({exc.filename})" if exc.filename else ""
    return JournalUnavailable("storage_unavailable", f"{action}: {exc.strerror or exc}{where}")


# ------------------------------------------------------------------ journal --

class Journal:
    """Serialized admission, appends, state reconstruction and verification
    for one data directory (SPEC §4-§7, §11).

    ``data_dir``: the profile's plugin data directory (str or path).
    ``busy_timeout``: seconds to wait for SQLite's writer lock.
    ``readonly``: open with a ``mode=ro`` URI; never creates or writes anything
    (the operator CLI's ``status``/``verify``/``checkpoint``).
    ``create``: create a fresh journal when none exists (the guard); when False a
    missing journal raises ``journal_absent``.
    ``full_verification``: re-verify the whole history on every call instead of
    only what was appended since the last verification.

    Thread-safe: one connection, serialized by a lock.  Every method raises only
    :class:`JournalError` subclasses.
    """

    def __init__(self, data_dir: "os.PathLike[str] | str", *,
                 busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
                 readonly: bool = False, create: bool = True,
                 full_verification: bool = False):
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        self.database_path = os.path.join(self.data_dir, DATABASE_NAME)
        self.checkpoint_path = os.path.join(self.data_dir, CHECKPOINT_NAME)
        self.marker_path = os.path.join(self.data_dir, MARKER_NAME)
        self._temp_path = os.path.join(self.data_dir, CHECKPOINT_TEMP_NAME)
        self.busy_timeout = float(busy_timeout)
        self.readonly = readonly
        self.create = create and not readonly
        self.full_verification = full_verification
        self._lock = threading.RLock()
        self._connection: Optional[sqlite3.Connection] = None
        self._file_identity: Optional[tuple] = None
        # (database, WAL) file states after this journal's last transaction; see
        # _refresh_if_touched.
        self._files_seen: Optional[tuple] = None
        # path -> (file state, exact content) of the marker/head.json as last
        # read and found correct; see _unchanged_since_seen.
        self._files_read: dict = {}
        self._expected_checkpoint: tuple = (None, b"")
        self._chain: Optional[_Chain] = None
        self._data_version: Optional[int] = None
        self._appending = False  # an append began in the current transaction
        # head.json before the current append, restored if it fails after the INSERT.
        self._undo_checkpoint: Optional[dict] = None

    # ------------------------------------------------------------ public --

    def status(self) -> JournalStatus:
        """Verify and return the summary plus open operations (SPEC §10, §11)."""
        with self._verified() as chain:
            return self._status_of(chain)

    def unresolved(self) -> tuple:
        """Verify and return the open (pending/uncertain) operations, oldest first."""
        return self.status().unresolved

    def checkpoint(self) -> dict:
        """Verify and return the current checkpoint dict (SPEC §11 ``checkpoint``)."""
        return self.status().checkpoint

    def verify(self, external_checkpoint: Any = None) -> JournalStatus:
        """Full verification of the whole history (SPEC §11 ``verify``).

        ``external_checkpoint``: an optional dict that must be an *ancestor* of
        the journal: same schema and journal id, ``count`` <= the current count,
        ``head`` equal to the hash at that position (H0 for count 0).  Raises
        :class:`IntegrityError` ``checkpoint_not_ancestor`` otherwise.
        """
        with self._lock:
            self._chain = None  # force a full pass
            with self._verified() as chain:
                status = self._status_of(chain)
                if external_checkpoint is not None:
                    self._check_ancestor(chain, external_checkpoint)
                return status

    def admit(self, *, operation_id: str, tool: str, args_hash: str, fingerprint: str,
              session_id: Optional[str], tool_call_id: Optional[str]) -> Operation:
        """Admission (SPEC §3, §7, §8): verify, refuse if any operation is open,
        else durably append ``started`` and return the new pending operation.

        Raises :class:`AdmissionRefused` ``unresolved_operations`` (with
        ``details["operations"]``), :class:`IntegrityError`,
        :class:`JournalUnavailable`.  On any error nothing was committed.
        """
        for name, value in (("session_id", session_id), ("tool_call_id", tool_call_id)):
            if not _optional_text(value):
                raise AdmissionRefused("invalid_request", f"{name} must be text or null")
        if not (isinstance(tool, str) and tool):
            raise AdmissionRefused("invalid_request", "tool name must be non-empty text")
        payload = {"kind": "started", "operation_id": operation_id, "tool": tool,
                   "fingerprint": fingerprint, "args_hash": args_hash,
                   "session_id": session_id, "tool_call_id": tool_call_id}
        with self._verified(write=True, kind="started") as chain:
            if chain.open:
                raise self._refusal(chain)
            self._append(chain, payload)
            return chain.operation(operation_id)

    def record_outcome(self, operation_id: str, *, uncertain: bool, result_hash: str,
                       reason: str) -> None:
        """Append ``returned`` (``uncertain=False``) or ``uncertain`` for a
        pending operation (SPEC §3, §5).  Raises :class:`AdmissionRefused`
        ``operation_not_pending`` if it is not pending (e.g. force-resolved)."""
        kind = "uncertain" if uncertain else "returned"
        with self._verified(write=True, kind=kind) as chain:
            current = chain.operation(operation_id)
            if current is None or current.state != STATE_PENDING:
                raise AdmissionRefused("operation_not_pending",
                                       f"operation {operation_id} is not pending",
                                       operation_id=operation_id)
            self._append(chain, {"kind": kind, "operation_id": operation_id,
                                 "result_hash": result_hash, "reason": reason})

    def resolve(self, operation_id: str, *, outcome: str, evidence: str) -> Operation:
        """Append ``resolved`` for a pending or uncertain operation (SPEC §11).

        ``outcome`` is ``completed`` or ``not_applied``; ``evidence`` non-empty
        text.  Returns the operation as it was before resolution.  Raises
        :class:`AdmissionRefused` (``invalid_request``, ``unknown_operation``,
        ``operation_not_open``), :class:`IntegrityError`, :class:`JournalUnavailable`.
        """
        if outcome not in OUTCOMES:
            raise AdmissionRefused("invalid_request", f"outcome must be one of {OUTCOMES}")
        if not (isinstance(evidence, str) and evidence.strip()):
            raise AdmissionRefused("invalid_request", "evidence must be non-empty text")
        with self._verified(write=True, kind="resolved") as chain:
            current = chain.operation(operation_id)
            if current is None:
                if operation_id in chain.closed:
                    raise AdmissionRefused("operation_not_open",
                                           f"operation {operation_id} is already closed "
                                           "(returned or resolved)", operation_id=operation_id)
                raise AdmissionRefused("unknown_operation",
                                       f"no operation {operation_id} in this journal",
                                       operation_id=operation_id)
            self._append(chain, {"kind": "resolved", "operation_id": operation_id,
                                 "outcome": outcome, "evidence": evidence})
            return current

    def repair_checkpoint(self) -> tuple:
        """Re-anchor ``head.json`` to the database head -- only in the one crash
        state SPEC §7 describes: the database chain and marker verify on their
        own, and ``head.json`` is well-formed, names the same journal and schema,
        and anchors exactly one event more than the database holds.

        Safe because the missing event was never committed: an uncommitted
        ``started`` never ran downstream (the guard calls downstream only after
        COMMIT); an uncommitted ``returned``/``uncertain`` leaves its operation
        pending and an uncommitted ``resolved`` leaves it open, so the gate stays
        closed for them.  Returns ``(checkpoint_before, checkpoint_after)``.
        Raises :class:`IntegrityError` ``repair_not_applicable`` for every other
        state (carrying the underlying verification code in ``details``).
        """
        if self.readonly:
            raise JournalUnavailable("storage_unavailable", "journal opened read-only")
        with self._lock:
            self._chain = None
            with self._verified(write=True, kind="repair", check_checkpoint=False) as chain:
                try:
                    self._check_checkpoint(chain)
                except IntegrityError as exc:
                    if exc.code != "checkpoint_ahead":
                        raise IntegrityError(
                            "repair_not_applicable",
                            f"repair-checkpoint only clears checkpoint_ahead; found {exc.code}: "
                            f"{exc.message}", found=exc.code) from None
                    before = json.loads(read_regular_file(self.checkpoint_path))
                else:
                    raise IntegrityError("repair_not_applicable",
                                         "head.json already matches the journal", found="ok")
                after = chain.checkpoint()
                self._write_checkpoint(after, announce="")
                return before, after

    def history(self, since: int = 0, operation_id: Optional[str] = None) -> tuple:
        """One full verification, then the verified events, read lazily:
        ``(JournalStatus, iterator of (seq, payload dict))`` for ``since`` < seq
        <= the verified head, only those of ``operation_id`` when given.  A long
        history is streamed, never held in memory; consume the iterator before
        closing the journal (single-threaded use, as in the operator CLI)."""
        since = max(0, min(int(since), SQLITE_MAX_INTEGER))  # SQLite integers are 64-bit
        with self._lock:
            self._chain = None
            with self._verified() as chain:
                status = self._status_of(chain)
        return status, self._verified_rows(since, status.checkpoint["count"], operation_id)

    def _verified_rows(self, since: int, until: int,
                       operation_id: Optional[str]) -> Iterator[tuple]:
        if operation_id is None:
            query, parameters = SQL_SELECT_EVENTS_BETWEEN, (since, until)
        else:  # instr() keeps other operations' payloads out of Python entirely
            query, parameters = SQL_SELECT_OPERATION_EVENTS, (since, until, operation_id)
        try:
            for seq, payload_text in self._connection.execute(query, parameters):
                payload = json.loads(payload_text)
                if operation_id is None or payload.get("operation_id") == operation_id:
                    yield seq, payload
        except sqlite3.Error as exc:
            raise _translate_sqlite_error(exc, "reading events") from None

    def events(self, since: int = 0) -> list:
        """Verify the whole journal, then return ``(seq, payload dict)`` for every
        event with seq > ``since`` (a list; see :meth:`history` to stream)."""
        with self._lock:
            return list(self.history(since)[1])

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # --------------------------------------------------------- opening --

    def _survivors(self) -> list:
        """Journal files other than the database that exist now."""
        names = (CHECKPOINT_NAME, MARKER_NAME, DATABASE_NAME + "-wal", DATABASE_NAME + "-shm")
        return [name for name in names if os.path.lexists(os.path.join(self.data_dir, name))]

    def _missing_database(self) -> IntegrityError:
        return IntegrityError(
            "missing_database",
            f"{DATABASE_NAME} is missing while {', '.join(self._survivors())} survive(s); "
            "it is never re-created over surviving state", survivors=self._survivors())

    def _connect(self) -> sqlite3.Connection:
        """Open (once) the connection; refuse to re-create a lost database."""
        if self._connection is not None:
            self._check_file_identity()
            return self._connection
        if os.path.isfile(self.data_dir) or (os.path.lexists(self.data_dir)
                                             and not os.path.isdir(self.data_dir)):
            raise JournalUnavailable("storage_unavailable",
                                     f"data directory {self.data_dir} is not a directory")
        with _OPEN_DATABASES_LOCK:  # see _OPEN_DATABASES: never drop a sibling's locks
            if not _OPEN_DATABASES.get(self.database_path):
                self._refuse_rewritable_database()
        if not os.path.exists(self.database_path):
            # Survivors are checked before the database is looked at again: a
            # concurrent creator makes the database first, then head.json/marker.
            survivors = self._survivors()
            if not os.path.exists(self.database_path):
                if survivors:
                    raise self._missing_database()
                if not self.create:
                    raise JournalUnavailable("journal_absent",
                                             f"no journal in {self.data_dir}")
                try:
                    os.makedirs(self.data_dir, exist_ok=True)
                except OSError as exc:
                    raise _storage_error(exc, "creating the data directory") from None
        try:
            if self.readonly:
                uri = "file:" + urllib.parse.quote(self.database_path) + "?mode=ro"
                connection = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout,
                                             isolation_level=None, check_same_thread=False)
            else:
                connection = sqlite3.connect(self.database_path, timeout=self.busy_timeout,
                                             isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _translate_sqlite_error(exc, "opening the journal database") from None
        _remember_database(self.database_path)  # before any statement takes a lock
        try:
            if not self.readonly:
                self._refuse_foreign_tables(connection)
                mode = self._enable_wal(connection)
                if str(mode).lower() != "wal":
                    raise JournalUnavailable(
                        "wal_unavailable",
                        f"SQLite answered journal_mode={mode!r} instead of 'wal' in "
                        f"{self.data_dir}; the journal needs WAL (a local filesystem)")
                connection.execute("PRAGMA synchronous=FULL")
            identity = os.stat(self.database_path)
        except sqlite3.Error as exc:
            connection.close()
            _forget_database(self.database_path)
            raise _translate_sqlite_error(exc, "configuring the journal database") from None
        except BaseException:
            connection.close()
            _forget_database(self.database_path)
            raise
        self._connection = connection
        self._file_identity = (identity.st_dev, identity.st_ino)
        return connection

    @staticmethod
    def _refuse_foreign_tables(connection: sqlite3.Connection) -> None:
        """A database with tables but no journal tables is someone else's:
        refuse it before ``journal_mode=WAL`` would rewrite its header."""
        tables = {row[0] for row in connection.execute(SQL_SELECT_TABLES)}
        if tables and not {"metadata", "events"} <= tables:
            raise IntegrityError("invalid_metadata",
                                 f"{DATABASE_NAME} holds tables {sorted(tables)[:10]} but not "
                                 "metadata/events: it is not a crash-recovery journal; nothing "
                                 "was changed")

    def _enable_wal(self, connection: sqlite3.Connection) -> str:
        """``PRAGMA journal_mode=WAL``, retried while another process is creating
        the same fresh database: SQLite reports that lock at once, without its
        busy handler, so the busy timeout is applied here."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                    raise
            time.sleep(WAL_RETRY_PAUSE_SECONDS)

    def _refuse_rewritable_database(self) -> None:
        """Never hand SQLite a database file it would silently rewrite.

        SQLite deletes a ``-wal`` beside an empty database file (even when
        opened read-only) -- possibly the only copy of the journal -- and reads
        a non-SQLite file entirely from the WAL: both are a stray WAL beside a
        replaced database (``stray_wal``).  An empty file beside the marker or
        checkpoint would get a fresh header (``missing_database``).  Nothing is
        opened or changed in either case.
        """
        try:
            header = read_regular_file(self.database_path, len(SQLITE_FILE_HEADER))
            header = header[:len(SQLITE_FILE_HEADER)]
        except FileNotFoundError:
            return  # removed meanwhile: SQLite and the identity checks decide
        except OSError as exc:
            raise _storage_error(exc, f"reading {DATABASE_NAME}") from None
        if header == SQLITE_FILE_HEADER:
            self._check_wal_owner()
            return
        if _file_size(self.database_path + WAL_SUFFIX) > 0:
            raise IntegrityError(
                "stray_wal",
                f"{DATABASE_NAME} is {'empty' if not header else 'not an SQLite database'} but a "
                f"non-empty {DATABASE_NAME}{WAL_SUFFIX} lies beside it: the database was replaced "
                "and the WAL belongs to another file; nothing was opened",
                survivors=self._survivors())
        if not header and (os.path.lexists(self.marker_path)
                           or os.path.lexists(self.checkpoint_path)):
            raise IntegrityError(
                "missing_database",
                f"{DATABASE_NAME} is empty while the marker or checkpoint survives; "
                "it is never re-created over surviving state", survivors=self._survivors())

    def _check_wal_owner(self) -> None:
        """A WAL is not bound to its database file: beside a database replaced by
        another journal's, SQLite shows the WAL's pages -- and the first writer
        to close would checkpoint them into the replacement.  So before a
        writable connection exists, the main file on its own (``immutable=1``
        ignores the WAL) and the WAL's view (read-only: never checkpoints) must
        name the same journal."""
        if _file_size(self.database_path + WAL_SUFFIX) <= 0:
            return
        quoted = "file:" + urllib.parse.quote(self.database_path)
        found = []
        for query in ("?mode=ro&immutable=1", "?mode=ro"):
            try:
                probe = sqlite3.connect(quoted + query, uri=True, isolation_level=None,
                                        timeout=self.busy_timeout)
                try:
                    row = probe.execute(SQL_SELECT_JOURNAL_ID).fetchone()
                finally:
                    probe.close()
            except sqlite3.Error:
                # Deliberately not translated: a main file without tables yet
                # (nothing checkpointed), one being checkpointed right now, or a
                # database the real open reports on is no evidence here.
                return
            if row is None:
                return
            found.append(row[0])
        if found[0] != found[1]:
            raise IntegrityError(
                "stray_wal",
                f"{DATABASE_NAME} on its own is journal {_short(str(found[0]))} but its "
                f"{WAL_SUFFIX} file shows journal {_short(str(found[1]))}: the database was "
                "replaced beside a stray WAL; nothing was written", survivors=self._survivors())

    def _remember_files(self) -> None:
        """Record the files as this journal's own transaction left them."""
        self._files_seen = (_file_state(self.database_path),
                            _file_state(self.database_path + WAL_SUFFIX))

    def _refresh_if_touched(self, connection: sqlite3.Connection) -> sqlite3.Connection:
        """The files changed since this journal's last transaction: drop every
        cached page and the cached chain, which forces a full verification from
        what is on disk.

        ``PRAGMA data_version`` only sees commits made through SQLite; a raw edit
        of the file, or an older copy restored in place, hides behind this
        connection's cached pages -- and a later commit would write them back.
        Another worker's commit or checkpoint also lands here (a legitimate
        change, verified again at the cost of a full pass).  A WAL that vanished
        or was swapped while this connection is open is refused (``wal_missing``):
        SQLite deletes it only when the last connection closes, so someone removed
        it, and new commits would go to a file nobody can read back.
        """
        if self._files_seen is None:
            return connection
        database_state, wal_state = self._files_seen
        wal_now = _file_state(self.database_path + WAL_SUFFIX)
        if wal_state is not None and (wal_now is None or wal_now[:2] != wal_state[:2]):
            raise IntegrityError(
                "wal_missing",
                f"{DATABASE_NAME}{WAL_SUFFIX} was deleted or replaced while this worker had the "
                "journal open; events it committed may exist only in the lost file")
        if (_file_state(self.database_path), wal_now) == self._files_seen:
            return connection
        # Empty the page cache without closing: a close could checkpoint the WAL
        # into the main file, and a refusal must change no file.
        try:
            connection.execute("PRAGMA shrink_memory")
        except sqlite3.Error as exc:
            raise _translate_sqlite_error(exc, "dropping cached pages") from None
        self._chain = None
        return connection

    def _check_file_identity(self) -> None:
        """Detect a database deleted or replaced under a live connection."""
        try:
            found = os.stat(self.database_path)
        except FileNotFoundError:
            raise self._missing_database() from None
        except OSError as exc:
            raise _storage_error(exc, "checking the journal database") from None
        if (found.st_dev, found.st_ino) != self._file_identity:
            self._drop_connection()
            raise IntegrityError("database_replaced",
                                 f"{DATABASE_NAME} was replaced by another file while in use")

    def _drop_connection(self) -> None:
        self._files_seen = None
        self._files_read = {}
        if self._connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self._connection.close()
            _forget_database(self.database_path)
        self._connection = None
        self._chain = None

    # ------------------------------------------------------ transactions --

    @contextlib.contextmanager
    def _verified(self, write: bool = False, kind: str = "",
                  check_checkpoint: bool = True) -> Iterator[_Chain]:
        """Hold the writer lock (``BEGIN IMMEDIATE``) -- or, read-only, a read
        snapshot -- and yield the verified chain.  Rolls back on any exception;
        commits after a clean exit.  ``kind`` names the event a writer intends
        to append (for the boundary hook only)."""
        with self._lock:
            if self.readonly:
                if write:
                    raise JournalUnavailable("storage_unavailable", "journal opened read-only")
                chain = self._verify_readonly()
                yield chain
                return
            connection = self._refresh_if_touched(self._connect())
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _translate_sqlite_error(exc, "taking the journal writer lock") from None
            self._appending = False
            self._undo_checkpoint = None
            try:
                reach_boundary("begin", kind)
                chain = self._verify_locked(connection, check_checkpoint)
                yield chain
            except BaseException:
                if self._appending:
                    self._chain = None  # half-appended: re-verify from the database
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                self._restore_checkpoint()
                self._remember_files()
                raise
            if connection.in_transaction:
                try:
                    connection.execute("COMMIT")
                except sqlite3.Error as exc:
                    self._chain = None
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
                    self._restore_checkpoint()
                    raise _translate_sqlite_error(exc, "committing") from None
                if kind:
                    reach_boundary("committed", kind)
                self._chain = self._chain if check_checkpoint else None
            self._remember_files()

    def _verify_locked(self, connection: sqlite3.Connection, check_checkpoint: bool = True) -> _Chain:
        """Verification under the writer lock (SPEC §7 step 1).  Without
        ``check_checkpoint`` the chain is not cached (it was not fully checked)."""
        try:
            version = connection.execute("PRAGMA data_version").fetchone()[0]
            chain = self._chain
            if (chain is None or self.full_verification or version != self._data_version):
                chain = self._read_genesis(connection, initialize=True)
                if chain is None:
                    chain = self._initialize(connection)
                _extend_chain(chain, connection.execute(SQL_SELECT_EVENTS_AFTER, (chain.count,)))
            # else: no other connection committed (data_version) and the files
            # are as this journal left them (_refresh_if_touched), so no row can
            # have appeared or changed since the cached chain was verified.
        except sqlite3.Error as exc:
            self._chain = None
            raise _translate_sqlite_error(exc, "verifying the journal") from None
        except JournalError:
            self._chain = None
            raise
        try:
            if chain.count == 0:
                self._complete_initialization(chain)
            self._check_marker(chain)
            if check_checkpoint:
                self._check_checkpoint(chain)
        except BaseException:
            self._chain = None
            raise
        self._chain = chain
        self._data_version = version
        return chain

    def _verify_readonly(self) -> _Chain:
        """Full verification from a read-only connection.  Live writers replace
        head.json before they COMMIT and may append while this runs, so a
        checkpoint ahead of the verified snapshot is re-read (catching up with
        the rows committed meanwhile) a few times before it is reported."""
        connection = self._connect()
        try:
            connection.execute("BEGIN")
            chain = self._read_genesis(connection, initialize=False)
            if chain is None:
                raise JournalUnavailable("journal_absent",
                                         f"the journal in {self.data_dir} has no tables yet")
            _extend_chain(chain, connection.execute(SQL_SELECT_EVENTS_AFTER, (0,)))
            connection.execute("COMMIT")
            for attempt in range(READ_RETRY_ATTEMPTS):
                try:
                    self._check_marker(chain)
                    self._check_checkpoint(chain)
                    return chain
                except IntegrityError as exc:
                    # Live writers keep head.json ahead of an older snapshot;
                    # a real rollback stays ahead after catching up.
                    if (exc.code not in ("checkpoint_ahead", "journal_rolled_back")
                            or attempt == READ_RETRY_ATTEMPTS - 1):
                        raise
                time.sleep(READ_RETRY_PAUSE_SECONDS)
                # Catch up with whatever committed meanwhile, verifying the link.
                connection.execute("BEGIN")
                row = connection.execute(SQL_SELECT_HASH_AT, (chain.count,)).fetchone()
                if chain.count and (row is None or row[0] != chain.head):
                    raise IntegrityError("hash_mismatch",
                                         f"seq {chain.count} changed while it was being verified")
                _extend_chain(chain, connection.execute(SQL_SELECT_EVENTS_AFTER, (chain.count,)))
                connection.execute("COMMIT")
            raise AssertionError("unreachable")
        except sqlite3.Error as exc:
            raise _translate_sqlite_error(exc, "verifying the journal") from None
        finally:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")

    def _read_genesis(self, connection: sqlite3.Connection, *, initialize: bool) -> Optional[_Chain]:
        """Read and check ``metadata``; None when the database has no tables
        (a fresh file).  Raises :class:`IntegrityError` for foreign state."""
        tables = {row[0] for row in connection.execute(SQL_SELECT_TABLES)}
        if not tables:
            if os.path.lexists(self.marker_path) or os.path.lexists(self.checkpoint_path):
                raise IntegrityError(
                    "missing_database",
                    f"{DATABASE_NAME} is empty while the marker or checkpoint survives; "
                    "it is never re-created over surviving state", survivors=self._survivors())
            return None
        if not {"metadata", "events"} <= tables:
            raise IntegrityError("invalid_metadata",
                                 f"tables {sorted(tables)} lack metadata/events")
        metadata = dict(connection.execute(SQL_SELECT_METADATA).fetchall())
        schema = metadata.get("schema")
        journal_id = metadata.get("journal_id")
        if schema != SCHEMA:
            raise IntegrityError("schema_mismatch",
                                 f"metadata schema is {_short(repr(schema))}, expected {SCHEMA}")
        if not _is_uuid(journal_id):
            raise IntegrityError("invalid_metadata",
                                 f"metadata journal_id {_short(repr(journal_id))} is not a UUID")
        self._check_marker_identity(journal_id)
        return _Chain(journal_id=journal_id, schema=schema, count=0,
                      head=genesis_hash(journal_id, schema))

    def _initialize(self, connection: sqlite3.Connection) -> _Chain:
        """Create tables and metadata inside the held writer lock.  head.json and
        the marker are written by :meth:`_complete_initialization` after it."""
        journal_id = str(uuid.uuid4())
        connection.execute(SQL_CREATE_METADATA)
        connection.execute(SQL_CREATE_EVENTS)
        connection.execute(SQL_INSERT_METADATA, ("journal_id", journal_id))
        connection.execute(SQL_INSERT_METADATA, ("schema", SCHEMA))
        connection.execute("COMMIT")
        reach_boundary("tables_committed", BOUNDARY_KIND_GENESIS)
        connection.execute("BEGIN IMMEDIATE")
        return _Chain(journal_id=journal_id, schema=SCHEMA, count=0,
                      head=genesis_hash(journal_id, SCHEMA))

    def _complete_initialization(self, chain: _Chain) -> None:
        """An empty journal whose creation was interrupted (or is new) gets its
        checkpoint and marker.  Only at count 0: no event can be lost."""
        if not self.create:
            return  # the operator CLI never writes files a failed command would leave
        if not os.path.lexists(self.checkpoint_path):
            self._write_checkpoint(chain.checkpoint(), announce=BOUNDARY_KIND_GENESIS)
        if not os.path.lexists(self.marker_path):
            self._write_atomically(self.marker_path,
                                   marker_text(chain.journal_id, chain.schema).encode("utf-8"),
                                   announce=BOUNDARY_KIND_MARKER)

    # --------------------------------------------------------- checks --

    def _creation_interrupted(self, chain: _Chain) -> bool:
        """An empty journal whose creator died before writing head.json or the
        marker, seen by a journal that must not create files (read-only, or the
        operator's ``create=False``): not corrupt (SPEC §7) -- with no event there
        is nothing to lose, and the next creating writer completes it."""
        return not self.create and chain.count == 0

    def _check_marker_identity(self, journal_id: str) -> None:
        """Before the chain is read: a marker naming another journal means the
        metadata was changed (or the database swapped) -- not a broken link."""
        try:
            decoded = json.loads(read_regular_file(self.marker_path))
        except (OSError, ValueError):
            return  # missing or unreadable: _check_marker names it after the chain
        if (isinstance(decoded, dict) and _is_uuid(decoded.get("journal_id"))
                and decoded["journal_id"] != journal_id):
            raise IntegrityError("identity_mismatch",
                                 f"{MARKER_NAME} names journal {decoded['journal_id']} but the "
                                 f"database metadata names {journal_id}")

    def _unchanged_since_seen(self, path: str, expected: bytes) -> tuple:
        """``(unchanged, state)``: ``unchanged`` when ``path`` still has the file
        state it had when it was last read holding exactly ``expected`` -- then
        it cannot hold anything else (any write changes size, mtime or ctime; a
        replace changes the inode).  ``state`` is taken *before* a caller reads,
        so a change during the read is seen next time."""
        state = _file_state(path)
        return state is not None and self._files_read.get(path) == (state, expected), state

    def _check_marker(self, chain: _Chain) -> None:
        expected = marker_text(chain.journal_id, chain.schema).encode("utf-8")
        unchanged, state = self._unchanged_since_seen(self.marker_path, expected)
        if unchanged:
            return
        try:
            found = read_regular_file(self.marker_path)
        except FileNotFoundError:
            if self._creation_interrupted(chain):
                return
            raise IntegrityError("marker_missing",
                                 f"{MARKER_NAME} is missing beside a journal with "
                                 f"{chain.count} events") from None
        except OSError as exc:
            raise _storage_error(exc, f"reading {MARKER_NAME}") from None
        if found == expected:
            self._files_read[self.marker_path] = (state, expected)
            return
        try:
            decoded = json.loads(found)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and decoded.get("journal_id") not in (None, chain.journal_id):
            raise IntegrityError("identity_mismatch",
                                 f"{MARKER_NAME} names journal {_short(str(decoded.get('journal_id')))} "
                                 f"but the database is journal {chain.journal_id}")
        raise IntegrityError("marker_corrupt", f"{MARKER_NAME} does not match the journal metadata")

    def _check_checkpoint(self, chain: _Chain) -> None:
        """``head.json`` must equal the journal summary exactly (SPEC §7)."""
        expected = chain.checkpoint()
        key = (chain.journal_id, chain.count, chain.head)
        if self._expected_checkpoint[0] != key:  # encode once per chain state
            self._expected_checkpoint = (key, canonical_text(expected).encode("utf-8"))
        expected_bytes = self._expected_checkpoint[1]
        unchanged, state = self._unchanged_since_seen(self.checkpoint_path, expected_bytes)
        if unchanged:
            return
        try:
            found = read_regular_file(self.checkpoint_path)
        except FileNotFoundError:
            if self._creation_interrupted(chain):
                return
            raise IntegrityError("checkpoint_missing", f"{CHECKPOINT_NAME} is missing") from None
        except OSError as exc:
            raise _storage_error(exc, f"reading {CHECKPOINT_NAME}") from None
        if found == expected_bytes:
            self._files_read[self.checkpoint_path] = (state, expected_bytes)
            return
        if len(found) > OWN_FILE_READ_LIMIT:
            raise IntegrityError("checkpoint_corrupt",
                                 f"{CHECKPOINT_NAME} is larger than {OWN_FILE_READ_LIMIT} bytes")
        if not found.strip():
            raise IntegrityError("checkpoint_empty", f"{CHECKPOINT_NAME} is empty")
        try:
            checkpoint = json.loads(found)
        except ValueError:
            raise IntegrityError("checkpoint_corrupt", f"{CHECKPOINT_NAME} is not JSON") from None
        problem = _checkpoint_shape_problem(checkpoint)
        if problem:
            raise IntegrityError("checkpoint_corrupt", f"{CHECKPOINT_NAME}: {problem}")
        details = {"checkpoint_count": checkpoint["count"], "journal_count": chain.count}
        if checkpoint["journal_id"] != chain.journal_id:
            raise IntegrityError("checkpoint_foreign",
                                 f"{CHECKPOINT_NAME} belongs to journal {checkpoint['journal_id']}, "
                                 f"not {chain.journal_id}")
        if checkpoint["schema"] != chain.schema:
            raise IntegrityError("schema_mismatch", f"{CHECKPOINT_NAME} has schema "
                                 f"{_short(repr(checkpoint['schema']))}")
        if checkpoint["count"] == chain.count + 1:
            raise IntegrityError("checkpoint_ahead",
                                 f"{CHECKPOINT_NAME} is one event ahead of the database (a crash "
                                 "between os.replace and COMMIT, or the last event was deleted)",
                                 **details)
        if checkpoint["count"] > chain.count:
            raise IntegrityError("journal_rolled_back",
                                 f"the database holds {chain.count} events but {CHECKPOINT_NAME} "
                                 f"anchors {checkpoint['count']}: events were deleted or an older "
                                 "copy was restored", **details)
        if checkpoint["count"] < chain.count:
            raise IntegrityError("checkpoint_behind",
                                 f"the database holds {chain.count} events but {CHECKPOINT_NAME} "
                                 f"anchors only {checkpoint['count']}: unanchored events or an "
                                 "older checkpoint", **details)
        if checkpoint["head"] != chain.head:
            raise IntegrityError("checkpoint_mismatch",
                                 f"{CHECKPOINT_NAME} head differs from the journal head at "
                                 f"count {chain.count}: history was rewritten", **details)
        if checkpoint != expected:
            raise IntegrityError("checkpoint_corrupt", f"{CHECKPOINT_NAME} has extra content")
        # Equal as JSON but not byte-equal to our encoding (e.g. written by
        # another tool with a trailing newline): accepted.

    def _check_ancestor(self, chain: _Chain, checkpoint: Any) -> None:
        problem = _checkpoint_shape_problem(checkpoint)
        if problem:  # the file is malformed; the journal itself verified
            raise AdmissionRefused("invalid_checkpoint", f"external checkpoint: {problem}")
        if checkpoint["journal_id"] != chain.journal_id or checkpoint["schema"] != chain.schema:
            raise IntegrityError("checkpoint_not_ancestor",
                                 "external checkpoint belongs to another journal or schema")
        count = checkpoint["count"]
        if count > chain.count:
            raise IntegrityError("checkpoint_not_ancestor",
                                 f"external checkpoint anchors {count} events, the journal holds "
                                 f"{chain.count}", checkpoint_count=count, journal_count=chain.count)
        if count == 0:
            at = genesis_hash(chain.journal_id, chain.schema)
        else:
            try:
                row = self._connection.execute(SQL_SELECT_HASH_AT, (count,)).fetchone()
            except sqlite3.Error as exc:
                raise _translate_sqlite_error(exc, "reading the ancestor hash") from None
            at = row[0] if row else None
        if checkpoint["head"] != at:
            raise IntegrityError("checkpoint_not_ancestor",
                                 f"external checkpoint head is not the hash at position {count}",
                                 checkpoint_count=count, journal_count=chain.count)

    def _refusal(self, chain: _Chain) -> AdmissionRefused:
        operations = chain.operations()
        return AdmissionRefused(
            "unresolved_operations",
            f"{len(operations)} protected operation(s) have an unknown outcome",
            operations=[operation.to_json() for operation in operations])

    def _status_of(self, chain: _Chain) -> JournalStatus:
        operations = chain.operations()
        return JournalStatus(checkpoint=chain.checkpoint(), unresolved=tuple(operations))

    # --------------------------------------------------------- appends --

    def _append(self, chain: _Chain, fields: dict) -> None:
        """SPEC §7 steps 2-3 (the caller's transaction commits: step 4).

        ``chain`` is updated in place; on failure the caller's rollback discards
        the cached chain, so the next call re-verifies from the database.
        """
        kind = fields["kind"]
        payload = {"schema": chain.schema, "timestamp_ns": time.time_ns(), **fields}
        payload_text = canonical_text(payload)
        problem = _payload_problem(payload, chain.schema)
        if problem is not None:
            raise AdmissionRefused("invalid_request", f"refusing to write an invalid event: {problem}")
        seq = chain.count + 1
        new_hash = event_hash(chain.head, payload_text)
        self._appending = True  # from here on a failure invalidates the cached chain
        _apply_event(chain, seq, payload)  # raises invalid_transition before any write
        try:
            self._connection.execute(SQL_INSERT_EVENT, (seq, payload_text, chain.head, new_hash))
        except sqlite3.Error as exc:
            raise _translate_sqlite_error(exc, f"inserting the {kind} event") from None
        reach_boundary("inserted", kind)
        self._undo_checkpoint = chain.checkpoint()  # what head.json says before this append
        chain.count = seq
        chain.head = new_hash
        self._write_checkpoint(chain.checkpoint(), announce=kind)

    def _restore_checkpoint(self) -> None:
        """An append failed (an exception, not a crash) after its INSERT and the
        transaction was rolled back: head.json may already name the lost event,
        so the previous checkpoint is put back under the same writer lock.
        Best effort -- if that fails too, head.json stays one ahead
        (``checkpoint_ahead``), which blocks and never admits."""
        undo, self._undo_checkpoint = self._undo_checkpoint, None
        if undo is None:
            return
        with contextlib.suppress(JournalError, OSError):
            self._write_checkpoint(undo, announce="")

    def _write_checkpoint(self, checkpoint: dict, *, announce: str) -> None:
        content = canonical_text(checkpoint).encode("utf-8")
        self._write_atomically(self.checkpoint_path, content, announce=announce)

    def _write_atomically(self, target: str, content: bytes, *, announce: str = "") -> None:
        """Temp write, flush, fsync, ``os.replace``, directory fsync (SPEC §7 step 3)."""
        temp_path = self._temp_path if target == self.checkpoint_path else target + ".tmp"
        replaced = False
        try:
            # Whatever sits at the temp path (a killed writer's leftover, or a
            # planted symlink/FIFO) is removed, never written through.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp_path)
            descriptor = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _SAFE_OPEN_FLAGS,
                                 0o644)
            try:
                view = memoryview(content)
                while view:
                    view = view[os.write(descriptor, view):]
                if announce:
                    reach_boundary("checkpoint_written", announce)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            if announce:
                reach_boundary("checkpoint_fsynced", announce)
            os.replace(temp_path, target)
            replaced = True
            if announce:
                reach_boundary("checkpoint_replaced", announce)
            _fsync_directory(self.data_dir)
            if announce:
                reach_boundary("directory_fsynced", announce)
        except OSError as exc:
            if not replaced:
                with contextlib.suppress(OSError):
                    os.unlink(temp_path)
            raise _storage_error(exc, f"writing {os.path.basename(target)}") from None


def _fsync_directory(path: str) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        descriptor = os.open(path, flags)
    except (PermissionError, IsADirectoryError):
        return  # e.g. Windows: directory handles cannot be fsynced there
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _checkpoint_shape_problem(checkpoint: Any) -> Optional[str]:
    if not isinstance(checkpoint, dict):
        return "not a JSON object"
    if set(checkpoint) != {"schema", "journal_id", "count", "head"}:
        return f"keys {sorted(map(str, checkpoint))} are not count/head/journal_id/schema"
    count = checkpoint["count"]
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
        return "count is not a non-negative integer"
    if not (isinstance(checkpoint["head"], str) and isinstance(checkpoint["journal_id"], str)
            and isinstance(checkpoint["schema"], str)):
        return "head/journal_id/schema are not text"
    return None
