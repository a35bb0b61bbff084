#!/usr/bin/env python3
"""Host checks of Tool Search ``tool_call`` batches (several calls in one
bridge call) inside a real, unmodified Hermes.

    python tests/host/check_tool_call_batches.py [--keep DIR] [--only NAME ...]

Which hosts have batches, read from their own ``resolve_underlying_call``
(``tools/tool_search.py``) by the ``batch_shape`` step:

* 0.19 and 0.20 have none: ``tool_call`` carries one ``name``; a ``calls``
  array is "tool_call requires a 'name' argument" and nothing runs.
* 0.22 batches connectors only (every entry ``connectors__<app>__<tool>``):
  the executor keeps the ``tool_call`` wrapper and
  ``tools/connectors/dispatch.py`` ``dispatch_connector_batch`` sends each
  entry through ``handle_function_call`` -- hooks and execution middleware --
  as its own call (id ``<id>#<position>``).  A batch naming any local tool is
  split by the agent into one ``tool_call`` per entry before anything runs
  (``agent/tool_call_batches.py``); ``handle_function_call`` itself refuses
  it whole (``local_batch_error``).  More than ten entries stay whole.

The ``connector_batch`` step (0.22) runs one such batch -- two protected
connector calls and one unprotected -- through ``AIAgent.run_conversation``
against the scripted provider, with a scripted connector gateway on 127.0.0.1
(the host's own ``CONNECTOR_GATEWAY_URL`` setting; a free-tier identity in
the profile's ``auth.json``), then a batch mixing a connector call with local
tools.  The ``local_batch`` step (0.20+) sends two protected local calls and
an unprotected one in one ``tool_call``.  Evidence: the calls the gateway
executed, the booking service's handler runs, the tool messages the model
received and the journal.  Prints one JSON report; exits 1 on any failed check.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import check_host  # noqa: E402  (tests/, the shared child/parent machinery)
import evidence  # noqa: E402
from check_host import BOOKING, CheckList, events_of  # noqa: E402
from check_host_refusals import booked, conversation, outcome_reasons  # noqa: E402
from evidence import PLUGIN_NAME, blocked_document, data_dir_of, service_counts  # noqa: E402
from mock_provider import ScriptedProvider  # noqa: E402

EXECUTE_PATH = "/v1/connectors/execute"  # tools/connectors/gateway/wire.py
PAY = "connectors__bank__pay"
TRANSFER = "connectors__bank__transfer"
BALANCE = "connectors__bank__balance"
UNRESOLVED = "bridge_call_unresolved"


def has_connector_batches() -> bool:
    """Hermes >= 0.22 batches connector calls in one ``tool_call``."""
    return evidence.hermes_release() >= (0, 22, 0)


def offers_tool_call() -> bool:
    """Tool Search is on by default (the model reaches plugin tools through
    ``tool_call``) from Hermes 0.20; 0.19 lists plugin tools directly."""
    return evidence.hermes_release() >= (0, 20, 0)


class ConnectorGateway:
    """A scripted connector gateway on 127.0.0.1: answers each single-call
    execute (``{"call": {connector, tool, arguments}}``) with a result naming
    the call, and records every call it executed."""

    def __init__(self) -> None:
        self.executed: List[Dict[str, Any]] = []
        self.other_requests: List[str] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                call = body.get("call") if isinstance(body, dict) else None
                if self.path != EXECUTE_PATH or not isinstance(call, dict):
                    gateway.other_requests.append(self.path)
                    self.answer(404, {"error": {"code": "NOT_FOUND", "message": self.path}})
                    return
                gateway.executed.append(call)
                self.answer(200, {"result": {"connector": call.get("connector"),
                                             "tool": call.get("tool"),
                                             "data": {"done": call.get("tool"),
                                                      "arguments": call.get("arguments")}}})

            def do_GET(self) -> None:  # noqa: N802
                gateway.other_requests.append(self.path)
                self.answer(404, {"error": {"code": "NOT_FOUND", "message": self.path}})

            def answer(self, status: int, document: Any) -> None:
                ScriptedProvider._send_json(self, status, document)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "ConnectorGateway":
        self.thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_free_tier_identity(home: Path) -> None:
    """The profile's ``auth.json`` holding a free-tier Nous identity with an
    unexpired token: what makes the host offer connectors
    (``tools/connectors/gateway/config.py`` ``connectors_available``) and
    send calls to the gateway rather than answer "not set up"."""
    document = {"providers": {"nous": {"auth_method": "anonymous",
                                       "access_token": "free-tier-token",
                                       "expires_at": "2099-01-01T00:00:00+00:00"}}}
    (home / "auth.json").write_text(json.dumps(document), encoding="utf-8")


def batch_call(call_id: str, entries: List[tuple]) -> Dict[str, Any]:
    """A scripted ``tool_call`` carrying ``entries`` (``(name, arguments)``)."""
    return {"id": call_id, "name": "tool_call", "direct": True,
            "arguments": {"calls": [{"name": name, "arguments": arguments}
                                    for name, arguments in entries]}}


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_batch_shape(home: Path, checks: CheckList) -> None:
    """What the host's own ``resolve_underlying_call`` makes of a batch."""
    evidence.write_profile(home)
    from tools import tool_search
    local = tool_search.resolve_underlying_call({"calls": [
        {"name": "book_trip", "arguments": {}}, {"name": "lookup_receipt", "arguments": {}}]})
    connectors = tool_search.resolve_underlying_call({"calls": [
        {"name": PAY, "arguments": {}}, {"name": TRANSFER, "arguments": {}}]})
    if not has_connector_batches():
        expected = (None, {}, "tool_call requires a 'name' argument")
        checks.check("no_batches_on_this_host", local == expected and connectors == expected,
                     local=local, connectors=connectors)
        return
    checks.check("local_batch_refused_whole", local[0] is None and local[2] is not None
                 and "Only connectors__ names may be batched together" in local[2], local=local)
    checks.check("connector_batch_kept_as_one_dispatch",
                 connectors[0] == "connectors__execute" and [
                     entry["name"] for entry in connectors[1].get("calls", [])] == [PAY, TRANSFER],
                 connectors=connectors)


