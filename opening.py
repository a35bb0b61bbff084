"""Never hand SQLite a database file it would silently rewrite (docs/format.md
§Files, rules a writer keeps).

SQLite trusts the files beside a database: it deletes a ``-wal`` beside an empty
database file, reads a non-SQLite file entirely from the WAL, and shows -- then
checkpoints into the main file -- the pages of a WAL that belongs to another
database.  Each of these would destroy the only copy of committed events, so
:func:`refuse_rewritable_database` runs before a process's first connection to
the journal and refuses them (``stray_wal``, ``missing_database``) without
opening or changing anything.  ``database`` is a :class:`database.Database`
(its ``path``, ``data_dir``, ``busy_timeout`` and ``survivors()``).
"""
from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from typing import Any, Optional

from .durable import file_size, read_regular_file, storage_error
from .errors import IntegrityError, short
from .schema import (SQL_SELECT_HASH_AT, SQL_SELECT_LAST_EVENT,
                     SQL_SELECT_METADATA, SQL_SELECT_PAYLOAD_AT, SQL_SELECT_PREVIOUS_AT)
from .record import (CHECKPOINT_NAME, DATABASE_NAME, KIND_ARCHIVED, MARKER_NAME, WAL_SUFFIX,
                     genesis_hash)

# The first 16 bytes of every SQLite 3 database file.
SQLITE_FILE_HEADER = b"SQLite format 3\x00"


def refuse_rewritable_database(database: Any) -> None:
    """Never hand SQLite a database file it would silently rewrite.

    SQLite deletes a ``-wal`` beside an empty database file (even when
    opened read-only) -- possibly the only copy of the journal -- and reads
    a non-SQLite file entirely from the WAL: both are a stray WAL beside a
    replaced database (``stray_wal``).  An empty file beside the marker or
    checkpoint would get a fresh header (``missing_database``).  Nothing is
    opened or changed in either case.
    """
    try:
        header = read_regular_file(database.path, len(SQLITE_FILE_HEADER))
        header = header[:len(SQLITE_FILE_HEADER)]
    except FileNotFoundError:
        return  # removed meanwhile: SQLite and the identity checks decide
    except OSError as exc:
        raise storage_error(exc, f"reading {DATABASE_NAME}") from None
    if header == SQLITE_FILE_HEADER:
        _check_wal_owner(database)
        return
    if file_size(database.path + WAL_SUFFIX) > 0:
        raise IntegrityError(
            "stray_wal",
            f"{DATABASE_NAME} is {'empty' if not header else 'not an SQLite database'} but a "
            f"non-empty {DATABASE_NAME}{WAL_SUFFIX} lies beside it: the database was replaced "
            "and the WAL belongs to another file; nothing was opened",
            survivors=database.survivors())
    if not header and (os.path.lexists(os.path.join(database.data_dir, MARKER_NAME))
                       or os.path.lexists(os.path.join(database.data_dir, CHECKPOINT_NAME))):
        raise IntegrityError(
            "missing_database",
            f"{DATABASE_NAME} is empty while the marker or checkpoint survives; "
            "it is never re-created over surviving state", survivors=database.survivors())


def _check_wal_owner(database: Any) -> None:
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
    if file_size(database.path + WAL_SUFFIX) <= 0:
        return
    quoted = "file:" + urllib.parse.quote(database.path)
    try:
        main_only = _probe(database, quoted + "?mode=ro&immutable=1", None)
        if main_only is None:
            return
        journal_id, schema, seq, _, _ = main_only
        checkpoint = _checkpoint_named(database)
        with_wal = _probe(database, quoted + "?mode=ro", checkpoint[1] if checkpoint else seq)
    except sqlite3.Error:
        # Deliberately not translated: a main file without tables yet (nothing
        # checkpointed), one being checkpointed right now, or a database the
        # real open reports on is no evidence here.
        return
    if with_wal is None or _successor_in_wal(database, quoted, journal_id):
        return
    genesis = genesis_hash(journal_id, schema)
    first_linked = _first_previous(database, quoted) in (None, genesis)
    if with_wal[0] != journal_id:
        stray = not first_linked
    elif not seq and not first_linked:
        stray = True
    else:
        stray = (checkpoint is not None and checkpoint[0] != journal_id
                 and checkpoint[0] == _marker_names(database)
                 and with_wal[3] == checkpoint[2])
    if stray:
        raise IntegrityError(
            "stray_wal",
            f"{DATABASE_NAME} on its own is journal {short(str(journal_id))} but its "
            f"{WAL_SUFFIX} file holds another journal's events: the database was replaced "
            "beside a stray WAL; nothing was written", survivors=database.survivors())


def _checkpoint_named(database: Any) -> Optional[tuple]:
    """``(journal_id, count, head)`` of head.json, None when unreadable
    (verification reports that)."""
    try:
        checkpoint = json.loads(read_regular_file(os.path.join(database.data_dir,
                                                               CHECKPOINT_NAME)))
        return checkpoint["journal_id"], int(checkpoint["count"]), checkpoint["head"]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _marker_names(database: Any) -> Optional[str]:
    """The journal id the marker names (None when unreadable)."""
    try:
        return json.loads(read_regular_file(os.path.join(database.data_dir,
                                                         MARKER_NAME)))["journal_id"]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _first_previous(database: Any, quoted: str) -> Optional[str]:
    """``previous`` of the first event in the WAL's view (None: no event)."""
    probe = sqlite3.connect(quoted + "?mode=ro", uri=True, isolation_level=None,
                            timeout=database.busy_timeout)
    try:
        row = probe.execute(SQL_SELECT_PREVIOUS_AT, (1,)).fetchone()
        return row[0] if row else None
    finally:
        probe.close()


def _probe(database: Any, uri: str, seq: Optional[int]) -> Optional[tuple]:
    """``(journal_id, schema, seq, hash at seq, None)`` as one read-only view
    shows them (``seq`` None: the last event's, 0 without events; the hash
    None where there is no such event); None without a journal id.
    ``sqlite3.Error`` propagates."""
    probe = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=database.busy_timeout)
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


def _successor_in_wal(database: Any, quoted: str, sealed_journal_id: str) -> bool:
    """After an archive switch the new journal may live only in the WAL until
    the next checkpoint: its first event then anchors the journal the main
    file still names (docs/format.md §Archives).  Not a stray WAL."""
    try:
        probe = sqlite3.connect(quoted + "?mode=ro", uri=True, isolation_level=None,
                                timeout=database.busy_timeout)
        try:
            row = probe.execute(SQL_SELECT_PAYLOAD_AT, (1,)).fetchone()
        finally:
            probe.close()
        first = json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError):
        return False
    return (isinstance(first, dict) and first.get("kind") == KIND_ARCHIVED
            and isinstance(first.get("archive"), dict)
            and first["archive"].get("journal_id") == sealed_journal_id)
