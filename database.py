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
import os
import sqlite3
import threading
import time
import urllib.parse
import uuid
from typing import Optional

from .durable import (file_size, file_state, read_regular_file, reach_boundary, storage_error,
                      BOUNDARY_KIND_GENESIS)
from .errors import IntegrityError, JournalError, JournalUnavailable, short
from .record import (CHECKPOINT_NAME, DATABASE_NAME, MARKER_NAME, SCHEMA, SHM_SUFFIX, WAL_SUFFIX,
                     is_uuid)

# Seconds a writer waits for SQLite's writer lock before the call is refused.
# Admissions hold the lock for milliseconds, so waiting longer only delays a refusal.
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0
# Pause in seconds between attempts to switch a database another process is
# creating right now to WAL (bounded by the busy timeout).
WAL_RETRY_PAUSE_SECONDS = 0.01
# The first 16 bytes of every SQLite 3 database file.
SQLITE_FILE_HEADER = b"SQLite format 3\x00"

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


class Database:
    """One connection to ``journal.sqlite3`` in ``data_dir``.

    ``readonly``: open with a ``mode=ro`` URI (never creates or writes).
    ``create``: a missing database may be created (else ``journal_absent``).
    Not thread-safe by itself: :class:`journal.Journal` serializes every use.
    Methods raise only :class:`JournalError` subclasses.
    """

    def __init__(self, data_dir: str, *, busy_timeout: float, readonly: bool, create: bool):
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, DATABASE_NAME)
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self.create = create
        self.connection: Optional[sqlite3.Connection] = None
        self._file_identity: Optional[tuple] = None
        # (database, WAL) file states after this connection's last transaction;
        # see refresh_if_touched.
        self._files_seen: Optional[tuple] = None

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

    def connect(self) -> sqlite3.Connection:
        """Open (once) the connection; refuse to re-create a lost database."""
        if self.connection is not None:
            self._check_file_identity()
            return self.connection
        if os.path.isfile(self.data_dir) or (os.path.lexists(self.data_dir)
                                             and not os.path.isdir(self.data_dir)):
            raise JournalUnavailable("storage_unavailable",
                                     f"data directory {self.data_dir} is not a directory")
        with _OPEN_DATABASES_LOCK:  # see _OPEN_DATABASES: never drop a sibling's locks
            if not _OPEN_DATABASES.get(self.path):
                self._refuse_rewritable_database()
        if not os.path.exists(self.path):
            # Survivors are checked before the database is looked at again: a
            # concurrent creator makes the database first, then head.json/marker.
            survivors = self.survivors()
            if not os.path.exists(self.path):
                if survivors:
                    raise self.missing_database()
                if not self.create:
                    raise JournalUnavailable("journal_absent", f"no journal in {self.data_dir}")
                try:
                    os.makedirs(self.data_dir, exist_ok=True)
                except OSError as exc:
                    raise storage_error(exc, "creating the data directory") from None
        try:
            if self.readonly:
                uri = "file:" + urllib.parse.quote(self.path) + "?mode=ro"
                connection = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout,
                                             isolation_level=None, check_same_thread=False)
            else:
                connection = sqlite3.connect(self.path, timeout=self.busy_timeout,
                                             isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "opening the journal database") from None
        _remember_database(self.path)  # before any statement takes a lock
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
            identity = os.stat(self.path)
        except sqlite3.Error as exc:
            connection.close()
            _forget_database(self.path)
            raise translate_sqlite_error(exc, "configuring the journal database") from None
        except BaseException:
            connection.close()
            _forget_database(self.path)
            raise
        self.connection = connection
        self._file_identity = (identity.st_dev, identity.st_ino)
        return connection

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._files_seen = None
        if self.connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self.connection.close()
            _forget_database(self.path)
        self.connection = None

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
            header = read_regular_file(self.path, len(SQLITE_FILE_HEADER))
            header = header[:len(SQLITE_FILE_HEADER)]
        except FileNotFoundError:
            return  # removed meanwhile: SQLite and the identity checks decide
        except OSError as exc:
            raise storage_error(exc, f"reading {DATABASE_NAME}") from None
        if header == SQLITE_FILE_HEADER:
            self._check_wal_owner()
            return
        if file_size(self.path + WAL_SUFFIX) > 0:
            raise IntegrityError(
                "stray_wal",
                f"{DATABASE_NAME} is {'empty' if not header else 'not an SQLite database'} but a "
                f"non-empty {DATABASE_NAME}{WAL_SUFFIX} lies beside it: the database was replaced "
                "and the WAL belongs to another file; nothing was opened",
                survivors=self.survivors())
        if not header and (os.path.lexists(os.path.join(self.data_dir, MARKER_NAME))
                           or os.path.lexists(os.path.join(self.data_dir, CHECKPOINT_NAME))):
            raise IntegrityError(
                "missing_database",
                f"{DATABASE_NAME} is empty while the marker or checkpoint survives; "
                "it is never re-created over surviving state", survivors=self.survivors())

    def _check_wal_owner(self) -> None:
        """A WAL is not bound to its database file: beside a database replaced by
        another journal's, SQLite shows the WAL's pages -- and the first writer
        to close would checkpoint them into the replacement.  So before a
        writable connection exists, the main file on its own (``immutable=1``
        ignores the WAL) and the WAL's view (read-only: never checkpoints) must
        name the same journal."""
        if file_size(self.path + WAL_SUFFIX) <= 0:
            return
        quoted = "file:" + urllib.parse.quote(self.path)
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
                f"{DATABASE_NAME} on its own is journal {short(str(found[0]))} but its "
                f"{WAL_SUFFIX} file shows journal {short(str(found[1]))}: the database was "
                "replaced beside a stray WAL; nothing was written", survivors=self.survivors())

    # ---------------------------------------------------- file identity --

    def remember_files(self) -> None:
        """Record the files as this connection's own transaction left them."""
        self._files_seen = (file_state(self.path), file_state(self.path + WAL_SUFFIX))

    def refresh_if_touched(self) -> bool:
        """True when the files changed since this connection's last transaction;
        every cached page is then dropped (the caller drops its verified chain).

        ``PRAGMA data_version`` only sees commits made through SQLite; a raw edit
        of the file, or an older copy restored in place, hides behind cached
        pages -- and a later commit would write them back.  Another worker's
        commit or checkpoint also lands here (a legitimate change, verified
        again).  A WAL that vanished or was swapped while this connection is
        open is refused (``wal_missing``): SQLite deletes it only when the last
        connection closes, so someone removed it, and new commits would go to a
        file nobody can read back.
        """
        if self._files_seen is None:
            return False
        database_state, wal_state = self._files_seen
        wal_now = file_state(self.path + WAL_SUFFIX)
        if wal_state is not None and (wal_now is None or wal_now[:2] != wal_state[:2]):
            raise IntegrityError(
                "wal_missing",
                f"{DATABASE_NAME}{WAL_SUFFIX} was deleted or replaced while this worker had the "
                "journal open; events it committed may exist only in the lost file")
        if (file_state(self.path), wal_now) == self._files_seen:
            return False
        # Empty the page cache without closing: a close could checkpoint the WAL
        # into the main file, and a refusal must change no file.
        try:
            self.connection.execute("PRAGMA shrink_memory")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "dropping cached pages") from None
        return True

    def _check_file_identity(self) -> None:
        """Detect a database deleted or replaced under a live connection."""
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            raise self.missing_database() from None
        except OSError as exc:
            raise storage_error(exc, "checking the journal database") from None
        if (found.st_dev, found.st_ino) != self._file_identity:
            self.close()
            raise IntegrityError("database_replaced",
                                 f"{DATABASE_NAME} was replaced by another file while in use")

    # ---------------------------------------------------------- schema --

    def read_genesis(self, connection: sqlite3.Connection,
                     has_checkpoint_or_marker: bool) -> Optional[tuple]:
        """``(journal_id, schema)`` from ``metadata``; None when the database has
        no tables (a fresh file).  Raises :class:`IntegrityError` for foreign
        state and ``sqlite3.Error`` (the caller translates)."""
        tables = {row[0] for row in connection.execute(SQL_SELECT_TABLES)}
        if not tables:
            if has_checkpoint_or_marker:
                raise IntegrityError(
                    "missing_database",
                    f"{DATABASE_NAME} is empty while the marker or checkpoint survives; "
                    "it is never re-created over surviving state", survivors=self.survivors())
            return None
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
        return journal_id, schema

    @staticmethod
    def initialize(connection: sqlite3.Connection) -> str:
        """Create tables and metadata inside the held writer lock, commit, and
        take the lock again; returns the new journal id.  head.json and the
        marker are written after it."""
        journal_id = str(uuid.uuid4())
        connection.execute(SQL_CREATE_METADATA)
        connection.execute(SQL_CREATE_EVENTS)
        connection.execute(SQL_INSERT_METADATA, ("journal_id", journal_id))
        connection.execute(SQL_INSERT_METADATA, ("schema", SCHEMA))
        connection.execute("COMMIT")
        reach_boundary("tables_committed", BOUNDARY_KIND_GENESIS)
        connection.execute("BEGIN IMMEDIATE")
        return journal_id
