"""A call the host refuses inside the middleware ends as not run, and only on
the host's own report (docs/guard.md §Host refusals); Tool Search bridge calls
are decided on the underlying tool (docs/guard.md §Tool Search).  Real SQLite
files; the host is played by the test (the real hosts are in
tests/test_host_refusals.py)."""
from __future__ import annotations

import contextvars
import json
import os
import threading
import unittest

from support import reference
from test_guard import Downstream, GuardTestCase

from crash_recovery.guard import RecoveryGuard

from crash_recovery.admission.bridge import PASS, REFUSE, bridge_entries, bridge_verdict

POLICY_REFUSAL = json.dumps({"error": "policy: not allowed"})


class HostPlayingRefusal:
    """``next_call`` as Hermes >= 0.20 runs it: the host's checks run inside it;
    a refusal fires ``post_tool_call`` (``status``) for the call and returns the
    refusal, never invoking the handler.  ``report``: overrides of what the
    host reports; ``hook_thread``: fire the hook on its own thread with a
    copied context (as 0.22 does)."""

    def __init__(self, guard, *, status="blocked", report=None, returned=POLICY_REFUSAL,
                 hook_thread=False, handler=None):
        self.guard, self.status, self.returned = guard, status, returned
        self.report = {"tool_name": "book_trip", "session_id": "s-1", "tool_call_id": "call-1",
                       **(report or {})}
        self.hook_thread = hook_thread
        self.handler = handler if handler is not None else Downstream()

    def __call__(self):
        if self.status != "blocked":
            result = self.handler()
            self.fire(result)
            return result
        self.fire(POLICY_REFUSAL)
        return self.returned

    def fire(self, result):
        def hook():
            self.guard.post_tool_call(args={}, result=result, status=self.status,
                                      error_type="plugin_block", duration_ms=0,
                                      task_id="t", turn_id="u", **self.report)
        if not self.hook_thread:
            hook()
            return
        thread = threading.Thread(target=contextvars.copy_context().run, args=(hook,))
        thread.start()
        thread.join(10)


class HostRefusalTests(GuardTestCase):

    def test_host_reported_refusal_is_recorded_not_run_and_gate_stays_open(self):
        host = HostPlayingRefusal(self.guard)
        self.assertEqual(self.call(downstream=host), POLICY_REFUSAL)
        self.assertEqual(host.handler.calls, 0)
        self.assertEqual(self.events(), [("started", None), ("returned", "not_run_host_refused")])
        self.assertEqual(self.open_operation_ids(), [])
        self.assertEqual(self.call(call_id="call-2"), '{"status": "confirmed"}')

    def test_report_from_the_hosts_hook_thread_counts(self):
        # Hermes 0.22 runs post_tool_call on a hermes-hook-* thread in a copy
        # of the caller's context.
        host = HostPlayingRefusal(self.guard, hook_thread=True)
        self.assertEqual(self.call(downstream=host), POLICY_REFUSAL)
        self.assertEqual(self.events(), [("started", None), ("returned", "not_run_host_refused")])

    def test_error_without_a_blocked_report_stays_uncertain(self):
        # The control: the handler ran and failed; the host reports "error".
        handler = Downstream(result=POLICY_REFUSAL)
        host = HostPlayingRefusal(self.guard, status="error", handler=handler)
        self.assertEqual(self.call(downstream=host), POLICY_REFUSAL)
        self.assertEqual(handler.calls, 1)
        self.assertEqual(self.events(), [("started", None), ("uncertain", "error_response")])

    def test_error_text_alone_never_means_not_run(self):
        # The same refusal text with no report from the host: uncertain.
        self.assertEqual(self.call(downstream=Downstream(result=POLICY_REFUSAL)), POLICY_REFUSAL)
        self.assertEqual(self.events(), [("started", None), ("uncertain", "error_response")])

    def test_report_for_another_call_or_without_a_call_id_changes_nothing(self):
        for index, (report, call_id) in enumerate((({"tool_call_id": "call-other"}, "call-1"),
                                                   ({"session_id": "s-other"}, "call-1"),
                                                   ({"tool_name": "send_payment"}, "call-1"),
                                                   ({"tool_call_id": ""}, ""))):
            with self.subTest(report=report):
                data_dir = os.path.join(self.data_dir, f"profile-{index}")
                guard = RecoveryGuard(data_dir)
                host = HostPlayingRefusal(guard, report=report)
                self.assertEqual(self.call(downstream=host, guard=guard, call_id=call_id),
                                 POLICY_REFUSAL)
                guard.close()
                verified = reference.verify(data_dir)
                self.assertTrue(verified.ok, verified.errors)
                self.assertEqual([(e["kind"], e.get("reason")) for e in verified.events],
                                 [("started", None), ("uncertain", "error_response")])

    def test_result_rewritten_after_the_report_stays_uncertain(self):
        # A middleware between us and the host changed what came back: the
        # report no longer describes this result.
        host = HostPlayingRefusal(self.guard, returned=json.dumps({"error": "rewritten"}))
        self.call(downstream=host)
        self.assertEqual(self.events(), [("started", None), ("uncertain", "error_response")])

    def test_report_outside_any_call_is_ignored(self):
        self.assertIsNone(self.guard.post_tool_call(
            tool_name="book_trip", session_id="s-1", tool_call_id="call-1", status="blocked",
            error_type="plugin_block", result=POLICY_REFUSAL))
        self.assertEqual(self.call(), '{"status": "confirmed"}')
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])

    def test_malformed_reports_never_raise(self):
        for kwargs in ({}, {"status": ["blocked"]}, {"tool_name": object(), "status": "blocked"},
                       {"status": "blocked", "result": float("nan")}):
            with self.subTest(kwargs=kwargs):
                self.assertIsNone(self.guard.post_tool_call(**kwargs))


