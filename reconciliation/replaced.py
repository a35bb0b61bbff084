"""Reading a journal that failed verification without changing a byte of it
(docs/cli.md §restart-journal, §verify): its longest verified prefix, and an
export of a replaced journal checked against its evidence folder.  Both read
plain copies in a scratch folder (SQLite may replay a WAL into a copy, never
into the originals), never following a symbolic link.
"""
from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import urllib.parse
from typing import Any, Optional

from ..storage.chain import Chain, PossibleReuse, extend_chain
from ..storage.durable import (foreign_file_type, fsync_directory, marker_written_ns,
                               read_regular_file)
from ..storage.errors import IntegrityError
from ..storage.record import (CHECKPOINT_NAME, DATABASE_NAME, SCHEMA, WAL_SUFFIX,
                              created_time, genesis_hash, is_uuid)
from ..storage.schema import SQL_SELECT_METADATA, SQL_SELECT_ROWS_AFTER

# Copies are made in pieces of this size (a journal may be gigabytes).
COPY_CHUNK_BYTES = 1 << 20
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def copy_file(source: str, target: str) -> bool:
    """Copy a regular file with reads and writes (no ``sendfile``: every byte
    passes through this process); False when ``source`` is absent or not a
    regular file (a symbolic link is never followed).  Raises ``OSError``."""
    try:
        descriptor = os.open(source, os.O_RDONLY | _NO_FOLLOW)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symbolic link, a socket
            return False
        raise
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return False
        written = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
        try:
            while True:
                chunk = os.read(descriptor, COPY_CHUNK_BYTES)
                if not chunk:
                    return True
                view = memoryview(chunk)
                while view:
                    view = view[os.write(written, view):]
        finally:
            os.close(written)
    finally:
        os.close(descriptor)


def _copy_database(directory: str, reading_dir: str) -> Optional[str]:
    """Copies of ``journal.sqlite3`` and its ``-wal`` in ``reading_dir``; the
    copy's path, or None when there is no regular database file."""
    if not copy_file(os.path.join(directory, DATABASE_NAME),
                     os.path.join(reading_dir, DATABASE_NAME)):
        return None
    copy_file(os.path.join(directory, DATABASE_NAME + WAL_SUFFIX),
              os.path.join(reading_dir, DATABASE_NAME + WAL_SUFFIX))
    # One directory fsync, so that a crash from here on leaves both names or
    # neither: scratch either way, but a state fewer for the crash-state
    # explorer to enumerate (docs/persistence.md).
    fsync_directory(reading_dir)
    return os.path.join(reading_dir, DATABASE_NAME)


def old_head(directory: str) -> Any:
    """The ``head.json`` of ``directory`` decoded, or a text saying why not."""
    path = os.path.join(directory, CHECKPOINT_NAME)
    kind = foreign_file_type(path)
    if kind is not None:
        return f"not a regular file (a {kind})"
    try:
        return json.loads(read_regular_file(path))
    except FileNotFoundError:
        return "absent"
    except (OSError, ValueError, RecursionError) as exc:
        return f"unreadable ({type(exc).__name__})"


def last_verified_state(directory: str, reading_dir: str, hashes_wanted: tuple = ()) -> dict:
    """The longest prefix of the journal in ``directory`` that verifies, read
    from copies in ``reading_dir`` (removed by the caller): ``{"journal_id",
    "checkpoint", "open": [(operation id, started payload, state, reason,
    started seq)], "stopped" (why reading stopped early), "head_json"
    (decoded, or its problem as text), "last_event_ns", "created_ns",
    "marker_written_ns", "attention" (ids of unacknowledged late outcomes),
    "anchor" (event 1's archive anchor), "hashes" ({seq: hash} for each seq
    of ``hashes_wanted`` reached)}``, None where unknown.  Raises ``OSError``
    when the copies cannot be made (a full disk)."""
    state = {"journal_id": None, "checkpoint": None, "open": [], "stopped": None,
             "head_json": old_head(directory), "last_event_ns": None, "created_ns": None,
             "marker_written_ns": marker_written_ns(directory), "attention": [],
             "anchor": None, "hashes": {}}
    path = _copy_database(directory, reading_dir)
    if path is None:
        kind = foreign_file_type(os.path.join(directory, DATABASE_NAME))
        state["stopped"] = (f"{DATABASE_NAME} is a {kind}, not a database file" if kind
                            else f"no readable {DATABASE_NAME}")
        return state
    connection, chain, last_payload = None, None, None
    try:
        # Read-only: SQLite replays the copied WAL but never checkpoints it.
        connection = sqlite3.connect("file:" + urllib.parse.quote(path) + "?mode=ro", uri=True,
                                     isolation_level=None)
        metadata = dict(connection.execute(SQL_SELECT_METADATA).fetchall())
        journal_id, schema = metadata.get("journal_id"), metadata.get("schema")
        if not is_uuid(journal_id) or schema != SCHEMA:
            state["stopped"] = "the database's metadata is not a crash-recovery journal's"
            return state
        state["journal_id"], state["created_ns"] = journal_id, created_time(metadata)
        chain = Chain(journal_id=journal_id, schema=schema, count=0,
                      head=genesis_hash(journal_id, schema))
        if 0 in hashes_wanted:
            state["hashes"][0] = chain.head
        for row in connection.execute(SQL_SELECT_ROWS_AFTER, (0,)):
            try:  # one row at a time: a failing row leaves the chain as it was
                extend_chain(chain, [row])
            except (IntegrityError, PossibleReuse) as exc:
                state["stopped"] = f"seq {row[0]}: {getattr(exc, 'code', 'possible_reuse')}"
                break
            last_payload = row[1]
            if chain.count in hashes_wanted:
                state["hashes"][chain.count] = chain.head
    except sqlite3.Error as exc:
        state["stopped"] = state["stopped"] or f"the database cannot be read ({exc})"
        if chain is None:
            return state
    finally:
        if connection is not None:
            connection.close()
    state["checkpoint"] = chain.checkpoint()
    state["anchor"] = chain.archive
    if last_payload is not None:
        stamp = json.loads(last_payload).get("timestamp_ns")
        state["last_event_ns"] = stamp if isinstance(stamp, int) else None
    state["open"] = sorted(((key.decode("utf-8", "surrogatepass"), json.loads(record[0]),
                             record[2], record[3], record[1])
                            for key, record in chain.open.items()), key=lambda item: item[4])
    state["attention"] = [item[0] for item in chain.late_outcomes()]
    return state


