"""Read-only inspection (docs/cli.md §Access): an operator who may read but not
write the data directory runs ``status``, ``verify``, ``checkpoint`` and
``log`` at each runbook step -- a worker running, every worker stopped, a
worker killed -- and is refused a write with ``read_access_only``.  Runs the
CLI as another user, so it needs root.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ReliabilityCase, Tool, call
from support import REPO, TESTS

from crash_recovery.guard import RecoveryGuard

TIMEOUT_SECONDS = 60
NOBODY = 65534  # uid and gid the read-only operator runs as (subprocess drops to them)


@unittest.skipUnless(hasattr(os, "getuid") and os.getuid() == 0,
                     "needs root to run the operator CLI as another user")
class ReadOnlyOperator(ReliabilityCase):
    """Inspection by a user who may read, not write, the data directory."""

    PYTHON = "/usr/bin/python3"

    def setUp(self):
        super().setUp()
        probe = subprocess.run([self.PYTHON, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True) if os.path.exists(self.PYTHON) else None
        if probe is None or probe.stdout.strip() != "True":
            self.skipTest(f"no Python >= 3.11 at {self.PYTHON} that another user can run")
        self.repo = os.path.join(self.root, "repo")
        shutil.copytree(REPO, self.repo, ignore=shutil.ignore_patterns(".git", ".venv*",
                                                                       "__pycache__"))
        os.chmod(self.root, 0o755)

    def as_operator(self, *words):
        for path, directories, files in os.walk(self.root):
            for name in directories + files:
                os.chmod(os.path.join(path, name), 0o755 if name in directories else 0o644)
        completed = subprocess.run([self.PYTHON, os.path.join(self.repo, "operator_cli.py"),
                                    "--data-dir", self.data_dir, *words], capture_output=True,
                                   text=True, timeout=TIMEOUT_SECONDS,
                                   user=NOBODY, group=NOBODY, extra_groups=[])
        return completed.returncode, json.loads(completed.stdout)

    def check_inspection(self, expected_unresolved):
        for words in (("status",), ("verify",), ("checkpoint",), ("log",)):
            code, found = self.as_operator(*words)
            self.assertEqual(code, 0, found)
        self.assertEqual(len(self.as_operator("status")[1]["unresolved"]), expected_unresolved)
        code, refused = self.as_operator("resolve", "00000000-0000-4000-8000-000000000000",
                                         "--outcome", "completed", "--evidence", "x")
        self.assertEqual((code, refused["error"]["code"]), (1, "read_access_only"))
        self.assertIn("write access", refused["error"]["message"])

    def test_each_runbook_step(self):
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "c0")
        call(guard, Tool(result='{"error": "x"}'), "c1")
        # a worker still running: -wal and -shm exist
        self.check_inspection(1)
        guard.close()
        # every worker stopped: no -wal, no -shm (SQLite would have to create them)
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "journal.sqlite3-wal")))
        self.check_inspection(1)
        # a worker killed: -wal and -shm left behind, owned by the worker's user
        killer = textwrap.dedent(f"""
            import os, signal, sys
            sys.path.insert(0, {TESTS!r})
            import support
            from crash_recovery.journal import Journal
            journal = Journal({self.data_dir!r}); journal.status()
            os.kill(os.getpid(), signal.SIGKILL)
        """)
        subprocess.run([sys.executable, "-c", killer], timeout=TIMEOUT_SECONDS)
        self.check_inspection(1)


if __name__ == "__main__":
    unittest.main()
