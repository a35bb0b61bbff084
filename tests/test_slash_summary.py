"""The ``/crash-recovery`` summary says who refuses and what helps: a worker
that refuses by itself (its outcome record failed, or the host gives it no
``next_call``) is not reported as a journal that cannot be used
(docs/guard.md §Inspection tools, §Isolation mode)."""
from __future__ import annotations

import json

from support import JournalTestCase

from crash_recovery.admission.isolation import ISOLATION_PROBLEM
from crash_recovery.guard import RecoveryGuard
from crash_recovery.host.hermes import summary_text

PREFIX = ("hermesx", "-p", "work", "crash-recovery")


class WorkerRefusesByItself(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.guard = RecoveryGuard(self.data_dir)
        self.addCleanup(self.guard.close)
        self.assertEqual(self.guard.tool_execution("send_payment", {"cents": 1}, lambda: "ok",
                                                   session_id="s", tool_call_id="c1"), "ok")

    def first_lines(self):
        return summary_text(self.guard.status_report(), PREFIX).splitlines()[:2]

    def test_a_poisoned_worker_says_why_and_points_to_the_profile_status(self):
        self.guard.poisoned = "Recording the outcome of operation X (send_payment) failed."
        self.assertEqual(self.first_lines(), [
            "crash-recovery: gate CLOSED in this worker -- Recording the outcome of operation X "
            "(send_payment) failed.",
            "The profile's journal: hermesx -p work crash-recovery status"])
        refused = json.loads(self.guard.tool_execution("send_payment", {"cents": 2}, dict,
                                                       session_id="s", tool_call_id="c2"))
        self.assertEqual(refused["code"], "guard_poisoned")

    def test_isolation_mode_names_the_setting_not_the_journal(self):
        self.guard.tool_execution("send_payment", {"cents": 3}, None, session_id="s",
                                  tool_call_id="c3")  # the host passed no next_call
        first, second = self.first_lines()
        self.assertEqual(first, f"crash-recovery: gate CLOSED in this worker -- {ISOLATION_PROBLEM}")
        self.assertEqual(second, "The profile's journal: hermesx -p work crash-recovery status")
        self.assertNotIn("cannot be used", first)
