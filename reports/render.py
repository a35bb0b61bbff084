"""Terminal output of the operator commands: JSON safe for a terminal, text
tables for ``status``, ``show`` and ``log`` (docs/cli.md §Output).
"""
from __future__ import annotations

import json
import sys
import unicodedata
from typing import Any, Iterator, Optional, Sequence

from ..storage.call_lock import OWNER_RUNNING
from .messages import (command_line, describe_age, first_waiting, iso_utc, lost_call_text,
                       reach_warning, standalone_prefix)
from .status import GATE_BUSY


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


def stdout_takes_unicode() -> bool:
    """Whether stdout's encoding can write any text (``PYTHONIOENCODING=ascii``
    or a C locale cannot)."""
    try:
        "\u2026\u00e9\u4e2d".encode(getattr(sys.stdout, "encoding", None) or "ascii")
        return True
    except (UnicodeError, LookupError):
        return False


def json_text(document: Any, indent: Optional[int]) -> str:
    """JSON for a terminal: readable non-ASCII text, terminal controls as
    ``\\uXXXX`` escapes (valid JSON: they occur only inside strings); all
    non-ASCII as escapes where stdout cannot encode it."""
    return json.dumps(document, ensure_ascii=not stdout_takes_unicode(), sort_keys=True,
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


def _field_cell(value: Any) -> str:
    """A ``key: value`` line's value: nested values as JSON."""
    return _cell(json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value)


def _header(result: dict) -> str:
    checkpoint = result.get("checkpoint") or {}
    return (f"integrity: {result.get('integrity')}   data dir: {result.get('data_dir') or ''}\n"
            f"events: {checkpoint.get('count', 0)}   head: {checkpoint.get('head', '-')}")


def _error_text(result: dict) -> str:
    error = result.get("error") or {}
    lines = [f"error: {error.get('code')}", f"  {_cell(error.get('message'))}"]
    lines += [f"  {key}: {_field_cell(value)}" for key, value in sorted(error.items())
              if key not in ("code", "message", "hint", "next")]
    if "integrity" in result:
        lines.append(f"integrity: {result['integrity']}")
    lines += _workers_lines(result)
    lines += _platform_lines(result)
    if error.get("hint"):
        lines.append(f"hint: {error['hint']}")
    if error.get("next"):
        lines.append(f"next: {_cell(error['next'])}")
    return "\n".join(lines)


# How a status document knows a worker runs (docs/cli.md §status, workers_running).
_KNOWN_AS = {"running_call": "its protected call is running",
             "resolved_call": "it still runs a call resolved with force",
             "owner": "it holds an open operation",
             "journal_open": "it has the journal open",
             "recorded_first_call": "the last worker to start here"}


def _workers_lines(result: dict) -> list:
    known = result.get("workers_running") or []
    if not known:
        return []
    return ["workers of this profile known to run (stop them before any repair): " + "; ".join(
        f"pid {entry.get('pid')} ({_KNOWN_AS.get(entry.get('known_as'), entry.get('known_as'))})"
        for entry in known)]


def _platform_lines(result: dict) -> list:
    problem = result.get("platform_problem")
    return ["", "PLATFORM NOT SUPPORTED (every protected call is refused): " + _cell(problem)] \
        if problem else []


def _owner_text(operation: dict) -> Optional[str]:
    owner = operation.get("owner")
    if owner == OWNER_RUNNING and operation.get("owner_pid"):
        return f"{owner} (pid {operation['owner_pid']})"
    return owner


def check_lines(result: dict) -> list:
    """What needs a person, first (the ``check`` field, docs/cli.md §status):
    a headline with the exit code of ``status --check`` and one line per
    reason; [] when nothing does."""
    check = result.get("check") or {}
    reasons = check.get("reasons") or []
    if not reasons:
        return []
    return [f"NEEDS A PERSON (status --check exits {check.get('exit_code')}):",
            *(f"- {_cell(reason.get('code'))}: {_cell(reason.get('message'))}"
              for reason in reasons), ""]


def _resolved_running_lines(result: dict) -> list:
    running = result.get("resolved_running") or []
    if not running:
        return []
    return [f"{len(running)} call(s) an operator resolved with --force still run: each may yet "
            "record a late outcome, and `archive` waits for them (stop the worker when it can "
            "no longer act):",
            *(f"  operation {entry.get('operation_id')}, pid {entry.get('pid')}"
              for entry in running)]


def _lost_cells(row: dict) -> dict:
    """Table cells of an operation brought back for a lost event: its window
    where a start time would be, its unknown session and call said so."""
    if not row.get("lost_before"):
        return {}
    return {"started_at": f"lost {row.get('lost_after') or '?'}..{row['lost_before']}",
            "session_id": "unknown", "tool_call_id": "unknown"}


def _status_text(result: dict, header: str, prefix: Sequence[str]) -> str:
    rows = [dict(row, age=describe_age(row["age_seconds"]), owner=_owner_text(row),
                 **_lost_cells(row)) for row in result["unresolved"]]
    in_flight = result.get("in_flight")
    lines = [*check_lines(result), header, f"gate: {result.get('gate')}" + (
        f" (a protected call is running: operation {in_flight.get('operation_id')}, pid "
        f"{in_flight.get('pid')})" if in_flight else "")]
    lines += _resolved_running_lines(result)
    lines += _workers_lines(result)
    if rows and result.get("gate") == GATE_BUSY:
        lines += [f"{len(rows)} protected call(s) running now (the worker holds its call lock); "
                  "other protected calls are refused (operation_in_flight) until it ends, and "
                  "nothing needs settling:",
                  _table(rows, ("operation_id", "tool", "state", "started_at", "age", "owner",
                                "session_id", "tool_call_id"))]
    elif rows:
        # The one a resolve can settle now (not a call still running).
        first = (first_waiting(rows) or rows[0])["operation_id"]
        lines += [
            f"{len(rows)} unresolved operation(s) block every protected call in this profile:",
            _table(rows, ("operation_id", "tool", "state", "reason", "started_at", "age",
                          "owner", "session_id", "tool_call_id", "args_hash")),
            "",
            *(f"{row['operation_id']} is dated {describe_age(row['clock_ahead_seconds'])} in the "
              "future (the clock of the process that started it was ahead); AGE is its distance "
              "from now" for row in rows if row.get("clock_ahead_seconds")),
            *(f"{row['operation_id']} stands for {lost_call_text(row)}" for row in rows
              if row.get("lost_before")),
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
                  "them (late outcomes): compare OUTCOME (the resolution) with LATE_REASON (how "
                  "the tool ended), check the service again, then acknowledge:",
                  _table(attention, ("operation_id", "tool", "outcome", "late_reason",
                                     "started_at", "age")),
                  "  " + command_line(prefix, "acknowledge", attention[0]["operation_id"],
                                      "--evidence", "<what you did>")]
    lines += _platform_lines(result)
    shown = result.get("settings")
    if shown:
        tools = ", ".join(map(_cell, shown.get(shown.get("mode"), []))) or "-"
        lines += ["", f"settings: mode {shown.get('mode')}: {tools}"]
        if shown.get("recorded_at"):
            lines.append(f"  as the worker pid {shown.get('recorded_by_pid')} read them at "
                         f"{_cell(shown['recorded_at'])} (registered_tools.json)")
        recorded = (f", recorded by a worker at {_cell(shown['tool_list_recorded_at'])}"
                    if shown.get("tool_list_recorded_at") else "")
        lines.append(f"  tool list: {shown.get('tool_list')}{recorded}")
        if shown.get("problem"):
            lines.append(f"SETTINGS PROBLEM (every tool is protected until it is fixed): "
                         f"{_cell(shown['problem'])}")
        if shown.get("unmatched_tools"):
            effect = ("each protects nothing: the real tool runs unrecorded" if shown.get(
                "mode") == "protected_tools" else "listing them changes nothing")
            lines.append(f"UNMATCHED TOOL NAMES (no tool of this host has the name; {effect}): "
                         + ", ".join(map(_cell, shown["unmatched_tools"])))
        reach = reach_warning([_cell(tool) for tool in shown.get("agent_reaches_journal") or []])
        if reach:
            lines.append(reach)
    return "\n".join(lines)


# The first line of a write or verify command's text output; the fields below
# it are the rest of its JSON document (docs/cli.md §Output).
_ACTION_LINES = {
    "resolve": lambda r: (f"resolved {r.get('resolved')} ({r.get('tool')}, was "
                          f"{r.get('previous_state')}) as {r.get('outcome')}"
                          + (" (forced)" if r.get("forced") else "")),
    "acknowledge": lambda r: (f"acknowledged the late outcome ({r.get('late_reason')}) of "
                              f"{r.get('acknowledged')} ({r.get('tool')})"),
    "repair-checkpoint": lambda r: f"repaired head.json: {r.get('lost_event')}",
    "archive": lambda r: (f"archived {(r.get('archived') or {}).get('count')} events into "
                          f"{(r.get('archived') or {}).get('file')}"),
    "restart-journal": lambda r: (
        f"replaced the journal ({r.get('found')}); its files are kept in "
        f"{r.get('evidence_directory')}; {len(r.get('carried_over') or [])} operation(s) "
        f"carried over" + (", one lost operation brought back" if r.get("lost_operation")
                           else "") + "; settle them before starting the workers"),
    "verify": lambda r: (f"verified: {r.get('count')} events, {r.get('unresolved_count')} "
                         f"unresolved, {r.get('attention_count')} late outcome(s)"
                         + (f", the exported checkpoint is a prefix of journal "
                            f"{(r.get('replaced') or {}).get('replaced_journal_id')}, which "
                            f"restart-journal replaced (kept in "
                            f"{(r.get('replaced') or {}).get('evidence_directory')})"
                            if r.get("external_checkpoint") == "replaced_ancestor" else
                            ", the exported checkpoint is an ancestor"
                            if r.get("external_checkpoint") else "")),
}


def _action_text(command: str, result: dict) -> str:
    """One summary line, then ``key: value`` for every other field."""
    lines = [_ACTION_LINES[command](result)]
    lines += [f"  {key}: {_field_cell(value)}" for key, value in sorted(result.items())
              if key not in ("ok", "unresolved")]
    for operation in result.get("unresolved") or []:
        lines.append(f"  open: {operation.get('operation_id')} {_cell(operation.get('tool'))} "
                     f"{operation.get('state')} {_cell(operation.get('reason'))}")
    return "\n".join(lines)


def render_text(command: str, result: dict, prefix: Optional[Sequence[str]] = None) -> str:
    """Aligned, human-readable tables for status/show/log and a readable error
    for any failed command; other results fall back to indented JSON.
    ``prefix``: how the operator commands are run here (default: stand-alone)."""
    if not result.get("ok", True):
        return _error_text(result)
    if command in _ACTION_LINES:
        return _action_text(command, result)
    if command not in ("status", "show", "log"):
        return json_text(result, 2)
    prefix = prefix or standalone_prefix(result.get("data_dir") or "")
    header = _header(result)
    if command == "status":
        if result.get("journal") == "absent":
            header += "\njournal: none yet (the profile's first protected call creates it)"
        return _status_text(result, header, prefix)
    if command == "show":
        operation = dict(result["operation"], owner=_owner_text(result["operation"]))
        if "age_seconds" in operation:
            operation["age"] = describe_age(operation["age_seconds"])
        if operation.get("lost_before"):
            operation.update(_lost_cells(operation), lost_call=lost_call_text(operation))
            operation.pop("started_at")
        keys = ("operation_id", "tool", "state", "reason", "outcome", "late_reason",
                "started_at", "lost_call", "recorded_at", "age",
                "owner", "session_id", "tool_call_id", "args_hash", "fingerprint")
        width = max(map(len, keys)) + 1
        lines = [f"{(key + ':').ljust(width)} {_cell(operation.get(key))}" for key in keys
                 if key in operation and not (key == "owner" and operation[key] is None)]
        data_dir = result.get("data_dir") or ""
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
    memory): the header, column titles, one line per event (``detail``: the
    evidence of a resolution or acknowledgement, an ``archived`` event's
    anchor; with ``--all`` a seq reads ``<journal id prefix>:<seq>``)."""
    yield _header(result)

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
        yield line([_cell(value) for value in (
            seq, iso_utc(event["timestamp_ns"]), event.get("kind"), event.get("operation_id"),
            event.get("tool"), event.get("reason"), event.get("outcome"), detail)])
