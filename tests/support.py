"""Shared test support: paths, the independent verifier, temp data dirs, the CLI.

Every journal a test writes should end with :meth:`JournalTestCase.assertVerifies`,
which runs ``../shared/tools/verify_journal.py`` -- written from SPEC alone, it
never imports the product.

Hazard: :meth:`JournalTestCase.assertVerifies`, :meth:`JournalTestCase.snapshot`
and :func:`journal_files` read ``journal.sqlite3`` with plain ``open()``.  Closing
that descriptor drops every POSIX lock this *process* holds on the file, including
those of a live SQLite connection (a guard or Journal in the test), after which
another process may checkpoint and delete the WAL under it.  Close in-process
guards/journals before calling them, or call them from a subprocess.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

VERIFIER_PATH = os.environ.get(
    "CRASH_RECOVERY_VERIFIER",
    os.path.join(os.path.dirname(REPO), "shared", "tools", "verify_journal.py"))
OPERATOR_CLI = os.path.join(REPO, "operator_cli.py")
# SQLite's own transient files: created by any reader, never part of the journal's content.
SQLITE_SIDE_FILES = ("journal.sqlite3-wal", "journal.sqlite3-shm")

_verifier = None


def verifier():
    """The independent verifier module (loaded once from VERIFIER_PATH)."""
    global _verifier
    if _verifier is None:
        if not os.path.isfile(VERIFIER_PATH):
            raise RuntimeError(f"independent verifier not found at {VERIFIER_PATH}; "
                               "set CRASH_RECOVERY_VERIFIER")
        spec = importlib.util.spec_from_file_location("verify_journal", VERIFIER_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["verify_journal"] = module
        spec.loader.exec_module(module)
        _verifier = module
    return _verifier


def run_cli(data_dir, *words, env=None, timeout=60):
    """Run ``operator_cli.py --data-dir DATA_DIR WORDS...`` in a subprocess.

    Returns ``(exit_code, parsed JSON or None, stdout text)``."""
    completed = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir", str(data_dir), *words],
                               capture_output=True, text=True, timeout=timeout,
                               env=env if env is not None else os.environ.copy())
    try:
        parsed = json.loads(completed.stdout)
    except ValueError:
        parsed = None
    return completed.returncode, parsed, completed.stdout


def journal_files(data_dir):
    """``{name: bytes}`` of every file in data_dir except SQLite's -wal/-shm."""
    found = {}
    for name in sorted(os.listdir(data_dir)):
        path = os.path.join(data_dir, name)
        if name in SQLITE_SIDE_FILES or not os.path.isfile(path):
            continue
        with open(path, "rb") as stream:
            found[name] = stream.read()
    return found


class JournalTestCase(unittest.TestCase):
    """A TestCase with a fresh temporary directory ``self.root`` and a data
    directory path ``self.data_dir`` inside it (not created)."""

    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(prefix="crash-recovery-test-")
        self.addCleanup(shutil.rmtree, self.root, True)
        self.data_dir = os.path.join(self.root, "data")

    def assertVerifies(self, data_dir=None):
        """The independent verifier accepts the journal in data_dir."""
        report = verifier().verify(data_dir or self.data_dir)
        self.assertTrue(report.ok, f"independent verifier rejected the journal: {report.errors}")
        return report

    def snapshot(self, data_dir=None):
        """Journal state that must not change: file bytes (minus -wal/-shm)
        and, when the database exists, its rows as SQLite reads them."""
        data_dir = data_dir or self.data_dir
        state = {"files": journal_files(data_dir)}
        if os.path.exists(os.path.join(data_dir, "journal.sqlite3")):
            try:
                state["rows"] = verifier().snapshot_rows(data_dir)
            except Exception as exc:  # an unreadable database is a state too
                state["rows"] = f"unreadable: {type(exc).__name__}"
        return state
