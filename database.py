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
import json
import os
import sqlite3
import threading
import time
import urllib.parse
import uuid
from typing import Optional

from .durable import (TEMP_SUFFIX, file_size, file_state, fsync_directory,
                      make_durable_directories, process_alive, read_regular_file, reach_boundary,
                      storage_error, temp_path_for, BOUNDARY_KIND_GENESIS)
from . import forksafe
from .errors import IntegrityError, JournalError, JournalUnavailable, short
from .record import (CHECKPOINT_NAME, DATABASE_NAME, KIND_ARCHIVED, MARKER_NAME, SCHEMA,
                     SHM_SUFFIX, WAL_SUFFIX, genesis_hash, is_uuid)

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
# The first 16 bytes of every SQLite 3 database file.
SQLITE_FILE_HEADER = b"SQLite format 3\x00"

SQL_CREATE_METADATA = "CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
SQL_CREATE_EVENTS = ("CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
                     "previous TEXT NOT NULL, hash TEXT NOT NULL)")
_APPEND_ONLY = "SELECT RAISE(ABORT, 'crash-recovery: the journal is append-only'); END"
# Append-only enforcement (docs/format.md §Tables): no row of either table can be
# changed or removed through SQLite, and events can only be added at the end.
# Removing a trigger changes the schema cookie, which every process notices.
TRIGGERS = {
    "events_append_only": ("CREATE TRIGGER events_append_only BEFORE INSERT ON events WHEN "
                           "NEW.seq IS NOT (SELECT coalesce(max(seq), 0) + 1 FROM events) BEGIN "
                           + _APPEND_ONLY),
    "events_no_update": "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN " + _APPEND_ONLY,
    "events_no_delete": "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN " + _APPEND_ONLY,
    "metadata_no_insert": ("CREATE TRIGGER metadata_no_insert BEFORE INSERT ON metadata BEGIN "
                           + _APPEND_ONLY),
    "metadata_no_update": ("CREATE TRIGGER metadata_no_update BEFORE UPDATE ON metadata BEGIN "
                           + _APPEND_ONLY),
    "metadata_no_delete": ("CREATE TRIGGER metadata_no_delete BEFORE DELETE ON metadata BEGIN "
                           + _APPEND_ONLY),
}
# The schema objects a journal consists of: (type, name) -> SQL (None: SQLite's own index).
SCHEMA_OBJECTS = {("table", "metadata"): SQL_CREATE_METADATA,
                  ("table", "events"): SQL_CREATE_EVENTS,
                  ("index", "sqlite_autoindex_metadata_1"): None,
                  **{("trigger", name): sql for name, sql in TRIGGERS.items()}}
SQL_INSERT_METADATA = "INSERT INTO metadata(key, value) VALUES (?, ?)"
SQL_SELECT_METADATA = "SELECT key, value FROM metadata"
SQL_SELECT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
SQL_SELECT_SCHEMA = "SELECT type, name, sql FROM sqlite_master"
# Rows for verification: the stored UTF-8 bytes of each text column, or NULL where
# the stored value is not text (chain.extend_chain compares bytes: no decoding).
SQL_SELECT_ROWS_AFTER = (
    "SELECT seq, CASE WHEN typeof(payload) = 'text' THEN CAST(payload AS BLOB) END, "
    "CASE WHEN typeof(previous) = 'text' THEN CAST(previous AS BLOB) END, "
    "CASE WHEN typeof(hash) = 'text' THEN CAST(hash AS BLOB) END "
    "FROM events WHERE seq > ? ORDER BY seq")
SQL_SELECT_ROW = "SELECT payload, previous, hash FROM events WHERE seq = ?"
SQL_SELECT_HASH_AT = "SELECT hash FROM events WHERE seq = ?"
SQL_SELECT_LAST_EVENT = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
SQL_SELECT_PREVIOUS_AT = "SELECT previous FROM events WHERE seq = ?"
SQL_SELECT_PAYLOAD_AT = "SELECT payload FROM events WHERE seq = ?"
SQL_SELECT_JOURNAL_ID = "SELECT value FROM metadata WHERE key = 'journal_id'"
SQL_SELECT_EVENTS_BETWEEN = "SELECT seq, payload FROM events WHERE seq > ? AND seq <= ? ORDER BY seq"
SQL_SELECT_OPERATION_EVENTS = ("SELECT seq, payload FROM events WHERE seq > ? AND seq <= ? "
                               "AND instr(payload, ?) > 0 ORDER BY seq")
