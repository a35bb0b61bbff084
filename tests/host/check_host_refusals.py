#!/usr/bin/env python3
"""Host checks of what differs between Hermes 0.19, 0.20 and 0.22, inside a
real, unmodified Hermes: calls the host refuses (another plugin's block, the
bundled security-guidance plugin, a Tool Search ``tool_call`` naming an
unknown tool) and a control whose handler ran and failed; the concurrent path
and ``execute_code``'s bridge; settings written the ways each host stores
them; ``plugins.isolation: host``.

    python tests/host/check_host_refusals.py [--keep DIR] [--only NAME ...]

Each scenario runs ``AIAgent.run_conversation`` against the scripted provider
(tests/host/mock_provider.py) in a child process with an isolated
``HERMES_HOME``, as tests/check_host.py does, and reads the evidence: the tool
messages the model received, the booking service's handler runs, the journal
file and the policy plugin's log.  Prints one JSON report; exits 1 on any
failed check.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import check_host  # noqa: E402  (tests/, the shared child/parent machinery)
import evidence  # noqa: E402
from check_host import BOOKING, PROBE, CheckList, events_of  # noqa: E402
from evidence import (HOST_COMMAND_SECONDS, PLUGIN_NAME, PROBE_PLUGIN_DIR, blocked_document, data_dir_of,  # noqa: E402
                      service_counts)

POLICY = "policy-gate"
POLICY_PLUGIN_DIR = HOST_DIR / "policy_plugin"
EMBARGOED = "Embargoed"


def hooks_inside_middleware() -> bool:
    """Hermes >= 0.20 runs every plugin's ``pre_tool_call`` hook inside the
    ``tool_execution`` middleware's ``next_call`` (agent/tool_executor.py,
    ``_run_agent_tool_execution_middleware``); 0.19 runs hooks first."""
    return evidence.hermes_release() >= (0, 20, 0)


def conversation(home: Path, checks: CheckList, turns: List[Dict[str, Any]], prompt: str, *,
                 session_id: str, enabled: List[str],
                 entries: Optional[Dict[str, Any]] = None,
                 isolation: Optional[str] = None) -> Dict[str, str]:
    """One ``AIAgent.run_conversation`` against the scripted provider (with
    ``plugins.isolation`` set when given); checks that crash-recovery loaded
    with its middleware and both hooks and that the conversation finished;
    returns the tool messages by tool-call id."""
    from mock_provider import ScriptedProvider
    with ScriptedProvider(turns) as provider:
        config = evidence.write_profile(home, base_url=provider.base_url, enabled=enabled,
                                        **({"entries": entries} if entries else {}))
        if isolation is not None:
            document = json.loads(config.read_text(encoding="utf-8"))
            document["plugins"]["isolation"] = isolation
            config.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        import model_tools  # noqa: F401  (importing it runs plugin discovery)
        from hermes_cli.plugins import get_plugin_manager
        loaded = get_plugin_manager()._plugins.get(PLUGIN_NAME)
        checks.check("plugin_loaded_with_both_hooks",
                     loaded is not None and loaded.error is None
                     and loaded.hooks_registered == ["pre_tool_call", "post_tool_call"]
                     and loaded.middleware_registered == ["tool_execution"],
                     found=None if loaded is None else {"error": loaded.error,
                                                        "hooks": loaded.hooks_registered})
        from run_agent import AIAgent
        agent = AIAgent(base_url=provider.base_url, api_key="sk-mock", provider="custom",
                        model="mock-model", quiet_mode=True, skip_context_files=True,
                        skip_memory=True, max_iterations=len(turns) + 2, session_id=session_id)
        outcome = agent.run_conversation(prompt)
        messages = {m["tool_call_id"]: str(m["content"]) for m in provider.tool_messages()}
    checks.check("conversation_finished", outcome.get("final_response") == "done",
                 final=outcome.get("final_response"), messages=messages)
    return messages


def booked(text: str) -> bool:
    """Whether a tool message is a successful booking (framed or not)."""
    try:
        document = evidence.decode_json_text(text)
    except ValueError:
        return False
    return isinstance(document, dict) and document.get("status") == "booked"


def outcome_reasons(events: List[Dict[str, Any]]) -> Dict[str, tuple]:
    """``tool_call_id -> (tool, closing kind, reason)`` of each journaled call."""
    started = {e["operation_id"]: e for e in events if e["kind"] == "started"}
    found = {}
    for event in events:
        if event["kind"] in ("returned", "uncertain") and event["operation_id"] in started:
            first = started[event["operation_id"]]
            found[first["tool_call_id"]] = (first["tool"], event["kind"], event["reason"])
    return found


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_refusals(home: Path, checks: CheckList) -> None:
    """Another plugin's ``pre_tool_call`` block, a Tool Search ``tool_call``
    naming a tool that does not exist, then a normal booking (the gate stayed
    open), then the control: a handler that ran and raised (uncertain), after
    which a booking is refused."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    policy_log = Path(os.environ["POLICY_GATE_LOG"])
    turns = [
        {"tool_calls": [{"id": "call_embargo", "name": "book_trip",
                         "arguments": {"traveler": "Ada", "destination": EMBARGOED}}]},
        {"tool_calls": [{"id": "call_unknown", "name": "no_such_tool",
                         "arguments": {"amount": 5}}]},
        {"tool_calls": [{"id": "call_lisbon", "name": "book_trip",
                         "arguments": {"traveler": "Ada", "destination": "Lisbon"}}]},
        {"tool_calls": [{"id": "call_atlantis", "name": "book_trip",
                         "arguments": {"traveler": "Bo", "destination": "Atlantis"}}]},
        {"tool_calls": [{"id": "call_paris", "name": "book_trip",
                         "arguments": {"traveler": "Cy", "destination": "Paris"}}]},
        {"text": "done"},
    ]
    messages = conversation(home, checks, turns, "Book the trips.", session_id="session-refusals",
                            enabled=[BOOKING, POLICY, PLUGIN_NAME])
    decisions = [json.loads(line) for line in policy_log.read_text().splitlines()] \
        if policy_log.exists() else []
    checks.check("policy_blocked_embargo",
                 {"tool": "book_trip", "tool_call_id": "call_embargo", "blocked": True}
                 in decisions and "policy-gate" in messages.get("call_embargo", ""),
                 decisions=decisions, message=messages.get("call_embargo"))
    # Tool Search (0.20+) sends it as tool_call naming the unknown tool, which
    # the guard refuses itself (nothing runs, nothing is journaled); 0.19's
    # executor answers that the tool does not exist before any middleware.
    unknown = blocked_document(messages.get("call_unknown", ""))
    checks.check("unknown_tool_refused_not_journaled",
                 (unknown or {}).get("code") == "bridge_call_unresolved"
                 if hooks_inside_middleware() else
                 unknown is None and "no_such_tool" in messages.get("call_unknown", ""),
                 message=messages.get("call_unknown"))
    checks.check("lisbon_booked_gate_stayed_open", booked(messages.get("call_lisbon", "")),
                 message=messages.get("call_lisbon"))
    # Handler runs: Lisbon (booked) and Atlantis (raised); never Embargoed or Paris.
    checks.check("handler_runs", service_counts(service) == {"bookings": 1, "attempts": 2},
                 counts=service_counts(service))
    events = events_of(home)
    outcomes = outcome_reasons(events)
    expected = {"call_lisbon": ("book_trip", "returned", "returned"),
                "call_atlantis": ("book_trip", "uncertain", "error_response")}
    if hooks_inside_middleware():
        expected["call_embargo"] = ("book_trip", "returned", "not_run_host_refused")
    checks.check("journal_outcomes", outcomes == expected, outcomes=outcomes, events=events)
    checks.check("no_bridge_name_in_journal",
                 not {e.get("tool") for e in events} & {"tool_call", "tool_search", "tool_describe"},
                 events=events)
    refusal = blocked_document(messages.get("call_paris", ""))
    atlantis = [e["operation_id"] for e in events
                if e["kind"] == "started" and e["tool_call_id"] == "call_atlantis"]
    checks.check("control_closes_gate",
                 refusal is not None and refusal.get("code") == "unresolved_operations"
                 and refusal.get("operation_ids") == atlantis,
                 refusal=refusal, message=messages.get("call_paris"))
    code, status = evidence.operator_cli(data_dir_of(home), "status")
    checks.check("status_lists_only_the_control",
                 code == 0 and status.get("gate") == "closed"
                 and [op["operation_id"] for op in status.get("unresolved", [])] == atlantis,
                 code=code, status=status)


