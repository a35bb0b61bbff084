"""The operator commands: inspect, export, settle and repair the journal
(docs/cli.md).

Each ``command_*`` function takes the parsed arguments and the data directory
and returns one JSON-safe result dict, or raises :class:`CommandError` /
:class:`errors.JournalError`.  A command that fails changes nothing on disk.
``status``, ``show``, ``log``, ``verify`` and ``checkpoint`` open the database
read-only and never create a journal, marker or checkpoint.  Every ``resolve``
and ``repair-checkpoint`` is also appended to ``operator.log`` beside the
journal (docs/cli.md §operator.log).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any, Optional

from . import report
from .durable import open_regular_file, read_regular_file
from .errors import JournalError
from .journal import Journal
from .owner import OWNER_RUNNING, probe_owner
from .record import CHECKPOINT_NAME, canonical_text

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


