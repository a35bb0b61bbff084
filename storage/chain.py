"""The verified chain: operation states, transitions, and row verification.

Pure functions over rows ``(seq, payload bytes, previous, hash)``; no I/O
(docs/format.md §Events, §Transitions, §Verification).  :class:`Chain` is the
verified summary of a journal prefix; :func:`extend_chain` checks the rows
that follow it and applies them, raising :class:`IntegrityError` at the first
problem.

Speed and memory (docs/format.md §Verification cost): a row whose payload has
exactly the canonical layout the plugin writes for ``started``, ``returned`` or
``uncertain`` is checked by slicing at fixed offsets (the *fast path*); any
other row -- a resolution, an extension kind, a hand-made or damaged payload --
is decoded and checked field by field (the *slow path*).  The fast path accepts
only what the slow path accepts and extracts the same fields; whenever it is
unsure it hands the row to the slow path, which alone produces verdicts.  Closed
operations are remembered as 64-bit digests (8 bytes each); a repeated digest
raises :class:`PossibleReuse`, and the caller re-verifies exactly.
"""
from __future__ import annotations

import binascii
import hashlib
import json
import re
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .errors import IntegrityError
from .record import (KIND_ARCHIVED, REASONS, SCHEMA, STATE_PENDING, STATE_UNCERTAIN, canonical_text,
                     checkpoint_of, decode_payload, event_hash, payload_problem)

_DIGEST_MASK = (1 << 64) - 1
# SeenIds spreads digests over this many buckets (a power of two): a bucket stays
# small enough to search linearly.
_BUCKETS = 4096
# Timestamps the fast path takes: 1 to 19 digits (any ns time until year 2286).
_TIMESTAMP_DIGITS = 19


class PossibleReuse(Exception):
    """Two ``started`` events may share an operation id (their digests collide).
    Internal: the journal then verifies again with exact ids."""


class SeenIds:
    """Every operation id a ``started`` used, as 64-bit digests in buckets.

    A full pass appends digests without looking (:meth:`gather`) and checks for
    repeats once at the end (:meth:`settle`); later appends check each new
    digest (:meth:`add`).  Memory: about 8 bytes per operation.  ``buckets``:
    one ``array("Q")`` per value of the digest's low bits.
    """

    def __init__(self) -> None:
        self.buckets = [array("Q") for _ in range(_BUCKETS)]

    def gather(self, digest: int) -> None:
        """Remember ``digest`` without checking (call :meth:`settle` after)."""
        self.buckets[digest & (_BUCKETS - 1)].append(digest)

    def settle(self) -> None:
        """Raise :class:`PossibleReuse` if any digest was gathered twice."""
        for bucket in self.buckets:  # most are empty in a short segment: no set built
            if len(bucket) > 1 and len(set(bucket)) != len(bucket):
                raise PossibleReuse()

    def add(self, digest: int) -> None:
        """Remember one more digest; raise :class:`PossibleReuse` if seen."""
        bucket = self.buckets[digest & (_BUCKETS - 1)]
        if digest in bucket:
            raise PossibleReuse()
        bucket.append(digest)


@dataclass(frozen=True)
class Operation:
    """One operation as rebuilt from its events (docs/format.md §Events).

    ``started_ns`` is the ``timestamp_ns`` of ``started`` (ns since the epoch);
    ``last_seq`` the seq of its latest event; ``reason``/``outcome`` come from the
    latest ``returned``/``uncertain``/``resolved`` event (None before one);
    ``late_reason`` is the reason of an unacknowledged late outcome.
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
    late_reason: Optional[str] = None
    # An operation brought back for a lost event: when that event can have
    # happened, ``{"after_ns", "before_ns"}`` (docs/format.md §Events).
    lost_window: Optional[dict] = None

    def to_json(self) -> dict:
        """JSON-safe dict of every field (``lost_window`` only when set)."""
        shown = {
            "operation_id": self.operation_id, "state": self.state, "tool": self.tool,
            "session_id": self.session_id, "tool_call_id": self.tool_call_id,
            "args_hash": self.args_hash, "fingerprint": self.fingerprint,
            "started_seq": self.started_seq, "started_ns": self.started_ns,
            "last_seq": self.last_seq, "reason": self.reason, "outcome": self.outcome,
            "late_reason": self.late_reason,
        }
        if self.lost_window is not None:
            shown["lost_window"] = self.lost_window
        return shown


def operation_key(operation_id: str) -> bytes:
    """The chain's key for an operation id: its UTF-8 bytes as stored."""
    return operation_id.encode("utf-8", "surrogatepass")


