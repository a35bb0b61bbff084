"""Every surface gives the verdict the gate gives at that moment: the hook,
the middleware, both inspection tools, the slash command of a live worker, and
the operator's status, --check and Prometheus gauges (docs/guard.md
§Inspection tools, docs/cli.md §status)."""
from __future__ import annotations

import json
import os
import unittest

from support import JournalTestCase, run_cli
from test_way_forward import LiveWorker


class WalDeletedUnderALiveWorker(JournalTestCase):
    """journal.sqlite3-wal is deleted while a worker has the journal open and
    nothing is unresolved: that worker refuses every call ``wal_missing``, and
    every surface names the same state and the same next step -- a worker
    still has the journal open (its pid), so stop it and look again: its exit
    brings the deleted log's events back."""

    def setUp(self):
        super().setUp()
        self.worker = LiveWorker(self, self.data_dir, os.path.join(self.root, "service.sqlite3"))
        self.assertEqual(self.worker.call("r1")["result"], {"booking": 1, "status": "confirmed"})
        os.unlink(os.path.join(self.data_dir, "journal.sqlite3-wal"))

    def test_every_surface_of_the_worker_says_wal_missing(self):
        surfaces = self.worker.ask("surfaces")
        self.assertEqual(json.loads(surfaces["hook"]["message"])["code"], "wal_missing")
        self.assertEqual((surfaces["status_tool"]["ok"], surfaces["status_tool"]["integrity"],
                          surfaces["status_tool"]["gate"]), (False, "wal_missing", "closed"))
        self.assertEqual(surfaces["verify_tool"]["integrity"], "wal_missing")
        self.assertIn("gate CLOSED", surfaces["slash"])
        self.assertIn("(wal_missing: ", surfaces["slash"])
        self.assertNotIn("restart-journal", surfaces["slash"])
        self.assertIn("hermes -p work crash-recovery status", surfaces["slash"])
        refused = self.worker.call("r2")
        self.assertEqual((refused["result"]["code"], refused["side_effects"]), ("wal_missing", 0))

    def test_operator_status_check_and_gauges_say_wal_missing(self):
        code, document, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, document["integrity"], document["error"]["workers_running"]),
                         (1, "wal_missing", [self.worker.process.pid]))
        self.assertTrue(document["error"]["next"].endswith(" status"), document["error"]["next"])
        # The document's own list of live workers names the same process.
        self.assertEqual(document["workers_running"],
                         [{"pid": self.worker.process.pid, "known_as": "journal_open"}])
        code, _, text = run_cli(self.data_dir, "--format", "text", "status")
        self.assertIn(f"stop them before any repair): pid {self.worker.process.pid} (it has the "
                      "journal open)", text)
        code, _, _ = run_cli(self.data_dir, "status", "--check")
        self.assertEqual(code, 1)
        code, _, gauges = run_cli(self.data_dir, "status", "--format", "prometheus")
        label = '{data_dir="%s"}' % self.data_dir
        self.assertIn(f"crash_recovery_gate_closed{label} 1\n", gauges)
        self.assertIn(f"crash_recovery_gate_open{label} 0\n", gauges)
        self.assertIn(f"crash_recovery_last_verification_ok{label} 0\n", gauges)

    def test_after_the_worker_exits_its_events_are_back_and_the_journal_verifies(self):
        self.worker.stop()
        code, document, text = run_cli(self.data_dir, "status", "--check")
        self.assertEqual((code, document["integrity"], document["checkpoint"]["count"]),
                         (0, "ok", 2), text)
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