def spy_on_concurrent_executor() -> List[List[str]]:
    """Record the tool-call ids of every batch Hermes hands its concurrent
    executor (``agent.tool_executor.execute_tool_calls_concurrent``, looked up
    at call time on 0.19-0.22); returns the list it fills."""
    import agent.tool_executor as tool_executor
    batches: List[List[str]] = []
    original = tool_executor.execute_tool_calls_concurrent

    def spy(agent, assistant_message, *args, **kwargs):
        batches.append([call.id for call in assistant_message.tool_calls])
        return original(agent, assistant_message, *args, **kwargs)

    tool_executor.execute_tool_calls_concurrent = spy
    return batches


INNER_CALL_SCRIPT = (
    "import json\n"
    "from hermes_tools import web_extract\n"
    "print(json.dumps(web_extract(urls=['https://inner.example/c'])))\n")


def scenario_concurrent_and_code(home: Path, checks: CheckList) -> None:
    """The concurrent path: a protected call another plugin blocks beside an
    exempt read_file, then an admitted one beside another read_file; then
    ``execute_code`` whose script calls a protected tool through Hermes' RPC
    bridge (a nested call: refused, never run)."""
    probe_log = Path(os.environ["HOST_PROBE_LOG"])
    pages = [home / "page1.txt", home / "page2.txt"]
    for number, page in enumerate(pages, 43):
        page.write_text(f"gamma-{number}\n", encoding="utf-8")
    batches = spy_on_concurrent_executor()
    turns = [
        {"tool_calls": [
            {"id": "call_web_embargo", "name": "web_extract",
             "arguments": {"urls": ["https://embargoed.example/a"]}},
            {"id": "call_read_1", "name": "read_file", "arguments": {"path": str(pages[0])}}]},
        {"tool_calls": [
            {"id": "call_web_ok", "name": "web_extract",
             "arguments": {"urls": ["https://ok.example/b"]}},
            {"id": "call_read_2", "name": "read_file", "arguments": {"path": str(pages[1])}}]},
        {"tool_calls": [{"id": "call_code", "name": "execute_code",
                         "arguments": {"code": INNER_CALL_SCRIPT}}]},
        {"text": "done"},
    ]
    messages = conversation(home, checks, turns, "Fetch, read, then run the script.",
                            session_id="session-concurrent-code",
                            enabled=[BOOKING, POLICY, PLUGIN_NAME, PROBE],
                            entries={PROBE: {"allow_tool_override": True}})
    checks.check("took_concurrent_path", batches == [["call_web_embargo", "call_read_1"],
                                                     ["call_web_ok", "call_read_2"]],
                 batches=batches)
    records = [json.loads(line) for line in probe_log.read_text().splitlines()] \
        if probe_log.exists() else []
    handled = [r["urls"] for r in records if r["event"] == "handler"]
    checks.check("only_the_admitted_page_fetched", handled == [["https://ok.example/b"]],
                 records=records)
    checks.check("read_files_untouched",
                 "gamma-43" in messages.get("call_read_1", "")
                 and "gamma-44" in messages.get("call_read_2", ""),
                 messages=messages)
    checks.check("blocked_page_told_by_policy", "policy-gate" in messages.get("call_web_embargo", ""),
                 message=messages.get("call_web_embargo"))
    # The script's output holds the refusal JSON, escaped once per layer.
    checks.check("inner_call_refused_as_nested",
                 "nested_call" in messages.get("call_code", "")
                 and "inner.example" not in json.dumps(records), message=messages.get("call_code"))
    outcomes = outcome_reasons(events_of(home))
    expected = {"call_web_ok": ("web_extract", "returned", "returned"),
                "call_code": ("execute_code", "returned", "returned")}
    if hooks_inside_middleware():
        expected["call_web_embargo"] = ("web_extract", "returned", "not_run_host_refused")
    checks.check("journal_outcomes", outcomes == expected, outcomes=outcomes,
                 events=events_of(home))


