"""The operator commands (docs/cli.md).  Each ``command_*`` takes the parsed
arguments, the data directory and the journal class (``journal.Journal``, passed
in: this side never imports the top level) and returns a JSON-safe dict or raises
:class:`CommandError` / :class:`errors.JournalError`; a failed command changes
nothing on disk, and reading commands open the database read-only.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator, Optional

from ..reports.hints import hint_for
from ..reports.messages import (INTEGRITY_VERDICTS, WINDOW_START_WORDS, WRITING_COMMANDS, dated,
                                iso_utc, next_command, next_step_of, operation_view)
from ..reports.status import status_report
from ..storage.database import translate_sqlite_error
from ..storage.durable import storage_error
from ..storage.chain import operation_from_started
from ..storage.errors import AdmissionRefused, IntegrityError, JournalError
from ..storage.call_lock import (OWNER_RUNNING, OWNER_UNKNOWN, OWNERS_KNOWABLE, held_calls,
                                  probe_owner)
from ..storage.log_lines import plugin_logger
from ..storage.record import CHECKPOINT_NAME, canonical_text
from .audit import acting_operator, command_caller, log_action, read_operator_log
from .evidence import read_evidence
from .replaced import check_replaced_export
from .restart import RESTART_TOOL, restart_journal
from .switch import RESTART_INTENT_NAME, RestartRefused, pending_restart

logger = plugin_logger(__name__)

# journal.Journal: Journal(data_dir, readonly=..., create=...) is a context manager.
JournalClass = Callable[..., Any]

# Evidence is stored verbatim in the journal forever; 64 KiB holds any receipt
# or log excerpt a person would paste, and bounds what one typo can add.
EVIDENCE_MAX_CHARS = 65536


class CommandError(Exception):
    """A refused command: ``code`` (machine-readable) and ``message``."""

    def __init__(self, code: str, message: str, **details: Any):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


def refuse_agent(command: str, args: argparse.Namespace, data_dir: str) -> None:
    """Raise :class:`CommandError` ``run_by_agent`` when a command that changes
    the journal comes from inside an agent of this profile (docs/cli.md §Who
    may settle): only a person settles, from their own shell or browser."""
    caller = command_caller(args)
    where = "this request came from" if caller.via == "dashboard" else "it was run from"
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
    """The canonical form the guard stores; a unique prefix of at least 4
    characters is completed from the live journal (docs/cli.md §Operation
    ids).  Raises :class:`CommandError` (``invalid_operation_id``,
    ``ambiguous_operation_id``) or :class:`AdmissionRefused`."""
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


def _lost_event(unresolved: tuple, lost: Optional[str]) -> str:
    """What the event dropped by ``repair-checkpoint`` can have been."""
    if lost is not None:
        window = next((operation.lost_window for operation in unresolved
                       if operation.operation_id == lost), None) or {}
        source = {"last_verified_event": "the last recorded event"}.get(
            window.get("after_source"), WINDOW_START_WORDS.get(window.get("after_source"), ""))
        after = (f"after {source} ({iso_utc(window['after_ns'])})" if window.get("after_ns")
                 else "at a time nothing recorded bounds")
        before = iso_utc(window["before_ns"]) if window.get("before_ns") else "now"
        return (f"possibly a started event whose tool ran: it is back as operation {lost} "
                "(tool unknown, uncertain, reason lost_in_crash). Its call, if any, happened "
                f"{after} and before this repair ({before}): check the real services for calls "
                "in that window, then resolve it like any other")
    return (f"an outcome or resolution of operation {unresolved[0].operation_id} "
            f"({unresolved[0].tool}); it stays {unresolved[0].state} and keeps blocking until "
            "an operator resolves it")


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
            found = list(journal.archived_history(operation_id))
            history = [dict(payload, seq=seq) for _, seq, payload in found]
            archived = found[0][0]["file"] if found else None
    if not history:
        # The journal verified: the request is what failed (integrity "ok").
        raise AdmissionRefused("unknown_operation", f"no operation {operation_id} in this journal")
    shown = {operation.operation_id: operation for operation in (*status.unresolved,
                                                                  *status.attention)}
    if operation_id in shown:
        attention = {operation.operation_id for operation in status.attention}
        operation = operation_view(shown[operation_id], data_dir,
                                   with_owner=operation_id not in attention)
    else:
        started, last = history[0], history[-1]
        closing = [event for event in history if event["kind"] in ("returned", "resolved")]
        operation = {"operation_id": operation_id,
                     "state": closing[-1]["kind"] if closing else last["kind"],
                     **{key: started.get(key) for key in ("tool", "session_id", "tool_call_id",
                                                          "args_hash", "fingerprint")},
                     "started_ns": started["timestamp_ns"],
                     "reason": next((event.get("reason") for event in reversed(history)
                                     if event["kind"] in ("returned", "uncertain")), None),
                     "outcome": next((event.get("outcome") for event in reversed(history)
                                      if event["kind"] == "resolved"), None),
                     "late_reason": next((event.get("reason") for event in history
                                          if event["kind"] == "late_outcome"), None),
                     "owner": None}
        window = operation_from_started(operation_id, canonical_text(started).encode("utf-8"),
                                        started["seq"], state=operation["state"], reason=None,
                                        last_seq=started["seq"]).lost_window
        operation = dated(dict(operation, **({"lost_window": window} if window else {})))
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
    check (an export of a journal that ``restart-journal`` replaced is checked
    against what the restart verified of it), past repairs."""
    external = _read_checkpoint_file(args.checkpoint) if args.checkpoint is not None else None
    archives, replaced = None, None
    with journal_class(data_dir, readonly=True, create=False) as journal:
        try:
            status = journal.verify(external)
        except IntegrityError as exc:
            if exc.code != "checkpoint_not_ancestor":
                raise
            replaced = _replaced_ancestor(journal, data_dir, external)
            if replaced is None:
                raise
            status = journal.verify()
        if args.all:
            archives = journal.verify_all()["archives"]
    repairs = [entry for entry in read_operator_log(data_dir)
               if entry.get("action") == "repair-checkpoint"]
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, "checkpoint": status.checkpoint,
            "count": status.checkpoint["count"], "unresolved_count": len(status.unresolved),
            "attention_count": len(status.attention),
            "external_checkpoint": (None if external is None else
                                    "replaced_ancestor" if replaced else "ancestor"),
            "replaced": replaced, "archives_verified": archives, "repairs": repairs}


