"""``restart-journal``: the way forward from any integrity verdict
(docs/cli.md §restart-journal, docs/format.md §Restarted journals).

A journal that fails verification refuses every protected call for good; most
verdicts have no repair, because nobody can tell which events are missing.
This command keeps the broken files untouched as evidence, moved into
``replaced/<UTC time>-<journal id>/`` inside the data directory, and starts a
new journal that

* records what it replaced: event 1 is a ``started`` of a bookkeeping
  operation (tool :data:`RESTART_TOOL`) with the field ``restarted_from``
  (old journal id, its last verified checkpoint, the old ``head.json``, the
  verdict, the evidence folder), closed at once by a ``resolved`` holding the
  operator's evidence;
* carries over, still open, every operation that was open in the old
  journal's last verified state (same id, tool, hashes and start time; the
  extra field ``carried_over``), so the gate never opens for a call that may
  have run;
* brings back one open operation (tool ``unknown``, ``uncertain``, reason
  ``lost_in_crash``) when events after that state may be lost.

The switch keeps the gate closed at every instant, a crash included: the old
``head.json`` is kept by a hard link first (or, when there is none, a
placeholder naming the new journal is written, so the directory never looks
like a fresh profile), the old database is moved next (what remains reads
``missing_database``), and the new ``head.json`` replaces the old one last.
Nothing is deleted.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import sqlite3
import stat
import uuid
from typing import Any, Callable, Optional

from ..reports.messages import INTEGRITY_VERDICTS
from ..storage.archive import ARCHIVE_DIRECTORY
from ..storage.chain import Chain, PossibleReuse, extend_chain
from ..storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS
from ..storage.durable import (PRIVATE_DIRECTORY_MODE, PRIVATE_FILE_MODE, TEMP_SUFFIX,
                               fsync_directory, fsync_file, process_alive, reach_boundary,
                               read_regular_file, write_atomically)
from ..storage.errors import IntegrityError, JournalError, JournalUnavailable
from ..storage.call_lock import held_calls
from ..storage.record import (CHECKPOINT_NAME, DATABASE_NAME, INTENT_NAME, LOST_TOOL, MARKER_NAME,
                              SCHEMA, SHM_SUFFIX, WAL_SUFFIX, canonical_text, checkpoint_of,
                              genesis_hash, is_uuid, value_hash)
from ..storage.schema import SQL_SELECT_ROWS_AFTER
from ..storage.snapshot import DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS
from ..storage.store import JournalStore
from ..storage.wal_keeper import SUPPORTED as WAL_KEEPER_SUPPORTED, journal_open_elsewhere

# The tool name of the bookkeeping operation that opens a restarted journal.
RESTART_TOOL = "crash-recovery.restart-journal"
# Where replaced journals are kept, inside the data directory.
REPLACED_DIRECTORY = "replaced"
# Moved in this order: the database first, so that whatever a crash leaves
# behind reads as missing_database (closed), never as a fresh profile.
MOVED_NAMES = (DATABASE_NAME, DATABASE_NAME + WAL_SUFFIX, DATABASE_NAME + SHM_SUFFIX,
               MARKER_NAME, INTENT_NAME, ARCHIVE_DIRECTORY)
NO_HASH = value_hash(None)
# The staging directory of a restart, its creator's pid in group 1.
STAGING_NAME = re.compile(r"restart\.(\d+)-[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))


class RestartRefused(Exception):
    """A worker still runs: ``code`` (``workers_running``, ``owner_running``)
    and ``message``."""

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


# ------------------------------------------------------------- old journal --

def _copy_for_reading(data_dir: str, reading_dir: str) -> Optional[str]:
    """Copy the database and its WAL (never the originals: they stay
    byte-identical) so SQLite may replay the WAL into the copy."""
    copied = None
    for suffix in ("", WAL_SUFFIX):
        source = os.path.join(data_dir, DATABASE_NAME + suffix)
        try:
            if not stat.S_ISREG(os.lstat(source).st_mode):
                continue
        except FileNotFoundError:
            continue
        target = os.path.join(reading_dir, DATABASE_NAME + suffix)
        shutil.copyfile(source, target, follow_symlinks=False)
        os.chmod(target, PRIVATE_FILE_MODE)
        if not suffix:
            copied = target
    return copied


def last_verified_state(data_dir: str, reading_dir: str) -> dict:
    """The longest prefix of the old database that verifies, as
    ``{"journal_id", "checkpoint" (dict or None), "open": [(operation id,
    started payload dict, state, reason, started seq)], "stopped" (why
    reading stopped early, or None), "head_json" (the old head.json, decoded,
    or its problem as text), "last_event_ns" (the last verified event's
    time, or None), "attention": [ids of resolved operations whose late
    outcome awaits acknowledgement]}``.  Reads copies in ``reading_dir``."""
    state = {"journal_id": None, "checkpoint": None, "open": [], "stopped": None,
             "head_json": _old_head(data_dir), "last_event_ns": None, "attention": []}
    path = _copy_for_reading(data_dir, reading_dir)
    if path is None:
        state["stopped"] = f"no readable {DATABASE_NAME}"
        return state
    connection = None
    try:
        connection = sqlite3.connect(path, isolation_level=None)
        metadata = dict(connection.execute("SELECT key, value FROM metadata").fetchall())
        journal_id, schema = metadata.get("journal_id"), metadata.get("schema")
        if not is_uuid(journal_id) or schema != SCHEMA:
            state["stopped"] = "the database's metadata is not a crash-recovery journal's"
            return state
        state["journal_id"] = journal_id
        chain = Chain(journal_id=journal_id, schema=schema, count=0,
                      head=genesis_hash(journal_id, schema))
        for row in connection.execute(SQL_SELECT_ROWS_AFTER, (0,)):
            try:  # one row at a time: a failing row leaves the chain as it was
                extend_chain(chain, [row])
            except (IntegrityError, PossibleReuse) as exc:
                state["stopped"] = f"seq {row[0]}: {getattr(exc, 'code', 'possible_reuse')}"
                break
            last_payload = row[1]
    except sqlite3.Error as exc:
        state["stopped"] = state["stopped"] or f"the database cannot be read ({exc})"
        if state["journal_id"] is None:
            return state
    finally:
        if connection is not None:
            connection.close()
    state["checkpoint"] = chain.checkpoint()
    if chain.count:
        stamp = json.loads(last_payload).get("timestamp_ns")
        state["last_event_ns"] = stamp if isinstance(stamp, int) else None
    state["open"] = [(key.decode("utf-8", "surrogatepass"), json.loads(record[0]), record[2],
                      record[3], record[1]) for key, record in chain.open.items()]
    state["open"].sort(key=lambda item: item[4])
    state["attention"] = [item[0] for item in chain.late_outcomes()]
    return state


def _old_head(data_dir: str) -> Any:
    """The old head.json decoded, or a text saying why it is not."""
    try:
        return json.loads(read_regular_file(os.path.join(data_dir, CHECKPOINT_NAME)))
    except FileNotFoundError:
        return "absent"
    except (OSError, ValueError, RecursionError) as exc:
        return f"unreadable ({type(exc).__name__})"


def unverified_history(state: dict) -> Optional[str]:
    """Why events after the last verified state may be lost, or None when
    ``head.json`` anchors exactly that state and every row verified."""
    if state["stopped"]:
        return state["stopped"]
    if state["head_json"] != state["checkpoint"]:
        return (f"{CHECKPOINT_NAME} does not anchor the last verified state "
                f"(it names {json.dumps(state['head_json'], sort_keys=True)[:300]})")
    return None


# ------------------------------------------------------------- new journal --

def _build_new_journal(staging: str, record: dict, state: dict, lost: Optional[str],
                       evidence: str, operator: dict, now_ns: int) -> dict:
    """Write the new journal's events in ``staging``; returns its checkpoint."""
    store = JournalStore(staging, busy_timeout=DEFAULT_BUSY_TIMEOUT_SECONDS, readonly=False,
                         create=True, full_verification=False,
                         full_verification_interval=DEFAULT_FULL_VERIFICATION_INTERVAL_SECONDS)
    try:
        bookkeeping = str(uuid.uuid4())
        with store.writing("started") as chain:
            store.append(chain, {"kind": "started", "operation_id": bookkeeping,
                                 "tool": RESTART_TOOL, "fingerprint": NO_HASH,
                                 "args_hash": NO_HASH, "session_id": None, "tool_call_id": None,
                                 "restarted_from": record})
            store.append(chain, {"kind": "resolved", "operation_id": bookkeeping,
                                 "outcome": "completed", "evidence": evidence,
                                 "forced": False, "operator": operator})
            for operation_id, started, old_state, reason, seq in state["open"]:
                fields = {key: started[key] for key in (
                    "tool", "fingerprint", "args_hash", "session_id", "tool_call_id",
                    "timestamp_ns")}
                store.append(chain, {"kind": "started", "operation_id": operation_id, **fields,
                                     "carried_over": {"journal_id": state["journal_id"],
                                                      "started_seq": seq, "state": old_state}})
                if old_state != "pending":
                    store.append(chain, {"kind": "uncertain", "operation_id": operation_id,
                                         "result_hash": NO_HASH, "reason": reason})
            if lost is not None:
                store.append(chain, {"kind": "started", "operation_id": lost, "tool": LOST_TOOL,
                                     "fingerprint": NO_HASH, "args_hash": NO_HASH,
                                     "session_id": None, "tool_call_id": None,
                                     "lost_in_crash": state["checkpoint"],
                                     "lost_window": {"after_ns": state["last_event_ns"],
                                                     "before_ns": now_ns}})
                store.append(chain, {"kind": "uncertain", "operation_id": lost,
                                     "result_hash": NO_HASH, "reason": "lost_in_crash"})
            after = chain.checkpoint()
    finally:
        store.close()
    # Fold the WAL into the file, so the database moves as one file.
    connection = sqlite3.connect(os.path.join(staging, DATABASE_NAME), isolation_level=None)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()
    if os.path.lexists(os.path.join(staging, DATABASE_NAME + WAL_SUFFIX)):
        raise JournalUnavailable("storage_unavailable", "the new journal's WAL was not folded "
                                 "into its database; nothing was switched")
    for name in (DATABASE_NAME, MARKER_NAME, CHECKPOINT_NAME):
        fsync_file(os.path.join(staging, name))
    return after


