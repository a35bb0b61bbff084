"""``restart-journal``: the way forward from any integrity verdict
(docs/cli.md §restart-journal, docs/format.md §Restarted journals).

A journal that fails verification refuses every protected call for good; most
verdicts have no repair, because nobody can tell which events are missing.
This command keeps the broken files untouched as evidence, moved into
``replaced/<UTC time>-<journal id>/`` inside the data directory, and starts a
new journal that records what it replaced, carries over, still open, every
operation open in the old journal's last verified state (same id, tool,
session, call id, hashes and start time), brings back one open operation (tool
``unknown``, reason ``lost_in_crash``) when later events may be lost, and
continues the old journal's archives when they verify.

It is a recorded procedure, like the archive switch:

1. *prepare* -- read the old journal from copies, build the new one complete
   in a staging folder ``restart.<pid>-<hex>.tmp/``, make it durable.  The
   journal's files are untouched; a failure or a crash leaves garbage the next
   run removes.
2. *intent* -- ``restart.json`` names the staging and evidence folders and
   holds the whole result; written durably before anything is moved.
3. *keep* -- the old ``head.json`` is linked into the evidence folder (an odd
   file there is moved and a placeholder naming the new journal takes its
   place), then the old files are moved, the database first; every rename is
   made durable in both directories before the next.
4. *place* -- the new database and marker are renamed out of the staging
   folder, the line of ``operator.log`` is written, and the new ``head.json``
   replaces the old one last: from then on the new journal is the journal.
5. *finish* -- ``restart.json`` and the empty staging folder are removed.

At every instant the data directory holds something of a journal (never a
fresh profile, whose gate is open), and reads as an integrity verdict until
step 4 ends.  A run that finds ``restart.json`` continues from wherever the
last one stopped, with the journal the first one built: the same operations,
the same result.  A failure in step 3 (a full disk) moves everything back.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import re
import shutil
import struct
import uuid
from typing import Any, Callable, Iterator, Optional

try:
    import fcntl
except ImportError:  # no advisory locks: workers cannot be detected
    fcntl = None  # type: ignore[assignment]

from ..reports.messages import INTEGRITY_VERDICTS
from ..storage import archive
from ..storage.chain import lost_window
from ..storage.durable import (TEMP_SUFFIX, foreign_file_type, fsync_directory, fsync_file,
                               make_durable_directories, reach_boundary, read_regular_file,
                               remove_files_of_dead_processes, write_atomically)
from ..storage.errors import IntegrityError, JournalError, JournalUnavailable
from ..storage.owner import OwnerLock
from ..storage.record import (CHECKPOINT_NAME, DATABASE_NAME, INTENT_NAME, MARKER_NAME,
                              SHM_SUFFIX, WAL_SUFFIX, canonical_text, checkpoint_of,
                              genesis_hash)
from ..storage.wal_keeper import REGISTRY_OFFSET
from .building import RESTART_TOOL, build_new_journal
from .replaced import last_verified_state, summary_of_state, unverified_history

__all__ = ["RESTART_TOOL", "RESTART_INTENT_NAME", "REPLACED_DIRECTORY", "RestartRefused",
           "restart_journal", "pending_restart"]

# Where replaced journals are kept, inside the data directory.
REPLACED_DIRECTORY = "replaced"
# The intent of a restart in progress (docs/format.md §Files).
RESTART_INTENT_NAME = "restart.json"
# Moved in this order: the database first, so that whatever a crash leaves
# behind reads as missing_database (closed), never as a fresh profile.
MOVED_NAMES = (DATABASE_NAME, DATABASE_NAME + WAL_SUFFIX, DATABASE_NAME + SHM_SUFFIX,
               MARKER_NAME, INTENT_NAME, archive.ARCHIVE_DIRECTORY)
# The new journal's files in the staging folder, placed in this order.
NEW_NAMES = (DATABASE_NAME, MARKER_NAME, CHECKPOINT_NAME)
# ``struct flock`` on Linux (64-bit off_t): l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = "@hhqqi4x"
# The staging directory of a restart, its creator's pid in group 1.
STAGING_NAME = re.compile(r"restart\.(\d+)-[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))
# The temporary files of the intent's and the placeholder's atomic replace.
DEAD_TEMP_NAME = re.compile(r"(?:restart\.json|head\.json)\.(\d+)-[0-9a-f]{8}"
                            + re.escape(TEMP_SUFFIX))
# How the old head.json is kept: linked (a regular file), moved (anything
# else: a placeholder takes its place) or absent (a placeholder is written).
HEAD_LINKED, HEAD_MOVED, HEAD_ABSENT = "linked", "moved", "absent"


class RestartRefused(Exception):
    """Refused before anything changed: ``code`` (``workers_running``,
    ``owner_running``, ``storage_unavailable``, ``read_access_only``) and
    ``message``, ``details`` for the error document."""

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


def _failure(exc: BaseException, action: str, found: Optional[str],
             data_dir: str) -> JournalUnavailable:
    """A failure of this command's own files as ``storage_unavailable`` (never
    the old journal's verdict: ``integrity`` stays ``found``).  A full disk, a
    read-only mount, a permission, or an error inside the staging database
    (SQLite may call a full disk "malformed" or an "I/O error"): the free
    space of the data directory's file system is named (``free_bytes``)."""
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
    room = "" if free is None else f" ({free} bytes free on the data directory's file system)"
    return JournalUnavailable("storage_unavailable", f"restart-journal could not {action}: "
                              f"{cause}{room}", found=found, step=action, free_bytes=free)