def splits_local_batches() -> bool:
    """Hermes >= 0.22's agent splits a ``tool_call`` batch naming a local tool
    into one ``tool_call`` per entry before anything runs
    (``agent/tool_call_batches.py`` ``expand_local_tool_batches``, from
    ``agent/turn_tool_round.py``), each with its own call id."""
    return has_connector_batches()


def scenario_local_batch(home: Path, checks: CheckList) -> None:
    """Two protected book_trip calls and an unprotected lookup_receipt in one
    ``tool_call``; then eleven book_trip calls in one (over the host's cap of
    ten, left whole); then a booking.  0.22 splits the first into three calls:
    each booking runs once, journaled under its own name and call id, the
    lookup runs unjournaled.  0.20 cannot read a batch: refused whole, nothing
    run.  The oversized batch is refused whole on both; the gate stays open."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    eleven = [("book_trip", {"traveler": f"T{number}", "destination": "Oslo"})
              for number in range(11)]
    turns = [
        {"tool_calls": [batch_call("call_batch", [
            ("book_trip", {"traveler": "Ada", "destination": "Lisbon"}),
            ("book_trip", {"traveler": "Bo", "destination": "Paris"}),
            ("lookup_receipt", {"traveler": "Ada"})])]},
        {"tool_calls": [batch_call("call_eleven", eleven)]},
        {"tool_calls": [{"id": "call_rome", "name": "book_trip",
                         "arguments": {"traveler": "Cy", "destination": "Rome"}}]},
        {"text": "done"},
    ]
    messages = conversation(home, checks, turns, "Book both trips.",
                            session_id="session-local-batch", enabled=[BOOKING, PLUGIN_NAME],
                            entries={PLUGIN_NAME: {"settings": {"protected_tools": ["book_trip"]}}})
    booked_ids = sorted(call_id for call_id, text in messages.items() if booked(text))
    travelers = sorted(json.loads(messages[call_id])["traveler"] for call_id in booked_ids)
    outcomes = outcome_reasons(events_of(home))
    if splits_local_batches():
        checks.check("each_entry_ran_once_as_its_own_call",
                     travelers == ["Ada", "Bo", "Cy"] and len(messages) == 5
                     and sum('"count": 1' in text for text in messages.values()) == 1,
                     messages=messages)
        expected_counts = {"bookings": 3, "attempts": 3}
    else:
        refusal = blocked_document(messages.get("call_batch", ""))
        checks.check("batch_refused_whole", (refusal or {}).get("code") == UNRESOLVED
                     and travelers == ["Cy"], messages=messages)
        expected_counts = {"bookings": 1, "attempts": 1}
    checks.check("each_protected_entry_journaled_under_its_own_name", outcomes == {
        call_id: ("book_trip", "returned", "returned") for call_id in booked_ids},
        outcomes=outcomes, booked=booked_ids)
    refusal = blocked_document(messages.get("call_eleven", ""))
    checks.check("oversized_batch_refused_whole", (refusal or {}).get("code") == UNRESOLVED,
                 message=messages.get("call_eleven"))
    checks.check("handler_runs", service_counts(service) == expected_counts,
                 counts=service_counts(service), expected=expected_counts)
    checks.check("rome_booked_gate_stayed_open", booked(messages.get("call_rome", "")),
                 message=messages.get("call_rome"))


def scenario_connector_batch(home: Path, checks: CheckList) -> None:
    """One ``tool_call`` with two protected connector calls and one
    unprotected: each entry runs once at the gateway, each protected entry is
    journaled under its own tool name and id (``<id>#<position>``) and
    returns, the unprotected one is not journaled.  Then eleven connector
    calls in one (over the host's cap of ten): refused whole by the host,
    nothing executed or journaled.  Then a batch mixing a connector call with
    local tools: the agent splits it, and each entry is guarded as its own
    call."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    write_free_tier_identity(home)
    turns = [
        {"tool_calls": [batch_call("call_batch", [
            (PAY, {"amount": 5}), (TRANSFER, {"amount": 7}), (BALANCE, {})])]},
        {"tool_calls": [batch_call("call_eleven", [(PAY, {"amount": 100 + number})
                                                   for number in range(11)])]},
        {"tool_calls": [batch_call("call_mixed", [
            (PAY, {"amount": 9}), ("book_trip", {"traveler": "Ada", "destination": "Lisbon"}),
            ("lookup_receipt", {"traveler": "Ada"})])]},
        {"text": "done"},
    ]
    with ConnectorGateway() as gateway:
        os.environ["CONNECTOR_GATEWAY_URL"] = gateway.url
        messages = conversation(home, checks, turns, "Pay, transfer, then check the balance.",
                                session_id="session-connector-batch",
                                enabled=[BOOKING, PLUGIN_NAME],
                                entries={PLUGIN_NAME: {"settings": {
                                    "protected_tools": [PAY, TRANSFER, "book_trip"]}}})
    # The host sends the vendor's conventional slug first (``BANK_pay`` for
    # ``connectors__bank__pay``: tools/connectors/gateway/names.py).
    executed = [(call.get("connector"), call.get("tool"), call.get("arguments"))
                for call in gateway.executed]
    checks.check("each_entry_executed_once_at_the_gateway", executed == [
        ("bank", "BANK_pay", {"amount": 5}), ("bank", "BANK_transfer", {"amount": 7}),
        ("bank", "BANK_balance", {}), ("bank", "BANK_pay", {"amount": 9})],
        executed=executed, other=gateway.other_requests)
    batch = messages.get("call_batch", "")
    checks.check("batch_result_holds_every_entry",
                 all(f'"done": "BANK_{tool}"' in batch for tool in ("pay", "transfer", "balance")),
                 message=batch)
    checks.check("oversized_batch_refused_by_the_host",
                 "too many calls" in messages.get("call_eleven", ""),
                 message=messages.get("call_eleven"))
    booked_ids = [call_id for call_id, text in messages.items() if booked(text)]
    events = events_of(home)
    expected = {"call_batch#0": (PAY, "returned", "returned"),
                "call_batch#1": (TRANSFER, "returned", "returned"),
                "call_mixed#0": (PAY, "returned", "returned")}
    expected.update({call_id: ("book_trip", "returned", "returned") for call_id in booked_ids})
    checks.check("each_protected_entry_journaled_under_its_own_name",
                 len(booked_ids) == 1 and outcome_reasons(events) == expected,
                 events=events, booked=booked_ids)
    checks.check("no_bridge_name_in_journal",
                 not {e.get("tool") for e in events} & {"tool_call", "connectors__execute"},
                 events=events)
    checks.check("mixed_batch_local_entries_ran_once",
                 service_counts(service) == {"bookings": 1, "attempts": 1}
                 and sum('"count": 1' in text for text in messages.values()) == 1,
                 counts=service_counts(service), messages=messages)
    code, status = evidence.operator_cli(data_dir_of(home), "status")
    checks.check("gate_open", code == 0 and status.get("gate") == "open"
                 and status.get("unresolved") == [], code=code, status=status)


SCENARIOS = {"batch_shape": scenario_batch_shape, "local_batch": scenario_local_batch,
             "connector_batch": scenario_connector_batch}


# --------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------

class BatchRun(check_host.HostRun):
    """Profiles with the booking service and crash-recovery."""

    CHILD_SCRIPT = str(Path(__file__).resolve())

    def batch_shape(self) -> None:
        self.run_scenario("batch_shape", "batch_shape", self.new_home("batch_shape"))

    def local_batch(self) -> None:
        home = self.user_profile("local_batch")
        self.run_scenario("local_batch", "local_batch", home)
        self.verify_journal("local_batch", home)

    def connector_batch(self) -> None:
        home = self.user_profile("connector_batch")
        self.run_scenario("connector_batch", "connector_batch", home)
        self.verify_journal("connector_batch", home)


def host_steps() -> tuple:
    """``batch_shape`` everywhere; ``local_batch`` where the model is offered
    ``tool_call`` (0.20+); ``connector_batch`` where batches exist (0.22+)."""
    steps = ("batch_shape",)
    if offers_tool_call():
        steps += ("local_batch",)
    if has_connector_batches():
        steps = ("connector_batch",) + steps
    return steps


def main(argv: Optional[List[str]] = None) -> int:
    return check_host.checker_main(argv, description="crash-recovery: Tool Search batches",
                                   steps=host_steps(), make_run=BatchRun, scenarios=SCENARIOS,
                                   temp_prefix="crash-recovery-batches-")


if __name__ == "__main__":
    raise SystemExit(main())