SECURITY_GUIDANCE = "security-guidance"  # bundled with Hermes 0.22


def scenario_security_guidance(home: Path, checks: CheckList) -> None:
    """Hermes 0.22's bundled ``security-guidance`` plugin in block mode
    (``SECURITY_GUIDANCE_BLOCK=1``) refuses a write whose content matches a
    dangerous pattern: the file is never written, the journal says not run,
    and the next write goes through."""
    risky, safe = home / "risky.py", home / "safe.py"
    turns = [
        {"tool_calls": [{"id": "call_risky", "name": "write_file", "arguments": {
            "path": str(risky), "content": "import os\nos.system(user_input)\n"}}]},
        {"tool_calls": [{"id": "call_safe", "name": "write_file", "arguments": {
            "path": str(safe), "content": "print('hello')\n"}}]},
        {"text": "done"},
    ]
    messages = conversation(home, checks, turns, "Write the two files.",
                            session_id="session-security-guidance",
                            enabled=[SECURITY_GUIDANCE, PLUGIN_NAME])
    checks.check("risky_write_refused_by_plugin",
                 "security-guidance refused this write" in messages.get("call_risky", "")
                 and not risky.exists(), message=messages.get("call_risky"))
    checks.check("safe_write_done", safe.exists(), message=messages.get("call_safe"))
    outcomes = outcome_reasons(events_of(home))
    checks.check("journal_outcomes", outcomes == {
        "call_risky": ("write_file", "returned", "not_run_host_refused"),
        "call_safe": ("write_file", "returned", "returned")}, outcomes=outcomes,
        events=events_of(home))


