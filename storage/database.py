"""The SQLite side of the journal: opening, the schema, and file identity
(docs/format.md §Files, §Tables).

:class:`Database` owns one ``sqlite3`` connection to ``journal.sqlite3`` and
never hands SQLite a file it would silently rewrite: a database missing beside
surviving state, an empty or foreign file beside a WAL, or someone else's
tables are refused before any statement runs.  It also notices when the files
change behind the connection (a raw edit, a replaced database, a deleted WAL).

:func:`translate_sqlite_error` is the one place a ``sqlite3.Error`` becomes a
:class:`JournalError`; no ``sqlite3.Error`` leaves this module or the journal.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import sqlite3
import time
import urllib.parse
import uuid
from typing import Optional

from . import forksafe, lock_holders
from .durable import (BOUNDARY_KIND_GENESIS, TEMP_SUFFIX, file_size, file_state, fsync_directory,
                      PRIVATE_FILE_MODE, fsync_file, make_durable_directories, reach_boundary,
                      remove_files_of_dead_processes, storage_error, temp_path_for)
from .errors import IntegrityError, JournalError, JournalUnavailable, short
from .opening import refuse_rewritable_database
from . import wal_keeper
from .record import (CHECKPOINT_NAME, DATABASE_NAME, MARKER_NAME, SCHEMA, SHM_SUFFIX, WAL_SUFFIX,
                     is_uuid)
from .schema import SQL_SELECT_METADATA, SQL_SELECT_TABLES, create_schema, schema_problem

# Seconds a writer waits for SQLite's writer lock before the call is refused.
# Admissions hold the lock for milliseconds, so waiting longer only delays a refusal.
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0
# Pause in seconds between attempts to switch a database another process is
# creating right now to WAL (bounded by the busy timeout).
WAL_RETRY_PAUSE_SECONDS = 0.01
# Where os.link fails with one of these, the filesystem has no hard links.
_NO_HARD_LINKS = frozenset(code for code in (getattr(errno, name, None) for name in (
    "EPERM", "ENOTSUP", "EOPNOTSUPP", "ENOSYS", "EMLINK", "EXDEV")) if code is not None)
# A database under construction and the side files SQLite may give it.
_BUILD_SUFFIXES = ("", "-journal", WAL_SUFFIX, SHM_SUFFIX)
# Those files by name (durable.temp_path_for), the creator's pid in group 1.
_BUILD_NAME = re.compile(re.escape(DATABASE_NAME) + r"\.(\d+)-[0-9a-f]+" + re.escape(TEMP_SUFFIX)
                         + "(?:" + "|".join(re.escape(suffix) for suffix in _BUILD_SUFFIXES) + ")")

def translate_sqlite_error(exc: sqlite3.Error, action: str) -> JournalError:
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


def wal_missing_verdict(database_path: str, what: str, *, index: bool = False) -> IntegrityError:
    """The ``wal_missing`` verdict (docs/cli.md §Verdict codes): ``what``
    happened, and who still has the journal open (``workers_running``: pids,
    [] for none, None where unknown).  While one of them lives, its connection
    holds the deleted WAL's events and its exit folds them back; with none
    left, events committed to that WAL are lost.  ``index``: the ``-shm`` was
    lost instead, the WAL is in place: once none has the journal open, SQLite
    rebuilds the index from it."""
    pids = lock_holders.connected_pids(database_path, wal_keeper.SHARED_FIRST,
                                       wal_keeper.SHARED_FIRST + wal_keeper.SHARED_SIZE - 1)
    if index and pids:
        after = (f"; process(es) {', '.join(map(str, pids))} still have the journal open, not "
                 "all through one index, so they no longer exclude each other. Stop every "
                 "worker of the profile, then look again: the WAL is in place, and SQLite "
                 "rebuilds its index from it once no process has the journal open")
    elif pids:
        after = (f"; process(es) {', '.join(map(str, pids))} still have the journal open: "
                 "while one runs, it holds the events of the deleted WAL, and they return to "
                 "the database when it exits. Stop every worker of the profile, then look again")
    elif pids == []:
        after = "; no process has the journal open any more: events committed to it are lost"
    else:
        after = "; events committed to it may be lost"
    return IntegrityError("wal_missing", what + after, workers_running=pids)


# What :meth:`Database.files_touched` found.
FILES_CHECKPOINTED, FILES_CHANGED = "checkpointed", "changed"
# A WAL file this long holds its header and no frame.
WAL_HEADER_BYTES = 32


class Database:
    """One connection to ``journal.sqlite3`` in ``data_dir``.

    ``readonly``: open with a ``mode=ro`` URI (never creates or writes); when
    the directory is not writable and no worker has the journal open (no
    ``-wal``/``-shm``), with ``immutable=1`` instead, since SQLite could not
    create the ``-shm`` it needs (:attr:`immutable`).
    ``create``: a missing database may be created (else ``journal_absent``).
    A read-write connection is opened under a :class:`wal_keeper.WalKeeper`.
    Used from a forked child, the parent's connection is dropped unclosed and
    a new one opened (storage/forksafe.py).  Not thread-safe by itself:
    :class:`journal.Journal` serializes every use.  Methods raise only
    :class:`JournalError` subclasses unless they say otherwise.
    """

    def __init__(self, data_dir: str, *, busy_timeout: float, readonly: bool, create: bool):
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, DATABASE_NAME)
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self.create = create
        self.immutable = False
        self.connection: Optional[sqlite3.Connection] = None
        self._pid = forksafe.current_pid()
        self._keeper: Optional[wal_keeper.WalKeeper] = None
        self._file_identity: Optional[tuple] = None
        # (device, inode) of the WAL this connection writes to, and of the -shm
        # (the WAL's index, where SQLite keeps its WAL locks); see check_wal.
        self._wal_identity: Optional[tuple] = None
        self._shm_identity: Optional[tuple] = None
        # (database, WAL) file states after this connection's last transaction.
        self._files_seen: Optional[tuple] = None

    def _drop_if_forked(self) -> None:
        """In a forked child: forget the parent's connection and keeper without
        closing them (the child must never close or finalize them)."""
        if self._pid == os.getpid():
            return
        if self.connection is not None:
            forksafe.abandon(self.connection)
        self.connection, self._keeper = None, None
        self._files_seen = self._wal_identity = self._shm_identity = None
        self._pid = os.getpid()

    # --------------------------------------------------------- opening --

    def survivors(self) -> list:
        """Journal files other than the database that exist now."""
        names = (CHECKPOINT_NAME, MARKER_NAME, DATABASE_NAME + WAL_SUFFIX,
                 DATABASE_NAME + SHM_SUFFIX)
        return [name for name in names if os.path.lexists(os.path.join(self.data_dir, name))]

    def missing_database(self) -> IntegrityError:
        """The ``missing_database`` verdict naming the surviving files."""
        survivors = self.survivors()
        return IntegrityError(
            "missing_database",
            f"{DATABASE_NAME} is missing while {', '.join(survivors)} survive(s); "
            "it is never re-created over surviving state", survivors=survivors)

    def is_open(self) -> bool:
        """Whether this process has the connection open (not a forked
        child's copy of its parent's)."""
        return self.connection is not None and self._pid == os.getpid()

    def connect(self, sample: Optional[tuple] = None) -> sqlite3.Connection:
        """Open (once) the connection; refuse to re-create a lost database.
        An open connection's file must still be the journal's: checked with
        ``sample`` (a :meth:`files_now` just taken) or a fresh ``stat``."""
        self._drop_if_forked()
        if self.connection is not None:
            self._check_file_identity(None if sample is None else sample[0])
            return self.connection
        if os.path.isfile(self.data_dir) or (os.path.lexists(self.data_dir)
                                             and not os.path.isdir(self.data_dir)):
            raise JournalUnavailable("storage_unavailable",
                                     f"data directory {self.data_dir} is not a directory")
        refuse_rewritable_database(self)
        if (not self.readonly and os.path.isdir(self.data_dir)
                and not (os.access(self.data_dir, os.W_OK)
                         and (not os.path.exists(self.path) or os.access(self.path, os.W_OK)))):
            raise JournalUnavailable(
                "read_access_only",
                f"this user may read but not write the journal in {self.data_dir}: inspection "
                "(status, show, log, verify, checkpoint) works; protected calls and resolve, "
                "acknowledge, repair-checkpoint and archive need write access (run them as the "
                "user the workers run as)")
        if not os.path.exists(self.path):
            # Survivors are checked before the database is looked at again: a
            # concurrent creator makes the database first, then head.json/marker.
            survivors = self.survivors()
            if not os.path.exists(self.path):
                if survivors:
                    raise self.missing_database()
                if not self.create:
                    raise JournalUnavailable("journal_absent", f"no journal in {self.data_dir}")
                self._create_database_file()
        self._refuse_deleted_wal()
        connection = None
        try:
            if self.readonly:
                self.immutable = self._quiescent_and_unwritable()
                uri = "file:" + urllib.parse.quote(self.path) + (
                    "?mode=ro&immutable=1" if self.immutable else "?mode=ro")
                connection = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout,
                                             isolation_level=None, check_same_thread=False)
            else:
                connection = self._open_writable()
                self._refuse_foreign_tables(connection)
                mode = self._enable_wal(connection)
                if str(mode).lower() != "wal":
                    raise JournalUnavailable(
                        "wal_unavailable",
                        f"SQLite answered journal_mode={mode!r} instead of 'wal' in "
                        f"{self.data_dir}; the journal needs WAL (a local filesystem)")
                connection.execute("PRAGMA synchronous=FULL")
                self._remember_wal(file_state(self.path + WAL_SUFFIX),
                                   file_state(self.path + SHM_SUFFIX))
            identity = os.stat(self.path)
        except sqlite3.Error as exc:
            self._release(connection, fold=False)
            raise translate_sqlite_error(exc, "opening the journal database") from None
        except OSError as exc:
            self._release(connection, fold=False)
            raise storage_error(exc, "opening the journal database") from None
        except BaseException:
            self._release(connection, fold=False)
            raise
        self.connection = connection
        self._file_identity = (identity.st_dev, identity.st_ino)
        return connection

    def _refuse_deleted_wal(self) -> None:
        """``-shm`` without ``-wal``: the WAL was deleted (SQLite itself removes
        ``-shm`` first and creates ``-wal`` first, so it never leaves this).
        Opening would make a new empty WAL beside it; instead nothing is
        touched, and the verdict names the processes that still have the
        journal open: while one lives, its connection still holds the deleted
        WAL's events, and its exit folds them back (docs/cli.md §wal_missing)."""
        if os.path.lexists(self.path + SHM_SUFFIX) and not os.path.lexists(
                self.path + WAL_SUFFIX):
            raise wal_missing_verdict(self.path, f"{DATABASE_NAME}{WAL_SUFFIX} is gone while "
                                      f"{DATABASE_NAME}{SHM_SUFFIX} remains: it was deleted "
                                      "while a worker had the journal open")

    def _open_writable(self) -> sqlite3.Connection:
        """A read-write connection, opened under its own WAL keeper.  Raises
        ``OSError`` and ``sqlite3.Error``."""
        keeper = wal_keeper.WalKeeper(self.path)
        keeper.hold(self.busy_timeout)
        try:
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout,
                                         isolation_level=None, check_same_thread=False)
        except BaseException:
            keeper.close()
            raise
        self._keeper = keeper
        return connection

    def _release(self, connection: Optional[sqlite3.Connection], *, fold: bool) -> None:
        """Close ``connection`` and this Database's keeper.  ``fold``: let the
        keeper go first, so that SQLite may fold the WAL into the database if
        this is the last connection anywhere (only for a journal last seen
        healthy); else nothing of the journal's files changes.  Never raises."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None and fold:
            keeper.let_go()
        if connection is not None:
            with contextlib.suppress(sqlite3.Error):
                connection.close()
        if keeper is not None:
            keeper.close()

    def _create_database_file(self) -> None:
        """Build a new journal (WAL mode, tables, metadata, triggers) under a
        temporary name, fsync it and hard-link it into place, so that
        ``journal.sqlite3`` never exists half-made and a crash at any point
        leaves either no journal or a complete empty one (docs/format.md
        §Creation).  A concurrent creator may win the link: its journal is
        used.  Where the filesystem has no hard links, SQLite creates the file
        in place (the writer lock then serializes the schema)."""
        temp_path = temp_path_for(self.path)
        try:
            make_durable_directories(self.data_dir)
            self._build_database(temp_path)
            # Private (issue 25); SQLite gives the -wal and -shm the database's mode.
            os.chmod(temp_path, PRIVATE_FILE_MODE)
            fsync_file(temp_path)
            try:
                os.link(temp_path, self.path)
            except FileExistsError:
                pass  # a concurrent creator won: its journal is used
            except OSError as exc:
                if exc.errno not in _NO_HARD_LINKS:
                    raise
            fsync_directory(self.data_dir)
        except OSError as exc:
            raise storage_error(exc, "creating the journal database") from None
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "creating the journal database") from None
        finally:
            for suffix in _BUILD_SUFFIXES:
                with contextlib.suppress(OSError):
                    os.unlink(temp_path + suffix)
        reach_boundary("tables_committed", BOUNDARY_KIND_GENESIS)

    def _build_database(self, temp_path: str) -> None:
        """The complete empty journal at ``temp_path``, closed (its WAL folded in)."""
        build = sqlite3.connect(temp_path, isolation_level=None)
        try:
            mode = build.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalUnavailable(
                    "wal_unavailable", f"SQLite answered journal_mode={mode!r} instead of "
                    f"'wal' in {self.data_dir}; the journal needs WAL (a local filesystem)")
            build.execute("PRAGMA synchronous=FULL")
            build.execute("BEGIN IMMEDIATE")
            create_schema(build, str(uuid.uuid4()))
            build.execute("COMMIT")
        finally:
            build.close()

    def remove_stale_build_files(self) -> list:
        """Remove databases a dead creator left half-built (the temporary files
        of :meth:`_create_database_file`); returns the names removed."""
        return remove_files_of_dead_processes(self.data_dir, _BUILD_NAME)

    def _quiescent_and_unwritable(self) -> bool:
        """No connection anywhere has the journal open (SQLite keeps ``-wal`` and
        ``-shm`` while one does), and this process may not create files here."""
        return (not os.access(self.data_dir, os.W_OK)
                and not os.path.lexists(self.path + WAL_SUFFIX)
                and not os.path.lexists(self.path + SHM_SUFFIX))

    def close(self, *, fold: bool = True) -> None:
        """Close the connection (idempotent).  ``fold``: see :meth:`_release`."""
        self._drop_if_forked()
        self._files_seen = None
        self._wal_identity = self._shm_identity = None
        connection, self.connection = self.connection, None
        self._release(connection, fold=fold)

    @staticmethod
    def _refuse_foreign_tables(connection: sqlite3.Connection) -> None:
        """A database with tables but neither journal table is someone else's:
        refuse it before ``journal_mode=WAL`` would rewrite its header.  (One
        with a journal table is a damaged journal: verification names it.)"""
        tables = {row[0] for row in connection.execute(SQL_SELECT_TABLES)}
        if tables and not {"metadata", "events"} & tables:
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

    # ---------------------------------------------------- file identity --

    def files_now(self) -> tuple:
        """``(database state, WAL state)`` (see :func:`durable.file_state`).  The
        WAL's change time is left out: SQLite running as root ``fchown``s the
        WAL whenever a connection opens it, so every ``status`` would look like
        an edit and cost each warm worker a full verification.  A raw edit of
        the WAL that keeps its size and mtime is left to the next full one."""
        wal = file_state(self.path + WAL_SUFFIX)
        return file_state(self.path), None if wal is None else wal[:4]

    def remember_files(self) -> Optional[tuple]:
        """Record the files as this connection's own transaction left them, and
        return that :meth:`files_now` (None when the files cannot be read: then
        the next use verifies all).  Never raises."""
        try:
            self._files_seen = self.files_now()
        except OSError:
            self._files_seen = None
        return self._files_seen

    def remember_sample(self, sample: Optional[tuple]) -> None:
        """Record ``sample`` (a :meth:`files_now` that shows the files as this
        connection's last read had them: taken under the head lock, or before a
        read that found no new commit) as the files it left."""
        self._files_seen = sample

    def files_touched(self, sample: Optional[tuple] = None) -> Optional[str]:
        """How the database and WAL files changed since this connection's last
        transaction: None (they did not), :data:`FILES_CHECKPOINTED` (only as
        a SQLite checkpoint changes them: the database file while the WAL
        holds frames, or the WAL truncated to nothing) or
        :data:`FILES_CHANGED` (anything else, or no record yet).  Without a
        commit (``data_version`` unchanged), a change is a raw edit behind
        SQLite's back; a checkpoint-like one may be a checkpoint, so it costs
        every warm reader no full verification (docs/format.md §What is
        checked when).  ``sample``: a :meth:`files_now` just taken (else one
        is taken here).  The page cache is then dropped, so a following full
        verification reads the files.  Raises ``storage_unavailable`` when
        the files cannot be examined."""
        try:
            now = self.files_now() if sample is None else sample
        except OSError as exc:
            raise storage_error(exc, "checking the journal's files") from None
        seen = self._files_seen
        if seen is not None and now == seen:
            return None
        # Empty the page cache without closing: a close could checkpoint the WAL
        # into the main file, and a refusal must change no file.
        try:
            self.connection.execute("PRAGMA shrink_memory")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "dropping cached pages") from None
        if seen is None or seen[1] is None or now[1] is None or now[0][:2] != seen[0][:2] \
                or now[1][:2] != seen[1][:2]:
            return FILES_CHANGED  # another file, or no WAL to checkpoint from
        # A checkpoint copies WAL frames into the database file and leaves the
        # WAL as it was, or truncates it (wal_checkpoint(TRUNCATE)).
        if seen[1][2] > WAL_HEADER_BYTES and (now[1] == seen[1] or now[1][2] == 0):
            return FILES_CHECKPOINTED
        return FILES_CHANGED

    def _remember_wal(self, wal: Optional[tuple], shm: Optional[tuple]) -> None:
        """The first look at the WAL and ``-shm`` of a read-write connection."""
        self._wal_identity = None if wal is None else wal[:2]
        self._shm_identity = None if shm is None else shm[:2]

    def check_wal(self, sample: Optional[tuple] = None) -> None:
        """Refuse to write when the file at ``journal.sqlite3-wal`` is not the WAL
        this connection writes to, or the one at ``journal.sqlite3-shm`` not the
        index it uses (``wal_missing``); ``sample``: a :meth:`files_now` just
        taken (else the WAL is looked at here; the ``-shm`` always is).

        SQLite removes or replaces a WAL only when the last connection closes;
        while this one is open that happens only if this process lost its POSIX
        locks (another descriptor of the database was closed, docs/guard.md
        §Child processes and in-process code) or someone deleted the file.
        Commits would then land in a file nobody can read back.  A new ``-shm``
        is a second index of the same WAL: SQLite's WAL locks live in it, so
        connections through the two neither see each other's commits nor
        exclude each other as writers.
        """
        try:
            wal = file_state(self.path + WAL_SUFFIX) if sample is None else sample[1]
            shm = file_state(self.path + SHM_SUFFIX)
        except OSError as exc:
            raise storage_error(exc, "checking the journal's files") from None
        if self._wal_identity is None:
            self._remember_wal(wal, shm)
            return
        if wal is None or wal[:2] != self._wal_identity:
            raise wal_missing_verdict(self.path, f"{DATABASE_NAME}{WAL_SUFFIX} was deleted or "
                                      "replaced while this worker had the journal open")
        if self._shm_identity is None:
            self._shm_identity = None if shm is None else shm[:2]
        elif shm is None or shm[:2] != self._shm_identity:
            raise wal_missing_verdict(self.path, f"{DATABASE_NAME}{SHM_SUFFIX} (the WAL's "
                                      "index) was deleted or replaced while this worker had "
                                      "the journal open", index=True)

    def may_fold(self, healthy: bool) -> bool:
        """Whether closing may let SQLite fold the WAL into the database and
        delete it (docs/format.md §Files); ``healthy``: the journal was last
        seen healthy.  Our WAL deleted or replaced: only when nothing is at
        its name or an empty file (nothing of anyone's is lost when the close
        removes it by name), since this connection holds that WAL whole and
        its index describes it.  Our WAL in place but our ``-shm`` not: never
        (this index is stale against a WAL others may have appended to).
        Else ``healthy``.  Never raises."""
        if self._wal_identity is None:  # no WAL seen by a read-write connection
            return healthy
        try:
            wal = file_state(self.path + WAL_SUFFIX)
            shm = file_state(self.path + SHM_SUFFIX)
        except OSError:
            return False
        if wal is None or wal[:2] != self._wal_identity:
            return wal is None or wal[2] == 0
        if self._shm_identity is not None and (shm is None or shm[:2] != self._shm_identity):
            return False
        return healthy

    def read_failure(self, exc: sqlite3.Error, action: str) -> JournalError:
        """:func:`translate_sqlite_error`, except that a read-only reader that
        fails beside a ``-shm`` whose ``-wal`` is gone (or empty) names the cause: SQLite
        removes both together when the last connection closes, so the WAL was
        deleted under a worker (``wal_missing``, the verdict that worker gives)."""
        if getattr(exc, "sqlite_errorname", "") in ("SQLITE_IOERR_SHMSIZE", "SQLITE_IOERR_SHMMAP"):
            # SQLite could not size its -shm: a full disk, not a lost WAL.
            return JournalUnavailable("storage_unavailable", f"{action}: SQLite could not size "
                                      f"{DATABASE_NAME}{SHM_SUFFIX} ({exc}): is the disk full?")
        if (self.readonly and "i/o" in str(exc).lower()
                and os.path.lexists(self.path + SHM_SUFFIX)
                and file_size(self.path + WAL_SUFFIX) <= 0):  # gone (or re-made empty)
            return wal_missing_verdict(self.path, f"{DATABASE_NAME}{WAL_SUFFIX} is gone while "
                                       f"{DATABASE_NAME}{SHM_SUFFIX} remains: it was deleted "
                                       "while a worker had the journal open")
        return translate_sqlite_error(exc, action)

    def _check_file_identity(self, state: Optional[tuple]) -> None:
        """Detect a database deleted or replaced under a live connection
        (``state``: its :func:`durable.file_state` just taken, else one is)."""
        try:
            found = file_state(self.path) if state is None else state
        except OSError as exc:
            raise storage_error(exc, "checking the journal database") from None
        if found is None:
            raise self.missing_database()
        if found[:2] != self._file_identity:
            # Never folded: this connection's WAL is the old file's, and its
            # close would delete the new file's WAL by name.
            self.close(fold=False)
            raise IntegrityError("database_replaced",
                                 f"{DATABASE_NAME} was replaced by another file while in use")

    # ---------------------------------------------------------- schema --

    def read_genesis(self, connection: sqlite3.Connection,
                     has_checkpoint_or_marker: bool) -> Optional[tuple]:
        """``(journal_id, schema, missing triggers)`` from ``metadata`` and
        ``sqlite_master``; None when the database has no tables (a fresh file).
        Raises :class:`IntegrityError` for foreign state and ``sqlite3.Error``
        (the caller translates)."""
        tables = {row[0] for row in connection.execute(SQL_SELECT_TABLES)}
        if not tables:
            if has_checkpoint_or_marker:
                raise IntegrityError(
                    "missing_database",
                    f"{DATABASE_NAME} is empty while the marker or checkpoint survives; "
                    "it is never re-created over surviving state", survivors=self.survivors())
            return None
        problem = schema_problem(connection)  # a foreign object is named first
        if not {"metadata", "events"} <= tables:
            raise IntegrityError("invalid_metadata",
                                 f"tables {sorted(tables)} lack metadata/events")
        metadata = dict(connection.execute(SQL_SELECT_METADATA).fetchall())
        schema = metadata.get("schema")
        journal_id = metadata.get("journal_id")
        if schema != SCHEMA:
            raise IntegrityError("schema_mismatch",
                                 f"metadata schema is {short(repr(schema))}, expected {SCHEMA}")
        if not is_uuid(journal_id):
            raise IntegrityError("invalid_metadata",
                                 f"metadata journal_id {short(repr(journal_id))} is not a UUID")
        return journal_id, schema, (problem[1] if problem else [])

    def initialize(self, connection: sqlite3.Connection) -> str:
        """Create a fresh journal inside the held writer lock, commit, and take
        the lock again; returns the new journal id.  head.json and the marker
        are written after it."""
        journal_id = str(uuid.uuid4())
        create_schema(connection, journal_id)
        connection.execute("COMMIT")
        reach_boundary("tables_committed", BOUNDARY_KIND_GENESIS)
        connection.execute("BEGIN IMMEDIATE")
        return journal_id


def close_dropped(locks: list, database: Database) -> None:
    """The finalizer of a journal store dropped unclosed, or still open at exit
    (hosts rarely close a guard); ``locks``: its ``[lock, pid]``.  The
    connection is closed, never left to the garbage collector -- unless a
    thread holds the lock (inside a call: it then ends as a kill would leave
    it).  A forked child drops its parent's connection unclosed (forksafe)."""
    lock, pid = locks
    if pid != os.getpid():
        database.close(fold=False)
    elif lock.acquire(blocking=False):
        try:
            database.close(fold=database.may_fold(False))
        finally:
            lock.release()