def _restart_records(journal: Any) -> Iterator[tuple]:
    """``(bookkeeping operation id, restarted_from)`` of every restart the
    journal's verified history records, archives included (oldest first)."""
    try:
        archived = list(journal.archived_history())
    except JournalError:  # an archive that fails is verify --all's finding
        archived = []
    _, events = journal.history()
    for payload in [payload for _, _, payload in archived] + [payload for _, payload in events]:
        if (payload.get("kind") == "started" and payload.get("tool") == RESTART_TOOL
                and isinstance(payload.get("restarted_from"), dict)):
            yield payload["operation_id"], payload["restarted_from"]


def _replaced_ancestor(journal: Any, data_dir: str, external: dict) -> Optional[dict]:
    """When ``external`` is an export of a journal a restart replaced: what
    :func:`replaced.check_replaced_export` found (raises its verdicts with the
    restart's bookkeeping operation in ``operation_id``); None otherwise."""
    for operation_id, record in _restart_records(journal):
        if record.get("journal_id") != external["journal_id"]:
            continue
        scratch = tempfile.mkdtemp(prefix="crash-recovery-verify-")  # read-only: never beside
        try:
            return dict(check_replaced_export(data_dir, record, external, scratch),
                        restart_operation=operation_id)
        except IntegrityError as exc:
            exc.details["operation_id"] = operation_id
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return None