# ------------------------------------------------------------- preparing --

def _prepare(data_dir: str, found: str, message: str, evidence: str,
                        operator: dict, now_ns: int) -> dict:
    """Steps 1 and 2's content: read the old journal, build the new one in a
    staging folder, and return the intent (not yet written).  On failure the
    staging folder is removed and nothing else was touched."""
    _refuse_unusable_replaced_directory(data_dir, found)
    staging_name = f"restart.{os.getpid()}-{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
    staging = os.path.join(data_dir, staging_name)
    action = "read the old journal"
    try:
        os.mkdir(staging, 0o700)
        fsync_directory(data_dir)
        reading = os.path.join(staging, "reading")
        os.mkdir(reading, 0o700)
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
    1), when the old journal's verified prefix names one and every archive of
    the chain verifies end to end now: ``show``, ``log --all``, ``verify
    --all`` and ``verify --checkpoint`` of the new journal then reach them.
    None otherwise (``archive/`` then moves into the evidence folder), also
    while an archive switch was left half-done (``archive.json``)."""
    anchor = state["anchor"]
    if anchor is None or os.path.lexists(os.path.join(data_dir, INTENT_NAME)):
        return None
    try:
        archive.verify_every_archive(data_dir, anchor)
    except JournalError:
        return None
    return anchor


# ------------------------------------------------------------- the intent --

def _intent_path(data_dir: str) -> str:
    return os.path.join(data_dir, RESTART_INTENT_NAME)


def pending_restart(data_dir: str) -> Optional[dict]:
    """The intent of a restart left half-way (its staging folder still holds
    a file of the new journal), or None (also for a ``restart.json`` that is
    not a restart's: restart-journal says what to do with it).  Never raises."""
    try:
        intent = _read_intent(data_dir)
    except (RestartRefused, OSError):
        return None
    if intent is None:
        return None
    staging = os.path.join(data_dir, intent["staging"])
    if any(os.path.lexists(os.path.join(staging, name)) for name in NEW_NAMES):
        return intent
    return None


_INTENT_KEYS = {"staging": str, "evidence_directory": str, "head": str, "placeholder": str,
                "moved": list, "read": dict, "evidence": str, "operator": dict, "result": dict,
                "old_database": bool}


def _read_intent(data_dir: str) -> Optional[dict]:
    """``restart.json`` decoded and checked; None when absent, or when it is
    not a restart's intent and no staging folder exists (then it is only
    evidence: :func:`_keep_unrecognised_intent` moves it).  Raises
    :class:`RestartRefused` ``restart_intent_unrecognised`` for one beside a
    staging folder: that folder may hold another version's finished journal."""
    path = _intent_path(data_dir)
    if not os.path.lexists(path):
        return None
    intent = _recognised(path)
    if intent is not None:
        return intent
    if any(STAGING_NAME.fullmatch(name) for name in os.listdir(data_dir)):
        raise RestartRefused(
            "restart_intent_unrecognised", f"{RESTART_INTENT_NAME} in the data directory is not "
            "the intent of a restart this version wrote (unreadable, another shape, or naming "
            "other folders), and a staging folder restart.*.tmp lies beside it: another "
            "version's restart may have stopped half-way. It stays for a person: finish it with "
            "the version that started it, or check which journal the folders hold and move "
            f"{RESTART_INTENT_NAME} away by hand", file=RESTART_INTENT_NAME)
    return None


def _recognised(path: str) -> Optional[dict]:
    """The intent at ``path`` when it has the shape this version writes."""
    try:
        intent = json.loads(read_regular_file(path))
    except (OSError, ValueError, RecursionError):
        return None
    shaped = isinstance(intent, dict) and all(isinstance(intent.get(key), kind)
                                              for key, kind in _INTENT_KEYS.items())
    if (shaped and STAGING_NAME.fullmatch(intent["staging"])
            and re.fullmatch(REPLACED_DIRECTORY + r"/[0-9A-Za-z-]+", intent["evidence_directory"])
            and set(intent["moved"]) <= set(MOVED_NAMES)
            and intent["head"] in (HEAD_LINKED, HEAD_MOVED, HEAD_ABSENT)):
        return intent
    return None


def _keep_unrecognised_intent(data_dir: str, intent: dict) -> None:
    """A ``restart.json`` that is not a restart's intent (and names no staging
    folder) goes into the new evidence folder before the new intent is
    written in its place."""
    path = _intent_path(data_dir)
    if os.path.lexists(path):
        evidence = os.path.join(data_dir, intent["evidence_directory"])
        make_durable_directories(evidence)
        os.rename(path, os.path.join(evidence, RESTART_INTENT_NAME))
        _fsync_both(evidence, data_dir)


# ------------------------------------------------------------ the switch --

def _fsync_both(first: str, second: str) -> None:
    """A rename between two directories is durable once both are fsynced."""
    fsync_directory(first)
    fsync_directory(second)


def _move(name: str, source_dir: str, target_dir: str) -> bool:
    """Rename ``name`` from one directory to the other, durably in both;
    False when it is not there (moved already).  Never replaces a file:
    ``OSError`` (EEXIST) when the target name is taken."""
    source, target = os.path.join(source_dir, name), os.path.join(target_dir, name)
    if not os.path.lexists(source):
        return False
    if os.path.lexists(target):
        raise OSError(errno.EEXIST, f"{name} is in both {os.path.basename(source_dir)} and "
                      f"{os.path.basename(target_dir)} (did something recreate it?)", target)
    os.rename(source, target)
    _fsync_both(target_dir, source_dir)
    return True


def _keep_old_files(data_dir: str, intent: dict) -> None:
    """Step 3 (idempotent): the old journal's files into the evidence folder."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    make_durable_directories(evidence)
    head = os.path.join(data_dir, CHECKPOINT_NAME)
    kept_head = os.path.join(evidence, CHECKPOINT_NAME)
    if intent["head"] == HEAD_LINKED and not os.path.lexists(kept_head) \
            and os.path.lexists(head):
        os.link(head, kept_head, follow_symlinks=False)
        fsync_directory(evidence)
    elif intent["head"] == HEAD_MOVED and foreign_file_type(head) \
            and not os.path.lexists(kept_head):
        os.rename(head, kept_head)  # the database still names something of a journal
        _fsync_both(evidence, data_dir)
    if not os.path.lexists(head):
        # Before anything else moves: never a directory that reads as fresh.
        write_atomically(head, intent["placeholder"].encode("utf-8"))
    reach_boundary("head_kept", "restart")
    for name in intent["moved"]:
        if _move(name, data_dir, evidence):
            reach_boundary(f"moved_{name}", "restart")


def _place_new_files(data_dir: str, intent: dict,
                     audit: Callable[[dict], Optional[str]]) -> Optional[str]:
    """Step 4 (idempotent): the new database and marker, the operator.log
    line (``audit``; its problem, if any, is returned), then head.json."""
    staging = os.path.join(data_dir, intent["staging"])
    for name in (DATABASE_NAME, MARKER_NAME):
        if _move(name, staging, data_dir):
            reach_boundary(f"placed_{name}", "restart")
    problem = audit(_result(data_dir, intent))
    source = os.path.join(staging, CHECKPOINT_NAME)
    if os.path.lexists(source):
        os.replace(source, os.path.join(data_dir, CHECKPOINT_NAME))
        _fsync_both(data_dir, staging)
        reach_boundary("placed_head.json", "restart")
    return problem


def _finish(data_dir: str, intent: dict) -> None:
    """Step 5: the (empty) staging folder, then the intent, go: an intent
    without its staging folder beside a placed database is a finished
    restart (:func:`_placed`)."""
    shutil.rmtree(os.path.join(data_dir, intent["staging"]), ignore_errors=True)
    fsync_directory(data_dir)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_intent_path(data_dir))
    fsync_directory(data_dir)
    reach_boundary("intent_removed", "restart")


def _placed(data_dir: str, intent: dict) -> bool:
    """Whether the new database is in place: a database in the data
    directory while the old one (if there was one) is in the evidence folder
    -- the new one is placed only after every old file was moved."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    return os.path.lexists(os.path.join(data_dir, DATABASE_NAME)) and (
        not intent["old_database"] or os.path.lexists(os.path.join(evidence, DATABASE_NAME)))


