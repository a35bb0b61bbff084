"""``restart-journal``: the way forward from any integrity verdict
(docs/cli.md §restart-journal; the procedure and the new journal's events:
docs/format.md §Restarted journals).  The broken files are kept untouched in
``replaced/<UTC time>-<journal id>/``; a new journal carries over every
operation open in their last verified state.  The steps:

1. *prepare* -- build the new journal from copies of the old one in a staging
   folder ``restart.<pid>-<hex>.tmp/``; a failure leaves garbage the next run
   removes;
2. *intent* -- ``restart.json``, written durably before anything moves;
3. *keep* -- the old files into the evidence folder, the database first;
4. *place* -- the new database and marker, the ``operator.log`` line, and
   the new ``head.json`` last;
5. *finish* -- the empty staging folder, then ``restart.json``, go.

Steps 3 to 5 and the intent are reconciliation/switch.py.  A run that finds
``restart.json`` continues where the last one stopped, with the journal the
first one built; a failure in step 3 moves everything back.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import uuid
from typing import Any, Callable, Iterator, Optional

from ..reports.messages import INTEGRITY_VERDICTS
from ..storage import archive
from ..storage.chain import lost_window
from ..storage.database import DEFAULT_BUSY_TIMEOUT_SECONDS
from ..storage.durable import (PRIVATE_DIRECTORY_MODE, TEMP_SUFFIX, foreign_file_type, fsync_directory, fsync_file,
                               reach_boundary, remove_files_of_dead_processes, write_atomically)
from ..storage.errors import IntegrityError, JournalError, JournalUnavailable
from ..storage.call_lock import held_calls
from ..storage.head_lock import HeadLock
from ..storage.record import (CHECKPOINT_NAME, DATABASE_NAME, INTENT_NAME, canonical_text,
                              checkpoint_of, genesis_hash)
from ..storage.wal_keeper import SUPPORTED as WAL_KEEPER_SUPPORTED, journal_open_elsewhere
from .building import RESTART_TOOL, build_new_journal
from .replaced import last_verified_state, summary_of_state, unverified_history
from .switch import (HEAD_ABSENT, HEAD_LINKED, HEAD_MOVED, MOVED_NAMES, NEW_NAMES,
                     REPLACED_DIRECTORY, STAGING_NAME, RestartRefused, finish, intent_path,
                     keep_old_files, keep_unrecognised_intent, place_new_files, placed,
                     read_intent, result_of, undo)

__all__ = ["RESTART_TOOL", "restart_journal"]

# The temporary files of the intent's and the placeholder's atomic replace; only
# a dead process's are removed (the writer lock is not held).
DEAD_TEMP_NAME = re.compile(r"(?:restart\.json|head\.json)\.(\d+)-[0-9a-f]{8}"
                            + re.escape(TEMP_SUFFIX))


def _failure(exc: BaseException, action: str, found: Optional[str],
             data_dir: str) -> JournalUnavailable:
    """A failure of this command's own files (a full disk, a read-only mount,
    an error inside the staging database) as ``storage_unavailable`` with
    ``free_bytes``, or ``read_access_only`` for a permission denied; never
    the old journal's verdict, which stays in ``found``."""
    if isinstance(exc, JournalError):
        cause = f"{exc.code}: {exc.message}"
    else:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        cause = f"{getattr(exc, 'strerror', None) or exc}{where}"
    try:
        found_free = os.statvfs(data_dir)
        free = found_free.f_bavail * found_free.f_frsize
    except (OSError, AttributeError):
        free = None
    if isinstance(exc, PermissionError):  # this user may read the journal, not write it
        return JournalUnavailable("read_access_only", f"restart-journal could not {action}: "
                                  f"{cause}; nothing was changed (run it as the user the "
                                  "workers run as)", found=found, step=action)
    room = "" if free is None else f" ({free} bytes free on the data directory's file system)"
    return JournalUnavailable("storage_unavailable", f"restart-journal could not {action}: "
                              f"{cause}{room}", found=found, step=action, free_bytes=free)