class ToolSearchBridgeTests(GuardTestCase):

    def test_catalog_reads_pass_untouched_and_unjournaled(self):
        for tool in ("tool_search", "tool_describe"):
            downstream = Downstream(result='{"matches": []}')
            self.assertEqual(self.call(tool=tool, args={"query": "pay"}, downstream=downstream),
                             '{"matches": []}')
            self.assertEqual(downstream.calls, 1)
            self.assertIsNone(self.hook(tool=tool, args={"query": "pay"}))
        self.assertEqual(self.report().events, [])

    def test_unresolved_tool_call_naming_a_protected_tool_is_refused_unjournaled(self):
        for args in ({"name": "send_payment", "arguments": {"amount": 5}},          # 0.20 shape
                     {"calls": [{"name": "no_such_tool", "arguments": {}}]},       # 0.22 shape
                     {"calls": '[{"name": "send_payment", "arguments": {}}]'},     # JSON text
                     {"calls": [{"name": "a"}, {"name": "b"}]},                   # local batch
                     {"arguments": {}}, {"calls": []}, {"calls": "not json"}):     # no name
            with self.subTest(args=args):
                downstream = Downstream()
                self.assertBlocked(self.call(tool="tool_call", args=args, downstream=downstream),
                                   "bridge_call_unresolved")
                self.assertHookBlocked(self.hook(tool="tool_call", args=args),
                                       "bridge_call_unresolved")
                self.assertEqual(downstream.calls, 0)
        self.assertEqual(self.report().events, [])

    def test_protection_follows_the_underlying_tool(self):
        guard = self.make_guard(protected_tools=["send_payment"])
        unprotected = {"name": "lookup_receipt", "arguments": {}}
        downstream = Downstream()
        self.assertEqual(self.call(tool="tool_call", args=unprotected, downstream=downstream,
                                   guard=guard), '{"status": "confirmed"}')
        self.assertEqual(downstream.calls, 1)
        self.assertBlocked(self.call(tool="tool_call", guard=guard,
                                     args={"name": "send_payment", "arguments": {}}),
                           "bridge_call_unresolved")
        # The host peels a tool_call it can run: the middleware sees the tool.
        self.assertEqual(self.call(tool="send_payment", args={"amount": 5}, guard=guard),
                         '{"status": "confirmed"}')
        guard.close()
        self.assertEqual([(e["kind"], e.get("tool")) for e in self.report().events],
                         [("started", "send_payment"), ("returned", None)])

    def test_connector_batch_passes_and_each_entry_is_guarded(self):
        # Hermes 0.22 keeps the wrapper and sends each entry through the
        # middleware as its own call (id "<id>#<position>").
        entries = [{"name": "connectors__bank__pay", "arguments": {"n": 1}},
                   {"name": "connectors__bank__pay", "arguments": {"n": 2}}]
        ran = []

        def batch_dispatch():
            for position, entry in enumerate(entries):
                ran.append(self.call(tool=entry["name"], args=entry["arguments"],
                                     call_id=f"call-1#{position}",
                                     downstream=Downstream(result='{"error": "declined"}')))
            return "batch done"

        self.assertEqual(self.call(tool="tool_call", args={"calls": entries},
                                   downstream=batch_dispatch), "batch done")
        self.assertEqual(ran[0], '{"error": "declined"}')
        self.assertBlocked(ran[1], "unresolved_operations")  # entry by entry
        self.assertEqual([(e["kind"], e.get("tool"), e.get("tool_call_id"))
                          for e in self.report().events],
                         [("started", "connectors__bank__pay", "call-1#0"),
                          ("uncertain", None, None)])

    def test_bridge_entries_reads_both_host_shapes(self):
        self.assertEqual(bridge_entries({"name": " pay ", "arguments": {}}), ["pay"])
        self.assertEqual(bridge_entries({"calls": {"name": "pay"}}), ["pay"])
        self.assertEqual(bridge_entries({"calls": [{"name": "a"}, {"name": "b"}]}), ["a", "b"])
        self.assertIsNone(bridge_entries({"calls": [{"name": ""}]}))
        self.assertIsNone(bridge_entries({"calls": [["pay"]]}))
        self.assertIsNone(bridge_entries("pay"))

    def test_bridge_verdicts(self):
        protected = {"send_payment"}.__contains__
        self.assertIsNone(bridge_verdict("send_payment", {}, protected))
        self.assertEqual(bridge_verdict("tool_search", {}, protected), PASS)
        self.assertEqual(bridge_verdict("tool_call", {"name": "lookup"}, protected), PASS)
        self.assertEqual(bridge_verdict("tool_call", {"name": "send_payment"}, protected), REFUSE)
        self.assertEqual(bridge_verdict("tool_call", {"name": "tool_call"}, protected), REFUSE)
        self.assertEqual(bridge_verdict("tool_call", {"calls": [
            {"name": "connectors__x__y"}, {"name": "connectors__x__z"}]}, protected), PASS)
        self.assertEqual(bridge_verdict("tool_call", {"calls": [
            {"name": "connectors__x__y"}, {"name": "send_payment"}]}, protected), REFUSE)


if __name__ == "__main__":
    unittest.main()