def _undo(data_dir: str, intent: dict) -> None:
    """Step 3 backwards, before anything new was placed: every kept file back
    where it was, the evidence folder and staging folder gone, no intent.
    The old journal is then exactly as it was.  Raises ``OSError``."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    head, kept_head = os.path.join(data_dir, CHECKPOINT_NAME), os.path.join(evidence,
                                                                           CHECKPOINT_NAME)
    for name in reversed(intent["moved"]):
        _move(name, evidence, data_dir)
    if os.path.lexists(kept_head):
        if intent["head"] == HEAD_LINKED:
            os.unlink(kept_head)
        elif intent["head"] == HEAD_MOVED:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(head)  # the placeholder: the database is back in place
            os.rename(kept_head, head)
            _fsync_both(data_dir, evidence)
    elif intent["head"] == HEAD_ABSENT and _holds(head, intent["placeholder"]):
        os.unlink(head)
    for empty in (evidence, os.path.dirname(evidence)):  # replaced/ too, when this left it empty
        with contextlib.suppress(OSError):
            os.rmdir(empty)
    fsync_directory(data_dir)
    shutil.rmtree(os.path.join(data_dir, intent["staging"]), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_intent_path(data_dir))
    fsync_directory(data_dir)


def _holds(path: str, text: str) -> bool:
    try:
        return read_regular_file(path) == text.encode("utf-8")
    except OSError:
        return False


def _result(data_dir: str, intent: dict, resumed: bool = False) -> dict:
    """The command's result, the first run's whatever run finishes it;
    ``moved``: the names kept in the evidence folder."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    moved = [name for name in (CHECKPOINT_NAME, *MOVED_NAMES)
             if os.path.lexists(os.path.join(evidence, name))]
    return {**intent["result"], "moved": moved, "resumed": resumed,
            "evidence": intent["evidence"], "operator": intent["operator"]}


