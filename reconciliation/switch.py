"""The switch of ``restart-journal`` (docs/format.md §Restarted journals):
the intent ``restart.json`` (``intent``: decoded, reconciliation/restart.py
writes it) and the steps it drives, each idempotent so that whichever run
carries one out does it once, and the undo of the keeping step."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from typing import Any, Callable, Optional

from ..storage import archive
from ..storage.durable import (TEMP_SUFFIX, foreign_file_type, fsync_directory,
                               make_durable_directories, reach_boundary, read_regular_file,
                               write_atomically)
from ..storage.record import (CHECKPOINT_NAME, DATABASE_NAME, INTENT_NAME, MARKER_NAME,
                              SHM_SUFFIX, WAL_SUFFIX)

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
# The staging directory of a restart, its creator's pid in group 1.
STAGING_NAME = re.compile(r"restart\.(\d+)-[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))
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


def intent_path(data_dir: str) -> str:
    """Where the intent of a restart lives in ``data_dir``."""
    return os.path.join(data_dir, RESTART_INTENT_NAME)


def pending_restart(data_dir: str) -> Optional[dict]:
    """The intent of a restart left half-way (its staging folder still holds
    a file of the new journal), or None (also for a ``restart.json`` that is
    not a restart's: restart-journal says what to do with it).  Never raises."""
    try:
        intent = read_intent(data_dir)
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


def read_intent(data_dir: str) -> Optional[dict]:
    """``restart.json`` decoded and checked; None when absent, or when it is
    not a restart's intent and no staging folder exists (then it is only
    evidence: :func:`keep_unrecognised_intent` moves it).  Raises
    :class:`RestartRefused` ``restart_intent_unrecognised`` for one beside a
    staging folder: that folder may hold another version's finished journal."""
    path = intent_path(data_dir)
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


def keep_unrecognised_intent(data_dir: str, intent: dict) -> None:
    """A ``restart.json`` that is not a restart's intent goes into the new
    evidence folder before the new intent is written in its place."""
    path = intent_path(data_dir)
    if os.path.lexists(path):
        evidence = os.path.join(data_dir, intent["evidence_directory"])
        make_durable_directories(evidence)
        os.rename(path, os.path.join(evidence, RESTART_INTENT_NAME))
        _fsync_both(evidence, data_dir)


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


def keep_old_files(data_dir: str, intent: dict) -> None:
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


def place_new_files(data_dir: str, intent: dict,
                     audit: Callable[[dict], Optional[str]]) -> Optional[str]:
    """Step 4 (idempotent): the new database and marker, the operator.log
    line (``audit``; its problem, if any, is returned), then head.json."""
    staging = os.path.join(data_dir, intent["staging"])
    for name in (DATABASE_NAME, MARKER_NAME):
        if _move(name, staging, data_dir):
            reach_boundary(f"placed_{name}", "restart")
    problem = audit(result_of(data_dir, intent))
    source = os.path.join(staging, CHECKPOINT_NAME)
    if os.path.lexists(source):
        os.replace(source, os.path.join(data_dir, CHECKPOINT_NAME))
        _fsync_both(data_dir, staging)
        reach_boundary("placed_head.json", "restart")
    return problem


def finish(data_dir: str, intent: dict) -> None:
    """Step 5: the (empty) staging folder, then the intent, go: an intent
    without its staging folder beside a placed database is a finished
    restart (:func:`placed`)."""
    shutil.rmtree(os.path.join(data_dir, intent["staging"]), ignore_errors=True)
    fsync_directory(data_dir)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(intent_path(data_dir))
    fsync_directory(data_dir)
    reach_boundary("intent_removed", "restart")


def placed(data_dir: str, intent: dict) -> bool:
    """Whether the new database is in place: a database in the data
    directory while the old one (if there was one) is in the evidence folder."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    return os.path.lexists(os.path.join(data_dir, DATABASE_NAME)) and (
        not intent["old_database"] or os.path.lexists(os.path.join(evidence, DATABASE_NAME)))


def undo(data_dir: str, intent: dict) -> None:
    """Step 3 backwards, before anything new was placed: every kept file back
    where it was, the evidence folder and staging folder gone, no intent.
    The old journal is then exactly as it was.  Raises ``OSError``."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    head = os.path.join(data_dir, CHECKPOINT_NAME)
    kept_head = os.path.join(evidence, CHECKPOINT_NAME)
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
        os.unlink(intent_path(data_dir))
    fsync_directory(data_dir)


def _holds(path: str, text: str) -> bool:
    try:
        return read_regular_file(path) == text.encode("utf-8")
    except OSError:
        return False


def result_of(data_dir: str, intent: dict, resumed: bool = False) -> dict:
    """The command's result, the first run's whatever run finishes it;
    ``moved``: the names kept in the evidence folder."""
    evidence = os.path.join(data_dir, intent["evidence_directory"])
    moved = [name for name in (CHECKPOINT_NAME, *MOVED_NAMES)
             if os.path.lexists(os.path.join(evidence, name))]
    return {**intent["result"], "moved": moved, "resumed": resumed,
            "evidence": intent["evidence"], "operator": intent["operator"]}
