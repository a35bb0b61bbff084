"""Archives: sealed segments of history (docs/format.md §Archives).

An operator's ``archive`` seals the live history (journal ``J``, events 1..N)
into ``archive/J.sqlite3`` in the data directory -- a read-only SQLite file,
never deleted or pruned by the plugin -- and starts a new journal ``J'`` whose
first event, ``archived``, anchors it: ``{"journal_id": J, "count": N, "head":
H_N, "file": "archive/J.sqlite3"}``.  The live segment stays short, so the
first call of a process verifies little; each archive's anchor is checked on
every full verification, and ``verify --all`` re-verifies archives end to end.

This module owns the archive files: naming, building the sealed copy, the
switch intent, and checking and reading archives.  The switch itself (under
the writer lock) is :meth:`journal.Journal.archive`.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import sqlite3
import urllib.parse
from typing import Any, Iterator, Optional

from .chain import Chain, PossibleReuse, extend_chain
from .durable import (fsync_directory, fsync_file, make_durable_directories, read_regular_file,
                      remove_files_of_dead_processes, storage_error, write_atomically)
from .errors import IntegrityError, JournalError
from .record import (INTENT_NAME, SCHEMA, canonical_text, checkpoint_shape_problem, decode_payload,
                     genesis_hash, is_uuid)
from .schema import (SQL_COUNT_EVENTS, SQL_INSERT_EVENT, SQL_SELECT_ALL_EVENTS, SQL_SELECT_HASH_AT,
                     SQL_SELECT_LAST_EVENT, SQL_SELECT_METADATA, SQL_SELECT_OPERATION_EVENTS,
                     SQL_SELECT_PAYLOAD_AT, SQL_SELECT_ROWS_AFTER, schema_problem)

ARCHIVE_DIRECTORY = "archive"
ARCHIVE_SUFFIX = ".sqlite3"
# INTENT_NAME (record.py) holds the switch in progress: {"from": checkpoint of the
# sealed journal, "to": the new journal id, "file": the archive, "temp": the copy}.
# While it exists, the next writer finishes or undoes the switch.
# An anchor chain longer than this is refused as a loop.
MAX_ARCHIVES = 100000
# An unfinished copy: archive/copy.<pid>-<8 hex>.tmp (and SQLite's -journal beside it).
_COPY_NAME = re.compile(r"copy\.(\d+)-[0-9a-f]{8}\.tmp")
_COPY_SUFFIXES = ("", "-journal")
_COPY_FILE = re.compile(_COPY_NAME.pattern + "(?:-journal)?")


def new_copy_path(data_dir: str) -> str:
    """A fresh path for this process's unfinished copy."""
    return os.path.join(data_dir, ARCHIVE_DIRECTORY,
                        f"copy.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def copy_path(data_dir: str, relative: Any) -> Optional[str]:
    """The unfinished copy an intent names, if ``relative`` has exactly the
    form :func:`new_copy_path` gives (anything else is never touched)."""
    if not isinstance(relative, str):
        return None
    directory, name = os.path.split(relative)
    if directory != ARCHIVE_DIRECTORY or not _COPY_NAME.fullmatch(name):
        return None
    return os.path.join(data_dir, ARCHIVE_DIRECTORY, name)


def remove_stale_copies(data_dir: str) -> list:
    """Remove unfinished copies whose process is gone (a copy runs without the
    writer lock, so a live one is left alone); returns the names removed."""
    return remove_files_of_dead_processes(os.path.join(data_dir, ARCHIVE_DIRECTORY),
                                          _COPY_FILE)


def relative_name(journal_id: str) -> str:
    """``archive/<journal_id>.sqlite3``: the anchor's ``file`` field."""
    return f"{ARCHIVE_DIRECTORY}/{journal_id}{ARCHIVE_SUFFIX}"


def archive_path(data_dir: str, anchor: dict) -> str:
    """The absolute path of the archive an anchor names (always inside
    ``data_dir/archive``, whatever the ``file`` field says)."""
    return os.path.join(data_dir, ARCHIVE_DIRECTORY,
                        os.path.basename(str(anchor.get("file", ""))))


def _open(path: str) -> sqlite3.Connection:
    """A read-only, immutable connection: archives are sealed, never written.
    Like the journal's other files, an archive is never reached through a
    symbolic link (of the file or of ``archive/``)."""
    name = os.path.basename(path)
    try:
        directory, found = os.lstat(os.path.dirname(path)), os.lstat(path)
    except FileNotFoundError:
        raise IntegrityError("archive_missing", f"archive {name} is missing") from None
    except OSError as exc:
        raise IntegrityError("archive_missing", f"archive {name} cannot be examined "
                             f"({exc.strerror or exc})") from None
    if not (stat.S_ISDIR(directory.st_mode) and stat.S_ISREG(found.st_mode)):
        raise IntegrityError("archive_missing", f"archive {name} is not a regular file in the "
                             f"{ARCHIVE_DIRECTORY} directory (a symbolic link or another kind of "
                             "file is never followed)")
    try:
        return sqlite3.connect("file:" + urllib.parse.quote(path) + "?mode=ro&immutable=1",
                               uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise IntegrityError("archive_missing", f"archive {os.path.basename(path)} cannot be "
                             f"opened ({exc})") from None


def _mismatch(anchor: dict, what: str) -> IntegrityError:
    return IntegrityError("archive_mismatch", f"archive {anchor.get('file')}: {what}",
                          archive=anchor.get("journal_id"))


def _summary(connection: sqlite3.Connection, anchor: dict) -> tuple:
    """``(journal_id, count, head, first payload)`` of an archive file."""
    try:
        metadata = dict(connection.execute(SQL_SELECT_METADATA).fetchall())
        last = connection.execute(SQL_SELECT_LAST_EVENT).fetchone()
        first = connection.execute(SQL_SELECT_PAYLOAD_AT, (1,)).fetchone()
    except sqlite3.Error as exc:
        raise _mismatch(anchor, f"not a journal ({exc})") from None
    if metadata.get("schema") != SCHEMA:
        raise _mismatch(anchor, f"schema {metadata.get('schema')!r}")
    count, head = last if last else (0, genesis_hash(str(metadata.get("journal_id")), SCHEMA))
    return metadata.get("journal_id"), count, head, first[0] if first else None


def check_anchor(data_dir: str, anchor: dict) -> None:
    """Each archive the anchor chain names exists and ends exactly where its
    anchor says (journal id, count, head); cheap: two rows per archive.
    Raises ``archive_missing`` or ``archive_mismatch``."""
    for _ in range(MAX_ARCHIVES):
        with contextlib.closing(_open(archive_path(data_dir, anchor))) as connection:
            journal_id, count, head, first = _summary(connection, anchor)
        if (journal_id, count, head) != (anchor["journal_id"], anchor["count"], anchor["head"]):
            raise _mismatch(anchor, f"holds journal {journal_id} at {count} events ending "
                                    f"{str(head)[:12]}..., the anchor names "
                                    f"{anchor['journal_id']} at {anchor['count']}")
        earlier = decode_payload(first) if first else None
        if not (isinstance(earlier, dict) and earlier.get("kind") == "archived"):
            return
        anchor = earlier["archive"]
    raise _mismatch(anchor, "the chain of archives does not end")


def anchors(data_dir: str, anchor: Optional[dict]) -> list:
    """Every anchor of the chain, newest archive first ([] for None)."""
    found = []
    while anchor is not None and len(found) < MAX_ARCHIVES:
        found.append(anchor)
        with contextlib.closing(_open(archive_path(data_dir, anchor))) as connection:
            first = _summary(connection, anchor)[3]
        earlier = decode_payload(first) if first else None
        anchor = earlier["archive"] if (isinstance(earlier, dict)
                                        and earlier.get("kind") == "archived") else None
    return found


def verify_archive(data_dir: str, anchor: dict) -> Chain:
    """Verify one archive end to end (schema, every row, the anchor's summary);
    returns its chain.  Raises :class:`IntegrityError` (the underlying verdict
    is named in the message, the code is ``archive_mismatch``)."""
    with contextlib.closing(_open(archive_path(data_dir, anchor))) as connection:
        try:
            schema_problem(connection)
            journal_id = _summary(connection, anchor)[0]
            for exact in (None, set()):
                chain = Chain(journal_id=journal_id, schema=SCHEMA, count=0,
                              head=genesis_hash(journal_id, SCHEMA), exact_ids=exact)
                try:
                    extend_chain(chain, connection.execute(SQL_SELECT_ROWS_AFTER, (0,)),
                                 full=True)
                    break
                except PossibleReuse:
                    continue
        except JournalError as exc:
            raise _mismatch(anchor, f"{exc.code}: {exc.message}") from None
        except sqlite3.Error as exc:
            raise _mismatch(anchor, f"unreadable ({exc})") from None
    if (chain.journal_id, chain.count, chain.head) != (anchor["journal_id"], anchor["count"],
                                                       anchor["head"]):
        raise _mismatch(anchor, "its verified end differs from the anchor")
    if chain.archive is not None:
        check_anchor(data_dir, chain.archive)
    return chain


def hash_at(data_dir: str, anchor: dict, seq: int) -> Optional[str]:
    """The stored hash of event ``seq`` of an archive (None if absent)."""
    with contextlib.closing(_open(archive_path(data_dir, anchor))) as connection:
        row = connection.execute(SQL_SELECT_HASH_AT, (seq,)).fetchone()
    return row[0] if row else None


def events(data_dir: str, anchor: dict, operation_id: Optional[str] = None) -> Iterator[tuple]:
    """``(seq, payload dict)`` of an archive, those of ``operation_id`` only
    when given; streamed.  Verify the archive first (:func:`verify_archive`)."""
    connection = _open(archive_path(data_dir, anchor))
    try:
        if operation_id is None:
            rows = connection.execute(SQL_SELECT_ALL_EVENTS)
        else:
            rows = connection.execute(SQL_SELECT_OPERATION_EVENTS,
                                      (0, anchor["count"], f'"operation_id":"{operation_id}"'))
        for seq, payload_text in rows:
            yield seq, decode_payload(payload_text)
    finally:
        connection.close()


# ---------------------------------------------------------------- sealing --

def start_copy(database_path: str, temp_path: str) -> None:
    """A consistent copy of the live database (``VACUUM INTO`` from a read-only
    connection: no writer lock is held for the long part)."""
    make_durable_directories(os.path.dirname(temp_path))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp_path)
    source = sqlite3.connect("file:" + urllib.parse.quote(database_path) + "?mode=ro", uri=True,
                             isolation_level=None)
    try:
        source.execute("VACUUM INTO ?", (temp_path,))
    finally:
        source.close()


def copied_count(temp_path: str) -> int:
    """The number of events in a copy made by :func:`start_copy`."""
    copy = sqlite3.connect("file:" + urllib.parse.quote(temp_path) + "?mode=ro", uri=True)
    try:
        return copy.execute(SQL_COUNT_EVENTS).fetchone()[0]
    finally:
        copy.close()


def discard(temp_path: str) -> None:
    """Remove an unfinished copy (never raises)."""
    for path in (temp_path + suffix for suffix in _COPY_SUFFIXES):
        with contextlib.suppress(OSError):
            os.unlink(path)


def finish_copy(temp_path: str, rows: list, chain: Chain) -> None:
    """Add the rows committed since the copy began, check it ends at
    ``chain``, and make it durable."""
    copy = sqlite3.connect(temp_path, isolation_level=None)
    try:
        copy.execute("BEGIN IMMEDIATE")
        copy.executemany(SQL_INSERT_EVENT, rows)
        last = copy.execute(SQL_SELECT_LAST_EVENT).fetchone()
        copy.execute("COMMIT")
    finally:
        copy.close()
    if tuple(last or (0, None)) != (chain.count, chain.head):
        raise IntegrityError("archive_mismatch", "the archive copy does not end at the live "
                             "head; nothing was switched")
    fsync_file(temp_path)


def seal(temp_path: str, final_path: str) -> None:
    """Read-only, renamed to its final name, both directories fsynced."""
    os.chmod(temp_path, 0o444)
    os.replace(temp_path, final_path)
    fsync_directory(os.path.dirname(final_path))
    fsync_directory(os.path.dirname(os.path.dirname(final_path)))


def settle_switch(data_dir: str, files: Any, intent: Any, journal_id: Optional[str],
                  count: int, first_hash: Optional[str]) -> str:
    """Finish or undo an interrupted switch, under the writer lock, from what
    the database holds (``journal_id``, ``count``, the hash of event 1):
    ``"undid"`` when it still names the sealed journal (the archive file and
    copy this switch made are removed; head.json and the marker put back),
    ``"finished"`` when it names the new journal with only its anchor
    (head.json and the marker written for it).  ``files``: the data
    directory's :class:`durable.DurableFiles`.  Removes the intent.  Raises
    ``archive_interrupted`` for anything else, changing nothing."""
    sealed = intent.get("from") if isinstance(intent, dict) else None
    target = intent.get("to") if isinstance(intent, dict) else None
    if (checkpoint_shape_problem(sealed) is not None or not is_uuid(sealed["journal_id"])
            or not is_uuid(target)):
        raise IntegrityError("archive_interrupted", f"{INTENT_NAME} is not an intent this "
                             "plugin writes; nothing was changed: a person must look")
    if journal_id == sealed["journal_id"]:  # undo: the old history is live
        # Only the two files this switch can have made, by their own names:
        # never a path the intent spells out (it could name anything).
        made = [archive_path(data_dir, {"file": relative_name(journal_id)}),
                copy_path(data_dir, intent.get("temp"))]
        for path in filter(None, made):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(path)
        files.write_checkpoint(sealed, announce="")
        files.write_marker(journal_id, SCHEMA, announce="")
        done = "undid"
    elif journal_id == target and count == 1 and first_hash is not None:
        files.write_marker(journal_id, SCHEMA, announce="")
        files.write_checkpoint({"schema": SCHEMA, "journal_id": journal_id, "count": 1,
                                "head": first_hash}, announce="")
        done = "finished"
    else:
        raise IntegrityError("archive_interrupted",
                             f"{INTENT_NAME} names journals {sealed['journal_id']} -> {target}, "
                             f"but the database is journal {journal_id} with {count} events: "
                             "a person must look")
    remove_intent(data_dir)
    return done


def write_intent(data_dir: str, intent: dict) -> None:
    """Record the switch about to happen, durably."""
    write_atomically(os.path.join(data_dir, INTENT_NAME),
                     canonical_text(intent).encode("utf-8"), announce="archive_intent")


def read_intent(data_dir: str) -> Optional[dict]:
    """The switch in progress, or None."""
    try:
        return json.loads(read_regular_file(os.path.join(data_dir, INTENT_NAME)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IntegrityError("archive_interrupted", f"{INTENT_NAME} is unreadable ({exc})") \
            from None


def remove_intent(data_dir: str) -> None:
    """The switch is complete or undone."""
    try:
        os.unlink(os.path.join(data_dir, INTENT_NAME))
        fsync_directory(data_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise storage_error(exc, f"removing {INTENT_NAME}") from None