def scenario_isolation_mode(home: Path, checks: CheckList) -> None:
    """Hermes 0.22 with ``plugins.isolation: host`` gives the middleware no
    ``next_call``: an unprotected tool runs untouched, a protected one is
    refused naming the setting, and the status tool says isolation mode cannot
    be protected."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    page = home / "page.txt"
    page.write_text("delta-45\n", encoding="utf-8")
    turns = [
        {"tool_calls": [{"id": "call_read", "name": "read_file", "arguments": {"path": str(page)}}]},
        {"tool_calls": [{"id": "call_book", "name": "book_trip",
                         "arguments": {"traveler": "Ada", "destination": "Lisbon"}}]},
        {"tool_calls": [{"id": "call_status", "name": "crash_recovery_status", "arguments": {}}]},
        {"text": "done"},
    ]
    messages = conversation(home, checks, turns, "Read, book, check.", session_id="session-iso",
                            enabled=[BOOKING, PLUGIN_NAME], isolation="host")
    checks.check("unprotected_tool_ran", "delta-45" in messages.get("call_read", ""),
                 message=messages.get("call_read"))
    refusal = blocked_document(messages.get("call_book", ""))
    checks.check("protected_call_refused_naming_the_setting",
                 (refusal or {}).get("code") == "isolation_unsupported"
                 and "plugins.isolation: in_process" in refusal.get("explanation", ""),
                 message=messages.get("call_book"))
    checks.check("handler_never_ran", service_counts(service) == {"bookings": 0, "attempts": 0},
                 counts=service_counts(service))
    try:
        status = evidence.decode_json_text(messages.get("call_status", ""))
    except ValueError:
        status = {}
    checks.check("status_says_isolation_cannot_be_protected",
                 status.get("gate") == "closed"
                 and "isolation mode cannot be protected" in str(status.get("isolation_problem")),
                 status=status)
    checks.check("nothing_journaled", events_of(home) == [], events=events_of(home))


def scenario_booking_protected(home: Path, checks: CheckList) -> None:
    """book_trip is journaled (protected), whatever the settings' spelling."""
    check_host.hermes_call("book_trip", {"traveler": "Ada", "destination": "Lisbon"},
                           session_id="session-settings", call_id="call-settings")
    checks.check("book_trip_protected",
                 [(e["kind"], e.get("tool")) for e in events_of(home)]
                 == [("started", "book_trip"), ("returned", None)], events=events_of(home))


