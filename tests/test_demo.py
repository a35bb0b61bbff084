"""demo.py (README §Try it) end to end, in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import REPO, JournalTestCase

DEMO = os.path.join(REPO, "demo.py")
DEMO_TIMEOUT_SECONDS = 60


class DemoTests(JournalTestCase):

    def run_demo(self, *words, env=None):
        completed = subprocess.run([sys.executable, DEMO, *words], capture_output=True, text=True,
                                   timeout=DEMO_TIMEOUT_SECONDS, env=env, cwd=self.root)
        return completed.returncode, json.loads(completed.stdout), completed.stderr

    def test_demo_with_directory(self):
        directory = os.path.join(self.root, "demo")
        exit_code, verdict, stderr = self.run_demo("--directory", directory)
        self.assertEqual(exit_code, 0, stderr)
        self.assertIs(verdict["ok"], True)
        self.assertEqual(verdict["bookings"], 1)
        self.assertIs(verdict["repeat_blocked"], True)
        self.assertEqual(verdict["unresolved_after_resolution"], 0)
        self.assertIs(verdict["integrity_ok"], True)
        self.assertEqual(verdict["pending_after_crash"], 1)
        self.assertIs(verdict["worker_killed_by_sigkill"], True)
        self.assertIs(verdict["gate_open_after_resolution"], True)
        self.assertEqual(verdict["blocked_code"], "unresolved_operations")
        data_dir = os.path.join(directory, "profile", "plugin-data", "crash-recovery")
        self.assertEqual(verdict["data_dir"], data_dir)
        report = self.assertVerifies(data_dir)
        self.assertEqual(report.kinds(), ["started", "resolved", "started", "returned"])
        self.assertEqual(report.events[0]["tool"], "book_trip")
        self.assertEqual(report.operations[verdict["operation_id"]]["outcome"], "completed")
        self.assertEqual(report.unresolved(), [])
        # A second run into the same (now non-empty) directory is refused.
        exit_code, verdict, _ = self.run_demo("--directory", directory)
        self.assertEqual((exit_code, verdict["ok"]), (1, False))
        self.assertJournalUnchanged(data_dir, report)

    def assertJournalUnchanged(self, data_dir, report):
        self.assertEqual(self.assertVerifies(data_dir).head, report.head)

    def test_demo_without_directory_leaves_no_temp_dir(self):
        temp = os.path.join(self.root, "tmp")
        os.makedirs(temp)
        environment = dict(os.environ, TMPDIR=temp, TEMP=temp, TMP=temp)
        exit_code, verdict, stderr = self.run_demo(env=environment)
        self.assertEqual(exit_code, 0, stderr)
        self.assertIs(verdict["ok"], True)
        self.assertEqual(verdict["bookings"], 1)
        self.assertNotIn("data_dir", verdict)
        self.assertEqual(os.listdir(temp), [])
        self.assertEqual(sorted(os.listdir(self.root)), ["tmp"])  # nothing in the cwd either
