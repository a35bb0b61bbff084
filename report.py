"""What people and models are shown: status reports, blocked results, operator commands.

Shared by the guard (model-facing tools and refusals, SPEC §10) and the operator
CLI (SPEC §11) so both describe an operation the same way.  Pure formatting plus
the owner probe; no journal writes.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from typing import Any, Iterable, Optional

try:  # package (inside Hermes, pip install) or top-level (scripts, tests)
    from .journal import JournalError, Operation
    from .owner import probe_owner
except ImportError:
    from journal import JournalError, Operation  # type: ignore[no-redef]
    from owner import probe_owner  # type: ignore[no-redef]

BLOCKED_ERROR = "crash_recovery_blocked"
RECORD_FAILED_ERROR = "crash_recovery_record_failed"
OPERATOR_CLI_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "operator_cli.py")


def iso_utc(timestamp_ns: int) -> str:
    """ISO 8601 UTC with second precision, e.g. ``2026-11-30T07:41:02Z``."""
    moment = datetime.datetime.fromtimestamp(timestamp_ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def operator_command(data_dir: str, *words: str) -> str:
    """A shell command line running the operator CLI on ``data_dir``.

    The interpreter is this process's own (absolute) executable: a venv's bare
    ``python`` may not be on the operator's PATH, the full path runs anywhere.
    Words starting with ``<`` are placeholders the person replaces; one with
    spaces is put in double quotes so the replacement stays one argument."""
    parts = [sys.executable or "python3", OPERATOR_CLI_PATH,
             "--data-dir", data_dir, *words]
    return " ".join(shlex.quote(part) if not part.startswith("<")
                    else f'"{part}"' if " " in part else part for part in parts)


def operation_view(operation: "Operation | dict", data_dir: str, *,
                   now_ns: Optional[int] = None, with_owner: bool = True) -> dict:
    """An open operation for people: every journal field (an :class:`Operation`
    or its ``to_json()`` dict) plus ``started_at`` (ISO 8601 UTC),
    ``age_seconds`` (float, >= 0) and, with ``with_owner``, ``owner``
    (``running``/``gone``/``unknown``) and ``owner_pid``."""
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


def blocked_result(code: str, explanation: str, *, data_dir: Optional[str],
                   operations: Iterable[dict] = ()) -> str:
    """The refusal JSON of SPEC §10: ``error`` = ``crash_recovery_blocked``,
    ``blocked`` true, ``code``, ``explanation``, ``operation_ids``, ``operations``
    (tool, state, started_at, age_seconds) and ``operator_command`` (null when
    the refusal came before the data directory was known: the keys never vary)."""
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
        "operator_command": operator_command(data_dir, "status") if data_dir else None,
    }
    return json.dumps(result, ensure_ascii=False, sort_keys=True)


def unresolved_explanation(operations: list, data_dir: Optional[str]) -> str:
    """Words a model relays to its user instead of retrying (issue: what the
    model sees).  ``operations`` are :func:`operation_view` dicts."""
    described = "; ".join(
        f"operation {operation['operation_id']} (tool {operation['tool']}, "
        f"{operation['state']}, started {describe_age(operation['age_seconds'])} ago)"
        for operation in operations)
    first = operations[0]["operation_id"] if operations else "<OPERATION_ID>"
    command = (operator_command(data_dir, "resolve", first, "--outcome", "<completed|not_applied>",
                                "--evidence", "<what you checked>")
               if data_dir else "operator_cli.py resolve")
    return (f"Protected tool calls are paused. An earlier call's outcome is unknown: "
            f"{described}. It may or may not have taken effect, so repeating it could "
            f"duplicate a booking, payment or message. Do not retry. Tell the user that a "
            f"person must check the real service and then settle it with (replacing the <...> "
            f"parts): {command}")


def integrity_explanation(error: JournalError, data_dir: Optional[str]) -> str:
    """Refusal text for an integrity or availability failure."""
    command = operator_command(data_dir, "verify") if data_dir else "operator_cli.py verify"
    return (f"Protected tool calls are refused because the crash-recovery journal cannot be "
            f"trusted or used right now ({error.code}: {error.message}). Nothing was run. "
            f"Do not retry. Tell the user that an operator must inspect it with: {command}")


def status_report(journal: Any, data_dir: str, *, now_ns: Optional[int] = None) -> dict:
    """Verified status (SPEC §10 tool, §11 ``status``).

    ``{"ok", "integrity": "ok" | code, "data_dir", "checkpoint", "unresolved":
    [operation_view...]}``, plus ``"error": {code, message, ...}`` when not ok.
    Never raises :class:`JournalError`.
    """
    try:
        status = journal.status()
    except JournalError as exc:
        return {"ok": False, "integrity": exc.code, "data_dir": data_dir,
                "checkpoint": None, "unresolved": [], "error": exc.to_json()}
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "checkpoint": status.checkpoint,
            "unresolved": [operation_view(operation, data_dir, now_ns=now_ns)
                           for operation in status.unresolved]}