def _prepare(data_dir: str, found: str, message: str, evidence: str, operator: dict,
             now_ns: int) -> dict:
    """Steps 1 and 2's content: read the old journal, build the new one in a
    staging folder, and return the intent (not yet written).  On failure the
    staging folder is removed and nothing else was touched."""
    _refuse_unusable_replaced_directory(data_dir, found)
    staging_name = f"restart.{os.getpid()}-{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
    staging = os.path.join(data_dir, staging_name)
    action = "read the old journal"
    try:
        os.mkdir(staging, PRIVATE_DIRECTORY_MODE)
        fsync_directory(data_dir)
        reading = os.path.join(staging, "reading")
        os.mkdir(reading, PRIVATE_DIRECTORY_MODE)
        fsync_directory(staging)
        state = last_verified_state(data_dir, reading)
        _remove_scratch(reading)
        unverified = unverified_history(state)
        anchor = _archives_to_continue(data_dir, state)
        stamp = datetime.datetime.fromtimestamp(now_ns / 1e9, tz=datetime.timezone.utc)
        folder = _free_folder(data_dir, f"{REPLACED_DIRECTORY}/{stamp:%Y%m%dT%H%M%SZ}-"
                                        f"{state['journal_id'] or 'unreadable'}")
        record = {"journal_id": state["journal_id"], "verdict": found, "message": message[:1000],
                  "last_verified_checkpoint": state["checkpoint"],
                  "head_json": state["head_json"], "unverified": unverified,
                  "late_outcomes_unacknowledged": state["attention"],
                  "evidence_directory": folder, "archive_anchor": anchor}
        lost = str(uuid.uuid4()) if unverified else None
        action = "build the new journal in its staging folder"
        after = build_new_journal(staging, record, state, evidence=evidence, operator=operator,
                                  anchor=anchor, lost=lost, window=lost_window(
                                      now_ns, last_event_ns=state["last_event_ns"],
                                      created_ns=state["created_ns"],
                                      marker_written_ns=state["marker_written_ns"]))
        for name in NEW_NAMES:
            fsync_file(os.path.join(staging, name))
        fsync_directory(staging)
        fsync_directory(data_dir)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, (OSError, JournalError)):
            raise _failure(exc, action, found, data_dir) from None
        raise
    head = os.path.join(data_dir, CHECKPOINT_NAME)
    placeholder = canonical_text(checkpoint_of(
        after["journal_id"], 0, genesis_hash(after["journal_id"])))
    moved = [name for name in MOVED_NAMES
             if not (anchor is not None and name == archive.ARCHIVE_DIRECTORY)]
    return {"staging": staging_name, "evidence_directory": folder,
            "head": (HEAD_ABSENT if not os.path.lexists(head) else
                     HEAD_MOVED if foreign_file_type(head) else HEAD_LINKED),
            "placeholder": placeholder, "moved": moved, "read": summary_of_state(state),
            "old_database": os.path.lexists(os.path.join(data_dir, DATABASE_NAME)),
            "evidence": evidence, "operator": operator,
            "result": {"found": found, "replaced_journal_id": state["journal_id"],
                       "last_verified_checkpoint": state["checkpoint"],
                       "unverified": unverified, "evidence_directory": folder,
                       "carried_over": [item[0] for item in state["open"]],
                       "lost_operation": lost, "archive_anchor": anchor,
                       "late_outcomes_unacknowledged": state["attention"],
                       "checkpoint_after": after}}


def _remove_scratch(reading: str) -> None:
    """Remove the reading copies for good before the build: their directory
    is fsynced empty, so no crash leaves a copy in the staging folder."""
    for name in os.listdir(reading):
        os.unlink(os.path.join(reading, name))
    fsync_directory(reading)
    os.rmdir(reading)
    fsync_directory(os.path.dirname(reading))


def _refuse_unusable_replaced_directory(data_dir: str, found: str) -> None:
    """``replaced`` must be a real directory, or absent (it is created)."""
    kind = foreign_file_type(os.path.join(data_dir, REPLACED_DIRECTORY))
    if kind is None and os.path.isfile(os.path.join(data_dir, REPLACED_DIRECTORY)):
        kind = "regular file"
    if kind is not None and kind != "directory":
        raise RestartRefused(
            "storage_unavailable", f"{REPLACED_DIRECTORY} in the data directory is a {kind}, "
            "not a directory: restart-journal keeps replaced journals there. Move it away (it "
            "is not the plugin's), then run restart-journal again; nothing was changed",
            directory=REPLACED_DIRECTORY, file_type=kind, found=found)


