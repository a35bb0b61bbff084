#!/usr/bin/env python3
"""Deployment checks: crash-recovery as an operator deploys it in a real,
unmodified Hermes Agent (offline, isolated profiles).

    python tests/host/check_deployment.py [--keep DIR] [--only STEP ...]

What tests/check_host.py does not cover:

* protection modes set in ``config.yaml`` (the default, ``protected_tools``,
  the string the real ``hermes config set`` stores, an unknown key);
* ``hermes [-p PROFILE] crash-recovery ...`` as real subprocesses in a named
  profile made by ``hermes profile create`` under a fake ``HOME``, in the
  default profile and with ``HERMES_HOME``: the same JSON and exit codes as
  ``operator_cli.py --data-dir DIR``; the command printed in a blocked result
  is run as printed and settles the operation;
* ``/crash-recovery`` through ``get_plugin_command_handler`` and through the
  CLI's own ``process_command`` (Hermes' ``tui_gateway.slash_worker``);
* the blocked text the model receives inside ``AIAgent.run_conversation``
  (what the scripted provider was sent), and the WARNING in Hermes' own log;
* re-entry on the concurrent path when Hermes rewrites the arguments between
  the two middleware entries (``coerce_tool_args``), and a call made through
  ``execute_code``'s RPC bridge while ``execute_code`` runs.

Every scenario runs in a child process (one profile per process: Hermes
discovers plugins once) inside ``unshare -rn`` where allowed. Prints one JSON
report (``failed`` lists each failed check with its evidence); exits 1 on any
failed check, 2 when hermes-agent is not installed.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import evidence  # noqa: E402  (tests/host, standard library only)
from check_host import (BOOKING, PROBE, CheckerRun, CheckList, booked, check_registrations,  # noqa: E402
                        checker_main, scripted_conversation,
                        events_of, hermes_call)
from evidence import (BOOKING_PLUGIN_DIR, OPERATOR_CLI, PLUGIN_NAME, PROBE_PLUGIN_DIR,  # noqa: E402
                      blocked_document, data_dir_of, kinds, service_counts)

SCENARIO_TIMEOUT_SECONDS = 120
COMMAND_TIMEOUT_SECONDS = 90
FLAKY = "flaky-service"
FLAKY_PLUGIN_DIR = HOST_DIR / "flaky_plugin"
PROFILE = "work"  # the named profile of the `profiles` step
# How the default profile's commands may be spelled: plain, or pinned with
# `-p default` (which also holds when another profile is made sticky).
DEFAULT_PREFIXES = ("hermes crash-recovery", "hermes -p default crash-recovery")
# An absolute path in text meant for a chat: "/" starting a path component,
# not inside a word ("and/or") or a placeholder ("<a|b>").
ABSOLUTE_PATH = re.compile(r"(?<![\w.<>|/-])/[\w.~-]")
RESOLVE_EVIDENCE = "checked the booking service: no booking row and no charge for this call"
SETTINGS_KEY = f"plugins.entries.{PLUGIN_NAME}.settings.protected_tools"


# --------------------------------------------------------------------------
# In-child helpers
# --------------------------------------------------------------------------

def status_tool(session_id: str, call_id: str) -> Dict[str, Any]:
    """``crash_recovery_status`` through Hermes' dispatcher, decoded."""
    return json.loads(hermes_call("crash_recovery_status", {}, session_id=session_id,
                                  call_id=call_id))


def settings_of(status: Dict[str, Any]) -> Dict[str, Any]:
    return status.get("settings") if isinstance(status.get("settings"), dict) else {}


def settings_problem(status: Dict[str, Any]) -> Optional[str]:
    """The settings problem ``crash_recovery_status`` reports (docs/guard.md
    names a top-level ``settings_problem``; the status also nests it under
    ``settings.problem``)."""
    return status.get("settings_problem") or settings_of(status).get("problem")


