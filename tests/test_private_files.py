"""Outside Hermes (library use, ``--data-dir``) everything the plugin creates
is its user's alone: the data directory and every directory in it ``0700``,
every file ``0600`` (archives ``0400``, read-only), whatever the umask --
evidence, ids and the journal are nobody else's to read (README §Files and
permissions)."""
from __future__ import annotations

import os
import stat

from support import JournalTestCase, run_cli
from test_guard import Downstream

from crash_recovery.guard import RecoveryGuard

PERMISSIVE_UMASK = 0o022


class EverythingIsPrivate(JournalTestCase):

    def setUp(self):
        super().setUp()
        previous = os.umask(PERMISSIVE_UMASK)
        self.addCleanup(os.umask, previous)
        # A data directory below a parent that does not exist yet.
        self.data_dir = os.path.join(self.root, "var", "my-agent", "crash-recovery")

    def modes(self):
        """``{relative path: permission bits}`` of everything in the data directory."""
        found = {".": stat.S_IMODE(os.stat(self.data_dir).st_mode)}
        for folder, directories, files in os.walk(self.data_dir):
            for name in directories + files:
                path = os.path.join(folder, name)
                found[os.path.relpath(path, self.data_dir)] = stat.S_IMODE(os.lstat(path).st_mode)
        return found

    def assertPrivate(self):
        modes = self.modes()
        for name, mode in modes.items():
            path = os.path.join(self.data_dir, name)
            expected = (0o700 if os.path.isdir(path) else
                        0o400 if name.startswith("archive" + os.sep) else 0o600)
            self.assertEqual(oct(mode), oct(expected), name)
        return modes

    def test_every_file_and_directory_of_a_journal_is_private(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(guard.tool_execution("book_trip", {"to": "LIS"}, Downstream()),
                         '{"status": "confirmed"}')
        with self.assertRaises(TimeoutError), self.assertLogs("crash_recovery", "WARNING"):
            guard.tool_execution("book_trip", {"to": "OPO"},
                                 Downstream(error=TimeoutError("gateway timeout")))
        modes = self.assertPrivate()  # while the worker holds the WAL and SHM open
        for name in ("journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm",
                     "head.json", "initialized", "calls"):
            self.assertIn(name, modes)
        for parent in (os.path.dirname(self.data_dir), os.path.dirname(
                os.path.dirname(self.data_dir))):
            self.assertEqual(oct(stat.S_IMODE(os.stat(parent).st_mode)), oct(0o700), parent)
        operation_id = guard.status_report()["unresolved"][0]["operation_id"]
        guard.close()
        code, _, text = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                "not_applied", "--evidence", "no booking for OPO at the airline")
        self.assertEqual(code, 0, text)
        code, _, text = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, text)
        modes = self.assertPrivate()
        self.assertIn("operator.log", modes)
        self.assertTrue([name for name in modes if name.startswith("archive" + os.sep)
                         and name.endswith(".sqlite3")], modes)

    def test_a_restarted_journal_and_the_files_it_keeps_are_private(self):
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("book_trip", {"to": "LIS"}, Downstream()),
                         '{"status": "confirmed"}')
        guard.close()
        os.unlink(os.path.join(self.data_dir, "head.json"))  # checkpoint_missing
        code, document, text = run_cli(self.data_dir, "restart-journal", "--evidence",
                                       "head.json deleted by a cleanup script")
        self.assertEqual(code, 0, text)
        modes = self.assertPrivate()
        self.assertTrue([name for name in modes if name.startswith("replaced" + os.sep)
                         and name.endswith("journal.sqlite3")], modes)
