"""What an operator types or hands to the command line (docs/cli.md): a
checkpoint file of any content or kind, huge numbers, empty paths, options
after the command, a mistyped data directory -- each gets a documented answer,
never a traceback, a hang or a false all-clear.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

from reliability_support import ProtectedCallCase, ReliabilityCase, Tool, call
from support import OPERATOR_CLI, run_cli

from crash_recovery.guard import RecoveryGuard


class ExternalCheckpointFiles(ReliabilityCase):
    """``verify --checkpoint FILE`` with a file the operator supplies."""

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "a")
        guard.close()
        self.early = run_cli(self.data_dir, "checkpoint")[1]
        self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)

    def verify_with(self, path):
        return run_cli(self.data_dir, "verify", "--checkpoint", path)  # a hang times out

    def test_no_traceback_and_no_hang(self):
        huge = os.path.join(self.root, "huge.json")
        with open(huge, "w") as stream:
            json.dump(dict(self.early, count=2 ** 63), stream)
        code, result, text = self.verify_with(huge)
        self.assertEqual((code, result["integrity"]), (1, "checkpoint_not_ancestor"), text)
        deep = os.path.join(self.root, "deep.json")
        with open(deep, "w") as stream:
            stream.write("[" * 100000)
        code, result, text = self.verify_with(deep)
        self.assertEqual((code, result["error"]["code"]), (1, "checkpoint_unreadable"), text)
        fifo = os.path.join(self.root, "fifo")
        os.mkfifo(fifo)
        code, result, text = self.verify_with(fifo)
        self.assertEqual((code, result["error"]["code"]), (1, "checkpoint_unreadable"), text)
        exported = os.path.join(self.root, "early.json")
        with open(exported, "w") as stream:
            json.dump(self.early, stream)
        code, result, text = self.verify_with(exported)
        self.assertEqual((code, result["external_checkpoint"]), (0, "ancestor"), text)


class CommandLineInput(ProtectedCallCase):
    """Odd words and paths on the command line."""

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Tool())
        guard.close()

    def test_huge_since_is_not_a_traceback(self):
        code, result, output = run_cli(self.data_dir, "log", "--since", "9" * 30)
        self.assertEqual((code, result["events"]), (0, []), output)

    def test_empty_data_dir_and_checkpoint_paths_are_errors(self):
        code, result, _ = run_cli("", "status")
        self.assertEqual((code, result["error"]["code"]), (1, "usage"))
        code, result, _ = run_cli(self.data_dir, "verify", "--checkpoint", "")
        self.assertEqual((code, result["error"]["code"]), (1, "checkpoint_unreadable"))

    def test_options_after_the_command(self):
        completed = subprocess.run(
            [sys.executable, OPERATOR_CLI, "status", "--data-dir", self.data_dir, "--format",
             "text"], capture_output=True, text=True, timeout=60)
        self.assertEqual(completed.returncode, 0, completed.stdout + completed.stderr)
        self.assertIn("no unresolved operations", completed.stdout)

    def test_status_of_a_missing_journal_is_not_all_clear(self):
        code, result, _ = run_cli(os.path.join(self.root, "typo"), "status")
        self.assertEqual((code, result["error"]["code"]), (1, "journal_absent"))
        self.assertIn("hint", result["error"])


if __name__ == "__main__":
    unittest.main()
