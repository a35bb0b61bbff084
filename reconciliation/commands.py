"""The operator commands: inspect, export, settle and repair the journal
(docs/cli.md).

Each ``command_*`` function takes the parsed arguments, the data directory
and the journal class to open it with (``journal.Journal``, passed by the
operator CLI: this side sits below the top-level journal and never imports
it), and returns one JSON-safe result dict, or raises :class:`CommandError` /
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
import re
import stat
import time
import uuid
from typing import Any, Callable, Optional

from ..reports.messages import (WRITING_COMMANDS, iso_utc, next_command, next_step_of,
                                operation_view)
from ..reports.status import status_report
from ..storage.durable import fsync_directory, open_regular_file, read_regular_file
from ..storage.errors import AdmissionRefused, JournalError
from ..storage.call_lock import OWNER_RUNNING, held_calls, probe_owner
from ..storage.record import CHECKPOINT_NAME, canonical_text
from .caller import Caller, os_identity, this_process
from .evidence import read_evidence
from .restart import RestartRefused, restart_journal

# journal.Journal: Journal(data_dir, readonly=..., create=...) is a context manager.
JournalClass = Callable[..., Any]

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
                        "every worker and run the `next` command (repair-checkpoint): it "
                        "re-anchors the checkpoint to the verified database and keeps every "
                        "open operation blocking",
    "owner_running": "stop the worker (or wait for the call to finish), then run `status` "
                     "again; `resolve --force` only when you know the worker can no longer "
                     "act, and say why in --evidence",
    "journal_absent": "no journal in this data directory, and it is not the data directory of "
                      "a Hermes profile (<home>/plugin-data/crash-recovery beside the home's "
                      "config.yaml): check the profile (-p PROFILE) or --data-dir you meant; "
                      "`next` runs status on the profile's own",
    "operation_not_open": "the operation is already settled: `show OP` prints its history",
    "unknown_operation": "copy the operation id from `status`",
    "repair_not_applicable": "repair-checkpoint only clears checkpoint_ahead (`found` says what "
                             "the journal shows; `ok` needs no repair); for any other "
                             "integrity verdict, stop every worker and run the `next` command "
                             "(restart-journal): it keeps the broken files as evidence and "
                             "every operation that may have run open",
    "journal_rolled_back": "events head.json vouched for are missing: a deleted "
                           "journal.sqlite3-wal, deleted events or an older copy restored. Stop "
                           "every worker and run the `next` command (restart-journal): it keeps "
                           "the broken files as evidence and every operation that may have run "
                           "open",
    "wal_missing": "the journal's write-ahead log (journal.sqlite3-wal) was deleted. While a "
                   "worker still has the journal open (workers_running), it holds the deleted "
                   "log's events, and they return to the database when it exits: stop every "
                   "worker of the profile, then run status again. With no worker left, run the "
                   "`next` command (restart-journal): it keeps the remaining files as evidence "
                   "and every operation that may have run open",
    "database_locked": "a process holds the journal's writer lock; retry in a moment. If it "
                       "stays, look at the process named in writer_pid: protected calls are "
                       "refused until it lets go",
    "nothing_to_acknowledge": "`status` lists the late outcomes that need acknowledging; an "
                              "operation that is still open is settled with `resolve`",
    "read_access_only": "this user may read the journal but not write it: run the command as "
                        "the user the workers run as (the owner of the data directory)",
}


# Hints that depend on the command that met the code: a hint names only
# options of its own command, or of a command it names before them.
COMMAND_HINTS = {
    ("archive", "owner_running"): "a protected call is out: one running now, or one an operator "
                                  "resolved whose worker still runs (status lists it under "
                                  "resolved_running): its outcome may still be recorded. Let it "
                                  "finish or stop that worker, then run `archive` again",
}


def hint_for(command: Optional[str], code: str) -> Optional[str]:
    """The ``hint`` of an error ``code`` met by ``command`` (docs/cli.md
    §Output), or None."""
    return COMMAND_HINTS.get((command, code), ERROR_HINTS.get(code))


class CommandError(Exception):
    """A refused command: ``code`` (machine-readable) and ``message``."""

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# ------------------------------------------------------------------ helpers --

def _evidence(args: argparse.Namespace) -> str:
    """The checked evidence text of ``--evidence`` or ``--evidence-file``."""
    try:
        text = read_evidence(args, EVIDENCE_MAX_CHARS)
    except ValueError as exc:
        raise CommandError("invalid_evidence", str(exc)) from None
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


# The start of an operation id, as `log --format text` and people shorten it.
_ID_PREFIX = re.compile(r"[0-9a-f][0-9a-f-]{3,34}")
# Candidates listed when a prefix names several operations.
AMBIGUOUS_SHOWN = 10


def _operation_id(text: str, data_dir: Optional[str] = None,
                  journal_class: Optional[JournalClass] = None) -> str:
    """The canonical (lower-case, hyphenated) form the guard stores; a unique
    prefix of at least 4 characters is completed from the live journal
    (docs/cli.md §Operation ids).  Raises :class:`CommandError`
    (``invalid_operation_id``, ``ambiguous_operation_id`` with
    ``candidates``) or :class:`AdmissionRefused` ``unknown_operation``."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        pass
    prefix = text.strip().lower()
    if data_dir is None or journal_class is None or not _ID_PREFIX.fullmatch(prefix):
        raise CommandError("invalid_operation_id", f"{text[:80]!r} is not an operation id (a "
                           "UUID from `status`, or its first characters)")
    with journal_class(data_dir, readonly=True, create=False) as journal:
        found = journal.operation_ids(prefix, limit=AMBIGUOUS_SHOWN + 1)
    if len(found) == 1:
        return found[0]
    if found:
        many = (f"more than {AMBIGUOUS_SHOWN}" if len(found) > AMBIGUOUS_SHOWN
                else str(len(found)))
        raise CommandError("ambiguous_operation_id", f"{prefix!r} starts {many} operation ids; "
                           "type more of it", candidates=found[:AMBIGUOUS_SHOWN])
    raise AdmissionRefused("unknown_operation", f"no operation id starting with {prefix!r} in "
                           "this journal's live segment", operation_id=prefix)