@dataclass
class Chain:
    """Verified summary of a journal prefix.

    ``open``: open operations, key -> ``[started payload bytes, started seq,
    state, reason, last seq]``.  ``resolved``: keys closed by ``resolved`` ->
    started seq (a late outcome may still follow).  ``attention``: keys with an
    unacknowledged late outcome -> ``(started seq, late reason, late seq)``.
    ``archive``: the ``archive`` field of this segment's anchor, if any.
    ``exact_ids``: every operation id, exactly, when digests are not enough.
    """
    journal_id: str
    schema: str
    count: int
    head: str
    open: dict = field(default_factory=dict)
    seen: SeenIds = field(default_factory=SeenIds)
    resolved: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    archive: Optional[dict] = None
    # Exact operation ids instead of digests (after a PossibleReuse): a set.
    exact_ids: Optional[set] = None

    def checkpoint(self) -> dict:
        """The checkpoint dict (docs/format.md §Checkpoint) of this verified prefix."""
        return checkpoint_of(self.journal_id, self.count, self.head, self.schema)

    def operation(self, operation_id: str) -> Optional[Operation]:
        """The open operation with that id, or None."""
        record = self.open.get(operation_key(operation_id))
        if record is None:
            return None
        started_text, started_seq, state, reason, last_seq = record
        return operation_from_started(operation_id, started_text, started_seq, state=state,
                                      reason=reason, last_seq=last_seq)

    def operations(self) -> list:
        """Every open operation, oldest first."""
        return sorted((self.operation(key.decode("utf-8", "surrogatepass"))
                       for key in self.open), key=lambda operation: operation.started_seq)

    def late_outcomes(self) -> list:
        """``(operation_id, started seq, late reason, late seq)`` of every resolved
        operation whose late outcome awaits acknowledgement, oldest first."""
        return sorted(((key.decode("utf-8", "surrogatepass"), *record)
                       for key, record in self.attention.items()), key=lambda item: item[1])


def operation_from_started(operation_id: str, started_text: bytes, started_seq: int, *,
                           state: str, reason: Optional[str], last_seq: int,
                           outcome: Optional[str] = None,
                           late_reason: Optional[str] = None) -> Operation:
    """An :class:`Operation` from its ``started`` payload text and later facts."""
    started = json.loads(started_text)
    return Operation(operation_id=operation_id, state=state, tool=started["tool"],
                     session_id=started["session_id"], tool_call_id=started["tool_call_id"],
                     args_hash=started["args_hash"], fingerprint=started["fingerprint"],
                     started_seq=started_seq, started_ns=started["timestamp_ns"],
                     last_seq=last_seq, reason=reason, outcome=outcome, late_reason=late_reason,
                     lost_window=_window(started.get("lost_window")))


# Where a ``lost_window``'s start comes from (docs/format.md §Events).
WINDOW_SOURCES = ("last_verified_event", "journal_created", "marker_written")


def lost_window(before_ns: int, *, last_event_ns: Optional[int], created_ns: Optional[int],
                marker_written_ns: Optional[int]) -> dict:
    """The ``lost_window`` of an operation brought back for a lost event
    (docs/format.md §Events): it can have happened after the last verified
    event; in a journal with none, after the journal's recorded creation;
    failing that, after its marker was written (a journal or segment writes
    its marker before any call can run); before ``before_ns``.
    ``after_source`` names which (absent, with ``after_ns`` null, when
    nothing tells)."""
    for value, source in zip((last_event_ns, created_ns, marker_written_ns), WINDOW_SOURCES):
        if value is not None:
            return {"after_ns": value, "before_ns": before_ns, "after_source": source}
    return {"after_ns": None, "before_ns": before_ns}


def _window(value: object) -> Optional[dict]:
    """A well-formed ``lost_window`` or None (it is evidence, never trusted
    blindly); ``after_source`` is kept when it is one of WINDOW_SOURCES."""
    if (isinstance(value, dict) and isinstance(value.get("before_ns"), int)
            and (value.get("after_ns") is None or isinstance(value.get("after_ns"), int))):
        window = {"after_ns": value.get("after_ns"), "before_ns": value["before_ns"]}
        if value.get("after_source") in WINDOW_SOURCES:
            window["after_source"] = value["after_source"]
        return window
    return None


@dataclass(frozen=True)
class JournalStatus:
    """A verified view: ``checkpoint`` (dict), the open operations and the
    resolved operations whose late outcome needs attention, oldest first."""
    checkpoint: dict
    unresolved: tuple
    attention: tuple = ()

    def to_json(self) -> dict:
        """``{"checkpoint", "unresolved": [...], "attention": [...]}``."""
        return {"checkpoint": self.checkpoint,
                "unresolved": [operation.to_json() for operation in self.unresolved],
                "attention": [operation.to_json() for operation in self.attention]}


# ------------------------------------------------------------- transitions --

def _invalid(seq: int, text: str) -> IntegrityError:
    return IntegrityError("invalid_transition", f"seq {seq}: {text}", seq=seq)