def _carry_out(data_dir: str, intent: dict, audit: Callable[[dict], Optional[str]],
               resumed: bool) -> dict:
    """Steps 3 to 5 from wherever they stand.  A failure in step 3 is undone
    (the old journal as it was: its own verdict stays); one in step 4 leaves
    the intent for the next run (``restart_interrupted``)."""
    found = intent["result"]["found"]
    staging = os.path.join(data_dir, intent["staging"])
    _remove_dead_temp_files(data_dir)
    if os.path.lexists(os.path.join(staging, DATABASE_NAME)):
        try:
            _keep_old_files(data_dir, intent)
        except (OSError, JournalError) as exc:
            failure = _failure(exc, "keep the old files in the evidence folder", found, data_dir)
            try:
                _undo(data_dir, intent)
            except OSError:
                failure.details["found"] = "restart_interrupted"
            raise failure from None
    try:
        problem = _place_new_files(data_dir, intent, audit)
        _finish(data_dir, intent)
    except (OSError, JournalError) as exc:
        failure = _failure(exc, "place the new journal", "restart_interrupted", data_dir)
        raise failure from None
    result = _result(data_dir, intent, resumed)
    if problem:
        result["operator_log_error"] = problem
    return result


def _resume(data_dir: str, intent: dict, journal_class: Callable[..., Any],
            audit: Callable[[dict], Optional[str]]) -> Optional[dict]:
    """Continue a restart that ``restart.json`` records; None when it was
    undone instead (the old journal changed since it was read, or the
    staging folder is gone), so that this run starts over."""
    staging = os.path.join(data_dir, intent["staging"])
    left = [name for name in NEW_NAMES if os.path.lexists(os.path.join(staging, name))]
    if not left:
        if _placed(data_dir, intent):
            audit(_result(data_dir, intent, True))  # written once: audit skips a repeat
            _finish(data_dir, intent)
            return _result(data_dir, intent, True)
        _undo(data_dir, intent)  # the staging folder vanished with the new journal
        return None
    if DATABASE_NAME in left and os.path.lexists(os.path.join(data_dir, DATABASE_NAME)):
        # Nothing moved yet: the old journal must still be what was read.
        reading = os.path.join(staging, "reading")
        shutil.rmtree(reading, ignore_errors=True)
        os.mkdir(reading, 0o700)
        try:
            again = summary_of_state(last_verified_state(data_dir, reading))
        finally:
            shutil.rmtree(reading, ignore_errors=True)
        if json.loads(canonical_text(again)) != intent["read"]:
            _undo(data_dir, intent)
            return None
    return _carry_out(data_dir, intent, audit, resumed=True)


