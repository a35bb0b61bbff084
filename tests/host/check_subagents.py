#!/usr/bin/env python3
"""Host checks of ``delegate_task`` subagents inside a real, unmodified Hermes
(0.19, 0.20 and 0.22): a subagent's protected call runs and is journaled under
its own tool name when no protected call of the parent is running, and is
refused, never run, while the parent's protected call (the delegation itself)
is running.

    python tests/host/check_subagents.py [--keep DIR] [--only NAME ...]

Each scenario runs ``AIAgent.run_conversation`` in a child process with an
isolated ``HERMES_HOME`` and the toolsets ``hermes chat`` gives the agent,
against a scripted provider that keeps one script per agent
(tests/host/routed_provider.py), so the parent's and the subagent's turns
never race however the host interleaves them. Two ways the host runs a
subagent are driven:

* **in the delegating call** (a one-shot runner such as ``hermes -z`` or cron,
  which declares its channel stateless: ``gateway.session_context.
  declare_stateless_channel``): ``delegate_task`` returns after the subagent
  finished; the subagent runs on a worker thread in a fresh context (0.19,
  tools/delegate_tool.py ``_run_single_child``: ``_timeout_executor.submit``)
  or in a copy of the delegating call's context (0.20
  tools/delegate_tool.py ``contextvars.copy_context()``; 0.22
  tools/delegate_tool_child_run.py, same);
* **in the background** (the interactive CLI and the gateway, the host's
  default): ``delegate_task`` returns a handle at once and the subagent's
  result arrives later on ``process_registry.completion_queue``, which the
  scenario waits for as the CLI does.

Evidence: the tool messages each agent received, the booking service's
handler runs (with the session each ran in), the journal and the
independent verifier. Prints one JSON report; exits 1 on any failed check.
"""
from __future__ import annotations

import os
import queue
import sqlite3
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import check_host  # noqa: E402  (tests/, the shared child/parent machinery)
import evidence  # noqa: E402
from check_host import BOOKING, CheckList, check_registrations, events_of  # noqa: E402
from check_host_refusals import booked, outcome_reasons  # noqa: E402
from evidence import PLUGIN_NAME, blocked_document  # noqa: E402

SUBAGENT = "SUBAGENT-GOAL"  # the marker in the delegated goal: the subagent's script
PARENT_SESSION = "session-parent"
BRIDGE_NAMES = {"tool_call", "tool_search", "tool_describe"}
COMPLETION_WAIT_SECONDS = 90


def copies_context_into_subagent() -> bool:
    """Hermes >= 0.20 runs a subagent in a copy of the delegating call's context
    (0.20 tools/delegate_tool.py, 0.22 tools/delegate_tool_child_run.py:
    ``contextvars.copy_context().run``); 0.19 on a worker thread with a fresh
    context (tools/delegate_tool.py, ``_run_single_child``)."""
    return evidence.hermes_release() >= (0, 20, 0)


def handler_runs(service_db: Path) -> List[Tuple[str, str, str]]:
    """``(traveler, destination, session_id)`` of each run of book_trip's handler."""
    if not service_db.exists():
        return []
    connection = sqlite3.connect(f"file:{service_db}?mode=ro", uri=True, timeout=10)
    try:
        return [tuple(row) for row in connection.execute(
            "SELECT traveler, destination, session_id FROM attempts ORDER BY seq")]
    finally:
        connection.close()