def apply_event(chain: Chain, seq: int, payload: dict, payload_text: bytes,
                full: bool = False) -> None:
    """Apply one valid decoded payload (docs/format.md §Transitions); raise
    ``invalid_transition`` or :class:`PossibleReuse`.  ``full``: new ids are
    gathered for one check at the end of a full pass."""
    kind = payload["kind"]
    if kind == KIND_ARCHIVED:
        if chain.count != 0 or seq != 1:
            raise _invalid(seq, "an archived anchor may only be the first event")
        chain.archive = payload["archive"]
        return
    operation_id = payload["operation_id"]
    key = operation_key(operation_id)
    record = chain.open.get(key)
    if kind == "started":
        if record is not None:
            raise _invalid(seq, f"started reuses operation id {operation_id}")
        remember_started(chain, key, seq, full)
        chain.open[key] = [payload_text, seq, STATE_PENDING, None, seq]
        return
    if kind == "late_outcome":
        started_seq = chain.resolved.pop(key, None)
        if started_seq is None:
            raise _invalid(seq, f"late_outcome for operation {operation_id} that is not "
                                "resolved, or that has a late outcome already")
        chain.attention[key] = (started_seq, payload["reason"], seq)
        return
    if kind == "acknowledged":
        if chain.attention.pop(key, None) is None:
            raise _invalid(seq, f"acknowledged for operation {operation_id} without an "
                                "unacknowledged late outcome")
        return
    if record is None:
        raise _invalid(seq, f"{kind} for closed or unknown operation {operation_id}")
    if kind == "resolved":  # legal for pending and uncertain, i.e. every open operation
        del chain.open[key]
        chain.resolved[key] = record[1]
        return
    if record[2] != STATE_PENDING:
        raise _invalid(seq, f"{kind} for {record[2]} operation {operation_id}")
    if kind == "returned":
        del chain.open[key]
    else:
        record[2:] = [STATE_UNCERTAIN, payload["reason"], seq]


def remember_started(chain: Chain, key: bytes, seq: int, full: bool) -> None:
    """Record a new operation id: exactly (``chain.exact_ids``), gathered for
    one check at the end of a full pass, or checked now (incremental)."""
    exact_ids = chain.exact_ids
    if exact_ids is not None:
        if key in exact_ids:
            raise _invalid(seq, f"started reuses operation id "
                                f"{key.decode('utf-8', 'replace')}")
        exact_ids.add(key)
    elif full:
        chain.seen.gather(hash(key) & _DIGEST_MASK)
    else:
        chain.seen.add(hash(key) & _DIGEST_MASK)


# ------------------------------------------------------------ fast layouts --

# Patterns of the variable parts of a canonical payload the plugin writes.
_HASH = rb"[0-9a-f]{64}"
_UUID = rb"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
_TIME = rb"(?:0|[1-9][0-9]{0,%d})" % (_TIMESTAMP_DIGITS - 1)
# A JSON string of printable ASCII without quotes and backslashes (its bytes are
# its text: no escapes), or null; _NAME is the non-empty form.  Anything else
# (non-ASCII text, escapes) takes the slow path.
_PLAIN = rb'(?:null|"[\x20\x21\x23-\x5b\x5d-\x7e]*")'
_NAME = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]+"'


def _layout(fields: dict, patterns: dict) -> "re.Pattern":
    """A regular expression matching exactly the canonical payloads of the
    shape of ``fields``: the canonical encoding of ``fields`` (by
    :func:`record.canonical_text`, the writer's own encoder), with each
    placeholder text in ``patterns`` replaced by its pattern."""
    sample = canonical_text({"schema": SCHEMA, **fields}).encode("utf-8")
    placeholders = sorted(patterns, key=lambda text: sample.index(text.encode()))
    pattern, rest = b"", sample
    for text in placeholders:
        head, found, rest = rest.partition(text.encode())
        assert found, text
        pattern += re.escape(head) + patterns[text]
    return re.compile(pattern + re.escape(rest), re.S)


_STARTED = _layout(
    {"kind": "started", "operation_id": "@operation", "tool": "@tool", "fingerprint": "@fingerprint",
     "args_hash": "@args", "session_id": "@session", "tool_call_id": "@call", "timestamp_ns": -1},
    {"@operation": _UUID, '"@tool"': _NAME, "@fingerprint": _HASH, "@args": _HASH,
     '"@session"': _PLAIN, '"@call"': _PLAIN, "-1": _TIME})
# Outcomes: group 1 the operation id, group 2 the reason.
_RETURNED, _UNCERTAIN = (
    _layout({"kind": kind, "operation_id": "@operation", "reason": "@reason",
             "result_hash": "@result", "timestamp_ns": -1},
            {"@operation": rb"(.{36})", "@reason": rb"(%s)" % b"|".join(
                reason.encode() for reason in REASONS[kind]), "@result": _HASH, "-1": _TIME})
    for kind in ("returned", "uncertain"))