def _switch(data_dir: str, staging: str, evidence_dir: str, placeholder: bytes) -> list:
    """Move the old journal's files into ``evidence_dir`` and the new ones in
    (see the module docstring for the order).  Returns the names moved.
    ``placeholder``: written as ``head.json`` when there is none, so that at
    no instant the directory holds nothing of a journal: that would read as a
    fresh profile, whose gate is open."""
    moved = []
    head = os.path.join(data_dir, CHECKPOINT_NAME)
    if os.path.lexists(head):
        os.link(head, os.path.join(evidence_dir, CHECKPOINT_NAME), follow_symlinks=False)
        moved.append(CHECKPOINT_NAME)
        fsync_directory(evidence_dir)
    else:
        write_atomically(head, placeholder)
    for name in MOVED_NAMES:
        source = os.path.join(data_dir, name)
        if os.path.lexists(source):
            os.rename(source, os.path.join(evidence_dir, name))
            moved.append(name)
            reach_boundary(f"moved_{name}", "restart")
    fsync_directory(evidence_dir)
    fsync_directory(data_dir)
    for name in (DATABASE_NAME, MARKER_NAME):
        os.rename(os.path.join(staging, name), os.path.join(data_dir, name))
        reach_boundary(f"placed_{name}", "restart")
    os.replace(os.path.join(staging, CHECKPOINT_NAME), head)
    fsync_directory(data_dir)
    return moved


