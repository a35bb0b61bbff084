"""The workspace's independent checker, where it is present, agrees with the
reference reading on a valid journal and on a tampered one.

Every other test cross-checks its journals silently when the checker is there;
this is the one place that says so (a skip with the reason) when it is not.
"""
from __future__ import annotations

import unittest

from support import JournalTestCase, reference, workspace_verifier

from crash_recovery.guard import RecoveryGuard


class WorkspaceChecker(JournalTestCase):

    def setUp(self):
        super().setUp()
        if workspace_verifier() is None:
            self.skipTest("optional: no independent format checker is configured (set "
                          "CRASH_RECOVERY_VERIFIER=/path/to/verify_journal.py to cross-check "
                          "every journal with it; tests/journal_reference.py checks them anyway)")

    def test_agrees_on_a_product_journal_and_on_a_tampered_one(self):
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution(tool_name="book_trip", args={"to": "LIS"},
                             next_call=lambda: '{"status": "booked"}', session_id="s",
                             tool_call_id="c")
        guard.close()
        self.assertEqual(self.assertVerifies().kinds(), ["started", "returned"])
        self.assertTrue(workspace_verifier().verify(self.data_dir).ok)
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'book_trip', 'book_car') WHERE seq = 1")
        self.assertFalse(reference.verify(self.data_dir).ok)
        self.assertFalse(workspace_verifier().verify(self.data_dir).ok)


if __name__ == "__main__":
    unittest.main()