def flaky_runs() -> List[Dict[str, Any]]:
    path = Path(os.environ["FLAKY_RUNS_LOG"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_facts(**facts: Any) -> None:
    """Hand values (operation ids, printed commands) to the parent step."""
    path = Path(os.environ["CHECK_FACTS"])
    known = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    known.update(facts)
    path.write_text(json.dumps(known), encoding="utf-8")


def paths_in(text: str) -> List[str]:
    """Absolute paths (or interpreter / operator_cli mentions) in chat text."""
    found = [match.group(0) for match in ABSOLUTE_PATH.finditer(text)]
    for word in ("operator_cli", "--data-dir", "plugin-data", sys.executable,
                 os.environ.get("HERMES_HOME", "\0"), os.environ.get("HOME", "\0")):
        if word and len(word) > 2 and word in text:
            found.append(word)
    return found


def check_chat_safe_command(checks: CheckList, name: str, document: Optional[Dict[str, Any]],
                            prefix: str, operation_id: Optional[str]) -> None:
    """A blocked result names the ``hermes ... crash-recovery`` commands of this
    profile and no filesystem or interpreter path."""
    document = document or {}
    explanation = str(document.get("explanation", ""))
    checks.check(f"{name}_operator_command", document.get("operator_command")
                 == f"{prefix} status", operator_command=document.get("operator_command"))
    checks.check(f"{name}_resolve_command",
                 f"{prefix} resolve {operation_id} --outcome " in explanation
                 and "--evidence" in explanation, explanation=explanation)
    checks.check(f"{name}_no_path", not paths_in(json.dumps(document)),
                 found=paths_in(json.dumps(document)), document=document)


def resolve_line(text: str, prefix: str) -> Optional[str]:
    """The ``PREFIX resolve ...`` command line printed in ``text``."""
    start = text.find(f"{prefix} resolve ")
    if start < 0:
        return None
    line = text[start:].splitlines()[0]
    end = line.find(">\"", line.find("--evidence"))
    return line[:end + 2] if end >= 0 else line


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_mode_default(home: Path, checks: CheckList) -> None:
    """No settings: every tool but read_file/search_files is protected, so a
    plugin tool's own error response (``{"success": false}``) leaves
    ``uncertain`` and then blocks every protected tool."""
    check_registrations(checks, "user")
    status = status_tool("session-D", "call-D0")
    settings = settings_of(status)
    checks.check("status_shows_default_mode",
                 settings.get("mode") == "read_only_tools"
                 and sorted(settings.get("read_only_tools") or []) == ["read_file", "search_files"]
                 and not settings_problem(status), status=status)
    result = hermes_call("flaky_quote", {"item": "sofa", "shape": "success_false"},
                         session_id="session-D", call_id="call-D1")
    checks.check("error_response_returned_unchanged",
                 json.loads(result) == {"success": False,
                                        "reason": "quote service rejected the request"},
                 result=result)
    events = events_of(home)
    checks.check("success_false_leaves_uncertain",
                 kinds(events) == ["started", "uncertain"] and events[0]["tool"] == "flaky_quote"
                 and events[1]["reason"] == "error_response", events=events)
    operation_id = events[0]["operation_id"] if events else None
    result = hermes_call("lookup_receipt", {"traveler": "Ada"}, session_id="session-E",
                         call_id="call-E1", hook=False)
    refusal = blocked_document(result)
    checks.check("unlisted_tool_refused_by_middleware",
                 refusal is not None and refusal.get("code") == "unresolved_operations"
                 and refusal.get("operation_ids") == [operation_id], result=result)
    result = hermes_call("flaky_quote", {"item": "lamp"}, session_id="session-E",
                         call_id="call-E2", hook=True)
    checks.check("refused_by_hook", blocked_document(result) is not None, result=result)
    checks.check("refused_handlers_not_run", len(flaky_runs()) == 1, runs=flaky_runs())
    sample = home / "notes.txt"
    sample.write_text("default-mode-marker\n", encoding="utf-8")
    result = hermes_call("read_file", {"path": str(sample)}, session_id="session-E",
                         call_id="call-E3")
    checks.check("read_file_exempt_while_blocked", "default-mode-marker" in result,
                 result=result[:300])
    status = status_tool("session-E", "call-E4")
    checks.check("status_lists_uncertain",
                 [o.get("operation_id") for o in status.get("unresolved", [])] == [operation_id],
                 status=status)
    checks.check("refusals_and_exempt_calls_append_nothing", len(events_of(home)) == 2,
                 events=events_of(home))


def scenario_mode_protected(home: Path, checks: CheckList) -> None:
    """``protected_tools: [book_trip]`` (a YAML list, or the string ``hermes
    config set`` stores): only book_trip is journaled and gated; another tool's
    error responses leave nothing and block nothing."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    check_registrations(checks, "user")
    status = status_tool("session-P", "call-P0")
    settings = settings_of(status)
    checks.check("status_shows_protected_mode",
                 settings.get("mode") == "protected_tools"
                 and settings.get("protected_tools") == ["book_trip"]
                 and not settings_problem(status), status=status)
    for number, shape in enumerate(("success_false", "error"), start=1):
        result = hermes_call("flaky_quote", {"item": "sofa", "shape": shape},
                             session_id="session-P", call_id=f"call-P{number}")
        checks.check(f"unprotected_{shape}_returned_unchanged",
                     isinstance(json.loads(result), dict) and blocked_document(result) is None
                     and ("success" in json.loads(result) or "error" in json.loads(result)),
                     result=result)
    checks.check("unprotected_errors_leave_no_journal_entry", events_of(home) == [],
                 events=events_of(home))
    checks.check("unprotected_handler_ran_each_time", len(flaky_runs()) == 2, runs=flaky_runs())
    lookup = json.loads(hermes_call("lookup_receipt", {"traveler": "Ada"},
                                    session_id="session-P", call_id="call-P3"))
    checks.check("other_tool_runs_unjournaled", lookup.get("count") == 0 and events_of(home) == [],
                 lookup=lookup)
    result = hermes_call("book_trip", {"traveler": "Ada", "destination": "Lisbon"},
                         session_id="session-P", call_id="call-P4")
    events = events_of(home)
    checks.check("protected_tool_journaled",
                 booked(result) is not None and kinds(events) == ["started", "returned"]
                 and events[0]["tool"] == "book_trip" and events[0]["tool_call_id"] == "call-P4",
                 result=result, events=events)
    result = hermes_call("book_trip", {"traveler": "Bob", "destination": "Atlantis"},
                         session_id="session-P", call_id="call-P5")
    events = events_of(home)
    checks.check("protected_failure_uncertain",
                 kinds(events) == ["started", "returned", "started", "uncertain"], events=events)
    operation_id = events[2]["operation_id"] if len(events) == 4 else None
    result = hermes_call("flaky_quote", {"item": "chair", "shape": "error"},
                         session_id="session-Q", call_id="call-Q1", hook=True)
    checks.check("unprotected_tool_runs_while_blocked",
                 blocked_document(result) is None and len(flaky_runs()) == 3, result=result,
                 runs=flaky_runs())
    for hook in (False, True):
        result = hermes_call("book_trip", {"traveler": "Cy", "destination": "Paris"},
                             session_id="session-Q", call_id=f"call-Q-hook-{hook}", hook=hook)
        refusal = blocked_document(result)
        checks.check(f"protected_tool_refused_{'hook' if hook else 'middleware'}",
                     refusal is not None and refusal.get("operation_ids") == [operation_id],
                     result=result)
    checks.check("refused_booking_not_run", service_counts(service)["attempts"] == 2,
                 counts=service_counts(service))
    checks.check("journal_holds_only_protected_calls", len(events_of(home)) == 4
                 and {e.get("tool") for e in events_of(home) if e["kind"] == "started"}
                 == {"book_trip"}, events=events_of(home))


def scenario_mode_unknown_key(home: Path, checks: CheckList) -> None:
    """``read_only_tool`` (a typo): reported by crash_recovery_status and by
    /crash-recovery, and the guard fails closed (nothing is exempt but the
    inspection tools)."""
    check_registrations(checks, "user")
    status = status_tool("session-U", "call-U0")
    problem = settings_problem(status)
    checks.check("status_reports_settings_problem",
                 isinstance(problem, str) and "read_only_tool" in problem, status=status)
    lookup = json.loads(hermes_call("lookup_receipt", {"traveler": "Ada"},
                                    session_id="session-U", call_id="call-U1"))
    events = events_of(home)
    checks.check("intended_read_only_tool_is_protected",
                 lookup.get("count") == 0 and kinds(events) == ["started", "returned"]
                 and events[0]["tool"] == "lookup_receipt", lookup=lookup, events=events)
    sample = home / "notes.txt"
    sample.write_text("unknown-key-marker\n", encoding="utf-8")
    result = hermes_call("read_file", {"path": str(sample)}, session_id="session-U",
                         call_id="call-U2")
    events = events_of(home)
    checks.check("default_read_only_tool_is_protected",
                 "unknown-key-marker" in result and len(events) == 4
                 and events[2]["tool"] == "read_file", events=events)
    status_tool("session-U", "call-U3")
    hermes_call("crash_recovery_verify", {}, session_id="session-U", call_id="call-U4")
    checks.check("inspection_tools_still_exempt", len(events_of(home)) == 4,
                 events=events_of(home))
    from hermes_cli.plugins import get_plugin_command_handler
    handler = get_plugin_command_handler(PLUGIN_NAME)
    text = str(handler("") if handler else "")
    checks.check("slash_command_names_settings_problem",
                 "settings problem" in text and "read_only_tool" in text, text=text)


def scenario_default_profile(home: Path, checks: CheckList) -> None:
    """The default profile of a fake HOME: a failed booking blocks, and the
    blocked result names ``hermes crash-recovery ...`` without ``-p``."""
    check_registrations(checks, "user")
    hermes_call("book_trip", {"traveler": "Bob", "destination": "Atlantis"},
                session_id="session-H", call_id="call-H1")
    events = events_of(home)
    operation_id = events[0]["operation_id"] if events else None
    checks.check("failure_uncertain", kinds(events) == ["started", "uncertain"], events=events)
    result = hermes_call("book_trip", {"traveler": "Cy", "destination": "Paris"},
                         session_id="session-H", call_id="call-H2", hook=False)
    refusal = blocked_document(result)
    command = str((refusal or {}).get("operator_command"))
    prefix = next((p for p in DEFAULT_PREFIXES if command == f"{p} status"), DEFAULT_PREFIXES[0])
    check_chat_safe_command(checks, "blocked", refusal, prefix, operation_id)
    write_facts(default_operation=operation_id, default_prefix=prefix, default_status=command,
                default_resolve=resolve_line(str((refusal or {}).get("explanation", "")),
                                             prefix))


def scenario_relay(home: Path, checks: CheckList) -> None:
    """Named profile, a real agent loop: book_trip fails (uncertain, WARNING in
    Hermes' log), the next book_trip is refused, and the model is sent the
    blocked text naming ``hermes -p work crash-recovery``. Then /crash-recovery
    through Hermes' plugin-command registry."""
    prefix = f"hermes -p {PROFILE} crash-recovery"
    turns = [
        {"tool_calls": [{"id": "call_fail", "name": "book_trip",
                         "arguments": {"traveler": "Bob", "destination": "Atlantis"}}]},
        {"tool_calls": [{"id": "call_blocked", "name": "book_trip",
                         "arguments": {"traveler": "Cy", "destination": "Paris"}}]},
        {"text": "done"},
    ]
    messages = scripted_conversation(home, checks, turns, "Book a trip for Bob, then one for Cy.",
                                     session_id="session-relay", enabled=[BOOKING, PLUGIN_NAME])
    events = events_of(home)
    operation_id = events[0]["operation_id"] if events else None
    checks.check("failure_uncertain", kinds(events) == ["started", "uncertain"], events=events)
    content = str(messages.get("call_blocked", ""))
    refusal = blocked_document(content)
    checks.check("model_sent_blocked_result",
                 refusal is not None and refusal.get("code") == "unresolved_operations"
                 and refusal.get("operation_ids") == [operation_id], content=content)
    check_chat_safe_command(checks, "relayed", refusal, prefix, operation_id)
    checks.check("relayed_message_no_path", not paths_in(content), found=paths_in(content),
                 content=content)
    checks.check("blocked_booking_not_run", service_counts(
        Path(os.environ["BOOKING_SERVICE_DB"]), traveler="Cy")["attempts"] == 0)

    # Hermes' own log (set up by AIAgent): a WARNING when the call became uncertain.
    logs = {name: (home / "logs" / name).read_text(encoding="utf-8", errors="replace")
            if (home / "logs" / name).exists() else "" for name in ("agent.log", "errors.log")}
    warned = {name: [line for line in text.splitlines() if " WARNING " in line
                     and "crash-recovery" in line and "uncertain" in line
                     and str(operation_id) in line]
              for name, text in logs.items()}
    checks.check("uncertain_warning_in_agent_log", bool(warned["agent.log"]),
                 agent_log_tail=logs["agent.log"][-2000:])
    checks.check("uncertain_warning_in_errors_log", bool(warned["errors.log"]),
                 errors_log_tail=logs["errors.log"][-2000:])
    warning_lines = warned["agent.log"] + warned["errors.log"]
    checks.check("warning_names_profile_command",
                 any(f"{prefix} show {operation_id}" in line for line in warning_lines),
                 lines=warning_lines)

    # /crash-recovery through Hermes' registry of plugin slash commands.
    from hermes_cli.plugins import get_plugin_command_handler, get_plugin_commands
    checks.check("slash_command_registered", PLUGIN_NAME in get_plugin_commands(),
                 commands=sorted(get_plugin_commands()))
    handler = get_plugin_command_handler(PLUGIN_NAME)
    before = len(events_of(home))
    text = str(handler("")) if handler else ""
    check_slash_text(checks, "slash", text, prefix, operation_id)
    text_with_words = str(handler(f"resolve {operation_id} --outcome not_applied "
                                  "--evidence typed-in-chat")) if handler else ""
    checks.check("slash_with_resolve_words_changes_nothing",
                 len(events_of(home)) == before and "gate CLOSED" in text_with_words
                 and "never resolves" in text_with_words, text=text_with_words,
                 events=events_of(home))
    write_facts(relay_operation=operation_id,
                relay_resolve=resolve_line(str((refusal or {}).get("explanation", "")), prefix),
                slash_text=text)


def check_slash_text(checks: CheckList, name: str, text: str, prefix: str,
                     operation_id: Optional[str]) -> None:
    """The /crash-recovery summary: gate, tool, age, owner, the exact resolve
    command, and that it never resolves."""
    line = resolve_line(text, prefix) or ""
    words = shlex.split(line) if line else []
    expected = [*shlex.split(prefix), "resolve", str(operation_id), "--outcome",
                "<completed|not_applied>", "--evidence", "<what you checked>"]
    checks.check(f"{name}_names_gate_tool_age_owner",
                 "gate CLOSED" in text and f"{operation_id} book_trip" in text
                 and re.search(r"started \d+ s(econds?)? ago|started .* ago", text) is not None
                 and re.search(r"worker (is gone|still runs|unknown)", text) is not None,
                 text=text)
    checks.check(f"{name}_exact_resolve_command", words == expected, line=line,
                 expected=expected, text=text)
    checks.check(f"{name}_says_never_resolves", "never resolves" in text, text=text)
    checks.check(f"{name}_no_path", not paths_in(text), found=paths_in(text), text=text)


def scenario_reentry(home: Path, checks: CheckList) -> None:
    """Issue 10, cases 4 and 5, in one real agent loop:

    1. two ``web_extract`` calls whose ``urls`` is a bare string (the probe
       replaces the handler and holds the admitted call open until the sibling
       has left the chain); Hermes' ``coerce_tool_args`` turns the string into
       a list between the outer and the inner middleware entry;
    2. two protected ``read_file`` calls whose ``limit`` is the string "5"
       (the real tool; coerced to 5 the same way);
    3. ``execute_code`` whose script calls ``terminal`` through Hermes' RPC
       bridge while execute_code runs;
    4. ``book_trip``: nothing that never ran keeps the profile blocked.
    """
    probe_log = Path(os.environ["HOST_PROBE_LOG"])
    first, second = home / "first.txt", home / "second.txt"
    first.write_text("alpha-51\n", encoding="utf-8")
    second.write_text("beta-52\n", encoding="utf-8")
    marker = home.parent / "terminal-ran.marker"
    script = ("import json\nfrom hermes_tools import terminal\n"
              f"result = terminal({json.dumps('touch ' + str(marker))})\n"
              "print('INNER=' + json.dumps(result))\n")
    turns = [
        {"tool_calls": [
            {"id": "call_web_1", "name": "web_extract", "arguments": {"urls": "https://a.example/1"}},
            {"id": "call_web_2", "name": "web_extract", "arguments": {"urls": "https://b.example/2"}}]},
        {"tool_calls": [
            {"id": "call_read_1", "name": "read_file", "arguments": {"path": str(first), "limit": "5"}},
            {"id": "call_read_2", "name": "read_file", "arguments": {"path": str(second), "limit": "5"}}]},
        {"tool_calls": [{"id": "call_exec", "name": "execute_code", "arguments": {"code": script}}]},
        {"tool_calls": [{"id": "call_book", "name": "book_trip",
                         "arguments": {"traveler": "Ada", "destination": "Lisbon"}}]},
        {"text": "done"},
    ]
    messages = scripted_conversation(
        home, checks, turns, "Fetch, read, run the script, then book.",
        session_id="session-reentry", enabled=[BOOKING, PLUGIN_NAME, PROBE], max_iterations=8,
        entries={PROBE: {"allow_tool_override": True},
                 PLUGIN_NAME: {"settings": {"read_only_tools": ["lookup_receipt"]}}})
    records = [json.loads(line) for line in probe_log.read_text().splitlines()] \
        if probe_log.exists() else []
    events = events_of(home)
    started = {e["operation_id"]: e for e in events if e["kind"] == "started"}
    closing = {e["operation_id"]: e for e in events if e["kind"] != "started"}

    def journaled(call_id: str) -> List[Tuple[str, Optional[str]]]:
        """(closing kind, reason) of each operation of this tool call id."""
        return [(closing[o]["kind"] if o in closing else "pending",
                 closing[o].get("reason") if o in closing else None)
                for o, e in started.items() if e.get("tool_call_id") == call_id]

    def entries(call_id: str) -> List[Any]:
        return [r.get("arg_types") for r in records
                if r["event"] == "middleware" and r["tool_call_id"] == call_id]

    # 1. web_extract with a bare-string urls (case 4)
    web_ids = ["call_web_1", "call_web_2"]
    admitted = [i for i in web_ids if "probe page" in messages.get(i, "")]
    refused = {i: blocked_document(messages.get(i, "")) for i in web_ids
               if blocked_document(messages.get(i, "")) is not None}
    checks.check("web_one_admitted_one_refused", len(admitted) == 1 and len(refused) == 1,
                 messages={i: messages.get(i) for i in web_ids})
    if admitted:
        call = admitted[0]
        checks.check("web_host_coerced_args_between_entries",
                     entries(call) == [{"urls": "str"}, {"urls": "list"}], entries=entries(call))
        checks.check("web_inner_entry_passed_as_reentry",
                     journaled(call) == [("returned", "returned")], journaled=journaled(call),
                     events=events)
        handler_runs = [r for r in records if r["event"] == "handler"]
        checks.check("web_handler_ran_once_with_list",
                     len(handler_runs) == 1 and handler_runs[0].get("urls") == [
                         "https://a.example/1" if call == "call_web_1" else "https://b.example/2"],
                     runs=handler_runs)
    for call, refusal in refused.items():
        checks.check("web_sibling_refused_operation_in_flight",
                     refusal.get("code") == "operation_in_flight" and journaled(call) == [],
                     refusal=refusal, journaled=journaled(call))
    checks.check("web_no_nested_call",
                 all((blocked_document(messages.get(i, "")) or {}).get("code") != "nested_call"
                     for i in admitted), messages={i: messages.get(i) for i in web_ids})

    # 2. protected read_file with a string limit: every call either ran (and
    # was journaled started -> returned) or was refused as in flight.
    read_ids = {"call_read_1": "alpha-51", "call_read_2": "beta-52"}
    ran = [i for i, text in read_ids.items() if text in messages.get(i, "")]
    outcomes = {i: (journaled(i), (blocked_document(messages.get(i, "")) or {}).get("code"))
                for i in read_ids}
    checks.check("read_file_admitted_calls_ran_once",
                 bool(ran) and all(outcomes[i] == ([("returned", "returned")], None) for i in ran),
                 outcomes=outcomes, messages={i: messages.get(i) for i in read_ids})
    checks.check("read_file_others_refused_in_flight",
                 all(outcomes[i] == ([], "operation_in_flight") for i in read_ids if i not in ran),
                 outcomes=outcomes)
    checks.check("read_file_host_coerced_args_between_entries",
                 all(entries(i) == [{"path": "str", "limit": "str"},
                                    {"path": "str", "limit": "int"}] for i in ran),
                 entries={i: entries(i) for i in read_ids})

    # 3. execute_code -> terminal through the RPC bridge (case 5)
    exec_result: Dict[str, Any] = {}
    try:
        exec_result = json.loads(messages.get("call_exec", ""))
    except ValueError:
        pass
    inner_line = next((line[len("INNER="):] for line in str(exec_result.get("output", "")).splitlines()
                       if line.startswith("INNER=")), None)
    inner = blocked_document(json.loads(inner_line)) if inner_line else None
    checks.check("execute_code_ran", exec_result.get("status") == "success"
                 and inner_line is not None, result=messages.get("call_exec"))
    checks.check("execute_code_inner_call_refused", inner is not None and not marker.exists(),
                 inner=inner_line, marker_exists=marker.exists())
    checks.check("execute_code_inner_call_nested_call", (inner or {}).get("code") == "nested_call",
                 inner=inner)
    checks.check("execute_code_parent_returned",
                 journaled("call_exec") == [("returned", "returned")], journaled=journaled("call_exec"),
                 events=events)
    checks.check("execute_code_inner_call_not_journaled",
                 not any(e.get("tool") == "terminal" for e in started.values()), events=events)

    # 4. nothing that never ran blocks the profile
    checks.check("book_trip_after_runs", booked(messages.get("call_book", "")) is not None
                 and journaled("call_book") == [("returned", "returned")],
                 result=messages.get("call_book"))
    checks.check("no_uncertain_operation", "uncertain" not in kinds(events), events=events)
    status = status_tool("session-after", "call-after")
    checks.check("profile_not_blocked_after", status.get("ok") is True
                 and status.get("unresolved") == [], status=status)


SCENARIOS = {
    "mode_default": scenario_mode_default,
    "mode_protected": scenario_mode_protected,
    "mode_unknown_key": scenario_mode_unknown_key,
    "default_profile": scenario_default_profile,
    "relay": scenario_relay,
    "reentry": scenario_reentry,
}


# --------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------

def without_volatile(value: Any, top: bool = True) -> Any:
    """A result with the fields that change between two runs (ages) removed,
    and at the top the one documented difference of ``hermes crash-recovery
    status``: it also shows the profile's settings (the stand-alone CLI cannot
    read config.yaml)."""
    if isinstance(value, dict):
        return {key: without_volatile(item, False) for key, item in value.items()
                if key != "age_seconds" and not (top and key == "settings")}
    if isinstance(value, list):
        return [without_volatile(item, False) for item in value]
    return value


def prometheus_samples(text: str) -> List[str]:
    """Sample lines without the one that holds an age."""
    return [line for line in text.splitlines()
            if line and not line.startswith("crash_recovery_oldest_unresolved_age_seconds")]


class Ran:
    """A finished command: exit code, stdout, parsed JSON (or None)."""

    def __init__(self, completed: subprocess.CompletedProcess) -> None:
        self.code = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        try:
            self.json = json.loads(completed.stdout)
        except ValueError:
            self.json = None

    def detail(self) -> Dict[str, Any]:
        return {"code": self.code, "stdout": self.stdout[-2500:], "stderr": self.stderr[-1500:]}


class DeploymentRun(CheckerRun):
    """Isolated profiles, child scenarios, real ``hermes`` subprocesses."""

    # -- environments and processes ----------------------------------------

    @staticmethod
    def base_environment(**extra: str) -> Dict[str, str]:
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("HERMES_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_"))}
        environment.update(PYTHONDONTWRITEBYTECODE="1", **extra)
        return environment

    def service_environment(self, work: Path, **extra: str) -> Dict[str, str]:
        """The environment of a step's processes: the services' files and the
        facts file live in the step's own directory ``work``."""
        return self.base_environment(BOOKING_SERVICE_DB=str(work / "service.db"),
                                     FLAKY_RUNS_LOG=str(work / "flaky-runs.jsonl"),
                                     CHECK_FACTS=str(work / "facts.json"), **extra)

    def run_scenario(self, label: str, scenario: str, home: Path,
                     work: Optional[Path] = None, **extra: str) -> None:
        work = work or home.parent
        self.launch_child(str(Path(__file__).resolve()), label, scenario, home,
                          work / f"checks-{scenario}.json",
                          self.service_environment(work, HERMES_HOME=str(home),
                                                   CHECK_LABEL=label, **extra), work)

    def run(self, argv: Sequence[str], environment: Dict[str, str], cwd: Path,
            stdin_text: Optional[str] = None) -> Ran:
        return Ran(subprocess.run(self.isolation_prefix + list(argv), env=environment,
                                  capture_output=True, text=True, cwd=str(cwd),
                                  timeout=COMMAND_TIMEOUT_SECONDS, input=stdin_text,
                                  stdin=None if stdin_text is not None else subprocess.DEVNULL))

    def operator(self, data_dir: Path, *words: str) -> Ran:
        """The stand-alone operator CLI on an explicit data directory."""
        return self.run([sys.executable, str(OPERATOR_CLI), "--data-dir", str(data_dir), *words],
                        self.base_environment(), data_dir.parent)

    def verify_journal(self, label: str, data_dir: Path) -> None:
        valid, report = evidence.run_verifier(data_dir)
        self.add(label, "independent_verifier", valid, report=report)

    # -- profiles ------------------------------------------------------------

    def plain_profile(self, label: str, *, entries: Optional[Dict[str, Any]] = None,
                      with_flaky: bool = True) -> Path:
        home = self.root / label / "home"
        home.mkdir(parents=True)
        install_plugins(home, with_flaky=with_flaky)
        enabled = [BOOKING, PLUGIN_NAME] + ([FLAKY] if with_flaky else [])
        evidence.write_profile(home, enabled=enabled, entries=entries)
        return home

    # -- steps ---------------------------------------------------------------

    def mode_default(self) -> None:
        """Default mode; then the operator settles the operation with
        ``hermes crash-recovery ...`` and ``HERMES_HOME`` set (a profile
        outside ~/.hermes)."""
        label = "mode_default"
        home = self.plain_profile(label)
        self.run_scenario(label, "mode_default", home)
        data_dir = data_dir_of(home)
        self.verify_journal(label, data_dir)
        events = evidence.read_events(data_dir)
        operation = events[0]["operation_id"] if events else "none"
        environment = self.base_environment(HERMES_HOME=str(home))

        def hermes(*words: str) -> Ran:
            return self.run([self.hermes, "crash-recovery", *words], environment, home.parent)

        for name, words, code in (("status", ("status",), 0), ("status_check", ("status", "--check"), 3),
                                  ("show", ("show", operation), 0)):
            ours, theirs = hermes(*words), self.operator(data_dir, *words)
            self.add(label, f"hermes_home_{name}_same",
                     ours.code == theirs.code == code and ours.json is not None
                     and without_volatile(ours.json) == without_volatile(theirs.json),
                     hermes=ours.detail(), operator_cli=theirs.detail())
        shown = hermes("status").json or {}
        self.add(label, "hermes_status_shows_settings",
                 (shown.get("settings") or {}).get("mode") == "read_only_tools"
                 and "settings" not in (self.operator(data_dir, "status").json or {}),
                 settings=shown.get("settings"))
        ran = hermes("resolve", operation, "--outcome", "completed", "--evidence",
                     RESOLVE_EVIDENCE)
        self.add(label, "hermes_home_resolve",
                 ran.code == 0 and (ran.json or {}).get("resolved") == operation
                 and (ran.json or {}).get("data_dir") == str(data_dir), **ran.detail())
        ours, theirs = hermes("status", "--check"), self.operator(data_dir, "status", "--check")
        self.add(label, "hermes_home_status_check_clear",
                 ours.code == theirs.code == 0 and (ours.json or {}).get("unresolved") == [],
                 hermes=ours.detail(), operator_cli=theirs.detail())

    def mode_protected(self) -> None:
        home = self.plain_profile("mode_protected", entries={
            PLUGIN_NAME: {"settings": {"protected_tools": ["book_trip"]}}})
        self.run_scenario("mode_protected", "mode_protected", home)
        self.verify_journal("mode_protected", data_dir_of(home))

    def mode_config_set(self) -> None:
        """The real ``hermes config set`` stores the list typed on the command
        line as a YAML string; the plugin reads it as the list it means."""
        label = "mode_config_set"
        home = self.plain_profile(label)
        ran = self.run([self.hermes, "config", "set", SETTINGS_KEY, '["book_trip"]'],
                       self.service_environment(home.parent, HERMES_HOME=str(home)), home.parent)
        self.add(label, "config_set_exit_0", ran.code == 0, **ran.detail())
        text = (home / "config.yaml").read_text(encoding="utf-8")
        import yaml  # Hermes' own dependency (PyYAML), present wherever Hermes is
        config = yaml.safe_load(text) or {}
        plugins = config.get("plugins") or {}
        stored = (((plugins.get("entries") or {}).get(PLUGIN_NAME) or {}).get("settings")
                  or {}).get("protected_tools")
        self.add(label, "config_set_stores_a_string", stored == '["book_trip"]',
                 stored=stored, config_yaml=text)
        self.add(label, "config_set_keeps_enabled_plugins",
                 plugins.get("enabled") == [BOOKING, PLUGIN_NAME, FLAKY], config_yaml=text)
        self.run_scenario(label, "mode_protected", home)
        self.verify_journal(label, data_dir_of(home))

    def mode_unknown_key(self) -> None:
        home = self.plain_profile("mode_unknown_key", entries={
            PLUGIN_NAME: {"settings": {"read_only_tool": ["lookup_receipt", "read_file"]}}})
        self.run_scenario("mode_unknown_key", "mode_unknown_key", home)
        self.verify_journal("mode_unknown_key", data_dir_of(home))

    def reentry(self) -> None:
        label = "reentry"
        home = self.root / label / "home"
        home.mkdir(parents=True)
        install_plugins(home, with_flaky=False)
        # "0-" sorts first: the probe's tracing middleware is the outermost link.
        shutil.copytree(PROBE_PLUGIN_DIR, home / "plugins" / f"0-{PROBE}")
        self.run_scenario(label, "reentry", home,
                          HOST_PROBE_LOG=str(home.parent / "probe.jsonl"))
        self.verify_journal(label, data_dir_of(home))

    def profiles(self) -> None:
        """A fake HOME with the default profile (~/.hermes) and a named profile
        made by ``hermes profile create``; both run the plugin and get an
        unknown outcome; then ``hermes [-p work] crash-recovery ...``."""
        label = "profiles"
        work = self.root / label
        fake_home = work / "user"
        fake_home.mkdir(parents=True)
        user_environment = self.service_environment(work, HOME=str(fake_home))
        created = self.run([self.hermes, "profile", "create", PROFILE, "--no-alias"],
                           user_environment, work)
        named = fake_home / ".hermes" / "profiles" / PROFILE
        default = fake_home / ".hermes"
        self.add(label, "profile_create", created.code == 0 and named.is_dir(), **created.detail())
        if not named.is_dir():
            return
        for home in (default, named):
            install_plugins(home, with_flaky=False)
            evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME])
        self.run_scenario(f"{label}.default", "default_profile", default, work,
                          HOME=str(fake_home))
        self.run_scenario(f"{label}.named", "relay", named, work, HOME=str(fake_home))
        facts_file = work / "facts.json"
        facts = json.loads(facts_file.read_text(encoding="utf-8")) if facts_file.exists() else {}
        self.slash_worker(label, work, named, fake_home, facts)
        self.cli_commands(label, fake_home, default, named, facts)
        self.verify_journal(f"{label}.default", data_dir_of(default))
        self.verify_journal(f"{label}.named", data_dir_of(named))

    def slash_worker(self, label: str, work: Path, named: Path, fake_home: Path,
                     facts: Dict[str, Any]) -> None:
        """``/crash-recovery`` through HermesCLI.process_command, in Hermes' own
        slash-command worker process (the TUI gateway's)."""
        environment = self.service_environment(work, HOME=str(fake_home),
                                               HERMES_HOME=str(named))
        request = json.dumps({"id": 1, "command": "/crash-recovery"}) + "\n"
        ran = self.run([sys.executable, "-m", "tui_gateway.slash_worker", "--session-key",
                        "deployment-check"], environment, work, stdin_text=request)
        replies = {}
        for line in ran.stdout.splitlines():
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if isinstance(reply, dict) and "id" in reply:
                replies[reply["id"]] = reply
        text = str((replies.get(1) or {}).get("output", ""))
        checks = CheckList(label)
        checks.check("process_command_answered", (replies.get(1) or {}).get("ok") is True
                     and bool(text), **ran.detail())
        check_slash_text(checks, "process_command", text, f"hermes -p {PROFILE} crash-recovery",
                         facts.get("relay_operation"))
        self.results.extend(checks.results)

    def cli_commands(self, label: str, fake_home: Path, default: Path, named: Path,
                     facts: Dict[str, Any]) -> None:
        """``hermes [-p work] crash-recovery ...`` against ``operator_cli.py``."""
        named_dir, default_dir = data_dir_of(named), data_dir_of(default)
        user = self.base_environment(HOME=str(fake_home))
        via_home = self.base_environment(HOME=str(fake_home), HERMES_HOME=str(named))
        cwd = fake_home.parent
        work_op, default_op = facts.get("relay_operation"), facts.get("default_operation")

        def hermes(*words: str, environment: Dict[str, str] = user) -> Ran:
            return self.run([self.hermes, *words], environment, cwd)

        def same(name: str, ours: Ran, reference: Ran, code: int) -> None:
            self.add(label, name, ours.code == reference.code == code
                     and ours.json is not None
                     and without_volatile(ours.json) == without_volatile(reference.json),
                     hermes=ours.detail(), operator_cli=reference.detail(), expected_code=code)

        reference = self.operator(named_dir, "status")
        same("status_named_profile", hermes("-p", PROFILE, "crash-recovery", "status"),
             reference, 0)
        self.add(label, "status_names_named_operation",
                 [o.get("operation_id") for o in (reference.json or {}).get("unresolved", [])]
                 == [work_op], reference=reference.detail())
        same("status_hermes_home", hermes("crash-recovery", "status", environment=via_home),
             reference, 0)
        same("show_hermes_home", hermes("crash-recovery", "show", str(work_op),
                                        environment=via_home),
             self.operator(named_dir, "show", str(work_op)), 0)
        same("status_default_profile", hermes("crash-recovery", "status"),
             self.operator(default_dir, "status"), 0)
        ours = hermes("-p", PROFILE, "crash-recovery", "status", "--check")
        same("status_check_exit_3", ours, self.operator(named_dir, "status", "--check"), 3)
        ours = hermes("-p", PROFILE, "crash-recovery", "--format", "prometheus", "status")
        theirs = self.operator(named_dir, "--format", "prometheus", "status")
        self.add(label, "prometheus_same",
                 ours.code == theirs.code == 0
                 and prometheus_samples(ours.stdout) == prometheus_samples(theirs.stdout)
                 and re.search(r"^crash_recovery_unresolved_operations\{[^}]*\} 1$", ours.stdout,
                               re.MULTILINE) is not None,
                 hermes=ours.detail(), operator_cli=theirs.detail())
        same("show_named_profile", hermes("-p", PROFILE, "crash-recovery", "show", str(work_op)),
             self.operator(named_dir, "show", str(work_op)), 0)
        text = hermes("-p", PROFILE, "crash-recovery", "status", "--format", "text")
        self.add(label, "status_text_names_profile_command",
                 text.code == 0 and f"hermes -p {PROFILE} crash-recovery resolve {work_op}"
                 in text.stdout and "operator_cli" not in text.stdout, **text.detail())
        ours = hermes("-p", PROFILE, "crash-recovery", "resolve", str(work_op), "--outcome",
                      "completed")
        theirs = self.operator(named_dir, "resolve", str(work_op), "--outcome", "completed")
        self.add(label, "usage_error_json_exit_1",
                 ours.code == theirs.code == 1 and (ours.json or {}).get("error", {}).get("code")
                 == (theirs.json or {}).get("error", {}).get("code") == "usage",
                 hermes=ours.detail(), operator_cli=theirs.detail())
        self.add(label, "usage_error_changed_nothing",
                 kinds(evidence.read_events(named_dir)) == ["started", "uncertain"])

        # The command the model was told to pass on, run as printed.
        for name, line, prefix, home_dir, operation in (
                ("named", facts.get("relay_resolve"), ["hermes", "-p", PROFILE, "crash-recovery"],
                 named_dir, work_op),
                ("default", facts.get("default_resolve"),
                 shlex.split(facts.get("default_prefix") or DEFAULT_PREFIXES[0]),
                 default_dir, default_op)):
            words = shlex.split(line) if line else []
            expected = [*prefix, "resolve", operation, "--outcome", "<completed|not_applied>",
                        "--evidence", "<what you checked>"]
            self.add(label, f"printed_resolve_command_{name}", words == expected, line=line,
                     expected=expected)
            if words != expected:
                continue
            words = [self.hermes if word == "hermes" else
                     "not_applied" if word == "<completed|not_applied>" else
                     RESOLVE_EVIDENCE if word == "<what you checked>" else word
                     for word in words]
            ran = self.run(words, user, cwd)
            document = ran.json or {}
            self.add(label, f"printed_resolve_command_settles_{name}",
                     ran.code == 0 and document.get("resolved") == operation
                     and document.get("outcome") == "not_applied"
                     and document.get("previous_state") == "uncertain"
                     and document.get("tool") == "book_trip"
                     and document.get("data_dir") == str(home_dir), **ran.detail())
            events = evidence.read_events(home_dir)
            self.add(label, f"resolution_journaled_{name}",
                     kinds(events) == ["started", "uncertain", "resolved"]
                     and events[-1].get("evidence") == RESOLVE_EVIDENCE, events=events)
        same("status_check_exit_0_when_clear",
             hermes("-p", PROFILE, "crash-recovery", "status", "--check"),
             self.operator(named_dir, "status", "--check"), 0)
        same("status_check_default_exit_0_when_clear", hermes("crash-recovery", "status", "--check"),
             self.operator(default_dir, "status", "--check"), 0)
        ours = hermes("-p", PROFILE, "crash-recovery", "--format", "prometheus", "status")
        self.add(label, "prometheus_clear",
                 ours.code == 0 and re.search(r"^crash_recovery_unresolved_operations\{[^}]*\} 0$",
                                              ours.stdout, re.MULTILINE) is not None,
                 **ours.detail())
        same("resolve_again_refused",
             hermes("-p", PROFILE, "crash-recovery", "resolve", str(work_op), "--outcome",
                    "completed", "--evidence", "again"),
             self.operator(named_dir, "resolve", str(work_op), "--outcome", "completed",
                           "--evidence", "again"), 1)
        same("show_resolved", hermes("-p", PROFILE, "crash-recovery", "show", str(work_op)),
             self.operator(named_dir, "show", str(work_op)), 0)

        # `hermes profile use work` makes `work` sticky: a command without -p then
        # runs in `work`. The default profile's printed command must still reach
        # the default profile.
        printed = shlex.split(str(facts.get("default_status") or ""))
        sticky = fake_home / ".hermes" / "active_profile"
        used = self.run([self.hermes, "profile", "use", PROFILE], user, cwd)
        ran = self.run([self.hermes if word == "hermes" else word for word in printed], user, cwd) \
            if printed[:1] == ["hermes"] else None
        self.add(label, "default_command_reaches_default_profile_when_another_is_sticky",
                 used.code == 0 and sticky.exists() and ran is not None and ran.code == 0
                 and (ran.json or {}).get("data_dir") == str(default_dir),
                 printed=printed, profile_use=used.detail(),
                 ran=ran.detail() if ran is not None else None)


def install_plugins(home: Path, *, with_flaky: bool) -> None:
    """Copy crash-recovery (install path 2), the booking service and, when
    asked, the flaky quote service into a profile."""
    evidence.copy_plugin_checkout(home / "plugins" / PLUGIN_NAME)
    shutil.copytree(BOOKING_PLUGIN_DIR, home / "plugins" / BOOKING)
    if with_flaky:
        shutil.copytree(FLAKY_PLUGIN_DIR, home / "plugins" / FLAKY)


# Slowest first, so two workers finish together.
STEPS = ("profiles", "reentry", "mode_config_set", "mode_protected", "mode_default",
         "mode_unknown_key")


def main(argv: Optional[List[str]] = None) -> int:
    return checker_main(argv, description="crash-recovery deployment checks inside real Hermes",
                        steps=STEPS, make_run=DeploymentRun, scenarios=SCENARIOS,
                        temp_prefix="crash-recovery-deploy-")


if __name__ == "__main__":
    raise SystemExit(main())
