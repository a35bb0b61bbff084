#!/usr/bin/env python3
"""Operator CLI for the crash-recovery journal (SPEC §11).

    python operator_cli.py [--data-dir DIR] [--format json|text] COMMAND ...

Commands: ``status``, ``show OP``, ``log [--since SEQ] [--jsonl]``,
``verify [--checkpoint FILE]``, ``checkpoint``,
``resolve OP --outcome completed|not_applied --evidence TEXT [--force]``,
``repair-checkpoint --evidence TEXT``.

Output is one JSON document on stdout (``--format text`` prints aligned tables
for status/show/log instead; ``log --jsonl`` prints one event per line).  Exit
0 on success with valid integrity, 1 on any error, usage errors included (they
print a JSON error too).  A failed command changes nothing on disk.  ``status``,
``show``, ``log``, ``verify`` and ``checkpoint`` open the database read-only and
never create a journal, marker or checkpoint.

Every ``resolve`` and ``repair-checkpoint`` is also appended to ``operator.log``
beside the journal (one JSON line per action: time, action, evidence, the
checkpoint before and after), which ``verify`` reports.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unicodedata
import uuid
from typing import Any, Optional, Sequence

try:  # package (pip install: console script) or top-level (python operator_cli.py)
    from . import report
    from .journal import (CHECKPOINT_NAME, AdmissionRefused, Journal, JournalError,
                          canonical_text, open_regular_file, read_regular_file)
    from .owner import OWNER_RUNNING, probe_owner
except ImportError:
    import report  # type: ignore[no-redef]
    from journal import (CHECKPOINT_NAME, AdmissionRefused, Journal,  # type: ignore[no-redef]
                         JournalError, canonical_text, open_regular_file, read_regular_file)
    from owner import OWNER_RUNNING, probe_owner  # type: ignore[no-redef]

OPERATOR_LOG_NAME = "operator.log"
# Evidence is stored verbatim in the journal forever; 64 KiB holds any receipt
# or log excerpt a person would paste, and bounds what one typo can add.
EVIDENCE_MAX_CHARS = 65536
# Enough to re-run a verification on many past repairs, bounded so a huge log
# cannot make `verify` slow.
OPERATOR_LOG_MAX_LINES = 10000
OPERATOR_LOG_MAX_BYTES = 16 * 1024 * 1024
# The next step for a person who meets an error code (added to the error as
# ``hint``); codes not listed need no more than their message.
ERROR_HINTS = {
    "checkpoint_ahead": "if the host or worker crashed while writing (the usual cause), stop "
                        "every worker and run `repair-checkpoint --evidence TEXT`; it re-anchors "
                        "head.json to the verified database and keeps every open operation "
                        "blocking",
    "owner_running": "stop the worker (or wait for the call to finish), then run `status` again; "
                     "use --force only when you know the worker can no longer act, and say why "
                     "in --evidence",
    "journal_absent": "no journal in this directory: check --data-dir (or HERMES_HOME). A "
                      "fresh profile has none until its first protected call; anywhere else "
                      "this is the wrong directory",
    "operation_not_open": "the operation is already settled: `show OP` prints its history",
    "unknown_operation": "copy the operation id from `status`",
    "repair_not_applicable": "repair-checkpoint only clears checkpoint_ahead; any other "
                             "integrity failure needs investigation (restore from backup, compare "
                             "with an exported checkpoint using `verify --checkpoint FILE`)",
    "database_locked": "a worker holds the journal's writer lock; retry in a moment",
}


class CommandError(Exception):
    """A refused command: ``code`` (machine-readable) and ``message``."""

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as :class:`CommandError` (JSON, exit 1)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Raise instead of printing usage and exiting 2."""
        raise CommandError("usage", f"{message} (see --help)")


def default_data_dir() -> str:
    """``$HERMES_HOME/plugin-data/crash-recovery`` (HERMES_HOME defaults to ~/.hermes)."""
    home = os.environ.get("HERMES_HOME") or os.path.join(os.path.expanduser("~"), ".hermes")
    return os.path.join(home, "plugin-data", "crash-recovery")