# ---------------------------------------------------------------- the pass --

def extend_chain(chain: Chain, rows: Iterable[tuple], *, full: bool = False) -> None:
    """Verify rows ``(seq, payload, previous, hash)`` that follow ``chain`` and
    apply them in place (docs/format.md §Verification).  The three text columns
    arrive as their stored UTF-8 bytes, or None when the stored value is not
    text (:data:`schema.SQL_SELECT_ROWS_AFTER`).

    ``full``: the pass started at genesis; new ids are gathered and checked for
    repeats at the end (exactly instead when ``chain.exact_ids`` is a set).
    Raises :class:`IntegrityError` or :class:`PossibleReuse`; ``chain`` must
    then be discarded.
    """
    seq = chain.count
    head = chain.head.encode()
    opened = chain.open
    gathering = full and chain.exact_ids is None
    buckets, bucket_mask = chain.seen.buckets, _BUCKETS - 1
    started_layout, returned_layout = _STARTED.fullmatch, _RETURNED.fullmatch
    uncertain_layout = _UNCERTAIN.fullmatch
    sha256, hexlify = hashlib.sha256, binascii.hexlify
    for found_seq, payload, previous, stored_hash in rows:
        seq += 1
        if found_seq != seq:
            raise IntegrityError("sequence_gap", f"expected seq {seq}, found {found_seq}", seq=seq)
        if previous != head:
            raise IntegrityError("broken_link",
                                 f"seq {seq}: previous does not equal the hash of seq {seq - 1}",
                                 seq=seq)
        if payload is None:
            raise IntegrityError("invalid_payload", f"seq {seq}: payload is not text", seq=seq)
        # The fast path: a payload in exactly the canonical layout the plugin
        # writes, printable ASCII without escapes -- so its JSON string form
        # inside the event hash only escapes the quotes.  Dispatch on a byte:
        # {"args_hash":... is a started, {"kind":"r... / {"kind":"u... an outcome.
        first = payload[2:3]
        if first == b"a":
            match = started_layout(payload)
            if match is not None:
                key = match.group(1)
                if key not in opened:
                    if hexlify(sha256(b'{"payload":"' + payload.replace(b'"', b'\\"')
                                      + b'","previous":"' + previous + b'"}').digest()) != stored_hash:
                        raise _hash_mismatch(seq)
                    head = stored_hash
                    if gathering:  # SeenIds.gather, inlined
                        digest = hash(key) & _DIGEST_MASK
                        buckets[digest & bucket_mask].append(digest)
                    else:
                        remember_started(chain, key, seq, full)
                    opened[key] = [payload, seq, STATE_PENDING, None, seq]
                    continue
        elif first == b"k":
            returned = payload[9:10] == b"r"
            match = returned_layout(payload) if returned else uncertain_layout(payload)
            if match is not None:
                key = match.group(1)
                record = opened.get(key)
                if record is not None and record[2] == STATE_PENDING:
                    if hexlify(sha256(b'{"payload":"' + payload.replace(b'"', b'\\"')
                                      + b'","previous":"' + previous + b'"}').digest()) != stored_hash:
                        raise _hash_mismatch(seq)
                    head = stored_hash
                    if returned:
                        del opened[key]
                    else:
                        record[2:] = [STATE_UNCERTAIN, match.group(2).decode(), seq]
                    continue
        head = _slow_row(chain, seq, payload, previous, stored_hash, full)
    chain.count, chain.head = seq, head.decode()
    if gathering:
        chain.seen.settle()


def _hash_mismatch(seq: int) -> IntegrityError:
    return IntegrityError("hash_mismatch",
                          f"seq {seq}: stored hash differs from the recomputed hash", seq=seq)


def _slow_row(chain: Chain, seq: int, payload: bytes, previous: bytes,
              stored_hash: Optional[bytes], full: bool) -> bytes:
    """Verify and apply one row the fast path did not take; returns its hash."""
    try:
        text = payload.decode("utf-8")
        computed = event_hash(previous.decode(), text).encode()
    except UnicodeError:
        raise IntegrityError("invalid_payload", f"seq {seq}: payload is not valid UTF-8",
                             seq=seq) from None
    if computed != stored_hash:
        raise _hash_mismatch(seq)
    decoded = decode_payload(text)
    if decoded is None:
        raise IntegrityError("invalid_payload", f"seq {seq}: payload is not JSON", seq=seq)
    problem = payload_problem(decoded, chain.schema)
    if problem is not None:
        raise IntegrityError("invalid_payload", f"seq {seq}: {problem}", seq=seq)
    apply_event(chain, seq, decoded, payload, full)
    return stored_hash
