"""An operation brought back for a lost event says when its call can have
happened: after the last recorded event, before the repair (or the restart)
that brought it back (docs/cli.md §repair-checkpoint, §restart-journal)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import unittest

from support import JournalTestCase, run_cli
from crash_recovery.reports.messages import iso_utc

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_worker.py")


class RepairedCheckpoint(JournalTestCase):

    def test_the_lost_operation_names_the_window_of_its_call(self):
        service = os.path.join(self.root, "service.sqlite3")
        for words in (("--request", "r1"),
                      ("--request", "r2", "--kill", "checkpoint_replaced:started")):
            subprocess.run([sys.executable, WORKER, "call", self.data_dir, service, *words],
                           capture_output=True, timeout=60)
        code, log, _ = run_cli(self.data_dir, "log")  # refused: checkpoint_ahead
        self.assertEqual(log["error"]["code"], "checkpoint_ahead")
        self.assertIn("repair-checkpoint", log["error"]["next"])
        code, repaired, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence",
                                    "worker killed (test)")
        self.assertEqual(code, 0, repaired)
        [lost] = repaired["unresolved"]
        code, events, _ = run_cli(self.data_dir, "log")
        last_recorded = events["events"][1]  # r1's returned
        self.assertEqual(lost["lost_window"]["after_ns"], last_recorded["timestamp_ns"])
        self.assertGreaterEqual(lost["lost_window"]["before_ns"], last_recorded["timestamp_ns"])
        self.assertEqual(lost["lost_after"], iso_utc(last_recorded["timestamp_ns"]))
        self.assertEqual(lost["lost_before"], iso_utc(lost["lost_window"]["before_ns"]))
        self.assertIn(f"after the last recorded event ({lost['lost_after']}) and before this "
                      f"repair ({lost['lost_before']})", repaired["lost_event"])
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual(status["unresolved"][0]["lost_before"], lost["lost_before"])
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
