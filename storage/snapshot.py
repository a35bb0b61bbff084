"""Verified snapshots: the read side of the journal's store (docs/format.md
§Verification, §What is checked when).

:class:`VerifiedSnapshots` turns the SQLite connection (through
:class:`database.Database`) and the files beside it (through
:class:`durable.DurableFiles`) into a verified :class:`chain.Chain`, read in
one read transaction and never under the writer lock: the whole history the
first time, after a schema change, after an unexplained file change, after
the full-verification interval; otherwise only the rows appended since.  It
also checks that history a process has verified never shrinks or changes
under it, and waits out a live archive switch.  :class:`store.JournalStore`
adds the writer's side.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from typing import Optional

from . import archive
from .chain import Chain, PossibleReuse, extend_chain
from .durable import file_state
from .errors import IntegrityError, JournalError, JournalUnavailable
from .record import INTENT_NAME, genesis_hash
from .schema import SQL_SELECT_HASH_AT, SQL_SELECT_ROWS_AFTER
from .writer_lock import writer_pid

# A reader's snapshot may be older than head.json, which live writers replace
# before they COMMIT: it reads again, this many seconds apart, while a writer
# is at work (and, where nobody can tell whether one is, this many times).
READ_RETRY_ATTEMPTS = 20
READ_RETRY_PAUSE_SECONDS = 0.02
# Verdicts a writer half-way through an append or an archive switch can make a
# reader see: the files beside the database against an older snapshot.
WRITER_TRANSIENT_VERDICTS = frozenset((
    "checkpoint_ahead", "journal_rolled_back", "checkpoint_behind", "checkpoint_mismatch",
    "checkpoint_foreign", "identity_mismatch", "marker_missing", "marker_corrupt",
    "checkpoint_missing", "checkpoint_empty", "checkpoint_corrupt", "archive_interrupted"))

# Seconds between full verifications of a long-running process: a raw byte edit
# hidden behind another process's commits is found within this time.
DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS = 600.0


class VerifiedSnapshots:
    """The verified chain of one data directory, read without the writer lock.

    A subclass sets ``data_dir``, ``readonly``, ``create``,
    ``full_verification``, ``full_verification_interval`` (seconds),
    ``database`` and ``files``, and provides the writer's parts used here:
    :meth:`_create` (a new journal, or one whose creator died) and
    :meth:`_recover_archive_switch`.  Raises only :class:`JournalError`
    subclasses.
    """

    _verified: Optional[tuple] = None

    def _create(self, connection: sqlite3.Connection) -> Chain:
        raise NotImplementedError

    def _recover_archive_switch(self) -> None:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop every cached verification result (the next snapshot is full)."""
        self._chain: Optional[Chain] = None
        self._schema_version: Optional[int] = None
        self._data_version: Optional[int] = None
        self._missing_triggers: list = []
        self._full_at = 0.0

    def snapshot(self, *, full: bool = False, check_files: bool = True,
                 complete_creation: bool = True) -> Chain:
        """The verified chain, verified on a read snapshot: the whole history
        when nothing is cached, when asked, when the schema changed, when the
        files changed with no commit to explain it, or when the interval has
        passed; else only what was appended since.  ``check_files``: also check
        the marker and head.json (re-reading a head.json a live writer has moved
        ahead).  A database without tables, or an empty journal without
        head.json or the marker, is completed when this store may create one
        (``complete_creation``); else a table-less one is ``journal_absent``."""
        connection = self.database.connect()
        if not self.readonly:
            # The admission's own test, so every surface of a worker (hook,
            # status tool, slash command) gives the verdict its gate gives.
            self.database.check_wal()
        if not self.readonly and archive.read_intent(self.data_dir) is not None:
            self._recover_archive_switch()  # a writer finishes or undoes it first
        try:  # one look at the files before the read serves both checks below
            sampled: Optional[tuple] = self.database.files_now()
        except OSError:
            sampled = None  # files_touched looks again and names the failure
        touched = self.database.files_touched(sampled)
        files_before = self.database.files_now() if self.database.immutable else None
        self._settle_deadline: Optional[float] = None
        attempt = 0
        while True:
            attempt += 1
            observed = self._observed_files(sampled if attempt == 1 else None)
            self._read_version = None
            try:
                connection.execute("BEGIN")
                schema_version = connection.execute("PRAGMA schema_version").fetchone()[0]
                data_version = connection.execute("PRAGMA data_version").fetchone()[0]
                self._read_version = data_version
                chain = self._chain
                stale = (chain is None or full or self.full_verification
                         or schema_version != self._schema_version
                         or (touched and data_version == self._data_version)
                         or time.monotonic() - self._full_at > self.full_verification_interval)
                if stale or not self._extend_cached(connection, chain):
                    chain = self._full_chain(connection)
                    if chain is not None:
                        self._check_continues(connection, chain)
                connection.execute("ROLLBACK")  # a read snapshot: nothing to commit
            except sqlite3.Error as exc:
                self.forget()
                raise self.database.read_failure(exc, "verifying the journal") from None
            except IntegrityError as exc:
                self.forget()
                self._unless_written_meanwhile(exc, observed, attempt)
                time.sleep(READ_RETRY_PAUSE_SECONDS)
                continue
            except BaseException:
                self.forget()
                raise
            finally:
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
            if files_before is not None and self.database.files_now() != files_before:
                # immutable=1 takes no lock: a worker that started meanwhile may
                # have changed the file under the read (docs/cli.md §Access).
                self.forget()
                raise JournalUnavailable("journal_changed_while_read",
                                         "a worker started while the journal was read without "
                                         "write access; run the command again (or stop the "
                                         "workers first)")
            if chain is None and not self.create:  # an empty file, made by hand
                raise JournalUnavailable("journal_absent",
                                         f"the journal in {self.data_dir} has no tables yet")
            if self.create and complete_creation and (chain is None or (
                    chain.count == 0 and not self.files.all_present())):
                return self._create(connection)  # new, or its creator died half-way
            self._chain, self._schema_version, self._data_version = chain, schema_version, data_version
            self._verified = (chain.journal_id, chain.count, chain.head)
            if observed:
                self.database.remember_sample(observed[0])
            else:
                self.database.remember_files()
            full = touched = False
            if not check_files:
                return chain
            try:
                self.check_files(chain)
                if self.readonly:
                    self._check_no_switch_open(chain)
                return chain
            except IntegrityError as exc:
                # A live writer keeps head.json ahead of an older snapshot; a
                # real rollback stays ahead once no writer is left.
                if self._unless_written_meanwhile(exc, observed, attempt):
                    return chain
            time.sleep(READ_RETRY_PAUSE_SECONDS)

    def _observed_files(self, database_files: Optional[tuple] = None) -> tuple:
        """What a writer changes: the database and WAL (``database_files``:
        a :meth:`files_now` just taken), head.json, the marker and the archive
        intent (see :meth:`_unless_written_meanwhile`)."""
        try:
            return (self.database.files_now() if database_files is None else database_files,
                    file_state(self.files.checkpoint_path),
                    file_state(self.files.marker_path),
                    file_state(os.path.join(self.data_dir, INTENT_NAME)))
        except OSError:
            return ()  # never equal to a later look: read again

    def _unless_written_meanwhile(self, error: IntegrityError, observed: tuple,
                                  attempt: int) -> bool:
        """Return (read again) when ``error`` may come from a writer half-way
        through an append or an archive switch; raise it when it cannot.
        True: ``checkpoint_ahead`` while another process holds the write lock
        and head.json was just replaced, i.e. that append is half-way: the
        snapshot is the last committed state and stands (a writer judges
        head.json under the lock before it writes).

        A writer of ours changes head.json, the marker and the intent only
        while it holds SQLite's WAL write lock.  So a disagreement between the
        files and a read snapshot is a verdict only when, after the read, no
        process holds that lock and no journal file changed since just before
        the snapshot: then the files were read at rest.  While writers keep
        the lock or keep changing the files, the read is repeated; past the
        busy timeout it ends with ``database_locked`` (the journal is being
        written; nothing could be concluded), never with a verdict."""
        if error.code not in WRITER_TRANSIENT_VERDICTS:
            self._name_interrupted_archive(error)
            raise error
        writer = writer_pid(self.database.path)
        # data_version moves with every commit another connection makes visible
        # (a WAL's size and mtime change earlier, when its frames are written).
        try:
            committed = (self.database.connection.execute("PRAGMA data_version").fetchone()[0]
                         != self._read_version)
        except sqlite3.Error:
            committed = True
        at_rest = bool(observed) and not committed and self._observed_files() == observed
        if (writer == 0 and at_rest) or (writer is None and at_rest
                                          and attempt >= READ_RETRY_ATTEMPTS):
            self._name_interrupted_archive(error)
            raise error
        if error.code == "checkpoint_ahead" and writer and self._checkpoint_just_written():
            return True
        now = time.monotonic()
        if self._settle_deadline is None:
            self._settle_deadline = now + max(self.database.busy_timeout,
                                              READ_RETRY_ATTEMPTS * READ_RETRY_PAUSE_SECONDS)
        elif now > self._settle_deadline:
            self.forget()
            raise JournalUnavailable(
                "database_locked", f"the journal was being written (writer pid {writer}) for "
                f"longer than the busy timeout while it was read, so it could not be verified "
                f"({error.code} was seen half-way); run the command again") from None
        return False

    def _checkpoint_just_written(self) -> bool:
        """head.json was replaced within the busy timeout: the lock holder's
        append, not a crashed writer's leftover that a refused admission is
        looking at under the lock (that one stays a verdict)."""
        try:
            state = file_state(self.files.checkpoint_path)
        except OSError:
            return False
        return state is not None and state[3] >= time.time_ns() - int(
            self.database.busy_timeout * 1e9)

    def _check_no_switch_open(self, chain: Chain) -> None:
        """A reader that verified a segment while an archive intent exists: a
        switch already committed (the database is the intent's new segment) is
        complete; otherwise it is live or interrupted (``archive_interrupted``,
        judged by :meth:`_unless_written_meanwhile`)."""
        intent = archive.read_intent(self.data_dir)
        if intent is not None and not (isinstance(intent, dict)
                                       and intent.get("to") == chain.journal_id):
            raise IntegrityError("archive_interrupted", f"{INTENT_NAME} shows an archive switch "
                                 "that was interrupted; the next protected call or writing "
                                 "operator command finishes or undoes it")

    def _check_continues(self, connection: sqlite3.Connection, chain: Chain) -> None:
        """A fully verified chain must continue what this store verified before:
        the same journal still holding the old head at its seq, or a new segment
        whose archive anchor covers it.  A consistent older copy of the database
        and head.json, restored under a live process, is caught here."""
        if self._verified is None:
            return
        journal_id, count, head = self._verified
        if chain.journal_id != journal_id:
            # Archived meanwhile, by one archive or by several.
            if archive.continues(self.data_dir, chain.archive, journal_id, count, head):
                return
            raise IntegrityError("identity_mismatch", f"this process verified journal "
                                 f"{journal_id} ({count} events); the data directory now holds "
                                 f"journal {chain.journal_id}, which does not continue it")
        if chain.count < count:
            raise IntegrityError("journal_rolled_back", f"this process verified {count} events; "
                                 f"the journal now holds {chain.count}: events were removed or "
                                 "an older copy was restored")
        if count and self._hash_at_locked(connection, count) != head:
            raise IntegrityError("checkpoint_mismatch", f"the event at seq {count} differs from "
                                 "the one this process verified: history was rewritten")

    def _name_interrupted_archive(self, error: IntegrityError) -> None:
        """While an archive switch is unfinished, a failed verification is that
        interruption (``archive_interrupted``), not tampering."""
        if error.code != "archive_interrupted" and archive.read_intent(self.data_dir) is not None:
            raise IntegrityError(
                "archive_interrupted", f"an archive switch was interrupted ({error.code}: "
                f"{error.message}); the next protected call or operator command that writes "
                "finishes or undoes it") from None

    def _extend_cached(self, connection: sqlite3.Connection, chain: Optional[Chain]) -> bool:
        """Extend the cached chain with the rows appended since; False when the
        last verified row is no longer there as it was (verify everything)."""
        if chain is None:
            return False
        if chain.count and self._hash_at_locked(connection, chain.count) != chain.head:
            return False
        try:
            extend_chain(chain, connection.execute(SQL_SELECT_ROWS_AFTER, (chain.count,)))
        except PossibleReuse:
            return False
        except JournalError:
            self._chain = None
            raise
        return True

    @staticmethod
    def _hash_at_locked(connection: sqlite3.Connection, seq: int) -> Optional[str]:
        row = connection.execute(SQL_SELECT_HASH_AT, (seq,)).fetchone()
        return row[0] if row else None

    def _full_chain(self, connection: sqlite3.Connection) -> Optional[Chain]:
        """Verify the whole history in the current read transaction (None for a
        database without tables).  On :class:`PossibleReuse` once more with exact ids."""
        surviving = (os.path.lexists(self.files.marker_path)
                     or os.path.lexists(self.files.checkpoint_path))
        genesis = self.database.read_genesis(connection, surviving)
        if genesis is None:
            return None
        journal_id, schema, self._missing_triggers = genesis
        self.files.check_marker_identity(journal_id)
        for exact in (None, set()):
            chain = Chain(journal_id=journal_id, schema=schema, count=0,
                          head=genesis_hash(journal_id, schema), exact_ids=exact)
            try:
                extend_chain(chain, connection.execute(SQL_SELECT_ROWS_AFTER, (0,)), full=True)
            except PossibleReuse:
                continue
            break
        self._full_at = time.monotonic()
        if chain.archive is not None:
            archive.check_anchor(self.data_dir, chain.archive)
        return chain

    def check_files(self, chain: Chain) -> None:
        """The marker, then head.json (docs/format.md §Verification steps 3-4).
        With no event, missing files are a creation in progress or interrupted:
        nothing can be lost, and the next writer completes them."""
        interrupted = chain.count == 0
        self.files.check_marker(chain.journal_id, chain.schema, chain.count,
                                 creation_interrupted=interrupted)
        self.files.check_checkpoint(chain.checkpoint(), creation_interrupted=interrupted)