def _free_folder(data_dir: str, folder: str) -> str:
    """``folder``, or ``folder-2``, ``-3``, ... when taken (two restarts in one
    second of journals whose id could not be read)."""
    candidate, number = folder, 1
    while os.path.lexists(os.path.join(data_dir, candidate)):
        number += 1
        candidate = f"{folder}-{number}"
    return candidate


def _archives_to_continue(data_dir: str, state: dict) -> Optional[dict]:
    """The anchor of the newest archive the new journal continues (its event
    1): the old verified prefix's, when every archive of the chain verifies
    now.  None otherwise (``archive/`` then moves into the evidence folder),
    also while an archive switch was left half-done (``archive.json``)."""
    anchor = state["anchor"]
    if anchor is None or os.path.lexists(os.path.join(data_dir, INTENT_NAME)):
        return None
    try:
        archive.verify_every_archive(data_dir, anchor)
    except JournalError:
        return None
    return anchor


def _carry_out(data_dir: str, intent: dict, audit: Callable[[dict], Optional[str]],
               resumed: bool) -> dict:
    """Steps 3 to 5 from wherever they stand.  A failure in step 3 is undone
    (the old journal as it was: its own verdict stays); one in step 4 leaves
    the intent for the next run (``restart_interrupted``)."""
    found = intent["result"]["found"]
    staging = os.path.join(data_dir, intent["staging"])
    remove_files_of_dead_processes(data_dir, DEAD_TEMP_NAME)
    if os.path.lexists(os.path.join(staging, DATABASE_NAME)):
        try:
            keep_old_files(data_dir, intent)
        except (OSError, JournalError) as exc:
            failure = _failure(exc, "keep the old files in the evidence folder", found, data_dir)
            try:
                undo(data_dir, intent)
            except OSError:
                failure.details["found"] = "restart_interrupted"
            raise failure from None
    try:
        problem = place_new_files(data_dir, intent, audit)
        finish(data_dir, intent)
    except (OSError, JournalError) as exc:
        raise _failure(exc, "place the new journal", "restart_interrupted", data_dir) from None
    result = result_of(data_dir, intent, resumed)
    if problem:
        result["operator_log_error"] = problem
    return result


def _resume(data_dir: str, intent: dict, audit: Callable[[dict], Optional[str]]) -> Optional[dict]:
    """Continue a restart that ``restart.json`` records; None when it was
    undone instead (the old journal changed since it was read, or the
    staging folder is gone), so that this run starts over."""
    staging = os.path.join(data_dir, intent["staging"])
    left = [name for name in NEW_NAMES if os.path.lexists(os.path.join(staging, name))]
    if not left:
        if placed(data_dir, intent):
            audit(result_of(data_dir, intent, True))  # written once: audit skips a repeat
            finish(data_dir, intent)
            return result_of(data_dir, intent, True)
        undo(data_dir, intent)  # the staging folder vanished with the new journal
        return None
    if DATABASE_NAME in left and os.path.lexists(os.path.join(data_dir, DATABASE_NAME)):
        # Nothing moved yet: the old journal must still be what was read.
        reading = os.path.join(staging, "reading")
        shutil.rmtree(reading, ignore_errors=True)
        os.mkdir(reading, PRIVATE_DIRECTORY_MODE)
        try:
            again = json.loads(canonical_text(summary_of_state(
                last_verified_state(data_dir, reading))))
        finally:
            shutil.rmtree(reading, ignore_errors=True)
        if intent["head"] != HEAD_LINKED:  # head.json may be the first run's placeholder now
            again["head_json"] = intent["read"]["head_json"]
        if again != intent["read"]:
            undo(data_dir, intent)
            return None
    return _carry_out(data_dir, intent, audit, resumed=True)


