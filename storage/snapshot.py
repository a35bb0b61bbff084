"""Verified snapshots: the read side of the journal's store (docs/format.md
§Verification, §What is checked when).

:class:`VerifiedSnapshots` turns the SQLite connection (through
:class:`database.Database`) and the files beside it (through
:class:`durable.DurableFiles`) into a verified :class:`chain.Chain`, never
under the writer lock.  One snapshot is:

1. one look at the database and WAL files (``stat``): changed with no commit
   to explain it, the page cache is dropped and everything verified again;
2. under the head lock, shared (storage/head_lock.py): ``BEGIN``, pin the
   read snapshot, read ``head.json``, the marker and whether an archive intent
   exists -- so the files are those of the pinned database state, never half
   of a write;
3. without any lock: verify the rows of that snapshot -- the whole history the
   first time, after a schema change, after an unexplained file change, after
   the full-verification interval, otherwise only the rows appended since --
   then compare the files seen in step 2 with the verified chain.

A disagreement in step 3 is a verdict, whoever writes meanwhile: nothing is
retried.  History a process has verified may never shrink or change under it
(:meth:`VerifiedSnapshots._check_continues`).  :class:`store.JournalStore`
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
from .database import FILES_CHANGED
from .durable import FilesAtRest
from .errors import IntegrityError, JournalError, JournalUnavailable
from .record import INTENT_NAME, genesis_hash
from .schema import SQL_SELECT_HASH_AT, SQL_SELECT_ROWS_AFTER, SQL_SELECT_ROWS_FROM, SQL_VERSIONS

# Seconds between full verifications of a long-running process: a raw byte edit
# hidden behind another process's commits is found within this time.
DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS = 600.0


class VerifiedSnapshots:
    """The verified chain of one data directory, read without the writer lock.

    A subclass sets ``data_dir``, ``readonly``, ``create``,
    ``full_verification``, ``full_verification_interval`` (seconds),
    ``database``, ``files`` and ``head_lock``, and provides the writer's parts
    used here: :meth:`_create` (a new journal, or one whose creator died) and
    :meth:`_recover_archive_switch`.  Raises only :class:`JournalError`
    subclasses.
    """

    _verified: Optional[tuple] = None
    # Whether the last verification passed: a connection to a journal that
    # failed closes without letting SQLite fold its WAL (storage/wal_keeper.py).
    healthy = True

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
        """The verified chain (see the module docstring).  ``full``: verify
        the whole history.  ``check_files``: also check the marker and
        head.json.  A database without tables, or an empty journal without
        head.json or the marker, is completed when this store may create one
        (``complete_creation``); else a table-less one is ``journal_absent``."""
        try:
            chain = self._snapshot(full, check_files, complete_creation)
        except IntegrityError:
            self.healthy = False
            raise
        self.healthy = True
        return chain

    def _snapshot(self, full: bool, check_files: bool, complete_creation: bool) -> Chain:
        opening = not self.database.is_open()
        # data_version just before the look: a commit between the look and the
        # read is told apart from a raw edit (see pinned below).
        before = None if opening else self._data_version_now()
        sampled = None if opening else self._look()
        connection = self.database.connect(sampled)
        if opening:  # opened (maybe created) just now: look at what it left
            before, sampled = self._data_version_now(), self._look()
        if not self.readonly:
            # The admission's own test, so every surface of a worker (hook,
            # status tool, slash command) gives the verdict its gate gives.
            self.database.check_wal(sampled)
            if os.path.lexists(self.files.intent_path) and archive.read_intent(self.data_dir):
                self._recover_archive_switch()  # a writer finishes or undoes it first
        touched = self.database.files_touched(sampled)
        at_rest = None
        try:
            # No writer of ours commits while the head lock is shared: the
            # snapshot, data_version and the files all show one state.
            with self.head_lock.held(exclusive=False):
                connection.execute("BEGIN")
                # Reading the header starts the read transaction: the snapshot.
                schema_version, data_version = connection.execute(SQL_VERSIONS).fetchone()
                at_rest = self.files.read_at_rest()
                # The files as this snapshot has them: the look above, unless a
                # commit came between it and the read (then it would read as a
                # raw edit later); an edit after the look stays seen as one.
                pinned = sampled if data_version == before else self._look()
            chain = self._chain
            stale = (chain is None or full or self.full_verification
                     or schema_version != self._schema_version
                     or (touched == FILES_CHANGED and data_version == self._data_version)
                     or time.monotonic() - self._full_at > self.full_verification_interval)
            if stale or not self._extend_cached(connection, chain):
                chain = self._full_chain(connection, at_rest)
                if chain is not None:
                    self._check_continues(connection, chain)
        except sqlite3.Error as exc:
            self.forget()
            raise self.database.read_failure(exc, "verifying the journal") from None
        except IntegrityError as exc:
            self.forget()
            if at_rest is not None:
                self._name_interrupted_archive(exc, at_rest)
            raise
        except BaseException:
            self.forget()
            raise
        finally:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")  # a read snapshot: nothing to commit
        if self.database.immutable and self.database.files_now() != sampled:
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
                chain.count == 0 and (at_rest.checkpoint is None or at_rest.marker is None))):
            return self._create(connection)  # new, or its creator died half-way
        self._chain, self._schema_version, self._data_version = chain, schema_version, data_version
        self._verified = (chain.journal_id, chain.count, chain.head)
        self.database.remember_sample(pinned)
        if check_files:
            try:
                self.check_files(chain, at_rest)
                if self.readonly:
                    self._check_no_switch_open(chain, at_rest)
            except IntegrityError as exc:
                self._name_interrupted_archive(exc, at_rest)
                raise
        return chain

    def _data_version_now(self) -> Optional[int]:
        """``PRAGMA data_version`` outside a transaction, None on error."""
        try:
            return self.database.connection.execute("PRAGMA data_version").fetchone()[0]
        except (sqlite3.Error, AttributeError):
            return None

    def _look(self) -> Optional[tuple]:
        """One look at the database and WAL files (:meth:`Database.files_now`),
        None when they cannot be examined (files_touched names the failure)."""
        try:
            return self.database.files_now()
        except OSError:
            return None

    def _check_no_switch_open(self, chain: Chain, at_rest: FilesAtRest) -> None:
        """A reader that verified a segment while an archive intent exists:
        a switch whose COMMIT happened (the database is the intent's new
        segment) is complete; otherwise its archiver died half-way
        (``archive_interrupted``): a live one holds the head lock throughout."""
        if not at_rest.intent:
            return
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

    def _name_interrupted_archive(self, error: IntegrityError, at_rest: FilesAtRest) -> None:
        """While an archive switch is unfinished, a failed verification is that
        interruption (``archive_interrupted``), not tampering."""
        if error.code != "archive_interrupted" and at_rest.intent:
            raise IntegrityError(
                "archive_interrupted", f"an archive switch was interrupted ({error.code}: "
                f"{error.message}); the next protected call or operator command that writes "
                "finishes or undoes it") from None

    def _extend_cached(self, connection: sqlite3.Connection, chain: Optional[Chain]) -> bool:
        """Extend the cached chain with the rows appended since (one query from
        its last verified row on); False when that row is no longer there as
        it was (verify everything)."""
        if chain is None:
            return False
        rows = connection.execute(SQL_SELECT_ROWS_FROM, (chain.count,))
        if chain.count:
            last = rows.fetchone()
            if last is None or last[0] != chain.count or last[3] != chain.head.encode():
                return False
        try:
            extend_chain(chain, rows)
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

    def _full_chain(self, connection: sqlite3.Connection,
                    at_rest: FilesAtRest) -> Optional[Chain]:
        """Verify the whole history in the current read transaction (None for a
        database without tables).  On :class:`PossibleReuse` once more with exact ids."""
        surviving = at_rest.checkpoint is not None or at_rest.marker is not None
        genesis = self.database.read_genesis(connection, surviving)
        if genesis is None:
            return None
        journal_id, schema, self._missing_triggers = genesis
        self.files.check_marker_identity(journal_id, at_rest)
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

    def check_files(self, chain: Chain, at_rest: Optional[FilesAtRest] = None) -> None:
        """The marker, then head.json (docs/format.md §Verification steps 3-4),
        as ``at_rest`` saw them (a writer holding the writer lock looks now).
        With no event, missing files are a creation in progress or
        interrupted: nothing can be lost, and the next writer completes them."""
        if at_rest is None:
            at_rest = self.files.read_at_rest()
        interrupted = chain.count == 0
        self.files.check_marker(chain.journal_id, chain.schema, chain.count, at_rest,
                                creation_interrupted=interrupted)
        self.files.check_checkpoint(chain.checkpoint(), at_rest, creation_interrupted=interrupted)