def delegation(home: Path, checks: CheckList, parent_turns: List[Dict[str, Any]],
               subagent_turns: List[Dict[str, Any]], *, in_turn: bool,
               entries: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, str], Any]:
    """One parent conversation whose ``delegate_task`` starts one subagent.

    ``in_turn``: run the subagent inside the delegating call, as a one-shot
    runner does (``hermes -z``: hermes_cli/oneshot.py declares its channel
    stateless); else the host's default, in the background, and wait for its
    completion on the host's completion queue.  Returns the tool messages of
    both agents by tool-call id, and the provider."""
    from routed_provider import RoutedProvider
    with RoutedProvider(parent_turns, {SUBAGENT: subagent_turns}) as provider:
        evidence.write_profile(home, base_url=provider.base_url, enabled=[BOOKING, PLUGIN_NAME],
                               **({"entries": entries} if entries else {}))
        check_registrations(checks, "user")
        if in_turn:
            from gateway.session_context import declare_stateless_channel
            declare_stateless_channel()
        from hermes_cli.config import load_config
        from hermes_cli.tools_config import _get_platform_tools
        from run_agent import AIAgent
        # The toolsets `hermes chat` and `hermes -z` give the agent (the plugins'
        # included); a subagent inherits them.
        toolsets = sorted(_get_platform_tools(load_config(), "cli"))
        agent = AIAgent(base_url=provider.base_url, api_key="sk-mock", provider="custom",
                        model="mock-model", quiet_mode=True, skip_context_files=True,
                        skip_memory=True, max_iterations=len(parent_turns) + 2,
                        session_id=PARENT_SESSION, enabled_toolsets=toolsets)
        outcome = agent.run_conversation("Delegate the booking.")
        if not in_turn:
            checks.check("subagent_completed", completion_status() == "completed")
        messages = {m["tool_call_id"]: str(m["content"]) for m in provider.tool_messages()}
    checks.check("conversation_finished", outcome.get("final_response") == "done"
                 and provider.remaining_lane_turns(SUBAGENT) == 0
                 and provider.holds_timed_out == [],
                 final=outcome.get("final_response"), messages=messages,
                 holds_timed_out=provider.holds_timed_out)
    return messages, provider


def completion_status() -> Optional[str]:
    """Wait for the background subagent's completion event on the queue the
    CLI and gateway drain (``tools.process_registry.process_registry.
    completion_queue``, ``type: async_delegation``); its status, or None if
    none arrives in time."""
    from tools.process_registry import process_registry
    while True:
        try:
            event = process_registry.completion_queue.get(timeout=COMPLETION_WAIT_SECONDS)
        except queue.Empty:
            return None
        if event.get("type") == "async_delegation" and not event.get("task_failure_notice"):
            return event.get("status")


def delegate_result(messages: Dict[str, str]) -> Dict[str, Any]:
    """The parent's ``delegate_task`` result, decoded ({} if not JSON)."""
    try:
        document = evidence.decode_json_text(messages.get("call_delegate", ""))
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def check_subagent_booked(checks: CheckList, home: Path, messages: Dict[str, str],
                          provider: Any) -> None:
    """The subagent's book_trip ran once, in the subagent's own session, and is
    journaled under book_trip (never a Tool Search bridge name) in that
    session; on 0.20+ the subagent reached it through ``tool_call``."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    runs = handler_runs(service)
    checks.check("subagent_call_ran_once", booked(messages.get("call_child_book", ""))
                 and len(runs) == 1 and runs[0][:2] == ("Ada", "Lisbon")
                 and runs[0][2] not in ("", PARENT_SESSION),
                 runs=runs, message=messages.get("call_child_book"))
    started = [e for e in events_of(home) if e["kind"] == "started"
               and e["tool_call_id"] == "call_child_book"]
    checks.check("journaled_under_tool_name_in_subagent_session",
                 [(e["tool"], e["session_id"]) for e in started]
                 == [("book_trip", runs[0][2] if runs else None)],
                 started=started, runs=runs)
    checks.check("no_bridge_name_in_journal",
                 not {e.get("tool") for e in events_of(home)} & BRIDGE_NAMES,
                 events=events_of(home))
    checks.check("reached_as_the_host_offers_it",
                 ("call_child_book" in provider.bridged) == (evidence.hermes_release()
                                                             >= (0, 20, 0)),
                 bridged=provider.bridged, hermes=evidence.hermes_version())


SUBAGENT_BOOKS = [
    {"tool_calls": [{"id": "call_child_book", "name": "book_trip",
                     "arguments": {"traveler": "Ada", "destination": "Lisbon"}}]},
    {"text": "subagent done"},
]
DELEGATE = {"tool_calls": [{"id": "call_delegate", "name": "delegate_task",
                            "arguments": {"goal": f"{SUBAGENT}: book Lisbon for Ada"}}]}


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_outside_protected_call(home: Path, checks: CheckList) -> None:
    """``protected_tools: [book_trip]``: delegate_task is not protected, so no
    protected call of the parent runs while the subagent (inside the
    delegating call) books: the booking runs once and is journaled."""
    messages, provider = delegation(
        home, checks, [DELEGATE, {"text": "done"}], SUBAGENT_BOOKS, in_turn=True,
        entries={PLUGIN_NAME: {"settings": {"protected_tools": ["book_trip"]}}})
    results = delegate_result(messages).get("results") or [{}]
    checks.check("subagent_ran_inside_the_delegating_call",
                 results[0].get("status") == "completed"
                 and results[0].get("summary") == "subagent done", result=messages.get("call_delegate"))
    check_subagent_booked(checks, home, messages, provider)
    checks.check("journal_outcomes", outcome_reasons(events_of(home)) == {
        "call_child_book": ("book_trip", "returned", "returned")}, events=events_of(home))


def scenario_inside_protected_call(home: Path, checks: CheckList) -> None:
    """Default settings (every tool but read_file and search_files is
    protected, delegate_task included): the subagent books while the
    delegating call runs, and is refused, never run: ``nested_call`` where the
    subagent runs in a copy of that call's context (0.20+),
    ``operation_in_flight`` where it runs in a fresh one (0.19). The
    delegation ends ``returned``, and the parent's own booking after it runs."""
    parent = [DELEGATE,
              {"tool_calls": [{"id": "call_parent_book", "name": "book_trip",
                               "arguments": {"traveler": "Bo", "destination": "Paris"}}]},
              {"text": "done"}]
    messages, _provider = delegation(home, checks, parent, SUBAGENT_BOOKS, in_turn=True)
    events = events_of(home)
    delegation_ids = [e["operation_id"] for e in events
                      if e["kind"] == "started" and e["tool"] == "delegate_task"]
    refusal = blocked_document(messages.get("call_child_book", "")) or {}
    expected = "nested_call" if copies_context_into_subagent() else "operation_in_flight"
    checks.check("subagent_call_refused_naming_the_delegation",
                 refusal.get("code") == expected and len(delegation_ids) == 1
                 and delegation_ids[0] in refusal.get("explanation", ""),
                 expected=expected, refusal=refusal, delegation_ids=delegation_ids)
    # Where the subagent cannot be seen as nested, it is told not to wait for its parent.
    checks.check("subagent_told_not_to_wait_for_its_parent",
                 ("If you are a subagent started by that call" in refusal.get("explanation", ""))
                 == (expected == "operation_in_flight"), refusal=refusal)
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    checks.check("only_the_parents_booking_ran",
                 handler_runs(service) == [("Bo", "Paris", PARENT_SESSION)]
                 and booked(messages.get("call_parent_book", "")),
                 runs=handler_runs(service), message=messages.get("call_parent_book"))
    checks.check("journal_outcomes", outcome_reasons(events) == {
        "call_delegate": ("delegate_task", "returned", "returned"),
        "call_parent_book": ("book_trip", "returned", "returned")}, events=events)


