"""What the model's inspection tools return (docs/guard.md §Inspection tools):
what it needs to tell a person, and nothing an operator surface alone should
show.  No path (the data directory, file names), no process ids, no hashes or
sequence numbers, no internal error text: a code, a plain sentence, and the
command the person runs (``hermes -p PROFILE crash-recovery ...``)."""
from __future__ import annotations

from typing import Optional, Sequence

from .messages import (INTEGRITY_VERDICTS, WRITING_COMMANDS, bounded, command_line,
                       first_waiting, next_command, status_next_step)

# The fields of an operation a person needs to find the call in the real service.
OPERATION_FIELDS = ("operation_id", "tool", "state", "reason", "outcome", "late_reason",
                    "started_at", "age_seconds", "owner", "session_id", "tool_call_id",
                    "lost_after", "lost_before")
# Fields of the operator's report that never reach a chat.
OPERATOR_ONLY = ("data_dir", "in_flight", "resolved_running", "checkpoint", "unresolved",
                 "attention", "error")


def chat_error(error: dict) -> dict:
    """``{"code", "message"}`` for a chat: a sentence by kind of code, never
    the operator's message (it names files and internal steps)."""
    code = str(error.get("code"))
    if code in INTEGRITY_VERDICTS:
        message = ("The journal that records protected calls failed its integrity check; "
                   "protected calls are refused until an operator has looked at it.")
    elif code == "database_locked":
        message = "The journal was busy; try again in a moment."
    else:
        message = ("The journal cannot be used right now; protected calls are refused until "
                   "an operator has looked at it.")
    return {"code": bounded(code), "message": message}


def chat_status(report: dict, prefix: Optional[Sequence[str]]) -> dict:
    """``crash_recovery_status`` from the guard's status report: its fields but
    :data:`OPERATOR_ONLY`, plus ``events``, ``call_running``,
    ``resolved_calls_running`` (a count), ``unresolved`` and ``attention``
    (:data:`OPERATION_FIELDS`), ``error`` (:func:`chat_error`),
    ``operator_command`` (``status``), ``next`` (:func:`chat_next_step`) and
    ``needs_a_person`` (a sentence, or null)."""
    shown = {key: bounded(value) for key, value in report.items() if key not in OPERATOR_ONLY}
    shown["events"] = (report.get("checkpoint") or {}).get("count")
    shown["call_running"] = bool(report.get("in_flight"))
    shown["resolved_calls_running"] = len(report.get("resolved_running") or [])
    for key in ("unresolved", "attention"):
        shown[key] = [{field: bounded(operation.get(field)) for field in OPERATION_FIELDS
                       if field in operation} for operation in report.get(key) or []]
    if report.get("error"):
        shown["error"] = chat_error(report["error"])
    shown["operator_command"] = command_line(prefix, "status") if prefix else None
    step = chat_next_step(report)
    shown["next"] = next_command(prefix, step) if prefix and step else None
    shown["needs_a_person"] = needs_a_person(report)
    return shown


def chat_next_step(report: dict) -> Optional[tuple]:
    """The operator's next step (:func:`status_next_step`) as a model may
    relay it: a command that changes the journal becomes ``show OP`` (a
    resolution or acknowledgement) or ``verify`` (docs/guard.md §What the
    model is told)."""
    step = status_next_step(report)
    if not step or step[0] not in WRITING_COMMANDS:
        return step
    if step[0] in ("resolve", "acknowledge"):
        return ("show", step[1])
    return ("verify",)


def needs_a_person(report: dict) -> Optional[str]:
    """A sentence for the user when a person must act, else None."""
    waiting = first_waiting(report.get("unresolved") or [])
    if not report.get("ok"):
        return ("A person must look at the crash-recovery journal: protected calls are refused "
                "until they have.")
    if report.get("gate") == "closed" and waiting is not None:
        return (f"A person must check the real service and settle operation "
                f"{waiting['operation_id']}; until then protected calls are refused and only "
                f"read-only tools run.")
    if report.get("attention"):
        return (f"A person must compare the late outcome of operation "
                f"{report['attention'][0]['operation_id']} with its resolution.")
    return None


def chat_verify(report: dict) -> dict:
    """``crash_recovery_verify``: the verdict, the checkpoint (to keep
    elsewhere) and counts; an error as :func:`chat_error`."""
    shown = dict(report)
    if report.get("error"):
        shown["error"] = chat_error(report["error"])
    return shown
