"""The verified chain: operation states, transitions, and row verification.

Pure functions over rows ``(seq, payload, previous, hash)``; no I/O
(docs/format.md §Events, §Verification).  :class:`Chain` is the verified summary
of a journal prefix; :func:`extend_chain` checks the rows that follow it and
applies them, raising :class:`IntegrityError` at the first problem.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _json_string
from typing import Iterator, Optional

from .errors import IntegrityError
from .record import (STATE_PENDING, STATE_UNCERTAIN, checkpoint_of, decode_payload,
                     payload_problem)


@dataclass(frozen=True)
class Operation:
    """One operation as rebuilt from its events (docs/format.md §Events).

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
class Chain:
    """Verified summary of a journal prefix.

    Open (pending/uncertain) operations are kept as light records
    ``[started payload, started seq, state, reason, last seq]`` and turned into
    :class:`Operation` objects only on demand; closed ones are kept as ids so
    that reuse and late events are still caught.
    """
    journal_id: str
    schema: str
    count: int
    head: str
    open: dict = field(default_factory=dict)      # operation_id -> open record (list)
    closed: set = field(default_factory=set)      # operation ids returned/resolved

    def checkpoint(self) -> dict:
        """The checkpoint dict (docs/format.md §Checkpoint) of this verified prefix."""
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
    """A verified view: ``checkpoint`` (dict) and the open operations, oldest first."""
    checkpoint: dict
    unresolved: tuple

    def to_json(self) -> dict:
        """``{"checkpoint": {...}, "unresolved": [operation dicts]}``."""
        return {"checkpoint": self.checkpoint,
                "unresolved": [operation.to_json() for operation in self.unresolved]}


def apply_event(chain: Chain, seq: int, payload: dict) -> None:
    """Apply one valid payload to ``chain``; raise ``invalid_transition``
    (docs/format.md §Transitions)."""
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


def extend_chain(chain: Chain, rows: Iterator[tuple]) -> None:
    """Verify rows ``(seq, payload, previous, hash)`` that follow ``chain`` and
    apply them in place (docs/format.md §Verification).  Raises
    :class:`IntegrityError`; ``chain`` is then partially extended and must be
    discarded."""
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
        try:  # record.event_hash(), inlined: this loop runs once per stored event
            computed = sha256(('{"payload":%s,"previous":"%s"}' % (quote(payload_text), head))
                              .encode("utf-8")).hexdigest()
        except UnicodeEncodeError:
            raise IntegrityError("invalid_payload", f"seq {seq}: payload is not valid UTF-8",
                                 seq=seq) from None
        if computed != stored_hash:
            raise IntegrityError("hash_mismatch",
                                 f"seq {seq}: stored hash differs from the recomputed hash", seq=seq)
        payload = decode_payload(payload_text)
        if payload is None:
            raise IntegrityError("invalid_payload", f"seq {seq}: payload is not JSON", seq=seq)
        problem = payload_problem(payload, schema)
        if problem is not None:
            raise IntegrityError("invalid_payload", f"seq {seq}: {problem}", seq=seq)
        apply_event(chain, seq, payload)
        head = stored_hash
        chain.count = seq
        chain.head = head
