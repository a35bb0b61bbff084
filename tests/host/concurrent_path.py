"""The host's concurrent path (two parallel-safe calls in one assistant
message) and re-entry, driven through ``AIAgent.run_conversation`` in scenario
children of tests/check_host.py (``concurrent``) and
tests/host/check_deployment.py (``reentry``: arguments the host coerces,
``execute_code``'s RPC bridge). One protected call is admitted, its sibling
refused as in flight, and the host's own behaviour on that path is checked as
it is on each release (0.19 enters every middleware twice, nested, coercing
arguments in between; 0.20+ once, with the model's raw arguments).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import evidence
from evidence import PLUGIN_NAME, blocked_document, kinds
from install_steps import BOOKING
from scenario_support import (PROBE, CheckList, booked, events_of, scripted_conversation,
                              status_tool)


def scenario_concurrent(home: Path, checks: CheckList) -> None:
    """Two protected calls in one assistant message (Hermes' concurrent executor,
    which enters the execution middleware twice, nested, per call on 0.19 and
    once on 0.20+), then two exempt read_file calls, driven by
    AIAgent.run_conversation. The probe's
    handler holds the admitted call open until the sibling has left the
    execution chain, so the two calls always overlap."""
    probe_log = Path(os.environ["HOST_PROBE_LOG"])
    first, second = home / "first.txt", home / "second.txt"
    first.write_text("alpha-41\n", encoding="utf-8")
    second.write_text("beta-42\n", encoding="utf-8")
    turns = [
        {"tool_calls": [
            {"id": "call_web_1", "name": "web_extract", "arguments": {"urls": ["https://a.example/1"]}},
            {"id": "call_web_2", "name": "web_extract", "arguments": {"urls": ["https://b.example/2"]}}]},
        {"tool_calls": [
            {"id": "call_read_1", "name": "read_file", "arguments": {"path": str(first)}},
            {"id": "call_read_2", "name": "read_file", "arguments": {"path": str(second)}}]},
        {"text": "done"},
    ]
    messages = scripted_conversation(home, checks, turns, "Fetch both pages, then read both files.",
                                     session_id="session-concurrent",
                                     enabled=[BOOKING, PLUGIN_NAME, PROBE],
                                     entries={PROBE: {"allow_tool_override": True}})
    web_ids = ["call_web_1", "call_web_2"]
    admitted = [i for i in web_ids if "probe page" in str(messages.get(i, ""))]
    refused = [i for i in web_ids if blocked_document(str(messages.get(i, ""))) is not None]
    checks.check("one_admitted_one_refused", len(admitted) == 1 and len(refused) == 1,
                 messages=messages)
    records = [json.loads(line) for line in probe_log.read_text().splitlines()] \
        if probe_log.exists() else []
    handler_runs = [r for r in records if r["event"] == "handler"]
    checks.check("handler_ran_once", len(handler_runs) == 1, records=records)
    checks.check("calls_overlapped",
                 not any(r["event"] == "handler_wait_timed_out" for r in records), records=records)
    events = events_of(home)
    checks.check("journal_one_started_one_returned", kinds(events) == ["started", "returned"],
                 events=events)
    if admitted and refused and len(events) == 2:
        checks.check("started_is_admitted_call",
                     events[0]["tool"] == "web_extract" and events[0]["tool_call_id"] == admitted[0]
                     and events[0]["session_id"] == "session-concurrent"
                     and events[1]["operation_id"] == events[0]["operation_id"], events=events)
        entries = [r["tool_call_id"] for r in records if r["event"] == "middleware"
                   and r["tool"] == "web_extract"]
        # The host's own behaviour: 0.19 enters every middleware twice, nested,
        # for an admitted call on this path; 0.20+ enters it once per call.
        checks.check("host_middleware_entries_for_admitted_call",
                     entries.count(admitted[0]) == middleware_entries_per_concurrent_call()
                     and entries.count(refused[0]) == 1,
                     entries=entries, hermes=evidence.hermes_version())
        refusal = blocked_document(str(messages[refused[0]]))
        checks.check("refusal_code", refusal.get("code") == "operation_in_flight", refusal=refusal)
    checks.check("read_files_untouched",
                 "alpha-41" in str(messages.get("call_read_1", ""))
                 and "beta-42" in str(messages.get("call_read_2", "")), messages=messages)
    check_concurrent_path(checks, "read_files_took_concurrent_path", records, "read_file",
                          ["call_read_1", "call_read_2"])


def middleware_entries_per_concurrent_call() -> int:
    """How often the host enters each ``tool_execution`` middleware for one call
    on its concurrent path: twice, nested, on 0.19 (``invoke_tool`` wraps
    ``handle_function_call``, which runs the chain again); once on 0.20+
    (the executor passes ``skip_tool_execution_middleware``)."""
    return 2 if evidence.hermes_release() < (0, 20, 0) else 1


def check_concurrent_path(checks: CheckList, name: str, records: List[Dict[str, Any]],
                          tool: str, call_ids: List[str]) -> None:
    """The calls took the host's concurrent path: each entered the probe's
    middleware as often as that path does (see
    :func:`middleware_entries_per_concurrent_call`), each on its own worker
    thread, and the second entered before the first left the chain."""
    entries = [r for r in records if r["event"] == "middleware" and r["tool"] == tool]
    exits = [r for r in records if r["event"] == "middleware_exit" and r["tool"] == tool]
    per_call = middleware_entries_per_concurrent_call()
    counts = [[r["tool_call_id"] for r in entries].count(call_id) for call_id in call_ids]
    threads = {r["tool_call_id"]: r["thread"] for r in entries}
    first_exit = min((r["time_ns"] for r in exits), default=0)
    last_entry = max((r["time_ns"] for r in entries), default=0)
    checks.check(name, counts == [per_call] * len(call_ids)
                 and len({threads.get(call_id) for call_id in call_ids}) == len(call_ids)
                 and last_entry < first_exit,
                 counts=counts, expected_per_call=per_call, threads=threads,
                 hermes=evidence.hermes_version())


def scenario_reentry(home: Path, checks: CheckList) -> None:
    """Re-entry with arguments Hermes coerces, and through the RPC bridge, in one
    real agent loop:

    1. two ``web_extract`` calls whose ``urls`` is a bare string (the probe
       replaces the handler and holds the admitted call open until the sibling
       has left the chain); Hermes' ``coerce_tool_args`` turns the string into
       a list between the outer and the inner middleware entry (0.19), or
       before the handler only (0.20+: see :func:`arg_types_per_entry`);
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

    # 1. web_extract with a bare-string urls
    web_ids = ["call_web_1", "call_web_2"]
    admitted = [i for i in web_ids if "probe page" in messages.get(i, "")]
    refused = {i: blocked_document(messages.get(i, "")) for i in web_ids
               if blocked_document(messages.get(i, "")) is not None}
    checks.check("web_one_admitted_one_refused", len(admitted) == 1 and len(refused) == 1,
                 messages={i: messages.get(i) for i in web_ids})
    if admitted:
        call = admitted[0]
        checks.check("web_host_arg_types_per_entry",
                     entries(call) == arg_types_per_entry({"urls": "str"}, {"urls": "list"}),
                     entries=entries(call), hermes=evidence.hermes_version())
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
    checks.check("read_file_host_arg_types_per_entry",
                 all(entries(i) == arg_types_per_entry({"path": "str", "limit": "str"},
                                                       {"path": "str", "limit": "int"})
                     for i in ran),
                 entries={i: entries(i) for i in read_ids}, hermes=evidence.hermes_version())

    # 3. execute_code -> terminal through the RPC bridge
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


def arg_types_per_entry(raw: Dict[str, str], coerced: Dict[str, str]) -> List[Dict[str, str]]:
    """The argument types each middleware entry of one call sees on the host's
    concurrent path: 0.19 enters twice, the model's raw arguments first, then
    the ones ``coerce_tool_args`` rewrote in place; 0.20+ enters once, with
    the raw arguments (only the handler gets the coerced ones)."""
    return [raw, coerced] if evidence.hermes_release() < (0, 20, 0) else [raw]