def scenario_background(home: Path, checks: CheckList) -> None:
    """Default settings, the host's default delegation: delegate_task (protected)
    returns a handle at once and is journaled; the subagent's booking, made
    once the delegating call has ended (the provider holds it until the
    parent sent that call's result), runs once and is journaled."""
    subagent = [dict(SUBAGENT_BOOKS[0], after_tool_result="call_delegate"), SUBAGENT_BOOKS[1]]
    messages, provider = delegation(home, checks, [DELEGATE, {"text": "done"}], subagent,
                                    in_turn=False)
    checks.check("delegation_dispatched_in_background",
                 delegate_result(messages).get("status") == "dispatched",
                 result=messages.get("call_delegate"))
    check_subagent_booked(checks, home, messages, provider)
    events = events_of(home)
    checks.check("journal_outcomes", outcome_reasons(events) == {
        "call_delegate": ("delegate_task", "returned", "returned"),
        "call_child_book": ("book_trip", "returned", "returned")}, events=events)


SCENARIOS = {"outside_protected_call": scenario_outside_protected_call,
             "inside_protected_call": scenario_inside_protected_call,
             "background": scenario_background}


# --------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------

class SubagentRun(check_host.HostRun):
    """One profile per scenario: the booking service and crash-recovery."""

    CHILD_SCRIPT = str(Path(__file__).resolve())

    def run_step(self, label: str) -> None:
        home = self.user_profile(label)
        self.run_scenario(label, label, home)
        self.verify_journal(label, home)

    def outside_protected_call(self) -> None:
        self.run_step("outside_protected_call")

    def inside_protected_call(self) -> None:
        self.run_step("inside_protected_call")

    def background(self) -> None:
        self.run_step("background")


def main(argv: Optional[List[str]] = None) -> int:
    return check_host.checker_main(argv, description="crash-recovery: delegate_task subagents",
                                   steps=tuple(SCENARIOS), make_run=SubagentRun,
                                   scenarios=SCENARIOS, temp_prefix="crash-recovery-subagents-")


if __name__ == "__main__":
    raise SystemExit(main())
