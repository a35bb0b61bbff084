"""The crash-recovery journal: a hash-chained SQLite event log plus a checkpoint file.

One data directory holds one journal (docs/format.md §Files): ``journal.sqlite3``
(WAL mode, ``synchronous=FULL``), ``head.json`` (the checkpoint) and
``initialized`` (the marker).  :class:`Journal` serializes admission, appends
events, rebuilds operation state and verifies integrity.

Append protocol (docs/format.md §Append), all under one ``BEGIN IMMEDIATE``
writer lock::

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

Verification cost (docs/format.md §What is checked when): the first
verification in a process reads the whole history.  Later ones in the same
``Journal`` trust the verified chain they cached, unless ``PRAGMA data_version``
shows that another connection committed, the database or WAL file changed in
any way since this journal's last transaction, or ``full_verification=True``
-- then the whole history is verified again.  The marker and ``head.json`` are
checked on every verification (re-read whenever their file state changed).

Errors: every failure is a :class:`JournalError` with a short machine-readable
``code``; ``sqlite3.Error`` never escapes (see :func:`database.translate_sqlite_error`).
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from typing import Any, Iterator, Optional

from .chain import Chain, JournalStatus, Operation, apply_event, extend_chain
from .database import (DEFAULT_BUSY_TIMEOUT_SECONDS, SQL_INSERT_EVENT, SQL_SELECT_EVENTS_AFTER,
                       SQL_SELECT_EVENTS_BETWEEN, SQL_SELECT_HASH_AT, SQL_SELECT_OPERATION_EVENTS,
                       Database, translate_sqlite_error)
from .durable import BOUNDARY_KIND_GENESIS, BOUNDARY_KIND_MARKER, DurableFiles, reach_boundary
from .errors import AdmissionRefused, IntegrityError, JournalError, JournalUnavailable
from .record import (OUTCOMES, SCHEMA, STATE_PENDING, canonical_text, checkpoint_shape_problem,
                     decode_payload, genesis_hash, event_hash, optional_text, payload_problem)

# Read-only verification re-reads head.json when it is ahead of the snapshot it
# verified, because live writers replace head.json before they COMMIT and keep
# appending while a long verification runs.  Attempts, pause in seconds.
READ_RETRY_ATTEMPTS = 20
READ_RETRY_PAUSE_SECONDS = 0.02
# SQLite integers are 64-bit.
SQLITE_MAX_INTEGER = 2**63 - 1


class Journal:
    """Serialized admission, appends, state reconstruction and verification
    for one data directory (docs/format.md, docs/cli.md).

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
        self.readonly = readonly
        self.create = create and not readonly
        self.full_verification = full_verification
        self._database = Database(self.data_dir, busy_timeout=float(busy_timeout),
                                  readonly=readonly, create=self.create)
        self._files = DurableFiles(self.data_dir)
        self.database_path = self._database.path
        self.checkpoint_path = self._files.checkpoint_path
        self.marker_path = self._files.marker_path
        self._lock = threading.RLock()
        self._chain: Optional[Chain] = None
        self._data_version: Optional[int] = None
        self._appending = False  # an append began in the current transaction
        # head.json before the current append, restored if it fails after the INSERT.
        self._undo_checkpoint: Optional[dict] = None

    # ------------------------------------------------------------ public --

    def status(self) -> JournalStatus:
        """Verify and return the summary plus open operations (docs/cli.md §status)."""
        with self._verified() as chain:
            return self._status_of(chain)

    def unresolved(self) -> tuple:
        """Verify and return the open (pending/uncertain) operations, oldest first."""
        return self.status().unresolved

    def checkpoint(self) -> dict:
        """Verify and return the current checkpoint dict (docs/cli.md §checkpoint)."""
        return self.status().checkpoint

    def verify(self, external_checkpoint: Any = None) -> JournalStatus:
        """Full verification of the whole history (docs/cli.md §verify).

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
        """Admission (docs/format.md §Append): verify, refuse if any operation
        is open, else durably append ``started`` and return the new pending
        operation.

        Raises :class:`AdmissionRefused` ``unresolved_operations`` (with
        ``details["operations"]``), :class:`IntegrityError`,
        :class:`JournalUnavailable`.  On any error nothing was committed.
        """
        for name, value in (("session_id", session_id), ("tool_call_id", tool_call_id)):
            if not optional_text(value):
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
        pending operation.  Raises :class:`AdmissionRefused`
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
        """Append ``resolved`` for a pending or uncertain operation (docs/cli.md §resolve).

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
        state docs/format.md §Append describes: the database chain and marker
        verify on their own, and ``head.json`` is well-formed, names the same
        journal and schema, and anchors exactly one event more than the database
        holds.

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
                    try:
                        before = self._files.read_checkpoint()
                    except (OSError, ValueError) as read_error:
                        raise IntegrityError("repair_not_applicable",
                                             f"head.json changed while it was read ({read_error})",
                                             found="checkpoint_corrupt") from None
                else:
                    raise IntegrityError("repair_not_applicable",
                                         "head.json already matches the journal", found="ok")
                after = chain.checkpoint()
                self._files.write_checkpoint(after, announce="")
                return before, after

    def history(self, since: int = 0, operation_id: Optional[str] = None) -> tuple:
        """One full verification, then the verified events, read lazily:
        ``(JournalStatus, iterator of (seq, payload dict))`` for ``since`` < seq
        <= the verified head, only those of ``operation_id`` when given.  A long
        history is streamed, never held in memory; consume the iterator before
        closing the journal (single-threaded use, as in the operator CLI)."""
        since = max(0, min(int(since), SQLITE_MAX_INTEGER))
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
            for seq, payload_text in self._database.connection.execute(query, parameters):
                payload = decode_payload(payload_text)
                if operation_id is None or payload.get("operation_id") == operation_id:
                    yield seq, payload
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "reading events") from None

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

    def _drop_connection(self) -> None:
        self._database.close()
        self._files.forget()
        self._chain = None

    # --------------------------------------------------------- checks --

    def _creation_interrupted(self, chain: Chain) -> bool:
        """An empty journal whose creator died before writing head.json or the
        marker, seen by a journal that must not create files (read-only, or the
        operator's ``create=False``): not corrupt -- with no event there is
        nothing to lose, and the next creating writer completes it."""
        return not self.create and chain.count == 0

    def _check_marker(self, chain: Chain) -> None:
        self._files.check_marker(chain.journal_id, chain.schema, chain.count,
                                 creation_interrupted=self._creation_interrupted(chain))

    def _check_checkpoint(self, chain: Chain) -> None:
        self._files.check_checkpoint(chain.checkpoint(),
                                     creation_interrupted=self._creation_interrupted(chain))

    def _check_ancestor(self, chain: Chain, checkpoint: Any) -> None:
        problem = checkpoint_shape_problem(checkpoint)
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
                row = self._database.connection.execute(SQL_SELECT_HASH_AT, (count,)).fetchone()
            except sqlite3.Error as exc:
                raise translate_sqlite_error(exc, "reading the ancestor hash") from None
            at = row[0] if row else None
        if checkpoint["head"] != at:
            raise IntegrityError("checkpoint_not_ancestor",
                                 f"external checkpoint head is not the hash at position {count}",
                                 checkpoint_count=count, journal_count=chain.count)

    def _refusal(self, chain: Chain) -> AdmissionRefused:
        operations = chain.operations()
        return AdmissionRefused(
            "unresolved_operations",
            f"{len(operations)} protected operation(s) have an unknown outcome",
            operations=[operation.to_json() for operation in operations])

    @staticmethod
    def _status_of(chain: Chain) -> JournalStatus:
        return JournalStatus(checkpoint=chain.checkpoint(), unresolved=tuple(chain.operations()))

    # --------------------------------------------------------- appends --

    def _append(self, chain: Chain, fields: dict) -> None:
        """docs/format.md §Append steps 2-3 (the caller's transaction commits:
        step 4).  ``chain`` is updated in place; on failure the caller's rollback
        discards the cached chain, so the next call re-verifies from the database.
        """
        kind = fields["kind"]
        payload = {"schema": chain.schema, "timestamp_ns": time.time_ns(), **fields}
        payload_text = canonical_text(payload)
        problem = payload_problem(payload, chain.schema)
        if problem is not None:
            raise AdmissionRefused("invalid_request", f"refusing to write an invalid event: {problem}")
        seq = chain.count + 1
        new_hash = event_hash(chain.head, payload_text)
        self._appending = True  # from here on a failure invalidates the cached chain
        apply_event(chain, seq, payload)  # raises invalid_transition before any write
        try:
            self._database.connection.execute(SQL_INSERT_EVENT,
                                              (seq, payload_text, chain.head, new_hash))
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, f"inserting the {kind} event") from None
        reach_boundary("inserted", kind)
        self._undo_checkpoint = chain.checkpoint()  # what head.json says before this append
        chain.count = seq
        chain.head = new_hash
        self._files.write_checkpoint(chain.checkpoint(), announce=kind)

    def _restore_checkpoint(self) -> None:
        """An append failed (an exception, not a crash) after its INSERT and the
        transaction was rolled back: head.json may already name the lost event,
        so the previous checkpoint is put back.  Best effort -- if that fails
        too, head.json stays one ahead (``checkpoint_ahead``), which blocks and
        never admits."""
        undo, self._undo_checkpoint = self._undo_checkpoint, None
        if undo is None:
            return
        with contextlib.suppress(JournalError, OSError):
            self._files.write_checkpoint(undo, announce="")

    # ------------------------------------------------------ transactions --

    @contextlib.contextmanager
    def _verified(self, write: bool = False, kind: str = "",
                  check_checkpoint: bool = True) -> Iterator[Chain]:
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
            connection = self._database.connect()
            if self._database.refresh_if_touched():
                self._chain = None
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise translate_sqlite_error(exc, "taking the journal writer lock") from None
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
                self._database.remember_files()
                raise
            if connection.in_transaction:
                try:
                    connection.execute("COMMIT")
                except sqlite3.Error as exc:
                    self._chain = None
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
                    self._restore_checkpoint()
                    raise translate_sqlite_error(exc, "committing") from None
                if kind:
                    reach_boundary("committed", kind)
                self._chain = self._chain if check_checkpoint else None
            self._database.remember_files()

    def _genesis_chain(self, connection: sqlite3.Connection) -> Optional[Chain]:
        """The empty chain of the database's metadata, or None for a fresh file."""
        surviving = (os.path.lexists(self.marker_path) or os.path.lexists(self.checkpoint_path))
        genesis = self._database.read_genesis(connection, surviving)
        if genesis is None:
            return None
        journal_id, schema = genesis
        self._files.check_marker_identity(journal_id)
        return Chain(journal_id=journal_id, schema=schema, count=0,
                     head=genesis_hash(journal_id, schema))

    def _verify_locked(self, connection: sqlite3.Connection, check_checkpoint: bool = True) -> Chain:
        """Verification under the writer lock (docs/format.md §Append step 1).
        Without ``check_checkpoint`` the chain is not cached (it was not fully
        checked)."""
        try:
            version = connection.execute("PRAGMA data_version").fetchone()[0]
            chain = self._chain
            if (chain is None or self.full_verification or version != self._data_version):
                chain = self._genesis_chain(connection)
                if chain is None:
                    journal_id = self._database.initialize(connection)
                    chain = Chain(journal_id=journal_id, schema=SCHEMA, count=0,
                                  head=genesis_hash(journal_id))
                extend_chain(chain, connection.execute(SQL_SELECT_EVENTS_AFTER, (chain.count,)))
            # else: no other connection committed (data_version) and the files
            # are as this journal left them (refresh_if_touched), so no row can
            # have appeared or changed since the cached chain was verified.
        except sqlite3.Error as exc:
            self._chain = None
            raise translate_sqlite_error(exc, "verifying the journal") from None
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

    def _verify_readonly(self) -> Chain:
        """Full verification from a read-only connection.  Live writers replace
        head.json before they COMMIT and may append while this runs, so a
        checkpoint ahead of the verified snapshot is re-read (catching up with
        the rows committed meanwhile) a few times before it is reported."""
        connection = self._database.connect()
        try:
            connection.execute("BEGIN")
            chain = self._genesis_chain(connection)
            if chain is None:
                raise JournalUnavailable("journal_absent",
                                         f"the journal in {self.data_dir} has no tables yet")
            extend_chain(chain, connection.execute(SQL_SELECT_EVENTS_AFTER, (0,)))
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
                extend_chain(chain, connection.execute(SQL_SELECT_EVENTS_AFTER, (chain.count,)))
                connection.execute("COMMIT")
            raise AssertionError("unreachable")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "verifying the journal") from None
        finally:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")

    def _complete_initialization(self, chain: Chain) -> None:
        """An empty journal whose creation was interrupted (or is new) gets its
        checkpoint and marker.  Only at count 0: no event can be lost."""
        if not self.create:
            return  # the operator CLI never writes files a failed command would leave
        if not os.path.lexists(self.checkpoint_path):
            self._files.write_checkpoint(chain.checkpoint(), announce=BOUNDARY_KIND_GENESIS)
        if not os.path.lexists(self.marker_path):
            self._files.write_marker(chain.journal_id, chain.schema, announce=BOUNDARY_KIND_MARKER)
