"""The journal's SQL: its tables and append-only triggers, every statement the
plugin runs as a named constant, and the check that a database holds nothing
else (docs/format.md §Tables).  No connection handling here (database.py)."""
from __future__ import annotations

import sqlite3
import time
from typing import Optional

from .errors import IntegrityError, short
from .record import CREATED_KEY, DATABASE_NAME, SCHEMA

SQL_CREATE_METADATA = "CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
SQL_CREATE_EVENTS = ("CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
                     "previous TEXT NOT NULL, hash TEXT NOT NULL)")
_APPEND_ONLY = "SELECT RAISE(ABORT, 'crash-recovery: the journal is append-only'); END"
# Append-only (docs/format.md §Tables): events only added at the end, no row changed
# or removed.  Dropping a trigger changes the schema cookie, which every process notices.
TRIGGERS = {
    "events_append_only": ("CREATE TRIGGER events_append_only BEFORE INSERT ON events WHEN "
                           "NEW.seq IS NOT (SELECT coalesce(max(seq), 0) + 1 FROM events) BEGIN "
                           + _APPEND_ONLY),
    **{f"{table}_no_{change}": f"CREATE TRIGGER {table}_no_{change} BEFORE {change.upper()} ON "
       f"{table} BEGIN " + _APPEND_ONLY
       for table, change in (("events", "update"), ("events", "delete"), ("metadata", "insert"),
                             ("metadata", "update"), ("metadata", "delete"))},
}
# The schema objects a journal consists of: (type, name) -> SQL (None: SQLite's own index).
SCHEMA_OBJECTS = {("table", "metadata"): SQL_CREATE_METADATA,
                  ("table", "events"): SQL_CREATE_EVENTS,
                  ("index", "sqlite_autoindex_metadata_1"): None,
                  **{("trigger", name): sql for name, sql in TRIGGERS.items()}}
SQL_INSERT_METADATA = "INSERT INTO metadata(key, value) VALUES (?, ?)"
SQL_SELECT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
SQL_SELECT_SCHEMA = "SELECT type, name, sql FROM sqlite_master"
# Each text column's stored UTF-8 bytes, NULL where not text (extend_chain compares bytes).
SQL_SELECT_ROWS_AFTER = (
    "SELECT seq, CASE WHEN typeof(payload) = 'text' THEN CAST(payload AS BLOB) END, "
    "CASE WHEN typeof(previous) = 'text' THEN CAST(previous AS BLOB) END, "
    "CASE WHEN typeof(hash) = 'text' THEN CAST(hash AS BLOB) END "
    "FROM events WHERE seq > ? ORDER BY seq")
SQL_SELECT_ROW = "SELECT payload, previous, hash FROM events WHERE seq = ?"
SQL_SELECT_RAW_ROWS_BETWEEN = ("SELECT seq, payload, previous, hash FROM events WHERE seq > ? "
                               "AND seq <= ? ORDER BY seq")
SQL_SELECT_PAYLOAD_AT = "SELECT payload FROM events WHERE seq = ?"
SQL_SELECT_EVENTS_BETWEEN = "SELECT seq, payload FROM events WHERE seq > ? AND seq <= ? ORDER BY seq"
SQL_SELECT_OPERATION_EVENTS = ("SELECT seq, payload FROM events WHERE seq > ? AND seq <= ? "
                               "AND instr(payload, ?) > 0 ORDER BY seq")
SQL_INSERT_EVENT = "INSERT INTO events(seq, payload, previous, hash) VALUES (?, ?, ?, ?)"
SQL_SELECT_JOURNAL_ID = "SELECT value FROM metadata WHERE key = 'journal_id'"
SQL_SELECT_METADATA = "SELECT key, value FROM metadata"
# The rows from seq ? on (the last verified one first), as SQL_SELECT_ROWS_AFTER reads them.
SQL_SELECT_ROWS_FROM = SQL_SELECT_ROWS_AFTER.replace("seq > ?", "seq >= ?")
# The schema cookie and data_version in one statement (it starts a read transaction).
SQL_VERSIONS = ("SELECT schema_version, data_version FROM pragma_schema_version, "
                "pragma_data_version")
SQL_SELECT_METADATA_VALUE = "SELECT value FROM metadata WHERE key = ?"
SQL_SELECT_HASH_AT = "SELECT hash FROM events WHERE seq = ?"
SQL_SELECT_LAST_EVENT = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
SQL_COUNT_EVENTS = "SELECT count(*) FROM events"
# An archive switch empties the tables in its transaction (triggers dropped, re-made).
SQL_DROP_TRIGGER = 'DROP TRIGGER IF EXISTS "{name}"'
SQL_EMPTY_EVENTS = "DELETE FROM events"
SQL_EMPTY_METADATA = "DELETE FROM metadata"
SQL_VACUUM = "VACUUM"
SQL_CHECKPOINT_PASSIVE = "PRAGMA wal_checkpoint(PASSIVE)"


def _normalized(sql: Optional[str]) -> Optional[str]:
    return None if sql is None else " ".join(sql.split()).lower()


def schema_problem(connection: sqlite3.Connection) -> Optional[tuple]:
    """Check ``sqlite_master`` against :data:`SCHEMA_OBJECTS`: None when all
    is ours and present, ``("missing", names)`` when only triggers are
    missing.  Raises :class:`IntegrityError` ``foreign_schema_object`` for an
    object not ours or altered; ``sqlite3.Error`` propagates."""
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


def create_schema(connection: sqlite3.Connection, journal_id: str) -> None:
    """Tables, metadata and triggers of a new journal, inside the caller's
    write transaction (docs/format.md §Tables, §Creation)."""
    connection.execute(SQL_CREATE_METADATA)
    connection.execute(SQL_CREATE_EVENTS)
    create_schema_rows(connection, journal_id)


def create_schema_rows(connection: sqlite3.Connection, journal_id: str) -> None:
    """Metadata rows and triggers into empty, trigger-less tables, inside the
    caller's write transaction; ``created_ns``: when the journal or segment
    began, before any of its calls (docs/format.md §Tables)."""
    connection.execute(SQL_INSERT_METADATA, ("journal_id", journal_id))
    connection.execute(SQL_INSERT_METADATA, ("schema", SCHEMA))
    connection.execute(SQL_INSERT_METADATA, (CREATED_KEY, str(time.time_ns())))
    for sql in TRIGGERS.values():
        connection.execute(sql)


def create_triggers(connection: sqlite3.Connection, names: list) -> None:
    """(Re-)create the named triggers inside the caller's write transaction."""
    for name in names:
        connection.execute(TRIGGERS[name])