def scenario_bridged_booking(home: Path, checks: CheckList) -> None:
    """``protected_tools: [book_trip]``: the model
    reaches book_trip and lookup_receipt the way the host offers them (Tool
    Search's ``tool_call`` on 0.20+); only book_trip is journaled, under its own
    name."""
    turns = [
        {"tool_calls": [{"id": "call_book", "name": "book_trip",
                         "arguments": {"traveler": "Ada", "destination": "Lisbon"}}]},
        {"tool_calls": [{"id": "call_lookup", "name": "lookup_receipt",
                         "arguments": {"traveler": "Ada"}}]},
        {"text": "done"},
    ]
    messages = conversation(home, checks, turns, "Book, then look it up.",
                            session_id="session-bridged", enabled=[BOOKING, PLUGIN_NAME],
                            entries={PLUGIN_NAME: {"settings": {"protected_tools": ["book_trip"]}}})
    checks.check("both_tools_ran", booked(messages.get("call_book", ""))
                 and '"count": 1' in messages.get("call_lookup", ""), messages=messages)
    checks.check("only_the_protected_tool_journaled", outcome_reasons(events_of(home)) == {
        "call_book": ("book_trip", "returned", "returned")}, events=events_of(home))


SCENARIOS = {"booking_protected": scenario_booking_protected,
             "bridged_booking": scenario_bridged_booking, "refusals": scenario_refusals, "concurrent_and_code": scenario_concurrent_and_code,
             "security_guidance": scenario_security_guidance,
             "isolation_mode": scenario_isolation_mode}


# --------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------