# -------------------------------------------------------------- the guard --

def _journal_open_elsewhere(data_dir: str) -> bool:
    """Whether a process has the journal open for writing, an idle worker
    too: each holds a read lock on one byte of the database far past SQLite's
    own (``storage.wal_keeper.REGISTRY_OFFSET``).  False where the platform
    has no open-file-description locks (nothing to tell by) or there is no
    database file (none, or another kind of file there: nobody has it open
    as a journal); True when the question cannot be answered (a restart must
    never move a journal a worker may still be using)."""
    if fcntl is None or not hasattr(fcntl, "F_OFD_GETLK"):
        return False
    path = os.path.join(data_dir, DATABASE_NAME)
    if foreign_file_type(path) is not None:
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except FileNotFoundError:
        return False  # no database: nobody has it open
    except OSError:
        return True  # cannot tell: refuse rather than move a journal in use
    try:
        found = fcntl.fcntl(descriptor, fcntl.F_OFD_GETLK, struct.pack(
            _FLOCK, fcntl.F_WRLCK, os.SEEK_SET, REGISTRY_OFFSET, 1, 0))
        return struct.unpack(_FLOCK, found)[0] != fcntl.F_UNLCK
    except OSError:
        return True
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def _exclusive(data_dir: str, found: str) -> Iterator[None]:
    """No worker has the journal open, and no protected call or other
    restart runs (the owner lock, held throughout).  ``found``: the journal's
    verdict, named by every refusal."""
    if _journal_open_elsewhere(data_dir):
        raise RestartRefused("workers_running", "a worker of this profile still has the journal "
                             "open; stop every worker (gateway, agents, cron jobs) first",
                             found=found)
    owner = OwnerLock(data_dir)
    try:
        taken = owner.acquire(str(uuid.uuid4()))
    except OSError as exc:
        denied = exc.errno in (errno.EACCES, errno.EPERM)
        raise RestartRefused(
            "read_access_only" if denied else "storage_unavailable",
            f"restart-journal cannot take the owner lock in the data directory: "
            f"{exc.strerror or exc}; nothing was changed"
            + (" (run it as the user the workers run as)" if denied else ""),
            found=found) from None
    if not taken:
        raise RestartRefused("owner_running", "a protected call is running in this profile; "
                             "stop every worker first", found=found)
    try:
        yield
    finally:
        owner.release()