def _read_checkpoint_file(path: str) -> Any:
    """An exported checkpoint (a small JSON file; symlinks are fine, a FIFO or
    device is refused rather than waited on)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise CommandError("checkpoint_unreadable", f"{path} is not a regular file")
            return json.loads(stream.read(1 << 20))
    except OSError as exc:
        raise CommandError("checkpoint_unreadable", f"{path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError):
        raise CommandError("checkpoint_unreadable", f"{path} is not JSON (or nests too "
                                                    "deeply)") from None


def _append_operator_log(data_dir: str, entry: dict) -> Optional[str]:
    """Append one JSON line and fsync; returns an error text instead of raising
    (the journal event is already durable and is the source of truth)."""
    # One action, one line, for any reader: the separators JSON leaves raw
    # (NEL, U+2028, U+2029) break lines for many, so they are escaped too.
    text = canonical_text(entry)
    for separator in ("\x85", "\u2028", "\u2029"):
        text = text.replace(separator, f"\\u{ord(separator):04x}")
    line = (text + "\n").encode("utf-8")
    try:
        descriptor = open_regular_file(os.path.join(data_dir, OPERATOR_LOG_NAME),
                                       os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, line)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        fsync_directory(data_dir)  # the file's name, when this append created it
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


def operator_identity() -> dict:
    """Who runs this command as far as the system knows: ``{"uid", "user",
    "host"}`` (:func:`caller.os_identity`: the password database's name for the
    uid, never ``$USER``)."""
    return os_identity()


def command_caller(args: argparse.Namespace) -> Caller:
    """The :class:`caller.Caller` of a command: ``args.caller`` (the
    dashboard's request peer), else this process run from a shell (``cli``)."""
    caller = getattr(args, "caller", None)
    return caller if isinstance(caller, Caller) else this_process()


def acting_operator(args: argparse.Namespace) -> dict:
    """Who acts: the caller's identity (uid, user, host, ``via``, for the
    dashboard its request peer) plus what the caller knows of the person
    (``args.operator_via``, e.g. the dashboard's ``{"via": "dashboard",
    "dashboard_user": ...}``, docs/dashboard.md); recorded in the journal event
    and in ``operator.log``."""
    return {**command_caller(args).identity(), **(getattr(args, "operator_via", None) or {})}


def refuse_agent(command: str, args: argparse.Namespace, data_dir: str) -> None:
    """Raise :class:`CommandError` ``run_by_agent`` when a command that changes
    the journal comes from inside an agent of this profile (docs/cli.md §Who
    may settle): only a person settles, from their own shell or browser."""
    caller = command_caller(args)
    where = ("this request came from" if caller.via == "dashboard"
             else "it was run from")
    if caller.problem:
        raise CommandError("run_by_agent", f"{command} was refused: {caller.problem}, so it "
                           "cannot be told apart from an agent of this profile. Open the "
                           "dashboard in your own browser, or run the command from your own "
                           "shell")
    evidence = caller.agent_evidence(data_dir)
    if evidence is None:
        return
    own = ("open the dashboard in a browser you started yourself" if caller.via == "dashboard"
           else "run this from your own shell, not from the agent's tools")
    raise CommandError("run_by_agent", f"{command} was refused: {where} inside an agent of "
                       f"this profile (process {evidence.pid} {evidence.program!r} "
                       f"{evidence.why}). Only a person settles the journal: {own}",
                       agent=evidence.to_json())


def _log_action(data_dir: str, action: str, result: dict,
                operator: Optional[dict] = None, **entry: Any) -> None:
    """Append one ``operator.log`` line (docs/cli.md §operator.log); a failure
    is reported in ``result`` (the journal event is the source of truth)."""
    problem = _append_operator_log(data_dir, {
        "time": iso_utc(time.time_ns()), "action": action,
        "operator": operator or operator_identity(), **entry})
    if problem:
        result["operator_log_error"] = problem


def _lost_event(unresolved: tuple, lost: Optional[str]) -> str:
    """What the event dropped by ``repair-checkpoint`` can have been."""
    if lost is not None:
        window = next((operation.lost_window for operation in unresolved
                       if operation.operation_id == lost), None) or {}
        after = iso_utc(window["after_ns"]) if window.get("after_ns") else "the journal's start"
        before = iso_utc(window["before_ns"]) if window.get("before_ns") else "this repair"
        return (f"possibly a started event whose tool ran: it is back as operation {lost} "
                "(tool unknown, uncertain, reason lost_in_crash). Its call, if any, happened "
                f"after the last recorded event ({after}) and before this repair ({before}): "
                "check the real services for calls in that window, then resolve it like any "
                "other")
    return (f"an outcome or resolution of operation {unresolved[0].operation_id} "
            f"({unresolved[0].tool}); it stays {unresolved[0].state} and keeps blocking until "
            "an operator resolves it")


# ----------------------------------------------------------------- commands --

def command_status(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``status``: integrity, the gate, every unresolved operation and every
    late outcome needing attention (docs/cli.md §status).  No journal at all is
    ``journal_absent``: a mistyped --data-dir must never read as all clear."""
    with journal_class(data_dir, readonly=True) as journal:
        result = status_report(journal, data_dir)
    if not result["ok"]:
        details = {key: value for key, value in result["error"].items()
                   if key not in ("code", "message")}
        raise JournalError(result["integrity"], result["error"]["message"], **details)
    result["journal"] = "present"
    return result


def command_show(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``show OP``: one operation's state and its whole verified history."""
    operation_id = _operation_id(args.operation_id, data_dir, journal_class)
    with journal_class(data_dir, readonly=True) as journal:
        status, events = journal.history(operation_id=operation_id)
        history = [dict(payload, seq=seq) for seq, payload in events]
        archived = None
        if not history:  # an operation sealed in an archive
            found = [(anchor, seq, payload) for anchor, seq, payload
                     in journal.archived_history(operation_id)]
            history = [dict(payload, seq=seq) for _, seq, payload in found]
            archived = found[0][0]["file"] if found else None
    if not history:
        # The journal verified: the request is what failed (integrity "ok").
        raise AdmissionRefused("unknown_operation", f"no operation {operation_id} in this journal")
    shown = {operation.operation_id: operation for operation in (*status.unresolved,
                                                                  *status.attention)}
    if operation_id in shown:
        operation = operation_view(shown[operation_id], data_dir,
                                          with_owner=operation_id not in
                                          {op.operation_id for op in status.attention})
    else:
        started, last = history[0], history[-1]
        closing = [event for event in history if event["kind"] in ("returned", "resolved")]
        operation = {"operation_id": operation_id,
                     "state": closing[-1]["kind"] if closing else last["kind"],
                     "tool": started.get("tool"), "session_id": started.get("session_id"),
                     "tool_call_id": started.get("tool_call_id"),
                     "args_hash": started.get("args_hash"),
                     "fingerprint": started.get("fingerprint"),
                     "started_at": iso_utc(started["timestamp_ns"]),
                     "reason": next((event.get("reason") for event in reversed(history)
                                     if event["kind"] in ("returned", "uncertain")), None),
                     "outcome": next((event.get("outcome") for event in reversed(history)
                                      if event["kind"] == "resolved"), None),
                     "late_reason": next((event.get("reason") for event in history
                                          if event["kind"] == "late_outcome"), None),
                     "owner": None}
    for event in history:
        event["at"] = iso_utc(event["timestamp_ns"])
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "operation": operation,
            "archive": archived, "events": history, "verified": True}


def command_log(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``log [--since SEQ] [--jsonl]``: a verified export of events with seq >
    SINCE.  ``events`` is a lazy iterator that the caller prints as it goes
    (the journal stays open until then): constant memory for any length."""
    journal = journal_class(data_dir, readonly=True)
    try:
        # Every archive is verified before the first line is printed, and the
        # live rows are read as they were verified, whatever archives meanwhile.
        if args.all:
            status, events = journal.export(since=args.since)
        else:
            status, live = journal.history(since=args.since)
            events = ((None, seq, payload) for seq, payload in live)
    except BaseException:
        journal.close()
        raise

    def exported():
        try:
            # With --all each event names its segment: an archive's, or the live one.
            for anchor, seq, payload in events:
                segment = anchor["journal_id"] if anchor else status.checkpoint["journal_id"]
                yield dict(payload, seq=seq, **({"journal_id": segment} if args.all else {}))
        finally:
            journal.close()

    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "checkpoint": status.checkpoint,
            "events": exported()}


def command_verify(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``verify [--checkpoint FILE]``: full verification, optional ancestor
    check, past repairs."""
    external = _read_checkpoint_file(args.checkpoint) if args.checkpoint is not None else None
    archives = None
    with journal_class(data_dir, readonly=True, create=False) as journal:
        status = journal.verify(external)
        if args.all:
            archives = journal.verify_all()["archives"]
    repairs = [entry for entry in read_operator_log(data_dir)
               if entry.get("action") == "repair-checkpoint"]
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "checkpoint": status.checkpoint,
            "count": status.checkpoint["count"], "unresolved_count": len(status.unresolved),
            "attention_count": len(status.attention),
            "external_checkpoint": "ancestor" if external is not None else None,
            "archives_verified": archives, "repairs": repairs}


def command_checkpoint(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``checkpoint``: the current checkpoint dict exactly (to keep elsewhere)."""
    with journal_class(data_dir, readonly=True) as journal:
        return journal.checkpoint()


def command_resolve(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``resolve OP``: append ``resolved``; refuses a running owner without --force."""
    operation_id = _operation_id(args.operation_id, data_dir, journal_class)
    evidence = _evidence(args)
    owner = probe_owner(data_dir, operation_id)
    if owner["owner"] == OWNER_RUNNING and not args.force:
        raise CommandError(
            "owner_running",
            f"the worker that started {operation_id} still runs (pid {owner['pid']}); its "
            "outcome is not final yet. Stop every worker of this profile first, or force the "
            "resolution with evidence that says why", owner=owner)
    forced = bool(args.force and owner["owner"] == OWNER_RUNNING)
    operator = acting_operator(args)
    with journal_class(data_dir, create=False) as journal:
        resolution = journal.resolve(operation_id, outcome=args.outcome, evidence=evidence,
                                     operator=operator, forced=forced)
    previous = resolution.operation
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, "resolved": operation_id,
              "outcome": args.outcome, "previous_state": previous.state, "tool": previous.tool,
              "checkpoint": resolution.checkpoint_after, "forced": forced}
    _log_action(data_dir, "resolve", result, operator, operation_id=operation_id,
                outcome=args.outcome,
                evidence=evidence, forced=forced, owner=owner["owner"],
                checkpoint_before=resolution.checkpoint_before,
                checkpoint_after=resolution.checkpoint_after)
    return result


def command_acknowledge(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``acknowledge OP``: an operator has seen a late outcome (docs/cli.md
    §acknowledge); the operation stops needing attention."""
    operation_id = _operation_id(args.operation_id, data_dir, journal_class)
    evidence = _evidence(args)
    operator = acting_operator(args)
    with journal_class(data_dir, create=False) as journal:
        resolution = journal.acknowledge(operation_id, evidence=evidence, operator=operator)
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, "acknowledged": operation_id,
              "late_reason": resolution.operation.late_reason, "tool": resolution.operation.tool,
              "checkpoint": resolution.checkpoint_after}
    _log_action(data_dir, "acknowledge", result, operator, operation_id=operation_id,
                evidence=evidence,
                late_reason=resolution.operation.late_reason,
                checkpoint_before=resolution.checkpoint_before,
                checkpoint_after=resolution.checkpoint_after)
    return result


def command_repair(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``repair-checkpoint``: clear checkpoint_ahead, never opening the gate
    for an operation whose tool may have run."""
    evidence = _evidence(args)
    with journal_class(data_dir, create=False) as journal:
        before, after, lost = journal.repair_checkpoint()
        unresolved = journal.status().unresolved
    lost_event = _lost_event(unresolved, lost)
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, "repaired": CHECKPOINT_NAME,
              "checkpoint_before": before, "checkpoint_after": after, "lost_event": lost_event,
              "lost_operation": lost,
              "unresolved": [operation_view(operation, data_dir)
                             for operation in unresolved]}
    _log_action(data_dir, "repair-checkpoint", result, acting_operator(args), evidence=evidence,
                checkpoint_before=before, checkpoint_after=after, lost_event=lost_event,
                lost_operation=lost)
    return result


def command_archive(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``archive``: seal the live history into a read-only archive file and
    start a new segment anchored to it (docs/cli.md §archive).  Refused while an
    operation is open, a late outcome awaits acknowledgement, or a protected
    call is running."""
    # A worker still running a call (one an operator resolved too) may yet
    # record its outcome; Journal.archive checks again under the writer lock.
    holder = next(iter(held_calls(data_dir)), None)
    if holder is not None:
        raise CommandError("owner_running", f"a protected call is running (pid "
                           f"{holder.get('pid')}, operation {holder.get('operation_id')}); "
                           "archive when it has finished", owner=holder)
    with journal_class(data_dir, create=False) as journal:
        sealed = journal.archive()
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, **sealed}
    _log_action(data_dir, "archive", result, acting_operator(args), archived=sealed["archived"],
                checkpoint_before=sealed["checkpoint_before"],
                checkpoint_after=sealed["checkpoint_after"])
    return result


def command_restart_journal(args: argparse.Namespace, data_dir: str,
                            journal_class: JournalClass) -> dict:
    """``restart-journal``: keep a journal that fails verification as evidence
    and start a new one that carries its open operations over (docs/cli.md
    §restart-journal)."""
    evidence = _evidence(args)
    operator = acting_operator(args)
    try:
        done = restart_journal(data_dir, journal_class, evidence=evidence, operator=operator,
                               now_ns=time.time_ns())
    except RestartRefused as exc:
        raise CommandError(exc.code, exc.message, **exc.details) from None
    with journal_class(data_dir, readonly=True, create=False) as journal:
        unresolved = journal.status().unresolved
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, **done,
              "unresolved": [operation_view(operation, data_dir) for operation in unresolved]}
    _log_action(data_dir, "restart-journal", result, operator, evidence=evidence,
                **{key: done[key] for key in ("found", "replaced_journal_id",
                                              "last_verified_checkpoint", "unverified",
                                              "evidence_directory", "carried_over",
                                              "lost_operation", "checkpoint_after")})
    return result


COMMANDS = {"status": command_status, "show": command_show, "log": command_log,
            "verify": command_verify, "checkpoint": command_checkpoint,
            "resolve": command_resolve, "acknowledge": command_acknowledge,
            "repair-checkpoint": command_repair, "archive": command_archive,
            "restart-journal": command_restart_journal}


def run_command(command: "str | Callable[..., dict]", args: argparse.Namespace, data_dir: str,
                journal_class: JournalClass) -> tuple:
    """Run one command (a name in :data:`COMMANDS`, or a function of the same
    signature): ``(document, ok)``.  A refusal or an integrity verdict becomes
    the error document of docs/cli.md §Output (``{"ok": false, "integrity"?,
    "error": {"code", "message", "hint"?}}``); the operator CLI and the
    dashboard answer with exactly this."""
    function = COMMANDS[command] if isinstance(command, str) else command
    try:
        if command in WRITING_COMMANDS:
            refuse_agent(command, args, data_dir)
        return function(args, data_dir, journal_class), True
    except CommandError as exc:
        result = {"ok": False, "error": {"code": exc.code, "message": exc.message, **exc.details}}
    except AdmissionRefused as exc:
        # The journal verified; the request itself was refused (e.g. already resolved).
        result = {"ok": False, "integrity": "ok", "error": exc.to_json()}
    except JournalError as exc:
        # repair_not_applicable carries the state it found (``found``), which is
        # the journal's real integrity.
        result = {"ok": False, "integrity": exc.details.get("found", exc.code),
                  "error": exc.to_json()}
    hint = hint_for(command if isinstance(command, str) else None, result["error"]["code"])
    if hint:
        result["error"]["hint"] = hint
    error = result["error"]
    error["next"] = next_command((), next_step_of(error))
    return result, False