def _journal_open_elsewhere(data_dir: str) -> bool:
    """Whether a process has the journal open (a worker of ours, idle or not,
    or any other SQLite connection: :func:`wal_keeper.journal_open_elsewhere`).
    True when the question cannot be answered where it can be asked (a
    restart must never move a journal a worker may still be using); False
    where the platform has no open-file-description locks."""
    found = journal_open_elsewhere(os.path.join(data_dir, DATABASE_NAME))
    return bool(found) if found is not None or not WAL_KEEPER_SUPPORTED else True


def _remove_dead_staging(data_dir: str) -> None:
    """Remove the staging directories of restarts whose process died (never
    part of a journal: the old files were moved into the evidence folder)."""
    for name in os.listdir(data_dir):
        match = STAGING_NAME.fullmatch(name)
        if match and not process_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)


def restart_journal(data_dir: str, journal_class: Callable[..., Any], *, evidence: str,
                    operator: dict, now_ns: int) -> dict:
    """Replace a journal that fails verification (docs/cli.md
    §restart-journal).  Returns ``{"found", "replaced_journal_id",
    "last_verified_checkpoint", "unverified", "evidence_directory" (relative),
    "moved", "carried_over" (ids), "lost_operation" (id or None),
    "checkpoint_after"}``.  Raises :class:`RestartRefused` (``owner_running``,
    ``restart_not_applicable``) with nothing changed, or OSError /
    :class:`JournalError` from the switch itself (the gate stays closed)."""
    found, message = _verdict(data_dir, journal_class)
    if _journal_open_elsewhere(data_dir):
        raise RestartRefused("workers_running", "a worker of this profile still has the journal "
                             "open; stop every worker (gateway, agents, cron jobs) first")
    if held_calls(data_dir):
        raise RestartRefused("owner_running", "a protected call is running in this profile; "
                             "stop every worker first")
    _remove_dead_staging(data_dir)
    staging = os.path.join(data_dir, f"restart.{os.getpid()}-{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
    try:
        os.mkdir(staging, 0o700)
        reading = os.path.join(staging, "reading")
        os.mkdir(reading, 0o700)
        state = last_verified_state(data_dir, reading)
        shutil.rmtree(reading)
        unverified = unverified_history(state)
        lost = str(uuid.uuid4()) if unverified else None
        stamp = datetime.datetime.fromtimestamp(now_ns / 1e9, tz=datetime.timezone.utc)
        folder = os.path.join(REPLACED_DIRECTORY, f"{stamp:%Y%m%dT%H%M%SZ}-"
                                                  f"{state['journal_id'] or 'unreadable'}")
        record = {"journal_id": state["journal_id"], "verdict": found, "message": message[:1000],
                  "last_verified_checkpoint": state["checkpoint"],
                  "head_json": state["head_json"], "unverified": unverified,
                  "late_outcomes_unacknowledged": state["attention"],
                  "evidence_directory": folder}
        after = _build_new_journal(staging, record, state, lost, evidence, operator, now_ns)
        evidence_dir = os.path.join(data_dir, folder)
        os.makedirs(os.path.dirname(evidence_dir), PRIVATE_DIRECTORY_MODE, exist_ok=True)
        os.mkdir(evidence_dir, PRIVATE_DIRECTORY_MODE)
        fsync_directory(os.path.dirname(evidence_dir))
        fsync_directory(data_dir)
        # The new journal's genesis checkpoint: never equal to what the
        # database holds until the real head.json replaces it.
        placeholder = canonical_text(checkpoint_of(
            after["journal_id"], 0, genesis_hash(after["journal_id"]))).encode("utf-8")
        moved = _switch(data_dir, staging, evidence_dir, placeholder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"found": found, "replaced_journal_id": state["journal_id"],
            "last_verified_checkpoint": state["checkpoint"], "unverified": unverified,
            "evidence_directory": folder, "moved": moved,
            "carried_over": [item[0] for item in state["open"]], "lost_operation": lost,
            "late_outcomes_unacknowledged": state["attention"],
            "checkpoint_after": after}


def _verdict(data_dir: str, journal_class: Callable[..., Any]) -> tuple:
    """``(code, message)`` of the journal's integrity verdict; refuses when it
    verifies or the failure is not an integrity verdict."""
    try:
        with journal_class(data_dir, readonly=True, create=False) as journal:
            journal.status()
    except JournalError as exc:
        if exc.code in INTEGRITY_VERDICTS:
            return exc.code, exc.message
        raise IntegrityError("restart_not_applicable",
                             f"restart-journal only replaces a journal that fails verification; "
                             f"found {exc.code}: {exc.message}", found=exc.code) from None
    raise IntegrityError("restart_not_applicable",
                         "the journal verifies: nothing to replace. Workers that still refuse "
                         "with an integrity code saw an earlier state: restart them", found="ok")