class RefusalRun(check_host.HostRun):
    """Profiles with the booking service, the policy plugin and crash-recovery."""

    CHILD_SCRIPT = str(Path(__file__).resolve())

    def profile(self, label: str) -> Path:
        home = self.user_profile(label)
        shutil.copytree(POLICY_PLUGIN_DIR, home / "plugins" / POLICY)
        shutil.copytree(PROBE_PLUGIN_DIR, home / "plugins" / PROBE)
        return home

    def refusals(self) -> None:
        home = self.profile("refusals")
        self.run_scenario("refusals", "refusals", home,
                          POLICY_GATE_LOG=str(home.parent / "policy.log"))
        self.verify_journal("refusals", home)

    def concurrent_and_code(self) -> None:
        home = self.profile("concurrent_and_code")
        self.run_scenario("concurrent_and_code", "concurrent_and_code", home,
                          HOST_PROBE_LOG=str(home.parent / "probe.log"))
        self.verify_journal("concurrent_and_code", home)

    def security_guidance(self) -> None:
        home = self.new_home("security_guidance")
        evidence.copy_plugin_checkout(home / "plugins" / PLUGIN_NAME)
        self.run_scenario("security_guidance", "security_guidance", home,
                          SECURITY_GUIDANCE_BLOCK="1")
        self.verify_journal("security_guidance", home)

    def operator_status(self, home: Path, **environment: str) -> Dict[str, Any]:
        """``hermes crash-recovery status`` (JSON) in ``home``."""
        ran = subprocess.run(self.isolation_prefix + [self.hermes, "crash-recovery", "status"],
                             env=self.child_environment(home, **environment),
                             capture_output=True, text=True, timeout=HOST_COMMAND_SECONDS,
                             stdin=subprocess.DEVNULL, cwd=str(home.parent))
        try:
            return json.loads(ran.stdout)
        except ValueError:
            return {"stdout": ran.stdout[-2000:], "stderr": ran.stderr[-2000:]}

    def settings_leftover_and_reference(self) -> None:
        """A leftover legacy ``config`` subtree beside ``settings`` and a
        ``${VAR}`` tool name: never "both modes set", never a tool left
        unprotected; 0.20+ expands the reference, 0.19 fails closed saying so."""
        label = "settings_leftover_and_reference"
        home = self.user_profile(label)
        evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME], entries={PLUGIN_NAME: {
            "settings": {"protected_tools": ["${PAY_TOOL}"]},
            "config": {"read_only_tools": ["read_file", "book_trip"]}}})
        shown = self.operator_status(home, PAY_TOOL="book_trip").get("settings") or {}
        expanded = {"mode": "protected_tools", "protected_tools": ["book_trip"]}
        if evidence.hermes_release() >= (0, 20, 0):
            self.add(label, "settings_as_written_expanded",
                     {key: shown.get(key) for key in expanded} == expanded
                     and not shown.get("problem"), shown=shown)
        else:
            self.add(label, "unexpanded_reference_fails_closed",
                     "unexpanded ${...} reference" in str(shown.get("problem"))
                     and shown.get("read_only_tools") == [], shown=shown)
        self.add(label, "leftover_config_not_read_as_both_modes",
                 "both set" not in str(shown.get("problem")), shown=shown)
        self.run_scenario(label, "booking_protected", home, PAY_TOOL="book_trip")
        self.verify_journal(label, home)

    def settings_config_set(self) -> None:
        """``hermes config set`` of a tool list (a string on 0.19/0.20, a real
        list on 0.22) gives the same settings on every host."""
        label = "settings_config_set"
        home = self.user_profile(label)
        ran = subprocess.run(self.isolation_prefix + [
            self.hermes, "config", "set", "plugins.entries.crash-recovery.settings.protected_tools",
            '["book_trip"]'], env=self.child_environment(home), capture_output=True, text=True,
            timeout=HOST_COMMAND_SECONDS, stdin=subprocess.DEVNULL, cwd=str(home.parent))
        self.add(label, "config_set_exit_0", ran.returncode == 0,
                 output=(ran.stdout + ran.stderr)[-2000:])
        shown = self.operator_status(home).get("settings") or {}
        self.add(label, "same_settings_as_written",
                 shown.get("mode") == "protected_tools"
                 and shown.get("protected_tools") == ["book_trip"] and not shown.get("problem"),
                 shown=shown, stored=(home / "config.yaml").read_text(encoding="utf-8")[-600:])
        self.run_scenario(label, "bridged_booking", home)  # rewrites the profile

    def isolation_mode(self) -> None:
        home = self.user_profile("isolation_mode")
        self.run_scenario("isolation_mode", "isolation_mode", home)


def host_steps() -> tuple:
    """The steps this host can run: the bundled security-guidance plugin and
    ``plugins.isolation`` exist from Hermes 0.22."""
    steps = ("refusals", "concurrent_and_code", "settings_leftover_and_reference",
             "settings_config_set")
    if evidence.hermes_release() >= (0, 22, 0):
        steps += ("security_guidance", "isolation_mode")
    return steps


def main(argv: Optional[List[str]] = None) -> int:
    return check_host.checker_main(argv, description="crash-recovery: host refusals, Tool Search",
                                   steps=host_steps(), make_run=RefusalRun, scenarios=SCENARIOS,
                                   temp_prefix="crash-recovery-refusals-")


if __name__ == "__main__":
    raise SystemExit(main())
