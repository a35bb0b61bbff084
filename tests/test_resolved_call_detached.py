"""A call an operator resolved while it hung, while other calls of its
process run (docs/cli.md §Owner): a child it forks never runs a protected
call outside the journal, and ``status`` lists it exactly once, beside a
sibling call that is running.

The hung call is a real thread of this process blocked in its downstream;
the child is a real ``os.fork``; the lock files are the real ones.
"""
from __future__ import annotations

import json
import os
import threading

from support import JournalTestCase

from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402
from crash_recovery.reports.status import status_report  # noqa: E402

WAIT_SECONDS = 60


def mark(path):
    """The child's downstream: leaves a trace that it ran."""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write("ran")
    return "child ran"


class ResolvedHungCall(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.guard = RecoveryGuard(self.data_dir)
        self.addCleanup(lambda: self.guard.gate.opened_journal is not None and self.guard.close())

    def hang(self, downstream_after_release=None):
        """``send_payment`` on its own thread, blocked in downstream until the
        returned event is set; then ``downstream_after_release()`` runs inside
        the call.  Returns ``(release, thread, results, operation_id)``."""
        entered, release, results = threading.Event(), threading.Event(), []

        def downstream():
            entered.set()
            release.wait(WAIT_SECONDS)
            if downstream_after_release is not None:
                downstream_after_release()
            return {"status": "paid"}

        thread = threading.Thread(target=lambda: results.append(self.guard.tool_execution(
            tool_name="send_payment", args={"to": "ACME"}, next_call=downstream,
            session_id="s", tool_call_id="hung")))
        thread.start()
        self.addCleanup(thread.join, WAIT_SECONDS)
        self.addCleanup(release.set)
        self.assertTrue(entered.wait(WAIT_SECONDS))
        with Journal(self.data_dir, create=False) as journal:
            [operation] = journal.status().unresolved
            journal.resolve(operation.operation_id, outcome="completed", forced=True,
                            evidence="worker hung on a dead socket; payment in the bank portal")
        return release, thread, results, operation.operation_id

    def test_a_child_forked_inside_a_resolved_call_journals_its_protected_calls(self):
        ran_marker = os.path.join(self.root, "child_ran")
        child_said = []

        def fork_a_child_that_calls_the_same_tool():
            reading, writing = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the same tool call, from inside the hung one
                try:
                    os.close(reading)
                    result = self.guard.tool_execution(
                        tool_name="send_payment", args={"to": "ACME"},
                        next_call=lambda: mark(ran_marker), 
                        session_id="s", tool_call_id="hung")
                    os.write(writing, json.dumps(result).encode("utf-8"))
                finally:
                    os._exit(0)
            os.close(writing)
            with os.fdopen(reading, "rb") as stream:
                child_said.append(json.loads(stream.read()))
            os.waitpid(pid, 0)

        release, thread, results, hung_id = self.hang(fork_a_child_that_calls_the_same_tool)
        # Another call of this process runs meanwhile.
        self.assertEqual(self.guard.tool_execution(
            tool_name="book_trip", args={}, next_call=lambda: "booked", session_id="s2",
            tool_call_id="sibling"), "booked")
        release.set()
        thread.join(WAIT_SECONDS)
        self.assertEqual(results, [{"status": "paid"}])
        self.assertEqual(child_said, ["child ran"])
        self.guard.close()
        # The child's call ran once and is in the journal as its own operation.
        with Journal(self.data_dir, create=False) as journal:
            status = journal.status()
            kinds = [payload["kind"] for _, payload in journal.events()]
        self.assertEqual(kinds, ["started", "resolved", "started", "returned",
                                 "started", "returned", "late_outcome"])
        self.assertEqual([late.operation_id for late in status.attention], [hung_id])
        with open(ran_marker, encoding="utf-8") as stream:
            self.assertEqual(stream.read(), "ran")
        self.assertVerifies()

    def test_status_lists_a_resolved_call_once_beside_a_running_sibling(self):
        release, thread, results, hung_id = self.hang()
        entered, go, sibling_results = threading.Event(), threading.Event(), []

        def sibling_downstream():
            entered.set()
            go.wait(WAIT_SECONDS)
            return "booked"

        sibling = threading.Thread(target=lambda: sibling_results.append(
            self.guard.tool_execution(tool_name="book_trip", args={},
                                      next_call=sibling_downstream, session_id="s2",
                                      tool_call_id="sibling")))
        sibling.start()
        self.addCleanup(sibling.join, WAIT_SECONDS)
        self.addCleanup(go.set)
        self.assertTrue(entered.wait(WAIT_SECONDS))
        with Journal(self.data_dir, create=False) as journal:
            report = status_report(journal, self.data_dir)
            [running] = journal.status().unresolved
        self.assertEqual((report["gate"], report["in_flight"]["operation_id"],
                          report["in_flight"]["pid"]), ("busy", running.operation_id, os.getpid()))
        self.assertEqual([(entry["operation_id"], entry["pid"])
                          for entry in report["resolved_running"]], [(hung_id, os.getpid())])
        go.set()
        sibling.join(WAIT_SECONDS)
        release.set()
        thread.join(WAIT_SECONDS)
        self.assertEqual((results, sibling_results), ([{"status": "paid"}], ["booked"]))
        self.guard.close()
        self.assertVerifies()

if __name__ == "__main__":
    import unittest
    unittest.main()
