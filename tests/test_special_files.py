"""Special files planted in the data directory (docs/format.md §Files, docs/cli.md
§Verdict codes): a FIFO in place of a journal file or of the call locks'
directory refuses and never hangs a worker or a command (and anything but a
directory at the call locks' place shows on every surface); a symbolic link never
redirects a write (the call locks, a temporary file, ``operator.log``) and
never creates its target.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ProtectedCallCase, Tool
from support import REPO, run_cli

from crash_recovery.guard import RecoveryGuard

# Seconds a subprocess may take before a FIFO is taken to have hung it.
HANG_TIMEOUT_SECONDS = 60


class PlantedFiles(ProtectedCallCase):
    """FIFOs must refuse, never hang; symlinks must never redirect a write."""

    SCRIPT = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, {repo!r} + "/tests")
        from checkout import load_module
        RecoveryGuard = load_module("guard").RecoveryGuard
        guard = RecoveryGuard({data_dir!r}, busy_timeout=1)
        hook = guard.pre_tool_call(tool_name="t", args={{}}, session_id="s", tool_call_id="c")
        result = guard.tool_execution(tool_name="t", args={{}}, next_call=lambda: "RAN",
                                      session_id="s", tool_call_id="c")
        print(json.dumps({{"hook": hook, "result": result}}))
    """)

    def prepared(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Tool())
        guard.close()

    def run_fresh_process(self):
        completed = subprocess.run(
            [sys.executable, "-c", self.SCRIPT.format(repo=REPO, data_dir=self.data_dir)],
            capture_output=True, text=True, timeout=HANG_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        return json.loads(completed.stdout)

    def test_fifo_instead_of_journal_files_refuses(self):
        for name in ("head.json", "initialized", "journal.sqlite3"):
            with self.subTest(name):
                self.prepared()
                path = os.path.join(self.data_dir, name)
                os.rename(path, path + ".saved")
                os.mkfifo(path)
                outcome = self.run_fresh_process()
                self.assertEqual(self.blocked_code(outcome["result"]), "foreign_file")
                self.assertEqual(outcome["hook"]["action"], "block")
                code, result, _ = run_cli(self.data_dir, "verify", timeout=HANG_TIMEOUT_SECONDS)
                self.assertEqual((code, result["integrity"], result["error"]["file_type"]),
                                 (1, "foreign_file", "FIFO"))
                self.assertIn("restart-journal", result["error"]["next"])
                os.unlink(path)
                os.rename(path + ".saved", path)
                self.assertVerifies()

    def plant_calls(self, make):
        """Replace ``calls/`` (the call locks' directory) by what ``make(path)`` makes."""
        calls = os.path.join(self.data_dir, "calls")
        os.rmdir(calls)  # empty between calls
        make(calls)
        self.addCleanup(lambda: os.path.islink(calls) and os.unlink(calls))
        return calls

    def test_anything_but_a_directory_as_call_locks_refuses_on_every_surface(self):
        """A FIFO, a regular file or a symbolic link at ``calls/``: every call is
        refused, and the hook, the status tool and ``status --check`` say so
        (and why) instead of calling the profile healthy; nothing hangs."""
        elsewhere = os.path.join(self.root, "elsewhere")
        os.mkdir(elsewhere)
        makers = {"FIFO": os.mkfifo, "regular file": lambda path: open(path, "w").close(),
                  "symbolic link": lambda path: os.symlink(elsewhere, path)}
        for kind, make in makers.items():
            with self.subTest(kind):
                self.prepared()
                calls = self.plant_calls(make)
                outcome = self.run_fresh_process()
                self.assertEqual(self.blocked_code(outcome["result"]), "storage_unavailable")
                self.assertEqual(self.blocked_code(outcome["hook"]["message"]), "storage_unavailable")
                guard = RecoveryGuard(self.data_dir)
                tool_status = json.loads(guard.status_tool({}))
                guard.close()
                self.assertEqual(tool_status["error"]["code"], "storage_unavailable")
                code, result, _ = run_cli(self.data_dir, "status", "--check",
                                          timeout=HANG_TIMEOUT_SECONDS)
                self.assertEqual((code, result["error"]["code"]), (1, "storage_unavailable"))
                self.assertIn(f"calls/ in the data directory {self.data_dir} is a {kind}, not a "
                              "directory", result["error"]["message"])
                self.assertEqual(os.listdir(elsewhere), [])
                os.unlink(calls)
                os.mkdir(calls)
        self.assertVerifies()

    def test_symlinked_call_locks_never_write_through_the_link(self):
        self.prepared()
        elsewhere = os.path.join(self.root, "elsewhere")
        os.mkdir(elsewhere)
        database = os.path.join(self.data_dir, "journal.sqlite3")
        size = os.path.getsize(database)
        for target in (elsewhere, database):
            with self.subTest(target=os.path.basename(target)):
                calls = self.plant_calls(lambda path: os.symlink(target, path))
                outcome = self.run_fresh_process()
                self.assertEqual(self.blocked_code(outcome["result"]), "storage_unavailable")
                self.assertEqual((os.listdir(elsewhere), os.path.getsize(database)), ([], size))
                os.unlink(calls)
                os.mkdir(calls)
        self.assertVerifies()

    def test_dangling_call_locks_symlink_creates_nothing(self):
        self.prepared()
        target = os.path.join(self.root, "created-by-mistake")
        self.plant_calls(lambda path: os.symlink(target, path))
        self.run_fresh_process()
        self.assertFalse(os.path.exists(target))

    def test_symlinked_temp_file_is_replaced_not_written_through(self):
        self.prepared()
        precious = os.path.join(self.root, "precious.txt")
        with open(precious, "w") as stream:
            stream.write("important data\n")
        os.symlink(precious, os.path.join(self.data_dir, "head.json.tmp"))
        outcome = self.run_fresh_process()
        self.assertEqual(outcome["result"], "RAN")
        with open(precious) as stream:
            self.assertEqual(stream.read(), "important data\n")
        self.assertFalse(os.path.islink(os.path.join(self.data_dir, "head.json")))
        self.assertVerifies()


class PlantedOperatorLog(ProtectedCallCase):
    """A symbolic link planted as operator.log is reported, never followed."""

    def test_symlinked_operator_log_is_reported_not_followed(self):
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution(tool_name="send_payment", args={}, next_call=lambda: '{"error": 1}',
                             session_id="s", tool_call_id="c")
        operation = guard.gate.opened_journal.unresolved()[0].operation_id
        guard.close()
        target = os.path.join(self.root, "elsewhere.txt")
        with open(target, "w") as stream:
            stream.write("unrelated\n")
        os.symlink(target, os.path.join(self.data_dir, "operator.log"))
        code, result, _ = run_cli(self.data_dir, "resolve", operation, "--outcome", "not_applied",
                                  "--evidence", "no charge in the ledger")
        self.assertEqual((code, result["resolved"]), (0, operation))  # the journal is the record
        self.assertIn("operator.log not written", result["operator_log_error"])
        with open(target) as stream:
            self.assertEqual(stream.read(), "unrelated\n")
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