def _journal_open_elsewhere(data_dir: str) -> bool:
    """Whether a process has the journal open (:func:`wal_keeper.journal_open_elsewhere`);
    False without open file description locks or a database file, True when
    nobody can tell (a restart must never move a journal a worker may use)."""
    path = os.path.join(data_dir, DATABASE_NAME)
    if not WAL_KEEPER_SUPPORTED or foreign_file_type(path) is not None:
        return False
    found = journal_open_elsewhere(path)
    return True if found is None else found


@contextlib.contextmanager
def _exclusive(data_dir: str, found: str) -> Iterator[None]:
    """No worker has the journal open and no protected call is out; then the
    head lock, held exclusively throughout (no reader sees the files half
    switched, no call or other restart starts).  ``found``: the journal's
    verdict, named by every refusal."""
    if _journal_open_elsewhere(data_dir):
        raise RestartRefused("workers_running", "a worker of this profile still has the journal "
                             "open; stop every worker (gateway, agents, cron jobs) first",
                             found=found)
    if held_calls(data_dir):
        raise RestartRefused("owner_running", "a protected call is running in this profile; "
                             "stop every worker first", found=found)
    lock = contextlib.ExitStack()
    try:
        lock.enter_context(HeadLock(data_dir, DEFAULT_BUSY_TIMEOUT_SECONDS).held(exclusive=True))
    except JournalUnavailable as exc:  # only taking the lock: the body's failures are its own
        if exc.code not in ("storage_unavailable", "database_locked"):
            raise
        denied = "permission" in exc.message.lower()
        raise RestartRefused(
            "read_access_only" if denied else exc.code,
            f"restart-journal cannot take the journal's head lock: {exc.message}; nothing was "
            "changed" + (" (run it as the user the workers run as)" if denied else ""),
            found=found) from None
    with lock:
        yield


def _remove_leftovers(data_dir: str) -> None:
    """Staging folders no intent names: a prepare step that died, never part
    of any journal (the owner lock is held)."""
    for name in os.listdir(data_dir):
        if STAGING_NAME.fullmatch(name):
            shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)
    remove_files_of_dead_processes(data_dir, DEAD_TEMP_NAME)


def restart_journal(data_dir: str, journal_class: Callable[..., Any], *, evidence: str,
                    operator: dict, now_ns: int,
                    audit: Callable[[dict], Optional[str]]) -> dict:
    """Replace a journal that fails verification, or finish the restart that
    ``restart.json`` records.  ``audit(result)`` writes the operator.log line
    (once per restart, also across runs) and returns its problem or None.
    Returns the fields of docs/cli.md §restart-journal but ``unresolved``,
    plus ``evidence`` and ``operator``.  Raises :class:`RestartRefused` or
    :class:`IntegrityError` ``restart_not_applicable`` with nothing changed,
    :class:`JournalUnavailable` for a failure of its own (``found``: the
    journal's verdict afterwards)."""
    # The verdict first (it only reads), so that every refusal names it.
    try:
        pending = read_intent(data_dir)
    except RestartRefused as refusal:
        refusal.details["found"] = _verdict_code(data_dir, journal_class)
        raise
    found, message = (None, "") if pending else _verdict(data_dir, journal_class)
    with _exclusive(data_dir, found or "restart_interrupted"):
        intent = read_intent(data_dir)
        if intent is not None:
            done = _resume(data_dir, intent, audit)
            if done is not None:
                return done
        if found is None:
            found, message = _verdict(data_dir, journal_class)
        _remove_leftovers(data_dir)
        intent = _prepare(data_dir, found, message, evidence, operator, now_ns)
        reach_boundary("staged", "restart")
        try:
            keep_unrecognised_intent(data_dir, intent)
            write_atomically(intent_path(data_dir), canonical_text(intent).encode("utf-8"))
        except (OSError, JournalError) as exc:
            shutil.rmtree(os.path.join(data_dir, intent["staging"]), ignore_errors=True)
            raise _failure(exc, "write its intent", found, data_dir) from None
        reach_boundary("intent_written", "restart")
        return _carry_out(data_dir, intent, audit, resumed=False)


def _verdict_code(data_dir: str, journal_class: Callable[..., Any]) -> str:
    """The journal's verdict code, ``ok`` when it verifies."""
    try:
        return _verdict(data_dir, journal_class)[0]
    except JournalError as exc:
        return exc.details.get("found", exc.code)


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