def _remove_leftovers(data_dir: str) -> None:
    """Staging folders no intent names: a prepare step that died, never part
    of any journal (the owner lock is held)."""
    for name in os.listdir(data_dir):
        if STAGING_NAME.fullmatch(name):
            shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)
    _remove_dead_temp_files(data_dir)


def _remove_dead_temp_files(data_dir: str) -> None:
    """Temporary files of an atomic replace that a killed restart left (the
    intent, the placeholder head.json): only those of dead processes, since
    this command does not hold the writer lock."""
    remove_files_of_dead_processes(data_dir, DEAD_TEMP_NAME)


def restart_journal(data_dir: str, journal_class: Callable[..., Any], *, evidence: str,
                    operator: dict, now_ns: int,
                    audit: Callable[[dict], Optional[str]]) -> dict:
    """Replace a journal that fails verification, or finish the restart that
    ``restart.json`` records (docs/cli.md §restart-journal).  ``audit(result)``
    writes the operator.log line (once per restart, also across runs) and
    returns its problem or None.  Returns ``{"found", "replaced_journal_id",
    "last_verified_checkpoint", "unverified", "evidence_directory" (relative),
    "moved", "carried_over" (ids), "lost_operation" (id or None),
    "archive_anchor", "late_outcomes_unacknowledged", "checkpoint_after",
    "resumed", "evidence", "operator"}``.  Raises :class:`RestartRefused` or
    :class:`IntegrityError` ``restart_not_applicable`` with nothing changed,
    :class:`JournalUnavailable` ``storage_unavailable`` for a failure of its
    own (``found``: the journal's verdict afterwards)."""
    # The verdict first (it only reads), so that every refusal names it.
    try:
        pending = _read_intent(data_dir)
    except RestartRefused as refusal:
        refusal.details["found"] = _verdict_code(data_dir, journal_class)
        raise
    found, message = (None, "") if pending else _verdict(data_dir, journal_class)
    with _exclusive(data_dir, found or "restart_interrupted"):
        intent = _read_intent(data_dir)
        if intent is not None:
            done = _resume(data_dir, intent, journal_class, audit)
            if done is not None:
                return done
        if found is None:
            found, message = _verdict(data_dir, journal_class)
        _remove_leftovers(data_dir)
        intent = _prepare(data_dir, found, message, evidence, operator, now_ns)
        reach_boundary("staged", "restart")
        try:
            _keep_unrecognised_intent(data_dir, intent)
            write_atomically(_intent_path(data_dir), canonical_text(intent).encode("utf-8"))
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
