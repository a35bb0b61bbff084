"""What people and models are shown: status reports, blocked results, operator commands.

Shared by the guard (model-facing tools and refusals, docs/guard.md §Blocked result) and the operator
CLI (docs/cli.md) so both describe an operation the same way.  Pure formatting plus
the owner probe; no journal writes.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
import unicodedata
from typing import Any, Iterable, Iterator, Optional, Sequence

from .chain import Operation
from .errors import JournalError
from .owner import OWNER_RUNNING, probe_lock, probe_owner

BLOCKED_ERROR = "crash_recovery_blocked"
RECORD_FAILED_ERROR = "crash_recovery_record_failed"
OPERATOR_CLI_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "operator_cli.py")
# Gate states (docs/cli.md §status).
GATE_OPEN, GATE_BUSY, GATE_CLOSED = "open", "busy", "closed"


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


def gate_of(ok: bool, unresolved: list, in_flight: Optional[dict]) -> str:
    """``closed`` (an integrity failure, or an outcome nobody knows: an open
    operation whose worker is not running it), ``busy`` (a call is running
    now: its worker holds the owner lock) or ``open``.  ``unresolved``:
    :func:`operation_view` dicts."""
    if not ok or any(operation_waits_for_a_person(view) for view in unresolved):
        return GATE_CLOSED
    return GATE_BUSY if unresolved or in_flight else GATE_OPEN


def operation_waits_for_a_person(view: dict) -> bool:
    """An open operation that is not a call running right now."""
    return not (view.get("state") == "pending" and view.get("owner") == OWNER_RUNNING)


def status_report(journal: Any, data_dir: str, *, now_ns: Optional[int] = None) -> dict:
    """Verified status (docs/guard.md §Inspection tools, docs/cli.md §status).

    ``{"ok", "integrity": "ok" | code, "data_dir", "gate", "checkpoint",
    "unresolved": [operation_view...], "attention": [...], "in_flight"}``, plus
    ``"error": {code, message, ...}`` when not ok.  Never raises
    :class:`JournalError`.
    """
    in_flight = probe_lock(data_dir)
    try:
        status = journal.status()
    except JournalError as exc:
        return {"ok": False, "integrity": exc.code, "data_dir": data_dir, "gate": GATE_CLOSED,
                "checkpoint": None, "unresolved": [], "attention": [], "in_flight": in_flight,
                "error": exc.to_json()}
    unresolved = [operation_view(operation, data_dir, now_ns=now_ns)
                  for operation in status.unresolved]
    return {"ok": True, "integrity": "ok", "data_dir": data_dir,
            "gate": gate_of(True, unresolved, in_flight), "checkpoint": status.checkpoint,
            "unresolved": unresolved,
            "attention": [operation_view(operation, data_dir, now_ns=now_ns, with_owner=False)
                          for operation in status.attention],
            "in_flight": in_flight}


def prometheus_text(result: dict, *, now_ns: Optional[int] = None) -> str:
    """``status`` as gauges in the node-exporter textfile format (docs/cli.md
    §status --format prometheus)."""
    label = '{data_dir="%s"}' % str(result.get("data_dir", "")).replace("\\", "\\\\").replace(
        '"', '\\"').replace("\n", "\\n")
    unresolved = result.get("unresolved") or []
    checkpoint = result.get("checkpoint") or {}
    gauges = (
        ("unresolved_operations", "Operations whose outcome is unknown (pending or uncertain).",
         len(unresolved)),
        ("oldest_unresolved_age_seconds", "Age of the oldest unresolved operation (0 if none).",
         max((operation["age_seconds"] for operation in unresolved), default=0)),
        ("late_outcomes_unacknowledged", "Resolved operations whose late outcome awaits an "
         "operator's acknowledgement.", len(result.get("attention") or [])),
        ("events", "Events in the live journal segment.", checkpoint.get("count", 0)),
        ("last_verification_ok", "1 if the journal verified, 0 if not.",
         1 if result.get("ok") else 0),
        ("gate_open", "1 if protected calls may run now, 0 if not.",
         1 if result.get("gate") == GATE_OPEN else 0),
        ("gate_closed", "1 if protected calls are refused until a person acts (an unknown "
         "outcome or an integrity failure), 0 if open or busy with a running call.",
         1 if result.get("gate") not in (GATE_OPEN, GATE_BUSY) else 0),
    )
    lines = []
    for name, help_text, value in gauges:
        lines += [f"# HELP crash_recovery_{name} {help_text}",
                  f"# TYPE crash_recovery_{name} gauge", f"crash_recovery_{name}{label} {value}"]
    return "\n".join(lines)


# ------------------------------------------------------------- terminal output --

# Characters that would break a table row: newlines, tabs and other controls.
# C1 controls (U+0080-U+009F: 8-bit CSI and friends) and bidi overrides reach a
# terminal raw even through json.dumps(ensure_ascii=False); tool names and ids
# come from the model, so they are escaped in every output.
_TERMINAL_UNSAFE = (*range(0x80, 0xa0), 0x200e, 0x200f, *range(0x202a, 0x202f),
                    *range(0x2066, 0x206a))
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in _TERMINAL_UNSAFE}
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7f)}
_CONTROL_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
_CONTROL_ESCAPES.update(_JSON_ESCAPES)


def json_text(document: Any, indent: Optional[int]) -> str:
    """JSON for a terminal: readable non-ASCII text, terminal controls as
    ``\\uXXXX`` escapes (valid JSON: they can only occur inside strings)."""
    return json.dumps(document, ensure_ascii=False, sort_keys=True,
                      indent=indent).translate(_JSON_ESCAPES)


def _cell(value: Any) -> str:
    """One table cell: ``-`` for nothing, control characters escaped."""
    return "-" if value is None or value == "" else str(value).translate(_CONTROL_ESCAPES)


def _display_width(text: str) -> int:
    """Terminal columns of ``text``: wide (CJK) characters take two, combining marks none."""
    return sum(0 if unicodedata.combining(character) else
               2 if unicodedata.east_asian_width(character) in "WF" else 1
               for character in text)


def _table(rows: list, columns: Sequence[str]) -> str:
    """Rows (dicts) under upper-case column titles, columns padded to equal
    display width and separated by two spaces."""
    cells = [[column.upper() for column in columns]]
    cells += [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(_display_width(line[index]) for line in cells) for index in range(len(columns))]
    return "\n".join("  ".join(cell + " " * (width - _display_width(cell))
                               for cell, width in zip(line, widths)).rstrip()
                     for line in cells)


def _error_text(result: dict) -> str:
    error = result.get("error") or {}
    lines = [f"error: {error.get('code')}", f"  {_cell(error.get('message'))}"]
    lines += [f"  {key}: {_cell(json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value)}"
              for key, value in sorted(error.items()) if key not in ("code", "message", "hint")]
    if "integrity" in result:
        lines.append(f"integrity: {result['integrity']}")
    if error.get("hint"):
        lines.append(f"next: {error['hint']}")
    return "\n".join(lines)


def _owner_text(operation: dict) -> Optional[str]:
    owner = operation.get("owner")
    if owner == OWNER_RUNNING and operation.get("owner_pid"):
        return f"{owner} (pid {operation['owner_pid']})"
    return owner


def _status_text(result: dict, header: str, prefix: Sequence[str]) -> str:
    rows = [dict(row, age=describe_age(row["age_seconds"]), owner=_owner_text(row))
            for row in result["unresolved"]]
    in_flight = result.get("in_flight")
    lines = [header, f"gate: {result.get('gate')}" + (
        f" (a protected call is running: operation {in_flight.get('operation_id')}, pid "
        f"{in_flight.get('pid')})" if in_flight else "")]
    if rows and result.get("gate") == GATE_BUSY:
        lines += [f"{len(rows)} protected call(s) running now (the worker holds the owner lock); "
                  "others wait for it, nothing needs settling:",
                  _table(rows, ("operation_id", "tool", "state", "started_at", "age", "owner",
                                "session_id", "tool_call_id"))]
    elif rows:
        first = rows[0]["operation_id"]
        lines += [
            f"{len(rows)} unresolved operation(s) block every protected call in this profile:",
            _table(rows, ("operation_id", "tool", "state", "reason", "started_at", "age",
                          "owner", "session_id", "tool_call_id", "args_hash")),
            "",
            "next: stop every worker of this profile (owner must not be running), check the "
            "real service for this call, then record what you found:",
            "  " + command_line(prefix, "show", first),
            "  " + command_line(prefix, "resolve", first, "--outcome", "<completed|not_applied>",
                                "--evidence", "<what you checked>"),
            "If you cannot establish the outcome, leave it unresolved."]
    else:
        lines.append("no unresolved operations: protected calls may run")
    attention = [dict(row, age=describe_age(row["age_seconds"]))
                 for row in result.get("attention") or []]
    if attention:
        lines += ["", f"{len(attention)} operation(s) returned after an operator had resolved "
                  "them (late outcomes): check the service again, then acknowledge:",
                  _table(attention, ("operation_id", "tool", "late_reason", "started_at", "age")),
                  "  " + command_line(prefix, "acknowledge", attention[0]["operation_id"],
                                      "--evidence", "<what you did>")]
    shown = result.get("settings")
    if shown:
        tools = ", ".join(map(_cell, shown.get(shown.get("mode"), []))) or "-"
        lines += ["", f"settings: mode {shown.get('mode')}: {tools}"]
        if shown.get("problem"):
            lines.append(f"SETTINGS PROBLEM (every tool is protected until it is fixed): "
                         f"{_cell(shown['problem'])}")
    return "\n".join(lines)


def render_text(command: str, result: dict, prefix: Optional[Sequence[str]] = None) -> str:
    """Aligned, human-readable tables for status/show/log and a readable error
    for any failed command; other results fall back to indented JSON.
    ``prefix``: how the operator commands are run here (default: stand-alone)."""
    if not result.get("ok", True):
        return _error_text(result)
    if command not in ("status", "show", "log"):
        return json_text(result, 2)
    data_dir = result.get("data_dir") or ""
    prefix = prefix or standalone_prefix(data_dir)
    checkpoint = result.get("checkpoint") or {}
    header = (f"integrity: {result.get('integrity')}   data dir: {data_dir}\n"
              f"events: {checkpoint.get('count', 0)}   head: {checkpoint.get('head', '-')}")
    if command == "status":
        return _status_text(result, header, prefix)
    if command == "show":
        operation = dict(result["operation"], owner=_owner_text(result["operation"]))
        if "age_seconds" in operation:
            operation["age"] = describe_age(operation["age_seconds"])
        keys = ("operation_id", "tool", "state", "reason", "outcome", "started_at", "age",
                "owner", "session_id", "tool_call_id", "args_hash", "fingerprint")
        width = max(map(len, keys)) + 1
        lines = [f"{(key + ':').ljust(width)} {_cell(operation.get(key))}" for key in keys
                 if key in operation and not (key == "owner" and operation[key] is None)]
        return "\n".join([f"integrity: {result.get('integrity')}   data dir: {data_dir}", "",
                          *lines, "", _table(result["events"], (
                              "seq", "at", "kind", "reason", "outcome", "result_hash",
                              "evidence"))])
    return "\n".join(log_text_lines(result))


# Column widths of the streamed `log --format text`: it cannot look ahead at a
# million rows to size them, so long cells are cut (the JSON forms are complete).
_LOG_COLUMNS = (("seq", 18), ("at", 20), ("kind", 12), ("operation_id", 36), ("tool", 20),
                ("reason", 14), ("outcome", 11), ("detail", 0))


def log_text_lines(result: dict) -> Iterator[str]:
    """``log --format text`` line by line, as the events are read (constant
    memory): the header, column titles, one line per event.  ``tool`` is shown
    on ``started`` events; ``detail`` holds the evidence of a resolution or
    acknowledgement and the anchor of an ``archived`` event.  With ``log
    --all`` a seq is written ``<journal id prefix>:<seq>`` (each segment
    counts from 1)."""
    checkpoint = result.get("checkpoint") or {}
    yield (f"integrity: {result.get('integrity')}   data dir: {result.get('data_dir') or ''}\n"
           f"events: {checkpoint.get('count', 0)}   head: {checkpoint.get('head', '-')}")

    def line(cells: Sequence[str]) -> str:
        padded = []
        for (_, width), cell in zip(_LOG_COLUMNS, cells):
            if width and _display_width(cell) > width:
                cell = cell[:width - 1] + "…"
            padded.append(cell + " " * max(0, width - _display_width(cell)))
        return "  ".join(padded).rstrip()

    yield line([name.upper() for name, _ in _LOG_COLUMNS])
    for event in result["events"]:
        anchor = event.get("archive")
        detail = (f"archive {anchor.get('file')} ({anchor.get('count')} events)"
                  if isinstance(anchor, dict) else event.get("evidence"))
        segment = event.get("journal_id")
        seq = f"{segment[:8]}:{event.get('seq')}" if isinstance(segment, str) else event.get("seq")
        yield line([_cell(seq), _cell(iso_utc(event["timestamp_ns"])),
                    _cell(event.get("kind")), _cell(event.get("operation_id")),
                    _cell(event.get("tool")), _cell(event.get("reason")),
                    _cell(event.get("outcome")), _cell(detail)])
