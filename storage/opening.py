"""Never hand SQLite a database file it would silently rewrite (docs/format.md
§Files, rules a writer keeps).

SQLite deletes a ``-wal`` beside an empty database, reads a non-SQLite file
entirely from the WAL, and checkpoints another database's WAL into the main
file: each would destroy committed events.  ``database`` is a
:class:`database.Database` (``path``, ``data_dir``, ``busy_timeout``, ``survivors()``).
"""
from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from typing import Any, Optional

from . import archive
from .durable import file_size, foreign_file, foreign_file_type, read_regular_file, storage_error
from .errors import IntegrityError, JournalError, short
from .record import (CHECKPOINT_NAME, DATABASE_NAME, KIND_ARCHIVED, MARKER_NAME, SHM_SUFFIX,
                     WAL_SUFFIX, genesis_hash)
from .schema import SQL_SELECT_HASH_AT, SQL_SELECT_LAST_EVENT, SQL_SELECT_METADATA, SQL_SELECT_ROW

# The first 16 bytes of every SQLite 3 database file.
SQLITE_FILE_HEADER = b"SQLite format 3\x00"


def refuse_rewritable_database(database: Any) -> None:
    """Before a process's first connection: raise :class:`IntegrityError`
    ``foreign_file`` (a journal file's name holds a link, directory, FIFO,
    device), ``stray_wal`` (a non-empty WAL beside an empty, non-SQLite or
    other journal's database) or ``missing_database`` (an empty database
    beside the marker or checkpoint).  Opens and changes nothing."""
    for name in (DATABASE_NAME, DATABASE_NAME + WAL_SUFFIX, DATABASE_NAME + SHM_SUFFIX,
                 CHECKPOINT_NAME, MARKER_NAME):
        path = os.path.join(database.data_dir, name)
        kind = foreign_file_type(path)
        if kind is not None:
            raise foreign_file(path, kind)
    try:
        header = read_regular_file(database.path, len(SQLITE_FILE_HEADER))[:len(SQLITE_FILE_HEADER)]
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
    """``stray_wal`` when the WAL belongs to another database (a writer would
    checkpoint it into this one): the main file alone (``immutable=1``; only
    its metadata trusted) against the WAL's view and head.json.  Stray:
    another journal in the WAL whose event 1 neither links to the main
    genesis nor anchors it; event 1 unlinked to an eventless main genesis; or
    the WAL holding head.json's head while head.json and marker name another."""
    if file_size(database.path + WAL_SUFFIX) <= 0:
        return
    quoted = "file:" + urllib.parse.quote(database.path)
    checkpoint = _checkpoint_named(database)
    try:
        main_only = _view(database, quoted + "?mode=ro&immutable=1", None)
        if main_only is None:
            return
        with_wal = _view(database, quoted + "?mode=ro", checkpoint[1] if checkpoint else None)
    except sqlite3.Error:
        # No evidence (no tables yet, a checkpoint running): the real open decides.
        return
    journal_id = main_only["journal_id"]
    if with_wal is None or (with_wal["journal_id"] != journal_id and _anchors(
            database.data_dir, with_wal["first_payload"], journal_id)):
        return  # e.g. an archive switch's new journal, still only in the WAL
    first_linked = with_wal["first_previous"] in (None, genesis_hash(journal_id,
                                                                     main_only["schema"]))
    if with_wal["journal_id"] != journal_id:
        stray = not first_linked
    elif not main_only["last_seq"] and not first_linked:
        stray = True
    else:
        stray = (checkpoint is not None and checkpoint[0] != journal_id
                 and checkpoint[0] == _marker_names(database)
                 and with_wal["hash_at"] == checkpoint[2])
    if stray:
        raise IntegrityError(
            "stray_wal",
            f"{DATABASE_NAME} on its own is journal {short(str(journal_id))} but its "
            f"{WAL_SUFFIX} file holds another journal's events: the database was replaced "
            "beside a stray WAL; nothing was written", survivors=database.survivors())


def _checkpoint_named(database: Any) -> Optional[tuple]:
    """``(journal_id, count, head)`` of head.json, or None when unreadable."""
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


def _view(database: Any, uri: str, seq: Optional[int]) -> Optional[dict]:
    """One snapshot's ``journal_id``, ``schema``, ``last_seq`` (0: none),
    ``hash_at`` (at ``seq``), ``first_previous``, ``first_payload`` (None
    where absent); None without a journal id.  ``sqlite3.Error`` propagates."""
    probe = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=database.busy_timeout)
    try:
        probe.execute("BEGIN")
        metadata = dict(probe.execute(SQL_SELECT_METADATA).fetchall())
        if "journal_id" not in metadata:
            return None
        last = probe.execute(SQL_SELECT_LAST_EVENT).fetchone()
        at = probe.execute(SQL_SELECT_HASH_AT, (seq,)).fetchone() if seq else None
        first = probe.execute(SQL_SELECT_ROW, (1,)).fetchone()
        return {"journal_id": metadata["journal_id"], "schema": metadata.get("schema"),
                "last_seq": last[0] if last else 0, "hash_at": at[0] if at else None,
                "first_payload": first[0] if first else None,
                "first_previous": first[1] if first else None}
    finally:
        probe.close()


def _anchors(data_dir: str, payload: Any, sealed_journal_id: str) -> bool:
    """Whether event 1's ``payload`` is an anchor whose chain reaches journal
    ``sealed_journal_id`` (a switch's successor may live only in the WAL); a
    broken chain does not count."""
    try:
        first = json.loads(payload) if isinstance(payload, str) else None
    except (ValueError, RecursionError):
        return False
    if not (isinstance(first, dict) and first.get("kind") == KIND_ARCHIVED
            and isinstance(first.get("archive"), dict)):
        return False
    try:
        return archive.anchor_of(data_dir, first["archive"], sealed_journal_id) is not None
    except JournalError:
        return False
