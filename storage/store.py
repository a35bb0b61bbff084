"""The journal's store: the writer lock, the append protocol, creation and
the archive switch (docs/format.md §Append, §Creation, §Archives).

:class:`JournalStore` owns the SQLite connection (through :class:`Database`)
and the files beside it (through :class:`DurableFiles`), and offers three
things to :class:`journal.Journal`:

* :meth:`JournalStore.snapshot` -- the verified chain, verified on a read
  snapshot without the writer lock (snapshot.py);
* :meth:`JournalStore.writing` -- the one place that orders database work and
  file work: the writer lock (``BEGIN IMMEDIATE``) around a chain brought up
  to date cheaply; then, from the first change to a file beside the database
  until COMMIT has returned (and the steps that must follow it, such as
  removing an archive intent), the head lock held exclusively
  (storage/head_lock.py); then COMMIT.  Before COMMIT, a failure puts the files
  back and rolls back, still under both locks;
* :meth:`JournalStore.append` -- one event: INSERT, confirm the stored row,
  replace ``head.json``.

Failure semantics are those of the module docstring of ``journal.py``.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from typing import Callable, Iterator, Optional

from . import archive
from .chain import Chain, PossibleReuse, apply_event
from .database import FILES_CHANGED, Database, close_dropped, translate_sqlite_error
from .durable import (BOUNDARY_KIND_GENESIS, BOUNDARY_KIND_MARKER, DurableFiles, reach_boundary,
                      storage_error)
from .errors import AdmissionRefused, IntegrityError, JournalError, JournalUnavailable
from .log_lines import plugin_logger
from .record import (CREATED_KEY, KIND_ARCHIVED, SCHEMA, canonical_text, created_time,
                     decode_payload, event_hash, genesis_hash, payload_problem)
from .schema import (SQL_CHECKPOINT_PASSIVE, SQL_COUNT_EVENTS, SQL_DROP_TRIGGER,
                     SQL_EMPTY_EVENTS, SQL_EMPTY_METADATA, SQL_INSERT_EVENT,
                     SQL_SELECT_EVENTS_BETWEEN, SQL_SELECT_HASH_AT, SQL_SELECT_JOURNAL_ID,
                     SQL_SELECT_METADATA_VALUE, SQL_SELECT_OPERATION_EVENTS, SQL_SELECT_PAYLOAD_AT,
                     SQL_SELECT_RAW_ROWS_BETWEEN, SQL_SELECT_ROW, SQL_VACUUM, SQL_VERSIONS, TRIGGERS,
                     create_schema_rows, create_triggers)
from .head_lock import HeadLock
from .snapshot import VerifiedSnapshots

logger = plugin_logger(__name__)

# A writer whose snapshot went stale under the lock (the schema changed, or the
# files changed behind SQLite) verifies again this many times before it gives up.
WRITE_ATTEMPTS = 3
# Pauses between two tries of the writer lock while another writer holds it
# (appends hold it for about a millisecond), never longer than the last.
BEGIN_PAUSES_SECONDS = (0.0001, 0.0002, 0.0005, 0.001)


class _StaleSnapshot(Exception):
    """Internal: what the snapshot verified may have changed in a way only a
    full verification (outside the writer lock) can judge."""


class JournalStore(VerifiedSnapshots):
    """Verified snapshots and appends for one data directory.

    Arguments as :class:`journal.Journal`.  Not thread-safe by itself beyond
    :attr:`lock`, which every caller holds around a snapshot or a write (a
    forked child gets a fresh one: the parent's may be held by a thread that
    does not exist there).  Raises only :class:`JournalError` subclasses.
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
        self.head_lock = HeadLock(data_dir, busy_timeout)
        self._locks = [threading.RLock(), os.getpid()]  # see lock; shared with the finalizer
        self._files_held = contextlib.ExitStack()
        self._after_commit_steps: list = []
        self._temp_files_checked = False
        self._copies_seen: Optional[tuple] = None  # see archive.remove_stale_copies
        # (journal id, count, head) this store last verified: history it has seen
        # may never shrink or change under it (see _check_continues).
        self._verified: Optional[tuple] = None
        # The code of the last verdict (None: the journal verified).
        self.verdict: Optional[str] = None
        self.forget()
        weakref.finalize(self, close_dropped, self._locks, self.database)

    @property
    def lock(self) -> "threading.RLock":
        """This process's lock around every snapshot and write."""
        if self._locks[1] != os.getpid():
            self._locks[:] = [threading.RLock(), os.getpid()]
            self.forget()
        return self._locks[0]

    def close(self) -> None:
        """Close the connection (idempotent).  SQLite may fold the WAL into the
        database only as :meth:`Database.may_fold` allows (a journal last seen
        healthy, or this connection's WAL deleted while it held it: folding then
        brings its events back); otherwise every file is left as found."""
        with self.lock:
            self.database.close(fold=self.database.may_fold(self.healthy))
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
        # Only a writer that appends tidies up: a refused call changes no file.
        self._remove_leftovers_locked()
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
        self.replace_checkpoint(chain.checkpoint(), announce=kind)

    def hold_files(self) -> None:
        """Inside :meth:`writing`: hold the head lock exclusively (once) before
        a file beside the database changes; released after COMMIT."""
        if not self._files_held_now:
            self._files_held.enter_context(self.head_lock.held(exclusive=True))
            self._files_held_now = True

    def _release_files(self) -> None:
        self._files_held.close()
        self._files_held_now = False

    def replace_checkpoint(self, checkpoint: dict, *, announce: str) -> None:
        """Inside :meth:`writing`: replace head.json, taking the head lock
        after the new file's fsync, before its replace."""
        self.files.write_checkpoint(checkpoint, announce=announce, before_replace=self.hold_files)

    def after_commit(self, step) -> None:
        """Inside :meth:`writing`: run ``step()`` right after COMMIT, still
        holding the head lock (e.g. removing an archive intent)."""
        self._after_commit_steps.append(step)

    # ------------------------------------------------------ transactions --

    @contextlib.contextmanager
    def writing(self, kind: str, check_checkpoint: bool = True,
                give_up: Optional[Callable[[Chain], None]] = None) -> Iterator[Chain]:
        """Hold the writer lock (``BEGIN IMMEDIATE``) with a verified chain;
        commit after a clean exit (see the module docstring for the order of
        database and file work).  A failed COMMIT leaves head.json as written
        (``commit_failed``, see journal.py).  ``kind`` names the event for the
        boundary hook.  ``give_up(chain)``: asked with the current chain
        while another writer holds the lock; it raises to refuse at once instead of
        waiting for a lock it would only be refused under."""
        if self.readonly:
            raise JournalUnavailable("storage_unavailable", "journal opened read-only")
        with self.lock:
            self._files_held_now = False
            self._after_commit_steps = []
            self._committed_files: Optional[tuple] = None
            try:
                chain, connection = self._locked_chain(kind, check_checkpoint, give_up)
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
                    self._commit(connection, kind)
                if kind:
                    reach_boundary("committed", kind)
                # What this process wrote it has seen: history may never shrink
                # under it (an archive switch left the new segment's chain).
                written = self._chain if self._chain is not None else chain
                self._verified = (written.journal_id, written.count, written.head)
                self._after_commit(connection)
                for step in self._after_commit_steps:
                    step()
            finally:
                self._release_files()
            # The WAL this COMMIT went to must still be the journal's: if it was
            # deleted meanwhile, the event exists only in the orphaned file
            # (docs/guard.md §In-process code).  wal_missing then; head.json
            # names the event, so the state is checkpoint_ahead.
            self.database.check_wal(self._committed_files)

    def _commit(self, connection: sqlite3.Connection, kind: str) -> None:
        try:
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            self.forget()
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            self.database.close(fold=False)  # the next use sees what is durable
            raise JournalUnavailable(
                "commit_failed", f"COMMIT of the {kind} event failed ({exc}); it may or "
                "may not be durable, and head.json names it either way",
                event_kind=kind) from None

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
        self._committed_files = self.database.remember_files()

    def _locked_chain(self, kind: str, check_checkpoint: bool,
                      give_up: Optional[Callable[[Chain], None]]) -> tuple:
        """Verify on a snapshot, take the writer lock, catch up; returns
        ``(chain, connection)`` with the lock held."""
        for _ in range(WRITE_ATTEMPTS):
            # The long part (a full verification) happens before the writer
            # lock; a chain verified moments ago is only caught up under it.
            if not self._fresh():
                self.snapshot(check_files=False)
            connection = self.database.connection
            self._begin_immediate(connection, give_up)
            # The newest verified chain: give_up may have read again meanwhile,
            # and data_version belongs to the chain that read left.
            chain = self._chain
            try:
                if chain is None:
                    raise _StaleSnapshot()
                reach_boundary("begin", kind)
                at_rest = self.files.read_at_rest()  # for the intent and the check below
                intent = archive.read_intent(self.data_dir) if at_rest.intent else None
                if intent is not None:
                    self.hold_files()
                    self._finish_archive_switch(connection, intent)
                    raise _StaleSnapshot()  # verify the state the switch left
                chain = self._catch_up_locked(connection, chain)
                if chain.count == 0 and self.create and not self.files.all_present():
                    self.hold_files()
                    self._complete_initialization(chain)
                    at_rest = None  # written just now: look again
                if check_checkpoint:
                    self.check_files(chain, at_rest)
                return chain, connection
            except _StaleSnapshot:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                self._release_files()
                self.forget()
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
                self.forget()
                if isinstance(exc, IntegrityError):
                    self.healthy = False  # its connection then closes without folding the WAL
                raise
        raise JournalUnavailable("database_locked", "the journal kept changing while it was "
                                 "being verified; nothing was written")

    def _fresh(self) -> bool:
        """A cached chain this connection verified, not yet due for a full
        verification (the writer then catches it up under the lock)."""
        return (self._chain is not None and self.database.connection is not None
                and not self.full_verification
                and time.monotonic() - self._full_at <= self.full_verification_interval)

    def _begin_immediate(self, connection: sqlite3.Connection,
                         give_up: Optional[Callable[[Chain], None]]) -> None:
        """``BEGIN IMMEDIATE`` within the busy timeout.  SQLite's own busy
        handler backs off up to 100 ms between tries; here each try fails at
        once while another writer holds the lock, the next comes within
        milliseconds, and ``give_up`` is asked between tries with the current
        chain (:meth:`_snapshot_while_waiting`), so a call that would only be
        refused under the lock is refused at once.  (Not before the first try:
        under the lock the files are checked first, so a verdict such as
        ``checkpoint_ahead`` comes before any refusal.)"""
        deadline = None
        attempt = 0
        wait = f"PRAGMA busy_timeout = {int(self.database.busy_timeout * 1000)}"
        try:
            while True:
                connection.execute("PRAGMA busy_timeout = 0")
                try:
                    connection.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    now = time.monotonic()
                    deadline = now + self.database.busy_timeout if deadline is None else deadline
                    if "locked" not in str(exc).lower() or now >= deadline:
                        raise
                finally:
                    connection.execute(wait)
                if give_up is not None:
                    give_up(self._snapshot_while_waiting())
                time.sleep(BEGIN_PAUSES_SECONDS[min(attempt, len(BEGIN_PAUSES_SECONDS) - 1)])
                attempt += 1
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "taking the journal writer lock") from None

    def _snapshot_while_waiting(self) -> Chain:
        """For a writer waiting for the writer lock: the chain its write verified
        while no other connection committed since (``data_version``), else a new
        snapshot; so waiters never take the head lock from the writer they wait for."""
        connection = self.database.connection
        with contextlib.suppress(sqlite3.Error):
            if self._chain is not None and connection is not None and connection.execute(
                    SQL_VERSIONS).fetchone() == (self._schema_version, self._data_version):
                return self._chain
        return self.snapshot(check_files=False)

    def _catch_up_locked(self, connection: sqlite3.Connection, chain: Chain) -> Chain:
        """Under the writer lock: what changed since the snapshot.  Cheap --
        the WAL's identity, the schema cookie, rows appended meanwhile -- or
        :class:`_StaleSnapshot` when only a full verification can judge."""
        try:
            try:
                sample = self.database.files_now()
            except OSError as exc:
                raise storage_error(exc, "checking the journal's files") from None
            self.database.connect(sample)  # still the journal's database file
            self.database.check_wal(sample)
            schema_version, version = connection.execute(SQL_VERSIONS).fetchone()
            if schema_version != self._schema_version:
                raise _StaleSnapshot()
            if version != self._data_version:
                if not self._extend_cached(connection, chain):
                    raise _StaleSnapshot()
                self._data_version = version
            elif self.database.files_touched(sample) == FILES_CHANGED:
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
            with self._begun(connection), self.head_lock.held(exclusive=True):  # in that order
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
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "creating the journal") from None
        self.forget()
        return self.snapshot(check_files=False, complete_creation=False)

    @contextlib.contextmanager
    def _begun(self, connection: sqlite3.Connection) -> Iterator[None]:
        """``BEGIN IMMEDIATE``, rolled back unless the body committed."""
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")

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
        self.files.write_marker(journal_id, SCHEMA, announce="archived_marker")  # lock held
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
            # Read under both locks: a live archiver holds the head lock until
            # its intent is gone, so what is found here was left by a dead one.
            with self._begun(connection), self.head_lock.held(exclusive=True):
                intent = archive.read_intent(self.data_dir)
                if intent is not None:
                    done = self._finish_archive_switch(connection, intent)
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