SQL_INSERT_EVENT = "INSERT INTO events(seq, payload, previous, hash) VALUES (?, ?, ?, ?)"


def _normalized(sql: Optional[str]) -> Optional[str]:
    return None if sql is None else " ".join(sql.split()).lower()


def schema_problem(connection: sqlite3.Connection) -> Optional[tuple]:
    """Check ``sqlite_master`` against :data:`SCHEMA_OBJECTS`.

    Returns None when every object is ours and every trigger is present, or
    ``("missing", names)`` when only append-only triggers are missing (a
    journal from before they existed, or one whose triggers someone dropped).
    Raises :class:`IntegrityError` ``foreign_schema_object`` for anything
    else: a table, index, view or trigger the plugin did not create, or one of
    its own objects altered.  ``sqlite3.Error`` propagates.
    """
    expected = {key: _normalized(sql) for key, sql in SCHEMA_OBJECTS.items()}
    missing = set(expected)
    for kind, name, sql in connection.execute(SQL_SELECT_SCHEMA):
        key = (kind, name)
        if key not in expected or expected[key] != _normalized(sql):
            what = "altered" if key in expected else "not created by crash-recovery"
            raise IntegrityError("foreign_schema_object",
                                 f"{DATABASE_NAME} holds {kind} {short(repr(name))}, {what}; "
                                 "every append could be silently changed by it",
                                 object_type=kind, object_name=short(str(name)))
        missing.discard(key)
    if {key for key in missing if key[0] != "trigger"}:
        return None  # a table is missing: read_genesis names it
    return ("missing", sorted(name for _, name in missing)) if missing else None


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

    ``readonly``: open with a ``mode=ro`` URI (never creates or writes); when
    the directory is not writable and no worker has the journal open (no
    ``-wal``/``-shm``), with ``immutable=1`` instead, since SQLite could not
    create the ``-shm`` it needs (:attr:`immutable`).
    ``create``: a missing database may be created (else ``journal_absent``).
    Not thread-safe by itself: :class:`journal.Journal` serializes every use.
    Methods raise only :class:`JournalError` subclasses unless they say otherwise.
    """

    def __init__(self, data_dir: str, *, busy_timeout: float, readonly: bool, create: bool):
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, DATABASE_NAME)
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self.create = create
        self.immutable = False
        self.connection: Optional[sqlite3.Connection] = None
        self._file_identity: Optional[tuple] = None
        # (device, inode) of the WAL this connection writes to; see check_wal.
        self._wal_identity: Optional[tuple] = None
        # (database, WAL) file states after this connection's last transaction.
        self._files_seen: Optional[tuple] = None
        forksafe.register(self)

    def _after_fork_in_child(self) -> None:
        """A forked child never uses, closes or finalizes the parent's connection."""
        if self.connection is not None:
            forksafe.abandon(self.connection)
        self.connection = None
        self._files_seen = None
        self._wal_identity = None
        _OPEN_DATABASES.clear()  # the child holds no POSIX locks of its own

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
        try:
            if self.readonly:
                self.immutable = self._quiescent_and_unwritable()
                uri = "file:" + urllib.parse.quote(self.path) + (
                    "?mode=ro&immutable=1" if self.immutable else "?mode=ro")
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
                wal = file_state(self.path + WAL_SUFFIX)
                self._wal_identity = None if wal is None else wal[:2]
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
            descriptor = os.open(temp_path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
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
            self.create_schema(build, str(uuid.uuid4()))
            build.execute("COMMIT")
        finally:
            build.close()

    def remove_stale_build_files(self) -> list:
        """Remove databases a dead creator left half-built (names of
        :meth:`_create_database_file`'s temporary files whose process is gone);
        returns the names removed.  Never raises."""
        removed = []
        try:
            names = os.listdir(self.data_dir)
        except OSError:
            return removed
        prefix = DATABASE_NAME + "."
        for name in names:
            if not name.startswith(prefix) or not any(name.endswith(TEMP_SUFFIX + suffix)
                                                      for suffix in _BUILD_SUFFIXES):
                continue
            pid = name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and not process_alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.data_dir, name))
                    removed.append(name)
        return removed

    def _quiescent_and_unwritable(self) -> bool:
        """No connection anywhere has the journal open (SQLite keeps ``-wal`` and
        ``-shm`` while one does), and this process may not create files here."""
        return (not os.access(self.data_dir, os.W_OK)
                and not os.path.lexists(self.path + WAL_SUFFIX)
                and not os.path.lexists(self.path + SHM_SUFFIX))

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._files_seen = None
        self._wal_identity = None
        if self.connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self.connection.close()
            _forget_database(self.path)
        self.connection = None

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
        to close would checkpoint them into the replacement, deleting the only
        copy of the events in the WAL.  So before a writable connection exists,
        the main file on its own (``immutable=1`` ignores the WAL) is compared
        with the WAL's view (read-only: never checkpoints) and with head.json.

        Only the main file's *metadata* is trusted: a crash during a checkpoint
        can leave torn event pages there (the WAL still holds them whole);
        metadata is rewritten by a checkpoint only after an archive switch,
        whose successor journal is recognised.  A stray WAL shows as: another
        journal in the WAL's view (unless its first event links to the main
        file's genesis: metadata edited through SQLite, which verification
        names); a first event not linked to the genesis of a main file without
        events; or the WAL's view holding head.json's head while head.json
        and the marker name another journal than the main file."""
        if file_size(self.path + WAL_SUFFIX) <= 0:
            return
        quoted = "file:" + urllib.parse.quote(self.path)
        try:
            main_only = self._probe(quoted + "?mode=ro&immutable=1", None)
            if main_only is None:
                return
            journal_id, schema, seq, _, _ = main_only
            checkpoint = self._checkpoint_named()
            with_wal = self._probe(quoted + "?mode=ro", checkpoint[1] if checkpoint else seq)
        except sqlite3.Error:
            # Deliberately not translated: a main file without tables yet (nothing
            # checkpointed), one being checkpointed right now, or a database the
            # real open reports on is no evidence here.
            return
        if with_wal is None or self._successor_in_wal(quoted, journal_id):
            return
        genesis = genesis_hash(journal_id, schema)
        first_linked = self._first_previous(quoted) in (None, genesis)
        if with_wal[0] != journal_id:
            stray = not first_linked
        elif not seq and not first_linked:
            stray = True
        else:
            stray = (checkpoint is not None and checkpoint[0] != journal_id
                     and checkpoint[0] == self._marker_names()
                     and with_wal[3] == checkpoint[2])
        if stray:
            raise IntegrityError(
                "stray_wal",
                f"{DATABASE_NAME} on its own is journal {short(str(journal_id))} but its "
                f"{WAL_SUFFIX} file holds another journal's events: the database was replaced "
                "beside a stray WAL; nothing was written", survivors=self.survivors())

    def _checkpoint_named(self) -> Optional[tuple]:
        """``(journal_id, count, head)`` of head.json, None when unreadable
        (verification reports that)."""
        try:
            checkpoint = json.loads(read_regular_file(os.path.join(self.data_dir,
                                                                   CHECKPOINT_NAME)))
            return checkpoint["journal_id"], int(checkpoint["count"]), checkpoint["head"]
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _marker_names(self) -> Optional[str]:
        """The journal id the marker names (None when unreadable)."""
        try:
            return json.loads(read_regular_file(os.path.join(self.data_dir,
                                                             MARKER_NAME)))["journal_id"]
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _first_previous(self, quoted: str) -> Optional[str]:
        """``previous`` of the first event in the WAL's view (None: no event)."""
        probe = sqlite3.connect(quoted + "?mode=ro", uri=True, isolation_level=None,
                                timeout=self.busy_timeout)
        try:
            row = probe.execute(SQL_SELECT_PREVIOUS_AT, (1,)).fetchone()
            return row[0] if row else None
        finally:
            probe.close()

    def _probe(self, uri: str, seq: Optional[int]) -> Optional[tuple]:
        """``(journal_id, schema, seq, hash at seq, None)`` as one read-only view
        shows them (``seq`` None: the last event's, 0 without events; the hash
        None where there is no such event); None without a journal id.
        ``sqlite3.Error`` propagates."""
        probe = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self.busy_timeout)
        try:
            probe.execute("BEGIN")  # every read from one snapshot
            metadata = dict(probe.execute(SQL_SELECT_METADATA).fetchall())
            if "journal_id" not in metadata:
                return None
            if seq is None:
                seq, head = probe.execute(SQL_SELECT_LAST_EVENT).fetchone() or (0, None)
            else:
                row = probe.execute(SQL_SELECT_HASH_AT, (seq,)).fetchone()
                head = row[0] if row else None
            return metadata["journal_id"], metadata.get("schema"), seq, head, None
        finally:
            probe.close()

    def _successor_in_wal(self, quoted: str, sealed_journal_id: str) -> bool:
        """After an archive switch the new journal may live only in the WAL until
        the next checkpoint: its first event then anchors the journal the main
        file still names (docs/format.md §Archives).  Not a stray WAL."""
        try:
            probe = sqlite3.connect(quoted + "?mode=ro", uri=True, isolation_level=None,
                                    timeout=self.busy_timeout)
            try:
                row = probe.execute("SELECT payload FROM events WHERE seq = 1").fetchone()
            finally:
                probe.close()
            first = json.loads(row[0]) if row else None
        except (sqlite3.Error, ValueError):
            return False
        return (isinstance(first, dict) and first.get("kind") == KIND_ARCHIVED
                and isinstance(first.get("archive"), dict)
                and first["archive"].get("journal_id") == sealed_journal_id)

    # ---------------------------------------------------- file identity --

    def files_now(self) -> tuple:
        """``(database state, WAL state)`` (see :func:`durable.file_state`)."""
        return file_state(self.path), file_state(self.path + WAL_SUFFIX)

    def remember_files(self) -> None:
        """Record the files as this connection's own transaction left them.
        Never raises: when the files cannot be read, the next use verifies all."""
        try:
            self._files_seen = self.files_now()
        except OSError:
            self._files_seen = None

    def files_touched(self) -> bool:
        """True when the database or WAL file changed since this connection's
        last transaction (a commit of another connection, a checkpoint, or a
        raw edit SQLite cannot see), or when this connection has no record yet.
        The page cache is then dropped, so a following full verification reads
        the files.  Raises ``storage_unavailable`` when the files cannot be
        examined."""
        try:
            unchanged = self._files_seen is not None and self.files_now() == self._files_seen
        except OSError as exc:
            raise storage_error(exc, "checking the journal's files") from None
        if unchanged:
            return False
        # Empty the page cache without closing: a close could checkpoint the WAL
        # into the main file, and a refusal must change no file.
        try:
            self.connection.execute("PRAGMA shrink_memory")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, "dropping cached pages") from None
        return True

    def check_wal(self) -> None:
        """Refuse to write when the file at ``journal.sqlite3-wal`` is not the WAL
        this connection writes to (``wal_missing``).

        SQLite removes or replaces a WAL only when the last connection closes;
        while this one is open that happens only if this process lost its POSIX
        locks (another descriptor of the database was closed, docs/guard.md
        §Child processes and in-process code) or someone deleted the file.
        Commits would then land in a file nobody can read back.
        """
        if self._wal_identity is None:
            wal = file_state(self.path + WAL_SUFFIX)
            self._wal_identity = None if wal is None else wal[:2]
            return
        wal = file_state(self.path + WAL_SUFFIX)
        if wal is None or wal[:2] != self._wal_identity:
            raise IntegrityError(
                "wal_missing",
                f"{DATABASE_NAME}{WAL_SUFFIX} was deleted or replaced while this worker had the "
                "journal open; events it committed may exist only in the lost file")

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

    @classmethod
    def create_schema(cls, connection: sqlite3.Connection, journal_id: str) -> None:
        """Tables, metadata and triggers of a new journal, inside the caller's
        write transaction (docs/format.md §Tables, §Creation)."""
        connection.execute(SQL_CREATE_METADATA)
        connection.execute(SQL_CREATE_EVENTS)
        cls.create_schema_rows(connection, journal_id)

    @staticmethod
    def create_schema_rows(connection: sqlite3.Connection, journal_id: str) -> None:
        """The metadata rows and the triggers, into existing (empty, trigger-less)
        tables, inside the caller's write transaction."""
        connection.execute(SQL_INSERT_METADATA, ("journal_id", journal_id))
        connection.execute(SQL_INSERT_METADATA, ("schema", SCHEMA))
        for sql in TRIGGERS.values():
            connection.execute(sql)

    @staticmethod
    def create_triggers(connection: sqlite3.Connection, names: list) -> None:
        """(Re-)create the named append-only triggers inside the caller's write
        transaction."""
        for name in names:
            connection.execute(TRIGGERS[name])

    def initialize(self, connection: sqlite3.Connection) -> str:
        """Create a fresh journal inside the held writer lock, commit, and take
        the lock again; returns the new journal id.  head.json and the marker
        are written after it."""
        journal_id = str(uuid.uuid4())
        self.create_schema(connection, journal_id)
        connection.execute("COMMIT")
        reach_boundary("tables_committed", BOUNDARY_KIND_GENESIS)
        connection.execute("BEGIN IMMEDIATE")
        return journal_id