# The procedure, for a person who has only --help at hand.
RUNBOOK_EPILOG = """\
when protected calls are blocked:
  1. stop every worker (gateway, agents) of this profile
  2. status --format text        what is unresolved, and whether its owner still runs
  3. show OP --format text       the operation's whole history
  4. check the real service (receipt, request log, database row) for that call
  5. resolve OP --outcome completed|not_applied --evidence "what you checked"
     (cannot tell? leave it unresolved: the gate stays closed, nothing is repeated)
integrity errors: verify; checkpoint_ahead after a crash: repair-checkpoint --evidence TEXT
output: one JSON document (exit 0 ok, 1 error); --format text for status/show/log
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every command (usage errors raise CommandError)."""
    parser = _Parser(prog="operator_cli.py",
                     description="Inspect and settle the crash-recovery journal (SPEC §11).",
                     epilog=RUNBOOK_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None,
                        help="the profile's plugin data directory "
                             "(default: $HERMES_HOME/plugin-data/crash-recovery)")
    parser.add_argument("--format", choices=("json", "text"), default="json",
                        help="json (default) or aligned text tables for status/show/log")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # `status --format text --data-dir D` works too: people put options after the command.
    # SUPPRESS keeps a value given before the command when none is given after.
    format_option = _Parser(add_help=False)
    format_option.add_argument("--format", choices=("json", "text"), default=argparse.SUPPRESS,
                               help="json (default) or aligned text tables")
    format_option.add_argument("--data-dir", default=argparse.SUPPRESS,
                               help="as before the command")
    commands.add_parser("status", help="integrity and unresolved operations",
                        parents=[format_option])
    show = commands.add_parser("show", help="one operation's verified history",
                               parents=[format_option])
    show.add_argument("operation_id", help="an operation id from `status` or `log`")
    log = commands.add_parser("log", help="verified export of events", parents=[format_option])
    log.add_argument("--since", type=int, default=0, help="only events with seq > SINCE")
    log.add_argument("--jsonl", action="store_true", help="one JSON event per line")
    verify = commands.add_parser("verify", help="full verification", parents=[format_option])
    verify.add_argument("--checkpoint", help="an exported checkpoint that must be an ancestor")
    commands.add_parser("checkpoint", help="print the current checkpoint (keep it elsewhere)",
                        parents=[format_option])
    resolve = commands.add_parser("resolve", help="settle a pending or uncertain operation",
                                  parents=[format_option])
    resolve.add_argument("operation_id", help="an operation id from `status`")
    resolve.add_argument("--outcome", required=True, choices=("completed", "not_applied"),
                         help="completed: the side effect happened; not_applied: it did not "
                              "(future calls may run; nothing is replayed)")
    resolve.add_argument("--evidence", required=True,
                         help="what you checked in the real service (receipt, log line, row)")
    resolve.add_argument("--force", action="store_true",
                         help="resolve although the operation's worker still runs; the "
                              "evidence must say why")
    repair = commands.add_parser("repair-checkpoint",
                                 help="re-anchor head.json after a crash between replace and commit",
                                 parents=[format_option])
    repair.add_argument("--evidence", required=True, help="why this repair is justified")
    return parser


# ------------------------------------------------------------------ helpers --

def _evidence(text: str) -> str:
    if not text.strip():
        raise CommandError("invalid_evidence", "evidence must be non-empty text")
    if len(text) > EVIDENCE_MAX_CHARS:
        raise CommandError("invalid_evidence",
                           f"evidence has {len(text)} characters; at most {EVIDENCE_MAX_CHARS}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CommandError("invalid_evidence",
                           "evidence is not valid UTF-8 (check the shell's locale or the pasted "
                           "bytes)") from None
    return text


