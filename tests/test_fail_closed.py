"""Fail-closed injection (docs/guard.md §Execution contract, §Inside Hermes).

Every internal step of admission is made to fail in turn -- sqlite3.connect,
each statement (journal_mode, synchronous, BEGIN IMMEDIATE, data_version,
reads, INSERT, COMMIT) through a wrapper connection, os.open, os.fsync,
os.replace, the verification code itself, and the boundary hook raising at
each boundary.  The middleware must return a blocked result without calling
downstream, the hook must return None or a block (never raise), and nothing
may be half-written: the independent verifier accepts the journal and the
files are as before.  Failures after downstream must give
``crash_recovery_record_failed`` with ``outcome_unknown: true``, never call
downstream again, and poison the guard.  Then the environments: a database
held under an exclusive lock by another process, a data directory that is a
file, a filesystem refusing WAL, a read-only directory.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import unittest
from unittest import mock

from reliability_support import ReliabilityCase, logical_snapshot
from support import REPO, TESTS, reference

from crash_recovery.storage import durable, snapshot
from crash_recovery.guard import RecoveryGuard

REAL_CONNECT = sqlite3.connect


def setUpModule():
    # The guard logs every injected failure with a traceback; keep the run readable.
    logging.disable(logging.CRITICAL)


def tearDownModule():
    logging.disable(logging.NOTSET)


class WrappedConnection:
    """A real connection whose ``execute`` fails for chosen statements."""

    def __init__(self, real, fail, error):
        self._real, self._fail, self._error = real, fail, error

    def execute(self, sql, *args):
        if self._fail(sql):
            raise self._error
        return self._real.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._real, name)


class FakeCursor:
    def __init__(self, row):
        self._row = row

    def fetchone(self):
        return self._row


# The journal whose already-open connection a failure also applies to (set by
# the after-downstream tests: the guard's connection exists before downstream).
LIVE = {"journal": None}


@contextlib.contextmanager
def connect_failing(prefix, error=None):
    """Statements starting with ``prefix`` raise ``error``: in new connections
    and in the open connection of ``LIVE["journal"]``."""
    error = error or sqlite3.OperationalError("disk I/O error")

    def fails(sql):
        return sql.lstrip().upper().startswith(prefix.upper())

    def connect(*args, **kwargs):
        return WrappedConnection(REAL_CONNECT(*args, **kwargs), fails, error)
    target = LIVE["journal"]
    real = target._store.database.connection if target is not None else None
    if real is not None:
        target._store.database.connection = WrappedConnection(real, fails, error)
    try:
        with mock.patch.object(sqlite3, "connect", connect):
            yield
    finally:
        if real is not None:
            target._store.database.connection = real


def os_failing(name, error_number=errno.EIO):
    def fail(*args, **kwargs):
        raise OSError(error_number, os.strerror(error_number))
    return mock.patch.object(os, name, fail)


@contextlib.contextmanager
def hook_raising(boundary, kind):
    def hook(reached, reached_kind):
        if (reached, reached_kind) == (boundary, kind):
            raise RuntimeError(f"injected at {boundary}")
    durable.set_boundary_hook(hook)
    try:
        yield
    finally:
        durable.set_boundary_hook(None)


# step -> (injection factory, expected blocked code, does the read-only hook hit it?)
ADMISSION_STEPS = {
    "connect": (lambda: mock.patch.object(sqlite3, "connect", mock.Mock(
        side_effect=sqlite3.OperationalError("unable to open database file"))),
        "storage_unavailable", True),
    "pragma_journal_mode": (lambda: connect_failing("PRAGMA journal_mode"), "storage_unavailable", True),
    "pragma_synchronous": (lambda: connect_failing("PRAGMA synchronous"), "storage_unavailable", True),
    "begin": (lambda: connect_failing("BEGIN", sqlite3.OperationalError("database is locked")),
              "database_locked", True),
    "data_version": (lambda: connect_failing("SELECT schema_version, data_version"),
                     "storage_unavailable", True),
    "read": (lambda: connect_failing("SELECT"), "storage_unavailable", True),
    "insert": (lambda: connect_failing("INSERT INTO events"), "storage_unavailable", False),
    "verify_bug": (lambda: mock.patch.object(snapshot, "extend_chain",
                                             mock.Mock(side_effect=RuntimeError("bug"))),
                   "internal_error", True),
    "fsync": (lambda: os_failing("fsync"), "storage_unavailable", False),
    "replace": (lambda: os_failing("replace"), "storage_unavailable", False),
    "open": (lambda: os_failing("open", errno.EACCES), "storage_unavailable", True),
}
BOUNDARIES = ("begin", "inserted", "checkpoint_written", "checkpoint_fsynced",
              "checkpoint_replaced", "directory_fsynced")


class Counter:
    def __init__(self, inject=None, raise_=False):
        self.calls = 0
        self.inject = inject
        self.raise_ = raise_
        self.active = None

    def __call__(self):
        self.calls += 1
        if self.inject is not None:
            self.active = self.inject()
            self.active.__enter__()
        if self.raise_:
            raise ConnectionError("service reset")
        return {"ok": True}

    def stop(self):
        if self.active is not None:
            self.active.__exit__(None, None, None)
            self.active = None


class Admission(ReliabilityCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("seed", {}, Counter(), session_id="s",
                                              tool_call_id="seed"), {"ok": True})
        guard.close()
        self.before = logical_snapshot(self)

    def attempt(self, injection, code, hook_blocks):
        guard = RecoveryGuard(self.data_dir, busy_timeout=0.2)
        downstream = Counter()
        with injection:
            hook = guard.pre_tool_call(tool_name="pay", args={"a": 1}, session_id="s",
                                       tool_call_id="c")
            result = guard.tool_execution("pay", {"a": 1}, downstream, session_id="s",
                                          tool_call_id="c")
        self.assertEqual(downstream.calls, 0)
        blocked = json.loads(result)
        self.assertEqual((blocked["error"], blocked["blocked"], blocked["code"]),
                         ("crash_recovery_blocked", True, code), blocked)
        if hook_blocks:
            self.assertEqual(hook["action"], "block")
            self.assertEqual(json.loads(hook["message"])["code"], code)
        else:
            self.assertIsNone(hook)
        self.assertIsNone(guard.poisoned)
        if guard.gate.opened_journal is not None:
            guard.close()
        return guard

    def assert_untouched(self):
        self.assertEqual(logical_snapshot(self), self.before, "half-written state")
        self.assertTrue(self.assertVerifies().ok)
        self.assertEqual(sorted(name for name in os.listdir(self.data_dir) if "tmp" in name), [])
        # and the next call goes through: nothing was left blocking
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("next", {}, Counter(), session_id="s",
                                              tool_call_id="n"), {"ok": True})
        guard.close()

    def test_each_admission_step_failing(self):
        for step, (injection, code, hook_blocks) in ADMISSION_STEPS.items():
            with self.subTest(step):
                self.before = logical_snapshot(self)
                self.attempt(injection(), code, hook_blocks)
                self.assertEqual(logical_snapshot(self), self.before, "half-written state")
                self.assertTrue(self.assertVerifies().ok)

    def test_boundary_hook_raising_before_commit_leaves_nothing(self):
        for boundary in BOUNDARIES:
            with self.subTest(boundary):
                self.before = logical_snapshot(self)
                self.attempt(hook_raising(boundary, "started"), "internal_error", False)
                # head.json was put back even after os.replace
                self.assert_untouched()
                self.before = logical_snapshot(self)

    def test_boundary_hook_raising_after_commit_blocks_with_a_pending_record(self):
        self.attempt(hook_raising("committed", "started"), "internal_error", False)
        report = self.assertVerifies()
        self.assertEqual([report.state_of(op) for op in report.unresolved()], ["pending"])
        downstream = Counter()
        blocked = json.loads(RecoveryGuard(self.data_dir).tool_execution(
            "pay", {}, downstream, session_id="s", tool_call_id="x"))
        self.assertEqual((blocked["code"], downstream.calls), ("unresolved_operations", 0))


# step after downstream -> injection
RECORD_STEPS = {
    "begin_locked": lambda: connect_failing("BEGIN", sqlite3.OperationalError("database is locked")),
    "insert": lambda: connect_failing("INSERT INTO events"),
    "fsync": lambda: os_failing("fsync"),
    "replace": lambda: os_failing("replace"),
    "open": lambda: os_failing("open"),
    "verify_bug": lambda: mock.patch.object(snapshot, "extend_chain",
                                            mock.Mock(side_effect=RuntimeError("bug"))),
    **{f"hook_{boundary}": (lambda boundary=boundary: hook_raising(boundary, "returned"))
       for boundary in BOUNDARIES + ("committed",)},
}


class AfterDownstream(ReliabilityCase):

    def test_each_recording_step_failing(self):
        for step, injection in RECORD_STEPS.items():
            with self.subTest(step):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                guard = RecoveryGuard(self.data_dir, busy_timeout=0.2, full_verification=True)
                LIVE["journal"] = guard.journal()
                self.addCleanup(LIVE.update, journal=None)
                downstream = Counter(injection)
                try:
                    result = guard.tool_execution("pay", {"a": 1}, downstream, session_id="s",
                                                  tool_call_id="c")
                finally:
                    downstream.stop()
                failed = json.loads(result)
                self.assertEqual((failed["error"], failed["outcome_unknown"], failed["tool"]),
                                 ("crash_recovery_record_failed", True, "pay"))
                self.assertEqual(downstream.calls, 1)
                self.assertTrue(guard.poisoned)
                again = json.loads(guard.tool_execution("pay", {"a": 1}, downstream,
                                                        session_id="s", tool_call_id="c2"))
                self.assertEqual(again["code"], "guard_poisoned")
                hook = guard.pre_tool_call(tool_name="pay", args={"a": 1}, session_id="s",
                                           tool_call_id="c2")
                self.assertEqual(json.loads(hook["message"])["code"], "guard_poisoned")
                self.assertEqual(downstream.calls, 1, "downstream was called again")
                guard.close()
                report = self.assertVerifies()  # nothing half-written
                expected = ["returned"] if step == "hook_committed" else ["pending"]
                self.assertEqual([report.state_of(op) for op in
                                  {event["operation_id"] for event in report.events}], expected)
                # a fresh process (guard) still refuses while it is pending
                if expected == ["pending"]:
                    blocked = json.loads(RecoveryGuard(self.data_dir).tool_execution(
                        "pay", {}, downstream, session_id="s", tool_call_id="x"))
                    self.assertEqual(blocked["code"], "unresolved_operations")
                    self.assertEqual(downstream.calls, 1)

    def test_downstream_raising_and_recording_failing(self):
        guard = RecoveryGuard(self.data_dir)
        LIVE["journal"] = guard.journal()
        self.addCleanup(LIVE.update, journal=None)
        downstream = Counter(lambda: connect_failing("INSERT INTO events"), raise_=True)
        try:
            with self.assertRaises(ConnectionError):  # propagates unchanged
                guard.tool_execution("pay", {}, downstream, session_id="s", tool_call_id="c")
        finally:
            downstream.stop()
        self.assertTrue(guard.poisoned)
        self.assertEqual(json.loads(guard.tool_execution("pay", {}, downstream, session_id="s",
                                                         tool_call_id="d"))["code"], "guard_poisoned")
        self.assertEqual(downstream.calls, 1)
        guard.close()
        self.assertEqual(self.assertVerifies().unresolved().__len__(), 1)


LOCK_HOLDER = textwrap.dedent("""
    import sqlite3, sys
    connection = sqlite3.connect(sys.argv[1], isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.read()
""")


class Environments(ReliabilityCase):

    def blocked(self, guard, code, hook_blocks=True):
        downstream = Counter()
        result = json.loads(guard.tool_execution("pay", {}, downstream, session_id="s",
                                                 tool_call_id="c"))
        self.assertEqual((result["code"], downstream.calls), (code, 0), result)
        hook = guard.pre_tool_call(tool_name="pay", args={}, session_id="s", tool_call_id="c")
        if hook_blocks:
            self.assertEqual(json.loads(hook["message"])["code"], code)
        else:
            self.assertIsNone(hook)
        return result

    def test_database_locked_by_another_process(self):
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution("seed", {}, Counter(), session_id="s", tool_call_id="s")
        guard.close()
        before = logical_snapshot(self)
        holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER,
                                   os.path.join(self.data_dir, "journal.sqlite3")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(holder.stdout.readline().strip(), "locked")
            for full in (True, False):
                # The hook only reads (a WAL snapshot): a held writer lock never blocks it.
                result = self.blocked(RecoveryGuard(self.data_dir, busy_timeout=0.2,
                                                    full_verification=full), "database_locked",
                                      hook_blocks=False)
                self.assertIn("locked", result["explanation"])
        finally:
            holder.stdin.close()
            holder.wait(10)
            holder.stdout.close()
        self.assertEqual(logical_snapshot(self), before)
        self.assertVerifies()

    def test_data_directory_is_a_file(self):
        with open(self.data_dir, "w") as stream:
            stream.write("not a directory")
        self.blocked(RecoveryGuard(self.data_dir), "storage_unavailable")
        with open(self.data_dir) as stream:
            self.assertEqual(stream.read(), "not a directory")

    def test_wal_unavailable(self):
        def connect(*args, **kwargs):
            real = REAL_CONNECT(*args, **kwargs)
            connection = WrappedConnection(real, lambda sql: False, None)
            connection.execute = lambda sql, *a: (FakeCursor(("delete",))
                                                  if sql.upper().startswith("PRAGMA JOURNAL_MODE")
                                                  else real.execute(sql, *a))
            return connection
        logging.disable(logging.NOTSET)  # this test reads the log
        self.addCleanup(logging.disable, logging.CRITICAL)
        with mock.patch.object(sqlite3, "connect", connect), \
                self.assertLogs("crash_recovery", "WARNING") as logs:
            result = self.blocked(RecoveryGuard(self.data_dir), "wal_unavailable")
        # SQLite's answer is for the operator's log; the chat gets the code.
        self.assertIn("'delete'", "\n".join(logs.output))
        self.assertNotIn("'delete'", result["explanation"])
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "head.json")))

    def test_unwritable_directory(self):
        parent = os.path.join(self.root, "ro")
        os.makedirs(parent)
        existing = os.path.join(parent, "existing")
        guard = RecoveryGuard(existing)
        guard.tool_execution("seed", {}, Counter(), session_id="s", tool_call_id="s")
        guard.close()
        probe = textwrap.dedent(f"""
            import json, sys
            sys.path.insert(0, {TESTS!r})
            from checkout import load_module
            RecoveryGuard = load_module("guard").RecoveryGuard
            out = {{}}
            for name in ("fresh", "existing"):
                calls = []
                guard = RecoveryGuard({parent!r} + "/" + name)
                result = guard.tool_execution("pay", {{}}, lambda: calls.append(1),
                                              session_id="s", tool_call_id="c")
                hook = guard.pre_tool_call(tool_name="pay", args={{}}, session_id="s",
                                           tool_call_id="c")
                out[name] = [json.loads(result)["code"], len(calls),
                             json.loads(hook["message"])["code"]]
            print(json.dumps(out))
        """)
        script = (f"mount --bind {parent} {parent} && mount -o remount,bind,ro {parent} {parent} "
                  f"&& exec {sys.executable} -c \"$0\"")
        try:
            completed = subprocess.run(["unshare", "-rm", "sh", "-c", script, probe],
                                       capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            completed = None
        if completed is None or completed.returncode != 0 or not completed.stdout.strip():
            # No user namespaces here: fall back to os.open/os.makedirs refusing.
            with os_failing("open", errno.EROFS), os_failing("makedirs", errno.EROFS):
                self.blocked(RecoveryGuard(os.path.join(parent, "fresh")), "storage_unavailable")
            return
        found = json.loads(completed.stdout)
        self.assertEqual(found["fresh"], ["storage_unavailable", 0, "storage_unavailable"])
        self.assertEqual(found["existing"][1], 0)
        self.assertEqual(found["existing"][0], "read_access_only")
        self.assertFalse(os.path.exists(os.path.join(parent, "fresh")))
        self.assertTrue(reference.verify(existing).ok)


if __name__ == "__main__":
    unittest.main()
