"""Shared test support: the package, temp data dirs, the CLI, journal checks.

Importing this module loads the checkout as the package ``crash_recovery`` (see
``host/standalone.py``, via tests/checkout.py), so tests import ``crash_recovery.journal`` and friends.

Every journal a test writes should end with :meth:`JournalTestCase.assertVerifies`:
``tests/journal_reference.py`` (a second reading of docs/format.md that never
imports the product) must accept it.  As an *extra* cross-check, the
workspace's independent checker runs too when it is present -- beside the
repository at ``../shared/tools/verify_journal.py`` or named by
``CRASH_RECOVERY_VERIFIER``.  When it is absent only that cross-check is
left out (``tests/test_cross_check.py`` reports it as one skip, saying why);
``CRASH_RECOVERY_REQUIRE_VERIFIER=1`` (set by CI) turns its absence into a
failure.

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
import logging
import os
import subprocess
import sys
import tempfile
import shutil
import unittest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
for _path in (REPO, TESTS):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import leak_check  # noqa: E402,F401  (installs the check before the plugin loads)
from checkout import load_package  # noqa: E402

load_package()

# The plugin's WARNINGs (an operation became uncertain, a call was refused) are the
# point of many tests, which check them with assertLogs; without a handler Python
# would print every one of them to stderr and bury the test report.
logging.getLogger("crash_recovery").addHandler(logging.NullHandler())

import journal_reference as reference  # noqa: E402

WORKSPACE_VERIFIER = os.environ.get("CRASH_RECOVERY_VERIFIER") or os.path.join(
    os.path.dirname(REPO), "shared", "tools", "verify_journal.py")
REQUIRE_VERIFIER = os.environ.get("CRASH_RECOVERY_REQUIRE_VERIFIER", "") == "1"
OPERATOR_CLI = os.path.join(REPO, "operator_cli.py")
# Runs a command outside this process's tree, as the operator's own shell would.
OPERATOR_SHELL = os.path.join(TESTS, "operator_shell.py")
# The operator commands that refuse to run from inside an agent (docs/cli.md
# §Who may settle): a test holding the journal open runs them from OPERATOR_SHELL.
WRITING_WORDS = ("resolve", "acknowledge", "repair-checkpoint", "archive", "restart-journal")
# SQLite's own transient files: created by any reader, never part of the journal's content.
SQLITE_SIDE_FILES = ("journal.sqlite3-wal", "journal.sqlite3-shm")

_workspace_module = None


def workspace_verifier():
    """The workspace's independent checker module, or None when it is absent
    (raises when CRASH_RECOVERY_REQUIRE_VERIFIER=1 asks for it)."""
    global _workspace_module
    if _workspace_module is None:
        if not os.path.isfile(WORKSPACE_VERIFIER):
            if REQUIRE_VERIFIER:
                raise RuntimeError(f"CRASH_RECOVERY_REQUIRE_VERIFIER=1 but no checker at "
                                   f"{WORKSPACE_VERIFIER}")
            return None
        spec = importlib.util.spec_from_file_location("verify_journal", WORKSPACE_VERIFIER)
        module = importlib.util.module_from_spec(spec)
        sys.modules["verify_journal"] = module
        spec.loader.exec_module(module)
        _workspace_module = module
    return _workspace_module


def operator_argv(argv, words, from_here=False):
    """``argv`` as the operator runs it: a writing command (``words`` names
    one) from :data:`OPERATOR_SHELL`, outside this test process's tree (which
    may hold the journal open, like an agent); ``from_here`` runs it as a
    child of this process, as an agent's tool would."""
    if from_here or not any(word in WRITING_WORDS for word in words):
        return list(argv)
    return [sys.executable, OPERATOR_SHELL, *argv]


def run_cli(data_dir, *words, env=None, timeout=60, from_here=False):
    """Run ``operator_cli.py --data-dir DATA_DIR WORDS...`` in a subprocess
    (a writing command from the operator's own shell: :func:`operator_argv`).

    Returns ``(exit_code, parsed JSON or None, stdout text)``."""
    argv = [sys.executable, OPERATOR_CLI, "--data-dir", str(data_dir), *words]
    completed = subprocess.run(operator_argv(argv, words, from_here),
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

    def assertVerifies(self, data_dir=None, **options):
        """The reference reading accepts the journal in data_dir (and the
        workspace checker agrees, where present).  Returns the reference report."""
        data_dir = data_dir or self.data_dir
        report = reference.verify(data_dir, **options)
        self.assertTrue(report.ok, f"the reference check rejected the journal: {report.errors}")
        self.cross_check(data_dir, True, **options)
        return report

    def cross_check(self, data_dir, expect_ok, **options):
        """The workspace's independent checker gives ``expect_ok`` on data_dir.
        Where the checker is absent this extra check does not run (the one
        visible skip is ``test_cross_check``); the reference check still does."""
        module = workspace_verifier()
        if module is None:
            return
        found = module.verify(data_dir, allow_unknown_kinds=True, **options)
        self.assertEqual(found.ok, expect_ok, f"workspace checker: {found.errors}")

    def snapshot(self, data_dir=None):
        """Journal state that must not change: file bytes (minus -wal/-shm)
        and, when the database exists, its rows as SQLite reads them."""
        data_dir = data_dir or self.data_dir
        state = {"files": journal_files(data_dir)}
        if os.path.exists(os.path.join(data_dir, "journal.sqlite3")):
            try:
                state["rows"] = reference.snapshot_rows(data_dir)
            except Exception as exc:  # an unreadable database is a state too
                state["rows"] = f"unreadable: {type(exc).__name__}"
        return state