def _operation_id(text: str) -> str:
    """The canonical (lower-case, hyphenated) form the guard stores."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise CommandError("invalid_operation_id",
                           f"{text[:80]!r} is not an operation id (a UUID from `status`)") from None


def _read_checkpoint_file(path: str) -> Any:
    try:
        with open(path, "rb") as stream:
            return json.loads(stream.read(1 << 20))
    except OSError as exc:
        raise CommandError("checkpoint_unreadable", f"{path}: {exc.strerror or exc}") from None
    except ValueError:
        raise CommandError("checkpoint_unreadable", f"{path} is not JSON") from None


def _append_operator_log(data_dir: str, entry: dict) -> Optional[str]:
    """Append one JSON line and fsync; returns an error text instead of raising
    (the journal event is already durable and is the source of truth)."""
    line = (canonical_text(entry) + "\n").encode("utf-8")
    try:
        descriptor = open_regular_file(os.path.join(data_dir, OPERATOR_LOG_NAME),
                                       os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, line)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as exc:
        return f"{OPERATOR_LOG_NAME} not written: {exc.strerror or exc}"
    return None


def read_operator_log(data_dir: str) -> list:
    """Past operator actions (dicts), oldest first; unreadable lines are
    reported as ``{"unreadable_line": N}``."""
    path = os.path.join(data_dir, OPERATOR_LOG_NAME)
    try:
        lines = read_regular_file(path, OPERATOR_LOG_MAX_BYTES).splitlines()
        lines = lines[-OPERATOR_LOG_MAX_LINES:]
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [{"unreadable": str(exc)}]
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entries.append(json.loads(line))
        except ValueError:
            entries.append({"unreadable_line": number})
    return entries


def _lost_event(unresolved: tuple) -> str:
    """What the uncommitted event dropped by ``repair-checkpoint`` can have been.

    Admission refuses while any operation is open, so with none open the lost
    event can only be a ``started`` (its tool never ran: downstream starts after
    COMMIT); with one open it was that operation's outcome or resolution, and
    the operation stays open and blocking."""
    if not unresolved:
        return ("most likely a started event whose tool never ran (a crash before its commit: "
                "downstream starts only after it). A committed event deleted on purpose, or a "
                "database restored from a copy one event old, looks the same: if that is "
                "possible, check the real service for a call at that time")
    return (f"an outcome or resolution of operation {unresolved[0].operation_id} "
            f"({unresolved[0].tool}); it stays {unresolved[0].state} and keeps blocking until "
            "an operator resolves it")


# ----------------------------------------------------------------- commands --

def command_status(args: argparse.Namespace, data_dir: str) -> dict:
    """``status``: integrity plus every unresolved operation (exit 0 even when
    some are open).  No journal at all is exit 1 ``journal_absent``: a mistyped
    --data-dir must never read as "nothing is blocked"."""
    with Journal(data_dir, readonly=True) as journal:
        result = report.status_report(journal, data_dir)
    if not result["ok"]:
        details = {key: value for key, value in result["error"].items()
                   if key not in ("code", "message")}
        raise JournalError(result["integrity"], result["error"]["message"], **details)
    result["journal"] = "present"
    return result


def command_show(args: argparse.Namespace, data_dir: str) -> dict:
    """``show OP``: one operation's state and its whole verified history."""
    operation_id = _operation_id(args.operation_id)
    with Journal(data_dir, readonly=True) as journal:
        status, events = journal.history(operation_id=operation_id)
        history = [dict(payload, seq=seq) for seq, payload in events]
    if not history:
        raise CommandError("unknown_operation", f"no operation {operation_id} in this journal")
    open_operation = next((operation for operation in status.unresolved
                           if operation.operation_id == operation_id), None)
    if open_operation is not None:
        operation = report.operation_view(open_operation, data_dir)
    else:
        started, last = history[0], history[-1]
        reason = next((event.get("reason") for event in reversed(history) if "reason" in event),
                      None)
        operation = {"operation_id": operation_id, "state": last["kind"], "tool": started.get("tool"),
                     "session_id": started.get("session_id"),
                     "tool_call_id": started.get("tool_call_id"),
                     "args_hash": started.get("args_hash"),
                     "fingerprint": started.get("fingerprint"),
                     "started_at": report.iso_utc(started["timestamp_ns"]),
                     "reason": reason, "outcome": last.get("outcome"), "owner": None}
    for event in history:
        event["at"] = report.iso_utc(event["timestamp_ns"])
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "operation": operation,
            "events": history}


def command_log(args: argparse.Namespace, data_dir: str) -> dict:
    """``log [--since SEQ] [--jsonl]``: a verified export of events with seq >
    SINCE.  With ``--jsonl`` the events stay a lazy iterator that :func:`main`
    prints line by line (the journal stays open until then), so a long journal
    is streamed rather than held in memory."""
    journal = Journal(data_dir, readonly=True)
    status, events = journal.history(since=args.since)
    exported = (dict(payload, seq=seq) for seq, payload in events)
    if not args.jsonl:
        exported = list(exported)
        journal.close()
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "checkpoint": status.checkpoint,
            "events": exported}


