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
failed check, 2 when Hermes is not importable.
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
from typing import Any, Dict, List, Optional, Sequence

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
from concurrent_path import scenario_reentry  # noqa: E402
from scenario_support import status_tool  # noqa: E402
from operator_commands import (DEFAULT_PREFIXES, PROFILE, PROGRAM, RESOLVE_EVIDENCE,  # noqa: E402
                               OperatorCommands, Ran, without_volatile)

SCENARIO_TIMEOUT_SECONDS = 300
COMMAND_TIMEOUT_SECONDS = 90
FLAKY = "flaky-service"
FLAKY_PLUGIN_DIR = HOST_DIR / "flaky_plugin"
# An absolute path in text meant for a chat: "/" starting a path component,
# not inside a word ("and/or") or a placeholder ("<a|b>").
ABSOLUTE_PATH = re.compile(r"(?<![\w.<>|/-])/[\w.~-]")
SETTINGS_KEY = f"plugins.entries.{PLUGIN_NAME}.settings.protected_tools"


# --------------------------------------------------------------------------
# In-child helpers
# --------------------------------------------------------------------------

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
    # It tells the user how a person looks at the operation, never how to settle it.
    checks.check(f"{name}_show_command",
                 f"{prefix} show {operation_id}" in explanation
                 and not re.search(r"\b(resolve|acknowledge)\b|--(force|outcome|evidence)",
                                   explanation), explanation=explanation)
    checks.check(f"{name}_no_path", not paths_in(json.dumps(document)),
                 found=paths_in(json.dumps(document)), document=document)


def resolve_line(text: str, prefix: str) -> Optional[str]:
    """The ``PREFIX resolve ...`` command line printed in ``text`` (an
    operator's surface: the slash command)."""
    start = text.find(f"{prefix} resolve ")
    if start < 0:
        return None
    line = text[start:].splitlines()[0]
    end = line.find(">\"", line.find("--evidence"))
    return line[:end + 2] if end >= 0 else line


def show_line(text: str, prefix: str) -> Optional[str]:
    """The ``PREFIX show OP`` command line printed in ``text``."""
    found = re.search(re.escape(prefix) + r" show [0-9a-f-]{36}", text)
    return found.group(0) if found else None



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
    # While the gate is closed only the read-only tools run, in this mode too
    # (docs/guard.md §While the gate is closed): refused, not journaled.
    result = hermes_call("flaky_quote", {"item": "chair", "shape": "error"},
                         session_id="session-Q", call_id="call-Q1", hook=True)
    refusal = blocked_document(result) or {}
    checks.check("unprotected_tool_refused_while_closed",
                 refusal.get("code") == "unresolved_operations"
                 and refusal.get("operation_ids") == [operation_id] and len(flaky_runs()) == 2,
                 result=result, runs=flaky_runs())
    notes = home / "notes.txt"
    notes.write_text("read-only-marker-5d2\n", encoding="utf-8")
    result = hermes_call("read_file", {"path": str(notes)}, session_id="session-Q",
                         call_id="call-Q2", hook=True)
    checks.check("read_only_tool_runs_while_closed", "read-only-marker-5d2" in result
                 and blocked_document(result) is None, result=result[:400])
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
                 "! settings_problem: the settings could not be read exactly" in text
                 and "read_only_tool" in text, text=text)


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
                default_show=show_line(str((refusal or {}).get("explanation", "")), prefix))


def scenario_relay(home: Path, checks: CheckList) -> None:
    """Named profile, a real agent loop: book_trip fails (uncertain, WARNING in
    Hermes' log), the next book_trip is refused, and the model is sent the
    blocked text naming ``hermes -p work crash-recovery`` (``hermesx`` on
    0.20.1: the host's own program). Then /crash-recovery
    through Hermes' plugin-command registry."""
    prefix = f"{PROGRAM} -p {PROFILE} crash-recovery"
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
                relay_show=show_line(str((refusal or {}).get("explanation", "")), prefix),
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

class DeploymentRun(CheckerRun, OperatorCommands):
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
        recorded = (self.operator(data_dir, "status").json or {}).get("settings") or {}
        self.add(label, "hermes_status_shows_settings",
                 (shown.get("settings") or {}).get("mode") == "read_only_tools"
                 and "recorded_at" not in shown.get("settings", {})
                 and recorded.get("mode") == "read_only_tools" and recorded.get("recorded_at"),
                 settings=shown.get("settings"), recorded=recorded)
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
        line as a YAML string (Hermes 0.19, 0.20) or as a real list (0.22);
        the plugin reads either as the list it means."""
        label = "mode_config_set"
        home = self.plain_profile(label)
        ran = self.run([self.hermes, "config", "set", SETTINGS_KEY, '["book_trip"]'],
                       self.service_environment(home.parent, HERMES_HOME=str(home)), home.parent)
        self.add(label, "config_set_exit_0", ran.code == 0, **ran.detail())
        text = (home / "config.yaml").read_text(encoding="utf-8")
        config = evidence.load_yaml(text) or {}
        plugins = config.get("plugins") or {}
        stored = (((plugins.get("entries") or {}).get(PLUGIN_NAME) or {}).get("settings")
                  or {}).get("protected_tools")
        if config_set_stores_lists():
            self.add(label, "config_set_stores_a_list", stored == ["book_trip"],
                     stored=stored, config_yaml=text)
        else:
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
        # The probe loads first (check_host.PROBE): its tracing middleware is the outermost link.
        shutil.copytree(PROBE_PLUGIN_DIR, home / "plugins" / PROBE)
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
        check_slash_text(checks, "process_command", text, f"{PROGRAM} -p {PROFILE} crash-recovery",
                         facts.get("relay_operation"))
        self.results.extend(checks.results)

def config_set_stores_lists() -> bool:
    """Whether the host's ``hermes config set KEY '["a"]'`` stores a real YAML
    list (0.22) rather than the string typed (0.19, 0.20)."""
    return evidence.hermes_release() >= (0, 22, 0)


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
