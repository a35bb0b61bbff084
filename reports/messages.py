"""What people and models are told about operations (command lines, views, ages,
blocked results, refusals), for the admission side (docs/guard.md §Blocked
result) and the operator side (docs/cli.md).  Formatting and the owner probe only.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import sys
import time
from typing import Any, Iterable, Optional, Sequence

from ..storage.chain import Operation
from ..storage.errors import JournalError
from ..storage.call_lock import OWNER_RUNNING, probe_owner


BLOCKED_ERROR = "crash_recovery_blocked"
# The operator commands that change the journal or move its files: nothing a
# model is told names them (docs/guard.md §What the model is told).
WRITING_COMMANDS = ("resolve", "acknowledge", "repair-checkpoint", "archive", "restart-journal")
RECORD_FAILED_ERROR = "crash_recovery_record_failed"
# The plugin directory is this folder's parent.
OPERATOR_CLI_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "operator_cli.py")


# The verdicts of docs/cli.md §Verdict codes that leave the journal unusable
# until a person acts; every other error is a refused request or a passing state.
INTEGRITY_VERDICTS = frozenset((
    "hash_mismatch", "broken_link", "sequence_gap", "invalid_payload", "invalid_transition",
    "invalid_metadata", "foreign_schema_object", "schema_mismatch", "identity_mismatch",
    "marker_missing", "marker_corrupt", "checkpoint_missing", "checkpoint_empty",
    "checkpoint_corrupt", "checkpoint_foreign", "checkpoint_ahead", "journal_rolled_back",
    "checkpoint_behind", "checkpoint_mismatch", "missing_database", "database_replaced",
    "stray_wal", "wal_missing", "database_corrupt", "archive_missing", "archive_mismatch",
    "archive_interrupted", "append_not_stored", "foreign_file", "restart_interrupted"))
RESTART_STEP = ("restart-journal", "--evidence", "<what happened, what you checked>")
SAME_AGAIN = ()
STATUS_STEP = ("status",)
SHOW_STEP = ("show", "<OPERATION_ID>")
# The operator command (the words after `hermes -p PROFILE crash-recovery`) that
# moves each state forward (docs/cli.md §Output, ``next``); () means "the same
# command again, in a moment".
NEXT_STEPS = {
    "checkpoint_ahead": ("repair-checkpoint", "--evidence", "<what happened, what you checked>"),
    **dict.fromkeys(("unresolved_operations", "owner_running", "unknown_operation",
                     "nothing_to_acknowledge", "archive_refused", "restart_not_applicable",
                     "interrupted", "ambiguous_operation_id"), STATUS_STEP),
    "checkpoint_not_ancestor": RESTART_STEP, "workers_running": RESTART_STEP,
    "journal_changed_while_read": SAME_AGAIN, "database_locked": SAME_AGAIN,
    # verify --checkpoint with an export of a journal a restart replaced: the
    # restart's record (its bookkeeping operation) says what became of it.
    **dict.fromkeys(("operation_not_open", "checkpoint_lost_in_restart",
                     "checkpoint_replaced_mismatch", "checkpoint_replaced_unverifiable"),
                    SHOW_STEP),
}


def next_step(code: str, found: Optional[str] = None,
              operation_id: Optional[str] = None) -> Optional[tuple]:
    """The words of the next operator command for an error ``code``
    (``found``: the real verdict behind it; ``operation_id``: the operation
    it names); ``()`` for "the same command again"; None when the message and
    hint are all there is (a usage error, a wrong directory)."""
    if code == "repair_not_applicable" and found:
        code = found
    if code == "storage_unavailable" and found:
        # A command failed on its own files (a full disk, a read-only mount, a
        # planted file it names) and left the journal's verdict as it was.
        return SAME_AGAIN
    if code in NEXT_STEPS:
        return tuple(operation_id if word == "<OPERATION_ID>" and operation_id else word
                     for word in NEXT_STEPS[code])
    return RESTART_STEP if code in INTEGRITY_VERDICTS else None


def next_step_of(error: dict) -> Optional[tuple]:
    """:func:`next_step` of an error document.  ``wal_missing`` while
    processes still have the journal open: stop them and look again (their
    exit folds the deleted WAL's events back)."""
    code = error.get("code") or ""
    if code == "wal_missing" and error.get("workers_running"):
        return STATUS_STEP
    return next_step(code, error.get("found"), error.get("operation_id"))


def operation_waits_for_a_person(view: dict) -> bool:
    """An open operation that is not a call running right now."""
    return not (view.get("state") == "pending" and view.get("owner") == OWNER_RUNNING)


def first_waiting(views: Sequence[dict]) -> Optional[dict]:
    """The first :func:`operation_view` that waits for a person (the one a
    ``resolve`` can settle now), or None."""
    return next((view for view in views if operation_waits_for_a_person(view)), None)


def status_next_step(result: dict) -> Optional[tuple]:
    """The words of the next operator command for a ``status`` document: the
    verdict's (:func:`next_step`), a resolution while an outcome is unknown,
    an acknowledgement while a late outcome waits, else None."""
    if not result.get("ok"):
        error = dict(result.get("error") or {})
        error["code"] = error.get("code") or result.get("integrity") or ""
        return next_step_of(error)
    waiting = first_waiting(result.get("unresolved") or [])
    if result.get("gate") == "closed" and waiting is not None:
        return ("resolve", waiting["operation_id"], "--outcome",
                "<completed|not_applied>", "--evidence", "<what you checked>")
    if result.get("attention"):
        return ("acknowledge", result["attention"][0]["operation_id"], "--evidence",
                "<what you did>")
    return None


def next_command(prefix: Sequence[str], words: Optional[tuple]) -> Optional[str]:
    """``next`` as a command line (docs/cli.md §Output), or None; ``()``
    becomes the text ``run the same command again``."""
    if words is None:
        return None
    return command_line(prefix, *words) if words else "run the same command again"


def iso_utc(timestamp_ns: int) -> str:
    """ISO 8601 UTC with second precision, e.g. ``2026-11-30T07:41:02Z``."""
    moment = datetime.datetime.fromtimestamp(timestamp_ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def standalone_prefix(data_dir: str) -> tuple:
    """The words that run the operator CLI on ``data_dir`` from a shell: this
    process's own (absolute) interpreter -- a venv's bare ``python`` may not be
    on the operator's PATH -- the CLI's path, and ``--data-dir``."""
    return (sys.executable or "python3", OPERATOR_CLI_PATH, "--data-dir", data_dir)


def hermes_prefix(profile: Optional[str], program: str = "hermes") -> tuple:
    """The words of ``PROGRAM [-p PROFILE] crash-recovery``: no path, no
    interpreter (safe to show in a chat).  ``profile``: None or ``custom`` (a
    HERMES_HOME outside the profiles) give no ``-p``; ``program``: the host's
    program name (``hermes``, ``hermesx``), never a path."""
    program = os.path.basename(program) or "hermes"
    # `-p default` even for the default profile: without it, a sticky
    # `hermes profile use NAME` would run the command in NAME.
    if profile and profile != "custom":
        return (program, "-p", profile, "crash-recovery")
    return (program, "crash-recovery")


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


def dated(view: dict) -> dict:
    """Add ``started_at`` (ISO) to an operation's fields; returns ``view``.
    One brought back for a lost event (``lost_window``) did not start then:
    ``started_at`` null, ``recorded_at`` when it was brought back, and
    ``lost_after``/``lost_before``/``lost_after_source`` the window in which
    its call, if any, happened (:data:`chain.WINDOW_SOURCES`)."""
    view["started_at"] = iso_utc(view["started_ns"])
    window = view.get("lost_window")
    if window:
        view["started_at"] = None
        view["recorded_at"] = iso_utc(view["started_ns"])
        view["lost_after"] = iso_utc(window["after_ns"]) if window["after_ns"] else None
        view["lost_after_source"] = window.get("after_source")
        view["lost_before"] = iso_utc(window["before_ns"])
    return view


def operation_view(operation: "Operation | dict", data_dir: str, *,
                   now_ns: Optional[int] = None, with_owner: bool = True) -> dict:
    """An operation for people: every journal field (an :class:`Operation` or
    its ``to_json()`` dict), the fields of :func:`dated`, ``age_seconds``
    (float, >= 0: the distance from now; a start dated in the future adds
    ``clock_ahead_seconds``) and, with ``with_owner``, ``owner``
    (``running``/``gone``/``unknown``) and ``owner_pid``."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    view = dict(operation) if isinstance(operation, dict) else operation.to_json()
    dated(view)
    age_ns = now_ns - view["started_ns"]
    # A start dated in the future (the writer's clock was ahead): its distance
    # from now keeps age alerts awake.
    view["age_seconds"] = round(abs(age_ns) / 1e9, 3)
    if age_ns < 0:
        view["clock_ahead_seconds"] = view["age_seconds"]
    if with_owner:
        probe = probe_owner(data_dir, view["operation_id"])
        view["owner"] = probe["owner"]
        view["owner_pid"] = probe["pid"]
    return view


# What dates the start of a lost call's window, for people (chain.WINDOW_SOURCES).
WINDOW_START_WORDS = {"last_verified_event": "the last verified event",
                      "journal_created": "the journal's creation",
                      "marker_written": "the journal's marker was written"}


def lost_call_text(view: dict) -> str:
    """The window of an :func:`operation_view` brought back for a lost event,
    in words."""
    after = view.get("lost_after")
    start = (f"after {after} ({WINDOW_START_WORDS.get(view.get('lost_after_source'), 'recorded')})"
             if after else "at a time nothing recorded bounds")
    return (f"a call lost in a crash: if it happened, it started {start} and before "
            f"{view.get('lost_before')} (when it was brought back); its tool, session and tool "
            "call are unknown: check the services for any call in that window")


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
    """The refusal JSON of docs/guard.md §Blocked result (``operator_command``
    null when the refusal came before the data directory was known: the keys
    never vary)."""
    operations = list(operations)[:MAX_OPERATIONS_SHOWN]
    result = {
        "error": BLOCKED_ERROR,
        "blocked": True,
        "code": code,
        "explanation": bounded(explanation),
        "operation_ids": [operation["operation_id"] for operation in operations],
        "operations": [{key: bounded(operation.get(key)) for key in
                        ("operation_id", "tool", "state", "started_at", "age_seconds")}
                       for operation in operations],
        "operator_command": command_line(prefix, "status") if prefix else None,
    }
    text = json.dumps(result, ensure_ascii=False, sort_keys=True)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate the model named: as an escape
        text = json.dumps(result, ensure_ascii=True, sort_keys=True)
    return text


# What a refusal echoes is bounded: a tool name or id comes from the model and
# may be a megabyte long.
LONG_WORD = 120
MAX_ECHO = 4000
MAX_OPERATIONS_SHOWN = 20
_LONG_RUN = re.compile(r"\S{%d,}" % (LONG_WORD + 1))


def bounded(value: Any) -> Any:
    """``value`` with every over-long word cut to ``LONG_WORD`` characters
    (plus ``...``) and the whole cut to ``MAX_ECHO``; non-text as it is."""
    if not isinstance(value, str):
        return value
    text = _LONG_RUN.sub(lambda match: match.group(0)[:LONG_WORD] + "...", value)
    return text if len(text) <= MAX_ECHO else text[:MAX_ECHO] + "..."


def _described(operations: list) -> str:
    if not operations:  # its admission is still being recorded
        return "its start is being recorded now"
    return "; ".join(f"operation {operation['operation_id']} (" + (
        f"tool {operation['tool']}, {operation['state']}, started "
        f"{describe_age(operation['age_seconds'])} ago)" if not operation.get("lost_before") else
        f"{lost_call_text(operation)})") for operation in operations)


def unresolved_explanation(operations: list, prefix: Optional[Sequence[str]]) -> str:
    """Words a model relays to its user instead of retrying (``operations``:
    :func:`operation_view` dicts of the unknown outcomes).  They name no
    command that changes the journal, only how a person looks (``show``)."""
    first = operations[0]["operation_id"] if operations else None
    named = f"operation {first}" if first else "the open operation"
    return (f"Protected tool calls are paused. An earlier call's outcome is unknown: "
            f"{_described(operations)}. It may or may not have taken effect, so repeating it "
            f"could duplicate a booking, payment or message. Do not retry, and do not try to "
            f"settle it yourself: only a person can. Tell the user that a person must check "
            f"the real service and settle {named}; {look_at(prefix, first)}")


def look_at(prefix: Optional[Sequence[str]], operation_id: Optional[str]) -> str:
    """How the person looks at an operation (``show``; ``status`` when no id is
    known): the only command a model-facing text names for it."""
    if operation_id is None:
        return (f"they can see it with: {command_line(prefix, 'status')}" if prefix
                else "they can see it with the crash-recovery status command")
    return (f"they can look at it with: {command_line(prefix, 'show', operation_id)}" if prefix
            else f"they can look at it with the crash-recovery show command ({operation_id})")


def reach_warning(tools: Sequence[str]) -> Optional[str]:
    """What every status surface says when the settings let the agent run,
    while the gate is closed, tools not known to be read-only (``tools``:
    ``settings.agent_reaches_journal``), or None when there are none."""
    if not tools:
        return None
    return (f"THE AGENT CAN REACH THE JOURNAL: while the gate is closed it may still run "
            f"{', '.join(map(str, tools))}, which may change the journal's files and the "
            f"plugin's settings (allowed_while_closed / read_only_tools; docs/guard.md "
            f"§The boundary)")


def closed_gate_explanation(tool_name: str, why: str, runs: Iterable[str]) -> str:
    """Why an unprotected call was refused while the gate is closed
    (docs/guard.md §While the gate is closed): ``why`` is the refusal a
    protected call gets now; ``runs`` the tools that still run."""
    return (f"{tool_name} was refused and not run: while the gate is closed, only read-only "
            f"tools run in this profile ({', '.join(sorted(runs))}), so that nothing run from "
            f"here can change the record a person relies on (no shell, code, file writes or "
            f"delegation). {why}")


def option_argument_explanation(tool_name: str, problem: str, why: str) -> str:
    """Why a read-only file tool was refused while the gate is closed:
    ``problem`` says which argument (docs/guard.md §While the gate is
    closed); ``why`` as above."""
    return (f"{tool_name} was refused and not run: while the gate is closed, {problem}. The "
            f"host puts these arguments on a search or read command line, where a value that "
            f"begins with \"-\" is taken as an option, and some options run programs. To "
            f"search for text that begins with \"-\", write it as \"[-]...\"; name a path "
            f"that begins with \"-\" as \"./-...\". {why}")


# Tools whose call runs other agents' tool calls inside it (Hermes' subagents).
DELEGATING_TOOLS = frozenset({"delegate_task"})


def in_flight_explanation(tool_name: str, operations: list, *, nested: bool) -> str:
    """A refusal because a protected call is running right now: in another
    process or session (``nested`` False: wait), or the caller's own parent
    call (``nested`` True: protected calls cannot nest)."""
    if nested:
        return (f"{tool_name} was called from inside another protected call that is still "
                f"running ({_described(operations)}). Protected calls cannot be nested, so "
                f"{tool_name} was refused and not run. Finish without it, or tell the user.")
    text = (f"Another protected call is running right now ({_described(operations)}), and only "
            f"one runs at a time in this profile, so {tool_name} was refused and not run. Wait "
            f"for that call to finish, then ask again; do not retry automatically in a loop.")
    if any(operation.get("tool") in DELEGATING_TOOLS for operation in operations):
        # A host that runs a subagent in a fresh context (Hermes 0.19) cannot
        # show it as nested: the subagent must not wait for its own parent.
        text += (" If you are a subagent started by that call, it cannot finish before you "
                 "do: finish without this tool and report that it was refused.")
    return text


def integrity_explanation(error: JournalError, prefix: Optional[Sequence[str]]) -> str:
    """Refusal text for an integrity or availability failure."""
    command = (command_line(prefix, "verify") if prefix
               else "the crash-recovery verify command")
    if error.code == "database_locked":
        return (f"The crash-recovery journal is busy: it stayed locked by another process "
                f"longer than the busy timeout (an archive being sealed, or a stuck worker). "
                f"This call was NOT run. Ask the user whether to try again in a moment; do not "
                f"retry in a loop. If it keeps happening, an operator can look with: {command}")
    if error.code == "platform_unsupported":
        return (f"Protected tool calls are refused because crash-recovery cannot give its "
                f"guarantees here: {error.message} Nothing was run. Do not retry; tell the user "
                f"what this says.")
    # The error's own message names files and steps (head.json, COMMIT): it
    # goes to the operator's log, not to a chat.
    if error.code == "commit_failed":
        return (f"The journal could not confirm that this call's start was recorded. The call "
                f"was NOT run (if the journal later shows it as pending, it still did not run). "
                f"Do not retry; tell the user that a person must check the journal with: "
                f"{command}")
    what = ("failed its integrity check: it may have been damaged or changed"
            if error.code in INTEGRITY_VERDICTS else "cannot be used right now")
    return (f"Protected tool calls are refused because the crash-recovery journal, which "
            f"records them, {what} (code {error.code}). Nothing was run. Do not retry. Tell "
            f"the user that an operator must look at it with: {command}")