def command_verify(args: argparse.Namespace, data_dir: str) -> dict:
    """``verify [--checkpoint FILE]``: full verification, optional ancestor check, past repairs."""
    external = _read_checkpoint_file(args.checkpoint) if args.checkpoint is not None else None
    with Journal(data_dir, readonly=True, create=False) as journal:
        status = journal.verify(external)
    repairs = [entry for entry in read_operator_log(data_dir)
               if entry.get("action") == "repair-checkpoint"]
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "checkpoint": status.checkpoint,
            "count": status.checkpoint["count"], "unresolved_count": len(status.unresolved),
            "external_checkpoint": "ancestor" if external is not None else None,
            "repairs": repairs}


def command_checkpoint(args: argparse.Namespace, data_dir: str) -> dict:
    """``checkpoint``: the current checkpoint dict exactly (to keep elsewhere)."""
    with Journal(data_dir, readonly=True) as journal:
        return journal.checkpoint()


def command_resolve(args: argparse.Namespace, data_dir: str) -> dict:
    """``resolve OP``: append ``resolved``; refuses a running owner without --force."""
    operation_id = _operation_id(args.operation_id)
    evidence = _evidence(args.evidence)
    owner = probe_owner(data_dir, operation_id)
    if owner["owner"] == OWNER_RUNNING and not args.force:
        raise CommandError(
            "owner_running",
            f"the worker that started {operation_id} still runs (pid {owner['pid']}); its "
            "outcome is not final yet. Stop every worker of this profile first, or pass "
            "--force with evidence that says why", owner=owner)
    with Journal(data_dir, create=False) as journal:
        before = journal.checkpoint()
        previous = journal.resolve(operation_id, outcome=args.outcome, evidence=evidence)
        after = journal.checkpoint()
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, "resolved": operation_id,
              "outcome": args.outcome, "previous_state": previous.state, "tool": previous.tool,
              "checkpoint": after, "forced": bool(args.force and owner["owner"] == OWNER_RUNNING)}
    problem = _append_operator_log(data_dir, {
        "time": report.iso_utc(time.time_ns()), "action": "resolve", "operation_id": operation_id,
        "outcome": args.outcome, "evidence": evidence, "forced": result["forced"],
        "owner": owner["owner"], "checkpoint_before": before, "checkpoint_after": after})
    if problem:
        result["operator_log_error"] = problem
    return result


def command_repair(args: argparse.Namespace, data_dir: str) -> dict:
    """``repair-checkpoint``: re-anchor head.json in the checkpoint_ahead state only."""
    evidence = _evidence(args.evidence)
    with Journal(data_dir, create=False) as journal:
        before, after = journal.repair_checkpoint()
        unresolved = journal.status().unresolved
    lost_event = _lost_event(unresolved)
    problem = _append_operator_log(data_dir, {
        "time": report.iso_utc(time.time_ns()), "action": "repair-checkpoint",
        "evidence": evidence, "checkpoint_before": before, "checkpoint_after": after,
        "lost_event": lost_event})
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, "repaired": CHECKPOINT_NAME,
              "checkpoint_before": before, "checkpoint_after": after, "lost_event": lost_event,
              "unresolved": [report.operation_view(operation, data_dir)
                             for operation in unresolved]}
    if problem:
        result["operator_log_error"] = problem
    return result


COMMANDS = {"status": command_status, "show": command_show, "log": command_log,
            "verify": command_verify, "checkpoint": command_checkpoint,
            "resolve": command_resolve, "repair-checkpoint": command_repair}


# ------------------------------------------------------------------- output --

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


def _json_text(document: Any, indent: Optional[int]) -> str:
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