def command_checkpoint(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``checkpoint``: the current checkpoint dict exactly (to keep elsewhere)."""
    with journal_class(data_dir, readonly=True) as journal:
        return journal.checkpoint()


def command_resolve(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``resolve OP``: append ``resolved``; refuses a running owner without --force."""
    operation_id = _operation_id(args.operation_id, data_dir, journal_class)
    evidence = _evidence(args)
    owner = probe_owner(data_dir, operation_id)
    may_run = owner["owner"] == OWNER_RUNNING or (owner["owner"] == OWNER_UNKNOWN
                                                  and OWNERS_KNOWABLE)
    if may_run and not args.force:
        runs = (f"still runs (pid {owner['pid']})" if owner["owner"] == OWNER_RUNNING else
                f"may still run: a call lock in the data directory cannot be read, or "
                f"something else stands at calls/{operation_id}")
        raise CommandError(
            "owner_running",
            f"the worker that started {operation_id} {runs}; its "
            "outcome is not final yet. Stop every worker of this profile first, or force the "
            "resolution with evidence that says why", owner=owner)
    forced = bool(args.force and may_run)
    operator = acting_operator(args)
    with journal_class(data_dir, create=False) as journal:
        resolution = journal.resolve(operation_id, outcome=args.outcome, evidence=evidence,
                                     operator=operator, forced=forced)
    previous = resolution.operation
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, "resolved": operation_id,
              "outcome": args.outcome, "previous_state": previous.state, "tool": previous.tool,
              "checkpoint": resolution.checkpoint_after, "forced": forced}
    log_action(data_dir, "resolve", result, operator, operation_id=operation_id,
               outcome=args.outcome, evidence=evidence, forced=forced, owner=owner["owner"],
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
    log_action(data_dir, "acknowledge", result, operator, operation_id=operation_id,
               evidence=evidence, late_reason=resolution.operation.late_reason,
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
              "unresolved": [operation_view(operation, data_dir) for operation in unresolved]}
    log_action(data_dir, "repair-checkpoint", result, acting_operator(args), evidence=evidence,
               checkpoint_before=before, checkpoint_after=after, lost_event=lost_event,
               lost_operation=lost)
    return result


def command_archive(args: argparse.Namespace, data_dir: str, journal_class: JournalClass) -> dict:
    """``archive``: seal the live history into a read-only archive file and
    start a new segment anchored to it (docs/cli.md §archive)."""
    # A worker still running a call (one an operator resolved too) may yet
    # record its outcome; Journal.archive checks again under the writer lock.
    holder = next(iter(held_calls(data_dir)), None)
    if holder is not None:
        operation = holder.get("operation_id") or "unknown: its lock file says not whose"
        raise CommandError("owner_running", f"a protected call is running (pid "
                           f"{holder.get('pid')}, operation {operation}); "
                           "archive when it has finished", owner=holder)
    with journal_class(data_dir, create=False) as journal:
        sealed = journal.archive()
    result = {"ok": True, "integrity": "ok", "data_dir": data_dir, **sealed}
    log_action(data_dir, "archive", result, acting_operator(args), archived=sealed["archived"],
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

    def audit(done: dict) -> Optional[str]:
        """The operator.log line of this restart, written once across runs."""
        if any(entry.get("action") == "restart-journal"
               and entry.get("checkpoint_after") == done["checkpoint_after"]
               for entry in read_operator_log(data_dir)):
            return None
        logged: dict = {}
        log_action(data_dir, "restart-journal", logged, done["operator"],
                   evidence=done["evidence"], **{key: done[key] for key in RESTART_LOGGED})
        return logged.get("operator_log_error")

    try:
        done = restart_journal(data_dir, journal_class, evidence=evidence, operator=operator,
                               now_ns=time.time_ns(), audit=audit)
    except RestartRefused as exc:
        raise CommandError(exc.code, exc.message, **exc.details) from None
    shown = {key: value for key, value in done.items() if key not in ("evidence", "operator")}
    try:
        with journal_class(data_dir, readonly=True, create=False) as journal:
            unresolved = journal.status().unresolved
    except JournalError as exc:  # e.g. a disk that filled up meanwhile: the restart stands
        raise type(exc)(exc.code, f"the journal was restarted (error.restarted), but reading it "
                        f"afterwards failed: {exc.message}; run status once that is fixed",
                        restarted=shown) from None
    return {"ok": True, "integrity": "ok", "data_dir": data_dir, **shown,
            "unresolved": [operation_view(operation, data_dir) for operation in unresolved]}


# The fields of a restart's result that its operator.log line repeats.
RESTART_LOGGED = ("found", "replaced_journal_id", "last_verified_checkpoint", "unverified",
                  "evidence_directory", "carried_over", "lost_operation", "archive_anchor",
                  "checkpoint_after", "resumed")


COMMANDS = {"status": command_status, "show": command_show, "log": command_log,
            "verify": command_verify, "checkpoint": command_checkpoint,
            "resolve": command_resolve, "acknowledge": command_acknowledge,
            "repair-checkpoint": command_repair, "archive": command_archive,
            "restart-journal": command_restart_journal}


def _journal_error_document(exc: JournalError, data_dir: str) -> dict:
    """The error document of a :class:`JournalError`: ``integrity`` is the
    journal's verdict (``found`` when the error carries the real one), and
    ``restart_interrupted`` while a restart is left half-way, whatever the
    half-moved files look like (its way forward: restart-journal again)."""
    integrity, error = exc.details.get("found", exc.code), exc.to_json()
    if integrity in INTEGRITY_VERDICTS and integrity != "restart_interrupted" \
            and pending_restart(data_dir) is not None:
        if error["code"] == integrity:
            error = {"code": "restart_interrupted", "message": (
                f"restart-journal was interrupted half-way ({RESTART_INTENT_NAME} records it; "
                f"the files left read as {integrity}): run it again, it finishes the switch with "
                "the journal it built, carrying over the same operations"),
                "found": integrity}
        else:
            error["found"] = "restart_interrupted"
        integrity = "restart_interrupted"
    return {"ok": False, "integrity": integrity, "error": error}


def run_command(command: "str | Callable[..., dict]", args: argparse.Namespace, data_dir: str,
                journal_class: JournalClass) -> tuple:
    """Run one command (a name in :data:`COMMANDS`, or a function of the same
    signature): ``(document, ok)``; any failure becomes the error document of
    docs/cli.md §Output, which the operator CLI and the dashboard answer."""
    function = COMMANDS[command] if isinstance(command, str) else command
    try:
        if command in WRITING_COMMANDS:
            refuse_agent(command, args, data_dir)
        return function(args, data_dir, journal_class), True
    except CommandError as exc:
        result = {"ok": False, "error": {"code": exc.code, "message": exc.message, **exc.details}}
        if "found" in exc.details:
            result["integrity"] = exc.details["found"]
    except AdmissionRefused as exc:
        # The journal verified; the request itself was refused (e.g. already resolved).
        result = {"ok": False, "integrity": "ok", "error": exc.to_json()}
    except JournalError as exc:
        result = _journal_error_document(exc, data_dir)
    except OSError as exc:  # the command's own file work: a full disk, a read-only mount
        result = _journal_error_document(storage_error(exc, "running the command"), data_dir)
    except sqlite3.Error as exc:
        result = _journal_error_document(translate_sqlite_error(exc, "running the command"),
                                         data_dir)
    except Exception as exc:  # noqa: BLE001 - one document whatever happens (docs/cli.md §Output)
        logger.error("crash-recovery: the operator command failed unexpectedly: %s: %s",
                     type(exc).__name__, exc)
        result = {"ok": False, "error": {
            "code": "internal_error", "message": f"an unexpected {type(exc).__name__} inside "
            f"the command ({str(exc)[:300]}); run status to see the journal's state"}}
    hint = hint_for(command if isinstance(command, str) else None, result["error"]["code"])
    if hint:
        result["error"]["hint"] = hint
    error = result["error"]
    error["next"] = next_command((), next_step_of(error))
    return result, False