def unverified_history(state: dict) -> Optional[str]:
    """Why events after the last verified state may be lost, or None when
    ``head.json`` anchors exactly that state and every row verified."""
    if state["stopped"]:
        return state["stopped"]
    if state["head_json"] != state["checkpoint"]:
        return (f"{CHECKPOINT_NAME} does not anchor the last verified state "
                f"(it names {json.dumps(state['head_json'], sort_keys=True)[:300]})")
    return None


def summary_of_state(state: dict) -> dict:
    """What a restart read of the old journal, in a form that can be compared
    with a second reading (the intent keeps it; docs/cli.md §restart-journal)."""
    return {"journal_id": state["journal_id"], "checkpoint": state["checkpoint"],
            "open": [[item[0], item[2], item[3], item[4]] for item in state["open"]],
            "head_json": state["head_json"], "stopped": state["stopped"],
            "attention": state["attention"], "anchor": state["anchor"]}


def check_replaced_export(data_dir: str, record: dict, export: dict, scratch: str) -> dict:
    """Check an exported checkpoint of a journal that ``restart-journal``
    replaced (``record``: the new journal's ``restarted_from``) against what
    the restart verified of it, with copies of its evidence folder in
    ``scratch`` (docs/cli.md §verify).  Returns ``{"replaced_journal_id",
    "evidence_directory", "last_verified_count", "checkpoint_count"}`` for a
    prefix; raises :class:`IntegrityError` ``checkpoint_lost_in_restart``,
    ``checkpoint_replaced_mismatch`` or ``checkpoint_replaced_unverifiable``."""
    verified = record.get("last_verified_checkpoint")
    verified = verified if isinstance(verified, dict) else None
    verified_count = verified.get("count") if verified else 0
    folder = record.get("evidence_directory")
    facts = {"replaced_journal_id": record.get("journal_id"), "evidence_directory": folder,
             "last_verified_count": verified_count, "checkpoint_count": export["count"],
             "found": "ok"}
    if export["count"] > verified_count:
        raise IntegrityError(
            "checkpoint_lost_in_restart",
            f"the export anchors {export['count']} events of journal {record.get('journal_id')}, "
            f"which restart-journal replaced; only its first {verified_count} verified then. The "
            "events after them are the ones a crash or a damage lost: the operation of tool "
            "unknown that the restart brought back stands for them", **facts)
    found = {key: value for key, value in facts.items() if key != "found"}
    if export["count"] == verified_count and verified and export["head"] == verified["head"]:
        return found
    state = last_verified_state(os.path.join(data_dir, str(folder)), scratch,
                                (export["count"], verified_count))
    if state["journal_id"] != record.get("journal_id") or (
            verified and state["hashes"].get(verified_count) != verified["head"]):
        raise IntegrityError(
            "checkpoint_replaced_unverifiable",
            f"the export belongs to journal {record.get('journal_id')}, which restart-journal "
            f"replaced, but {folder} no longer holds the history the restart verified (moved, "
            "removed or changed): the export cannot be checked", **facts)
    if state["hashes"].get(export["count"]) != export["head"]:
        raise IntegrityError(
            "checkpoint_replaced_mismatch",
            f"the export is not a prefix of journal {record.get('journal_id')} as restart-journal "
            f"found it (kept in {folder}): that history was rewritten after the export and "
            "before the restart. The new journal is not affected", **facts)
    return found