def render_text(command: str, result: dict) -> str:
    """Aligned, human-readable tables for status/show/log and a readable error
    for any failed command; other results fall back to indented JSON."""
    if not result.get("ok", True):
        return _error_text(result)
    if command not in ("status", "show", "log"):
        return _json_text(result, 2)
    data_dir = result.get("data_dir") or ""
    checkpoint = result.get("checkpoint") or {}
    header = (f"integrity: {result.get('integrity')}   data dir: {data_dir}\n"
              f"events: {checkpoint.get('count', 0)}   head: {checkpoint.get('head', '-')}")
    if command == "status":
        rows = [dict(row, age=report.describe_age(row["age_seconds"]), owner=_owner_text(row))
                for row in result["unresolved"]]
        if not rows:
            return header + "\nno unresolved operations: protected calls may run"
        first = rows[0]["operation_id"]
        return "\n".join([
            header,
            f"{len(rows)} unresolved operation(s) block every protected call in this profile:",
            _table(rows, ("operation_id", "tool", "state", "reason", "started_at", "age",
                          "owner", "session_id", "tool_call_id", "args_hash")),
            "",
            "next: stop every worker of this profile (owner must not be running), check the "
            "real service for this call, then record what you found:",
            "  " + report.operator_command(data_dir, "show", first),
            "  " + report.operator_command(data_dir, "resolve", first, "--outcome",
                                           "<completed|not_applied>", "--evidence",
                                           "<what you checked>"),
            "If you cannot establish the outcome, leave it unresolved."])
    if command == "show":
        operation = dict(result["operation"], owner=_owner_text(result["operation"]))
        if "age_seconds" in operation:
            operation["age"] = report.describe_age(operation["age_seconds"])
        keys = ("operation_id", "tool", "state", "reason", "outcome", "started_at", "age",
                "owner", "session_id", "tool_call_id", "args_hash", "fingerprint")
        width = max(map(len, keys)) + 1
        lines = [f"{(key + ':').ljust(width)} {_cell(operation.get(key))}" for key in keys
                 if key in operation and not (key == "owner" and operation[key] is None)]
        return "\n".join([f"integrity: {result.get('integrity')}   data dir: {data_dir}", "",
                          *lines, "", _table(result["events"], (
                              "seq", "at", "kind", "reason", "outcome", "result_hash",
                              "evidence"))])
    tools = {event["operation_id"]: event["tool"] for event in result["events"] if "tool" in event}
    events = [dict(event, at=report.iso_utc(event["timestamp_ns"]),
                   tool=tools.get(event["operation_id"])) for event in result["events"]]
    return header + "\n" + _table(events, (
        "seq", "at", "kind", "operation_id", "tool", "reason", "outcome", "evidence"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; print its result; return the exit code (0 or 1)."""
    parser = build_parser()
    output_format, command = "json", None
    try:
        args = parser.parse_args(argv)
        output_format, command = args.format, args.command
        if command is None:
            raise CommandError("usage", "a command is required (see --help)")
        if args.data_dir is not None and not args.data_dir.strip():
            raise CommandError("usage", "--data-dir is empty (an unset shell variable?)")
        data_dir = os.path.abspath(args.data_dir or default_data_dir())
        result = COMMANDS[command](args, data_dir)
        exit_code = 0
    except CommandError as exc:
        result, exit_code = {"ok": False, "error": {"code": exc.code, "message": exc.message,
                                                    **exc.details}}, 1
    except AdmissionRefused as exc:
        # The journal verified; the request itself was refused (e.g. already resolved).
        result, exit_code = {"ok": False, "integrity": "ok", "error": exc.to_json()}, 1
    except JournalError as exc:
        # repair_not_applicable carries the state it found (``found``), which is
        # the journal's real integrity.
        result, exit_code = {"ok": False, "integrity": exc.details.get("found", exc.code),
                             "error": exc.to_json()}, 1
    if exit_code and result["error"]["code"] in ERROR_HINTS:
        result["error"]["hint"] = ERROR_HINTS[result["error"]["code"]]
    if command == "log" and exit_code == 0 and getattr(args, "jsonl", False):
        for event in result["events"]:
            print(_json_text(event, None))
        return 0
    if output_format == "text":
        print(render_text(command or "", result))
    else:
        print(_json_text(result, 1))
    return exit_code


def run() -> int:
    """Console entry point: :func:`main`, quiet when stdout is closed early
    (``log --jsonl | head``)."""
    try:
        exit_code = main()
        sys.stdout.flush()
        return exit_code
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # stdout itself failed (a full disk): nothing to print to
        print(f"operator_cli.py: cannot write the result: {exc.strerror or exc}",
              file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run())
