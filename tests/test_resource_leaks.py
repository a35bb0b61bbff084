"""The leak check (tests/leak_check.py) really fails a run, and what it found
stays fixed.

The check is proved on scratch test modules run the way the README runs the
suite (``python -m unittest discover -s tests -v``) in a child interpreter
with its own log: a test that leaves a file (every Python) or an SQLite
connection (Python 3.13+, where ``sqlite3`` warns) to the garbage collector
fails by name, so does a test whose child process leaks, and a leak outside
any test makes the run exit 1.
"""
from __future__ import annotations

import gc
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import unittest

import leak_check
from reliability_support import ReliabilityCase
from support import TESTS

from crash_recovery.guard import RecoveryGuard

# Python's sqlite3 warns about an unclosed connection from 3.13 on.
SQLITE_WARNS = sys.version_info >= (3, 13)

SCRATCH_TESTS = textwrap.dedent("""
    import sqlite3, subprocess, sys, unittest
    sys.path.insert(0, {tests!r})
    import support  # installs the check, as for every test module of the suite

    CHILD = ("import sys; sys.path.insert(0, {tests!r}); import support; "
             "open(sys.argv[1]).read()")


    class Scratch(unittest.TestCase):
        def test_closes_everything(self):
            with open(__file__) as stream:
                stream.read()
            sqlite3.connect(":memory:").close()

        def test_leaks_a_file(self):
            open(__file__).read()

        def test_leaks_a_connection(self):
            sqlite3.connect(":memory:").execute("SELECT 1")

        def test_its_child_leaks_a_file(self):
            subprocess.run([sys.executable, "-c", CHILD, __file__], check=True)
""")

SCRATCH_LEAK_AFTER_THE_TESTS = textwrap.dedent("""
    import sys, unittest
    sys.path.insert(0, {tests!r})
    import support


    def tearDownModule():
        open(__file__).read()


    class Scratch(unittest.TestCase):
        def test_passes(self):
            pass
""")


def run_scratch_suite(source):
    """Run ``source`` as the only test module of a scratch checkout with the
    README's test command, in a fresh interpreter that is its own runner."""
    with tempfile.TemporaryDirectory(prefix="cr-leak-check-") as checkout:
        os.mkdir(os.path.join(checkout, "tests"))
        with open(os.path.join(checkout, "tests", "test_scratch.py"), "w") as stream:
            stream.write(source.format(tests=TESTS))
        environment = {key: value for key, value in os.environ.items()
                       if key != leak_check.LOG_VARIABLE}
        return subprocess.run([sys.executable, "-m", "unittest", "discover", "-s", "tests",
                               "-v"], cwd=checkout, env=environment, capture_output=True,
                              text=True, timeout=120)


def verdicts(output):
    """``{test name: "ok" | "FAIL" | "ERROR"}`` from unittest's verbose lines."""
    found = {}
    for line in output.splitlines():
        name, separator, verdict = line.partition(" ... ")
        if separator and name.startswith("test_"):
            found[name.split(" ")[0]] = verdict.strip()
    return found


class TheCheckFails(unittest.TestCase):

    def test_a_test_that_leaks_fails_by_name(self):
        completed = run_scratch_suite(SCRATCH_TESTS)
        self.assertEqual(completed.returncode, 1, completed.stderr)
        self.assertEqual(verdicts(completed.stderr), {
            "test_closes_everything": "ok",
            "test_its_child_leaks_a_file": "FAIL",
            "test_leaks_a_connection": "FAIL" if SQLITE_WARNS else "ok",
            "test_leaks_a_file": "FAIL"})
        self.assertIn("test_scratch.Scratch.test_leaks_a_file left 1 resource(s) to the "
                      "garbage collector", completed.stderr)
        self.assertIn("unclosed file", completed.stderr)
        self.assertEqual("unclosed database in <sqlite3.Connection" in completed.stderr,
                         SQLITE_WARNS)

    def test_a_leak_outside_any_test_fails_the_run(self):
        completed = run_scratch_suite(SCRATCH_LEAK_AFTER_THE_TESTS)
        self.assertEqual(verdicts(completed.stderr), {"test_passes": "ok"})
        self.assertEqual(completed.returncode, 1, completed.stderr)
        self.assertIn("FAILED: resources left to the garbage collector outside any test",
                      completed.stderr)


class ForkedChildren(ReliabilityCase):

    def test_a_forked_child_never_finalizes_its_parents_connection(self):
        # A child that uses the guard it inherited drops the parent's
        # connection without closing it (storage/forksafe.py): closed or
        # finalized there, it could checkpoint or remove the WAL under the
        # parent.  The child's own call opens a connection of its own.
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(guard.tool_execution("book", {}, lambda: "booked", session_id="s",
                                              tool_call_id="c"), "booked")
        connection = id(guard.journal()._store.database.connection)
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one call, collect, say whether the parent's connection lives
            try:
                result = guard.tool_execution("book", {}, lambda: "booked", session_id="s",
                                              tool_call_id="child")
                guard.close()
                gc.collect()
                alive = any(type(found) is sqlite3.Connection and id(found) == connection
                            for found in gc.get_objects())
                os.write(writing, f"{result} {'alive' if alive else 'finalized'}".encode())
            finally:
                os._exit(0)
        os.close(writing)
        with os.fdopen(reading, "rb") as stream:
            answer = stream.read()
        os.waitpid(pid, 0)
        self.assertEqual(answer, b"booked alive")
        self.assertEqual(guard.tool_execution("book", {}, lambda: "booked", session_id="s",
                                              tool_call_id="after"), "booked")
        self.assertEqual([event["tool_call_id"] for event in self.assertVerifies().events
                          if event["kind"] == "started"], ["c", "child", "after"])


if __name__ == "__main__":
    unittest.main()
