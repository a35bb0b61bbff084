"""The journal's store: the writer lock, the append protocol, creation and
the archive switch (docs/format.md §Append, §Creation, §Archives).

:class:`JournalStore` owns the SQLite connection (through :class:`Database`)
and the files beside it (through :class:`DurableFiles`), and offers three
things to :class:`journal.Journal`:

* :meth:`JournalStore.snapshot` -- the verified chain, verified on a read
  snapshot without the writer lock (snapshot.py);
* :meth:`JournalStore.writing` -- the writer lock (``BEGIN IMMEDIATE``) held
  around a chain brought up to date cheaply, then COMMIT;
* :meth:`JournalStore.append` -- one event: INSERT, confirm the stored row,
  replace ``head.json``.

Failure semantics are those of the module docstring of ``journal.py``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from typing import Iterator, Optional

from . import forksafe
from . import archive
from .chain import Chain, PossibleReuse, apply_event
from .database import Database, translate_sqlite_error
from .durable import BOUNDARY_KIND_GENESIS, BOUNDARY_KIND_MARKER, DurableFiles, reach_boundary
from .errors import AdmissionRefused, IntegrityError, JournalError, JournalUnavailable
from .record import (CREATED_KEY, KIND_ARCHIVED, SCHEMA, canonical_text, created_time,
                     decode_payload, event_hash, genesis_hash, payload_problem)
from .schema import (SQL_CHECKPOINT_PASSIVE, SQL_COUNT_EVENTS, SQL_DROP_TRIGGER,
                     SQL_EMPTY_EVENTS, SQL_EMPTY_METADATA, SQL_INSERT_EVENT,
                     SQL_SELECT_EVENTS_BETWEEN, SQL_SELECT_HASH_AT, SQL_SELECT_JOURNAL_ID,
                     SQL_SELECT_METADATA_VALUE,
                     SQL_SELECT_OPERATION_EVENTS, SQL_SELECT_PAYLOAD_AT,
                     SQL_SELECT_RAW_ROWS_BETWEEN, SQL_SELECT_ROW, SQL_VACUUM, TRIGGERS,
                     create_schema_rows, create_triggers)
from .snapshot import VerifiedSnapshots
from .writer_lock import writing_here

logger = logging.getLogger(__name__)

# A writer whose snapshot went stale under the lock (the schema changed, or the
# files changed behind SQLite) verifies again this many times before it gives up.
WRITE_ATTEMPTS = 3


class _StaleSnapshot(Exception):
    """Internal: what the snapshot verified may have changed in a way only a
    full verification (outside the writer lock) can judge."""


class JournalStore(VerifiedSnapshots):
    """Verified snapshots and appends for one data directory.

    Arguments as :class:`journal.Journal`.  Not thread-safe by itself beyond
    :attr:`lock`, which every caller holds around a snapshot or a write.
    Raises only :class:`JournalError` subclasses.
    """

    def __init__(self, data_dir: str, *, busy_timeout: float, readonly: bool, create: bool,
                 full_verification: bool, full_verification_interval: float):
        self.data_dir = data_dir
        self.readonly = readonly
        self.create = create
        self.full_verification = full_verification
        self.full_verification_interval = full_verification_interval
        self.database = Database(data_dir, busy_timeout=busy_timeout, readonly=readonly,
                                 create=create)
        self.files = DurableFiles(data_dir)
        self.lock = threading.RLock()
        self._temp_files_checked = False
        self._copies_seen: Optional[tuple] = None  # see archive.remove_stale_copies
        # (journal id, count, head) this store last verified: history it has seen
        # may never shrink or change under it (see _check_continues).
        self._verified: Optional[tuple] = None
        self.forget()
        forksafe.register(self)

    def _after_fork_in_child(self) -> None:
        self.lock = threading.RLock()  # another thread may have held it at the fork
        self.forget()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self.lock:
            self.database.close()
            self.files.forget()
            self.forget()

    # ----------------------------------------------------------- queries --

    def hash_at(self, seq: int) -> Optional[str]:
        """The stored hash of event ``seq``, or None."""
        return self._one(SQL_SELECT_HASH_AT, (seq,))

    def payload_at(self, seq: int) -> Optional[str]:
        """The stored payload text of event ``seq``, or None."""
        return self._one(SQL_SELECT_PAYLOAD_AT, (seq,))

    def created_ns(self) -> Optional[int]:
        """The journal's recorded creation time (``created_ns`` metadata), or None."""
        return created_time({CREATED_KEY: self._one(SQL_SELECT_METADATA_VALUE, (CREATED_KEY,))})

    def mentions(self, operation_id: str, until: int) -> bool:
        """Whether any event up to ``until`` names ``operation_id`` (one scan)."""
        return self._one(SQL_SELECT_OPERATION_EVENTS + " LIMIT 1",
                         (0, until, f'"operation_id":"{operation_id}"')) is not None

    def ids_starting_with(self, prefix: str, until: int, limit: int) -> list:
        """Distinct operation ids (as stored, canonical) of events up to
        ``until`` that start with ``prefix``, oldest first, at most ``limit``."""
        needle = '"operation_id":"' + prefix
        found: list = []
        try:
            for (operation_id,) in self.database.connection.execute(
                    "SELECT substr(payload, instr(payload, ?) + 16, 36) FROM events "
                    "WHERE seq <= ? AND instr(payload, ?) > 0 ORDER BY seq", (needle, until, needle)):
                if operation_id not in found:
                    found.append(operation_id)
                    if len(found) >= limit:
                        break
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "reading the journal") from None
        return found

    def _one(self, query: str, parameters: tuple):
        try:
            row = self.database.connection.execute(query, parameters).fetchone()
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "reading the journal") from None
        return row[0] if row else None

    def raw_rows(self, since: int, until: int) -> list:
        """Stored rows ``(seq, payload, previous, hash)`` for ``since`` < seq <=
        ``until`` (a few: the rows an archive copy lacks)."""
        try:
            return self.database.connection.execute(SQL_SELECT_RAW_ROWS_BETWEEN,
                                                    (since, until)).fetchall()
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "reading events") from None

    def rows(self, since: int, until: int, operation_id: Optional[str]) -> Iterator[tuple]:
        """``(seq, payload dict)`` for ``since`` < seq <= ``until``, only those of
        ``operation_id`` when given; streamed."""
        if operation_id is None:
            query, parameters = SQL_SELECT_EVENTS_BETWEEN, (since, until)
        else:  # instr() keeps other operations' payloads out of Python entirely
            query, parameters = SQL_SELECT_OPERATION_EVENTS, (since, until, operation_id)
        try:
            for seq, payload_text in self.database.connection.execute(query, parameters):
                payload = decode_payload(payload_text)
                if operation_id is None or payload.get("operation_id") == operation_id:
                    yield seq, payload
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "reading events") from None

    # --------------------------------------------------------- appends --

    def append(self, chain: Chain, fields: dict) -> None:
        """docs/format.md §Append steps 1-2 (the caller's transaction commits).
        ``chain`` is updated in place; on failure the caller discards it."""
        kind = fields["kind"]
        payload = {"schema": chain.schema, "timestamp_ns": time.time_ns(), **fields}
        payload_text = canonical_text(payload)
        problem = payload_problem(payload, chain.schema)
        if problem is not None:
            raise AdmissionRefused("invalid_request", f"refusing to write an invalid event: {problem}")
        seq, previous = chain.count + 1, chain.head
        new_hash = event_hash(previous, payload_text)
        self._appending = True  # from here on a failure invalidates the cached chain
        try:
            apply_event(chain, seq, payload, payload_text.encode("utf-8"))
        except PossibleReuse:
            raise AdmissionRefused("invalid_request", "the new operation id collides with an "
                                   "earlier one; nothing was written") from None
        connection = self.database.connection
        try:
            if self._missing_triggers:
                create_triggers(connection, self._missing_triggers)
                logger.warning("crash-recovery: re-created the journal's append-only triggers "
                               "%s after a full verification (a journal from an older version, "
                               "or someone dropped them)", ", ".join(self._missing_triggers))
                self._missing_triggers, self._schema_changed = [], True
            stored = connection.execute(SQL_INSERT_EVENT, (seq, payload_text, previous, new_hash))
            row = connection.execute(SQL_SELECT_ROW, (seq,)).fetchone()
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, f"inserting the {kind} event") from None
        if stored.rowcount != 1 or row != (payload_text, previous, new_hash):
            raise IntegrityError("append_not_stored", f"the {kind} event was not stored as "
                                 "written (a trigger or view not created by crash-recovery?); "
                                 "nothing was committed", seq=seq)
        reach_boundary("inserted", kind)
        self._undo_checkpoint = {**chain.checkpoint(), "count": seq - 1, "head": previous}
        chain.count, chain.head = seq, new_hash
        self.files.write_checkpoint(chain.checkpoint(), announce=kind)

    # ------------------------------------------------------ transactions --

    @contextlib.contextmanager
    def writing(self, kind: str, check_checkpoint: bool = True) -> Iterator[Chain]:
        """Hold the writer lock (``BEGIN IMMEDIATE``) with a verified chain; commit
        after a clean exit.  Before COMMIT, a failure puts head.json back (still
        under the lock, only if this writer replaced it) and rolls back; a failed
        COMMIT leaves head.json as written (``commit_failed``, see the module
        docstring).  ``kind`` names the event for the boundary hook."""
        if self.readonly:
            raise JournalUnavailable("storage_unavailable", "journal opened read-only")
        with self.lock, writing_here(self.database.path):
            chain, connection = self._locked_chain(kind, check_checkpoint)
            self._appending = self._schema_changed = False
            self._undo_checkpoint: Optional[dict] = None
            self._undo_marker: Optional[tuple] = None
            self.files.checkpoint_replaced = False
            try:
                yield chain
            except BaseException:
                self._abandon_transaction(connection)
                raise
            if connection.in_transaction:
                try:
                    connection.execute("COMMIT")
                except sqlite3.Error as exc:
                    self.forget()
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
                    self.database.close()  # the next use sees what is durable
                    raise JournalUnavailable(
                        "commit_failed", f"COMMIT of the {kind} event failed ({exc}); it may or "
                        "may not be durable, and head.json names it either way",
                        event_kind=kind) from None
            if kind:
                reach_boundary("committed", kind)
            self._after_commit(connection)
            # The WAL this COMMIT went to must still be the journal's: if this
            # process lost its POSIX locks meanwhile, another process may have
            # checkpointed and removed it, and the event exists only in the
            # orphaned file (docs/guard.md §In-process code).  wal_missing then;
            # head.json names the event, so the state is checkpoint_ahead.
            self.database.check_wal()

    def _abandon_transaction(self, connection: sqlite3.Connection) -> None:
        """Before COMMIT: head.json back to what it was (if this writer replaced
        it), then ROLLBACK -- in that order, so no other writer can interleave."""
        if self.files.checkpoint_replaced and self._undo_checkpoint is not None:
            with contextlib.suppress(JournalError, OSError):
                self.files.write_checkpoint(self._undo_checkpoint, announce="")
        if self._undo_marker is not None:
            with contextlib.suppress(JournalError, OSError):
                self.files.write_marker(*self._undo_marker, announce="")
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
        if self._appending:
            self.forget()  # half-appended: verify again from the database
        self.database.remember_files()

    def _after_commit(self, connection: sqlite3.Connection) -> None:
        """Bookkeeping after a successful COMMIT; never raises (the event is
        durable, whatever happens here: a failure only costs a re-verification)."""
        try:
            if self._schema_changed:
                self._schema_version = connection.execute("PRAGMA schema_version").fetchone()[0]
        except sqlite3.Error:
            self.forget()
        self.database.remember_files()

    def _locked_chain(self, kind: str, check_checkpoint: bool) -> tuple:
        """Verify on a snapshot, take the writer lock, catch up; returns
        ``(chain, connection)`` with the lock held."""
        for _ in range(WRITE_ATTEMPTS):
            chain = self.snapshot(check_files=False)
            connection = self.database.connection
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise translate_sqlite_error(exc, "taking the journal writer lock") from None
            try:
                reach_boundary("begin", kind)
                self._remove_leftovers_locked()
                intent = archive.read_intent(self.data_dir)
                if intent is not None:
                    self._finish_archive_switch(connection, intent)
                    raise _StaleSnapshot()  # verify the state the switch left
                chain = self._catch_up_locked(connection, chain)
                if chain.count == 0:
                    self._complete_initialization(chain)
                if check_checkpoint:
                    self.check_files(chain)
                return chain, connection
            except _StaleSnapshot:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                self.forget()
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                self.forget()
                raise
        raise JournalUnavailable("database_locked", "the journal kept changing while it was "
                                 "being verified; nothing was written")

    def _catch_up_locked(self, connection: sqlite3.Connection, chain: Chain) -> Chain:
        """Under the writer lock: what changed since the snapshot.  Cheap --
        the WAL's identity, the schema cookie, rows appended meanwhile -- or
        :class:`_StaleSnapshot` when only a full verification can judge."""
        try:
            self.database.check_wal()
            if connection.execute("PRAGMA schema_version").fetchone()[0] != self._schema_version:
                raise _StaleSnapshot()
            version = connection.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version:
                if not self._extend_cached(connection, chain):
                    raise _StaleSnapshot()
                self._data_version = version
            elif self.database.files_touched():
                raise _StaleSnapshot()  # changed behind SQLite's back: a raw edit?
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "verifying the journal") from None
        except PossibleReuse:
            raise _StaleSnapshot() from None
        return chain

    def _create(self, connection: sqlite3.Connection) -> Chain:
        """Create the journal of a fresh database -- tables, then head.json and
        the marker -- under the writer lock (a concurrent creator may win: then
        its journal is used, and completed if it died half-way)."""
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                self._remove_leftovers_locked()
                genesis = self.database.read_genesis(connection, False)
                if genesis is None:
                    journal_id, schema = self.database.initialize(connection), SCHEMA
                else:
                    journal_id, schema = genesis[:2]
                if self._hash_at_locked(connection, 1) is None:
                    self._complete_initialization(Chain(
                        journal_id=journal_id, schema=schema, count=0,
                        head=genesis_hash(journal_id, schema)))
                connection.execute("COMMIT")
            finally:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "creating the journal") from None
        self.forget()
        return self.snapshot(check_files=False, complete_creation=False)

    def _remove_leftovers_locked(self) -> None:
        """Writer lock held: remove the temporary files of dead writers and
        creators (once per store: every writer of them holds the lock) and of
        dead archivers (whenever ``archive/copies/`` changed)."""
        if not self._temp_files_checked:
            self.files.remove_stale_temp_files()
            self.database.remove_stale_build_files()
            self._temp_files_checked = True
        # Archive copies are made without the writer lock, by any process at
        # any time: looked at again whenever archive/copies/ changed (one
        # lstat; the archives themselves are never listed).
        self._copies_seen = archive.remove_stale_copies(self.data_dir, self._copies_seen)

    def _complete_initialization(self, chain: Chain) -> None:
        """An empty journal whose creation was interrupted (or is new) gets its
        checkpoint and marker (writer lock held).  Only at count 0: no event can
        be lost.  An operator's command (``create`` off) writes nothing."""
        if not self.create:
            return
        if not os.path.lexists(self.files.checkpoint_path):
            self.files.write_checkpoint(chain.checkpoint(), announce=BOUNDARY_KIND_GENESIS)
        if not os.path.lexists(self.files.marker_path):
            self.files.write_marker(chain.journal_id, chain.schema, announce=BOUNDARY_KIND_MARKER)

    # --------------------------------------------------------- archives --

    def reset_segment(self, chain: Chain, journal_id: str, anchor: dict) -> Chain:
        """Under the writer lock: replace the live history by a new journal
        ``journal_id`` whose first event anchors the sealed one (docs/format.md
        §Archives); head.json and the marker follow before COMMIT, and are put
        back if the transaction fails.  Returns the new chain."""
        connection = self.database.connection
        try:
            for name in TRIGGERS:
                connection.execute(SQL_DROP_TRIGGER.format(name=name))
            connection.execute(SQL_EMPTY_EVENTS)
            connection.execute(SQL_EMPTY_METADATA)
            create_schema_rows(connection, journal_id)
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "starting a new segment") from None
        self._schema_changed = True
        self._undo_marker = (chain.journal_id, chain.schema)
        old_checkpoint = chain.checkpoint()
        fresh = Chain(journal_id=journal_id, schema=SCHEMA, count=0,
                      head=genesis_hash(journal_id, SCHEMA))
        self.append(fresh, {"kind": KIND_ARCHIVED, "archive": anchor})
        self._undo_checkpoint = old_checkpoint
        self.files.write_marker(journal_id, SCHEMA, announce="archived_marker")
        self._chain = fresh
        return fresh

    def compact(self) -> None:
        """Give back the space of emptied tables (``VACUUM``) after an archive
        switch; best effort: a failure (another connection busy) is logged."""
        try:
            self.database.connection.execute(SQL_VACUUM)
            # Fold the switch into the database file now (never blocks, never
            # removes the WAL): a new process then finds the new journal there
            # instead of following anchors back through the archives.
            self.database.connection.execute(SQL_CHECKPOINT_PASSIVE).fetchall()
        except sqlite3.Error as exc:
            logger.warning("crash-recovery: could not compact the journal after archiving "
                           "(%s); its free space stays in the file", exc)
        self.forget()
        self.database.remember_files()

    def settle_interrupted_archive(self) -> Optional[str]:
        """After an archive switch failed in this process with its intent
        written: finish or undo it now (:meth:`_recover_archive_switch`), so
        no reader meets ``archive_interrupted``.  Returns ``"finished"``,
        ``"undid"`` or None (no intent, or it could not be settled).  Best
        effort, never raises: what it cannot do (a full disk) the next writer
        does."""
        try:
            return self._recover_archive_switch()
        except JournalError as exc:
            logger.warning("crash-recovery: an archive switch failed and could not be settled "
                           "at once (%s); the next writer finishes or undoes it", exc.code)
            return None

    def _recover_archive_switch(self) -> Optional[str]:
        """Take the writer lock and finish or undo an interrupted archive
        switch; returns what was done (None: no intent)."""
        connection = self.database.connect()
        done = None
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                intent = archive.read_intent(self.data_dir)
                if intent is not None:
                    done = self._finish_archive_switch(connection, intent)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "finishing an archive switch") from None
        self.forget()
        return done

    def _finish_archive_switch(self, connection: sqlite3.Connection, intent: dict) -> str:
        """Writer lock held: finish or undo an interrupted archive switch
        (:func:`archive.settle_switch`); returns ``"finished"`` or ``"undid"``."""
        try:
            found = connection.execute(SQL_SELECT_JOURNAL_ID).fetchone()
            count = connection.execute(SQL_COUNT_EVENTS).fetchone()[0]
            first = connection.execute(SQL_SELECT_HASH_AT, (1,)).fetchone()
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "reading an interrupted archive") from None
        done = archive.settle_switch(self.data_dir, self.files, intent,
                                     found[0] if found else None, count,
                                     first[0] if first else None)
        logger.warning("crash-recovery: %s an interrupted archive switch", done)
        return done
