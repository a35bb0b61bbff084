"""What people and models are told about operations: command lines, operation
views, ages, blocked results and the explanations of refusals.

Shared by the admission side (model-facing refusals, docs/guard.md §Blocked
result) and the operator side (docs/cli.md), so both describe an operation the
same way.  Pure formatting plus the owner probe; no journal writes.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from typing import Iterable, Optional, Sequence

from ..storage.chain import Operation
from ..storage.errors import JournalError
from ..storage.owner import probe_owner


BLOCKED_ERROR = "crash_recovery_blocked"
RECORD_FAILED_ERROR = "crash_recovery_record_failed"
# The plugin directory is this folder's parent.
OPERATOR_CLI_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "operator_cli.py")


def iso_utc(timestamp_ns: int) -> str:
    """ISO 8601 UTC with second precision, e.g. ``2026-11-30T07:41:02Z``."""
    moment = datetime.datetime.fromtimestamp(timestamp_ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def standalone_prefix(data_dir: str) -> tuple:
    """The words that run the operator CLI on ``data_dir`` from a shell: this
    process's own (absolute) interpreter -- a venv's bare ``python`` may not be
    on the operator's PATH -- the CLI's path, and ``--data-dir``."""
    return (sys.executable or "python3", OPERATOR_CLI_PATH, "--data-dir", data_dir)


def hermes_prefix(profile: Optional[str]) -> tuple:
    """The words of ``hermes [-p PROFILE] crash-recovery``: no path, no
    interpreter (safe to show in a chat).  ``profile``: None or ``default``
    for the default profile."""
    # `-p default` even for the default profile: without it, a sticky
    # `hermes profile use NAME` would run the command in NAME.
    if profile and profile != "custom":
        return ("hermes", "-p", profile, "crash-recovery")
    return ("hermes", "crash-recovery")


def command_line(prefix: Sequence[str], *words: str) -> str:
    """A shell command line.  Words starting with ``<`` are placeholders the
    person replaces; one with spaces is put in double quotes so the replacement
    stays one argument."""
    return " ".join(shlex.quote(part) if not part.startswith("<")
                    else f'"{part}"' if " " in part else part
                    for part in (*prefix, *words))


def operator_command(data_dir: str, *words: str) -> str:
    """The stand-alone command line running the operator CLI on ``data_dir``."""
    return command_line(standalone_prefix(data_dir), *words)


def operation_view(operation: "Operation | dict", data_dir: str, *,
                   now_ns: Optional[int] = None, with_owner: bool = True) -> dict:
    """An operation for people: every journal field (an :class:`Operation` or
    its ``to_json()`` dict) plus ``started_at`` (ISO 8601 UTC), ``age_seconds``
    (float, >= 0) and, with ``with_owner``, ``owner`` (``running``/``gone``/
    ``unknown``) and ``owner_pid``."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    view = dict(operation) if isinstance(operation, dict) else operation.to_json()
    view["started_at"] = iso_utc(view["started_ns"])
    view["age_seconds"] = round(max(0, now_ns - view["started_ns"]) / 1e9, 3)
    if with_owner:
        probe = probe_owner(data_dir, view["operation_id"])
        view["owner"] = probe["owner"]
        view["owner_pid"] = probe["pid"]
    return view


def describe_age(seconds: float) -> str:
    """``42 s``, ``7 min``, ``3 h``, ``2 d``."""
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 172800:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} d"


def blocked_result(code: str, explanation: str, *, prefix: Optional[Sequence[str]],
                   operations: Iterable[dict] = ()) -> str:
    """The refusal JSON of docs/guard.md §Blocked result: ``error`` =
    ``crash_recovery_blocked``, ``blocked`` true, ``code``, ``explanation``,
    ``operation_ids``, ``operations`` (tool, state, started_at, age_seconds) and
    ``operator_command`` (null when the refusal came before the data directory
    was known: the keys never vary)."""
    operations = list(operations)
    result = {
        "error": BLOCKED_ERROR,
        "blocked": True,
        "code": code,
        "explanation": explanation,
        "operation_ids": [operation["operation_id"] for operation in operations],
        "operations": [{key: operation.get(key) for key in
                        ("operation_id", "tool", "state", "started_at", "age_seconds")}
                       for operation in operations],
        "operator_command": command_line(prefix, "status") if prefix else None,
    }
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


def _described(operations: list) -> str:
    if not operations:  # its admission is still being recorded
        return "its start is being recorded now"
    return "; ".join(f"operation {operation['operation_id']} (tool {operation['tool']}, "
                     f"{operation['state']}, started {describe_age(operation['age_seconds'])} "
                     f"ago)" for operation in operations)


def unresolved_explanation(operations: list, prefix: Optional[Sequence[str]]) -> str:
    """Words a model relays to its user instead of retrying.  ``operations`` are
    :func:`operation_view` dicts of the operations whose outcome is unknown."""
    first = operations[0]["operation_id"] if operations else "<OPERATION_ID>"
    command = (command_line(prefix, "resolve", first, "--outcome", "<completed|not_applied>",
                            "--evidence", "<what you checked>")
               if prefix else "the crash-recovery resolve command")
    return (f"Protected tool calls are paused. An earlier call's outcome is unknown: "
            f"{_described(operations)}. It may or may not have taken effect, so repeating it "
            f"could duplicate a booking, payment or message. Do not retry. Tell the user that a "
            f"person must check the real service and then settle it with (replacing the <...> "
            f"parts): {command}")


def in_flight_explanation(tool_name: str, operations: list, *, nested: bool) -> str:
    """A refusal because a protected call is running right now: in another
    process or session (``nested`` False: wait), or the caller's own parent
    call (``nested`` True: protected calls cannot nest)."""
    if nested:
        return (f"{tool_name} was called from inside another protected call that is still "
                f"running ({_described(operations)}). Protected calls cannot be nested, so "
                f"{tool_name} was refused and not run. Finish without it, or tell the user.")
    return (f"Another protected call is running right now ({_described(operations)}), and only "
            f"one runs at a time in this profile, so {tool_name} was refused and not run. Wait "
            f"for that call to finish, then ask again; do not retry automatically in a loop.")


def integrity_explanation(error: JournalError, prefix: Optional[Sequence[str]]) -> str:
    """Refusal text for an integrity or availability failure."""
    command = (command_line(prefix, "verify") if prefix
               else "the crash-recovery verify command")
    if error.code == "database_locked":
        return (f"The crash-recovery journal is busy: it stayed locked by another process "
                f"longer than the busy timeout (an archive being sealed, or a stuck worker). "
                f"This call was NOT run. Ask the user whether to try again in a moment; do not "
                f"retry in a loop. If it keeps happening, an operator can look with: {command}")
    if error.code == "commit_failed":
        return (f"The journal could not confirm that this call's start was recorded "
                f"({error.message}). The call was NOT run. If the journal later shows it as "
                f"pending, settle it as not_applied. Do not retry; tell the user that an "
                f"operator must check the journal with: {command}")
    return (f"Protected tool calls are refused because the crash-recovery journal cannot be "
            f"trusted or used right now ({error.code}: {error.message}). Nothing was run. "
            f"Do not retry. Tell the user that an operator must inspect it with: {command}")


