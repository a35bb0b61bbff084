"""The storage review's findings (issue 14), each reproduced with real files and
processes, with variants of its kind.

1. Foreign schema objects: a trigger that swallows INSERTs, a plain edit
   through SQLite, dropped triggers, a lost INSERT.
2. A failed COMMIT can still be durable: for each event kind, a COMMIT that
   fails after it committed and one that fails before; every end state has an
   operator path.
3. The checkpoint restore runs under the writer lock: a stalled, failing
   outcome append and a forced resolution meanwhile.
5. Read-only inspection: an operator who may read but not write the data
   directory, at each runbook step.
Tidy: an interrupt while a call's locks are released; bookkeeping failing after
a successful COMMIT.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import unittest
from unittest import mock

from reliability_support import ReliabilityCase
from support import REPO, TESTS, reference, run_cli

from crash_recovery.storage import durable
from crash_recovery import guard as guard_module
from crash_recovery.storage.database import Database
from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal
from crash_recovery.storage.owner import probe_lock

TIMEOUT_SECONDS = 60
REAL_CONNECT = sqlite3.connect


class Tool:
    """A tool with a side effect we can count."""

    def __init__(self, result='{"status": "booked"}', error=None):
        self.result, self.error, self.calls = result, error, 0

    def __call__(self):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.result


def call(guard, tool, name="c", tool_name="book_trip"):
    return guard.tool_execution(tool_name=tool_name, args={"n": name}, next_call=tool,
                                session_id="s", tool_call_id=name)


class ForeignSchemaObjects(ReliabilityCase):

    def test_swallowing_trigger_never_lets_a_booking_run(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(call(guard, Tool(), "c1"), '{"status": "booked"}')
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        connection.execute("CREATE TRIGGER t BEFORE INSERT ON events BEGIN SELECT RAISE(IGNORE); END")
        connection.commit()
        connection.close()
        for candidate in (guard, RecoveryGuard(self.data_dir)):
            tool = Tool()
            blocked = json.loads(call(candidate, tool, "c2"))
            self.assertEqual((blocked["code"], tool.calls), ("foreign_schema_object", 0))
        code, status, _ = run_cli(self.data_dir, "verify")
        self.assertEqual((code, status["integrity"]), (1, "foreign_schema_object"))
        code, refused, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence", "x")
        self.assertEqual((code, refused["error"]["code"]), (1, "foreign_schema_object"))

    def test_plain_edits_through_sqlite_are_impossible(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c1")
        for statement in ("UPDATE events SET payload = 'x' WHERE seq = 1",
                          "DELETE FROM events WHERE seq = 2", "DELETE FROM events",
                          "INSERT OR REPLACE INTO events VALUES (1, 'x', 'y', 'z')",
                          "INSERT INTO events VALUES (9, 'x', 'y', 'z')",
                          "UPDATE metadata SET value = 'v2' WHERE key = 'schema'",
                          "DELETE FROM metadata", "INSERT INTO metadata VALUES ('k', 'v')"):
            with self.subTest(statement):
                with self.assertRaises(sqlite3.IntegrityError):
                    reference.execute_sql(self.data_dir, statement, keep_triggers=True)
        self.assertEqual(call(guard, Tool(), "c2"), '{"status": "booked"}')
        self.assertVerifies()

    def test_dropped_triggers_mean_a_full_verification_and_come_back(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c1")
        reference.execute_sql(self.data_dir, "SELECT 1")  # drops every trigger, edits nothing
        with self.assertLogs("crash_recovery.storage.store", "WARNING") as logged:
            self.assertEqual(call(guard, Tool(), "c2"), '{"status": "booked"}')
        self.assertIn("re-created", logged.output[0])
        with sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3")) as connection:
            names = {row[0] for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        connection.close()
        self.assertEqual(len(names), 6)
        # ...and an edit made while they were gone is found by every process.
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'book_trip', 'book_trap') WHERE seq = 1")
        for candidate in (guard, RecoveryGuard(self.data_dir)):
            self.assertEqual(json.loads(call(candidate, Tool(), "c3"))["code"], "hash_mismatch")

    def test_an_insert_that_stores_nothing_is_refused_before_head_json_moves(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c1")
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            head = stream.read()
        store = guard._journal._store
        real = store.database.connection

        class Swallowing:  # an INSERT that "succeeds" without storing the row
            def execute(self, sql, *args):
                if sql.startswith("INSERT INTO events"):
                    return real.execute("SELECT 1 WHERE 0")
                return real.execute(sql, *args)

            def __getattr__(self, name):
                return getattr(real, name)

        store.database.connection = Swallowing()
        try:
            tool = Tool()
            blocked = json.loads(call(guard, tool, "c2"))
        finally:
            store.database.connection = real
        self.assertEqual((blocked["code"], tool.calls), ("append_not_stored", 0))
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            self.assertEqual(stream.read(), head)
        self.assertEqual(call(guard, Tool(), "c3"), '{"status": "booked"}')


class FailingCommit:
    """Make the COMMIT of the next append fail: ``durable`` after SQLite really
    committed (an fsync error reported after the WAL was written), otherwise
    before (nothing committed)."""

    def __init__(self, durable, kind):
        self.durable, self.kind, self.armed = durable, kind, False

    def connect(self, *args, **kwargs):
        real = REAL_CONNECT(*args, **kwargs)
        plan = self

        class Connection:
            def execute(self, sql, *parameters):
                if (sql.startswith("INSERT INTO events")
                        and f'"kind":"{plan.kind}"' in parameters[0][1]):
                    plan.armed = True
                elif sql == "COMMIT" and plan.armed:
                    plan.armed = False
                    if plan.durable:
                        real.execute("COMMIT")
                    raise sqlite3.OperationalError("disk I/O error")
                return real.execute(sql, *parameters)

            def __getattr__(self, name):
                return getattr(real, name)

        return Connection()


class FailedCommit(ReliabilityCase):
    """Whatever a failed COMMIT left, the profile is blocked with an operator path."""

    def settle_everything(self):
        """Follow the runbook until the gate is open; returns the codes met."""
        met = []
        for _ in range(4):
            code, status, _ = run_cli(self.data_dir, "status")
            if code == 1:
                met.append(status["integrity"])
                self.assertEqual(status["integrity"], "checkpoint_ahead", status)
                self.assertEqual(run_cli(self.data_dir, "repair-checkpoint", "--evidence",
                                         "COMMIT failed with EIO")[0], 0)
                continue
            if not status["unresolved"]:
                return met
            for operation in status["unresolved"]:
                met.append(operation["reason"] or operation["state"])
                self.assertEqual(run_cli(self.data_dir, "resolve", operation["operation_id"],
                                         "--outcome", "not_applied", "--evidence",
                                         "checked the service")[0], 0)
        self.fail("the runbook did not open the gate")

    def run_case(self, kind, durable):
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "c0")
        if kind == "resolved":  # an open operation for the operator to resolve
            with contextlib.suppress(TimeoutError):
                call(guard, Tool(error=TimeoutError("gateway")), "c1")
        guard.close()
        plan = FailingCommit(durable, kind)
        tool = Tool()
        with mock.patch.object(sqlite3, "connect", plan.connect):
            guard = RecoveryGuard(self.data_dir)
            if kind == "started":
                blocked = json.loads(call(guard, tool, "c2"))
                self.assertEqual((blocked["code"], tool.calls), ("commit_failed", 0))
                self.assertIn("NOT run", blocked["explanation"])
            elif kind in ("returned", "uncertain"):
                tool = Tool(result='{"error": "x"}' if kind == "uncertain" else "ok")
                result = json.loads(call(guard, tool, "c2"))
                self.assertEqual((result["error"], tool.calls), ("crash_recovery_record_failed", 1))
            else:
                with Journal(self.data_dir, create=False) as journal:
                    operation = journal.unresolved()[0].operation_id
                    with self.assertRaises(Exception) as caught:
                        journal.resolve(operation, outcome="not_applied", evidence="x")
                    self.assertEqual(caught.exception.code, "commit_failed")
            guard.close()
        self.settle_everything()
        self.assertEqual(call(RecoveryGuard(self.data_dir), Tool(), "c9"), '{"status": "booked"}')
        self.assertVerifies()

    def test_each_kind_each_way(self):
        for kind in ("started", "returned", "uncertain", "resolved"):
            for durable in (True, False):
                with self.subTest(kind=kind, durable=durable):
                    shutil.rmtree(self.data_dir, ignore_errors=True)
                    self.run_case(kind, durable)

    def test_lost_started_comes_back_for_a_person(self):
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "c0")
        guard.close()
        with mock.patch.object(sqlite3, "connect", FailingCommit(False, "started").connect):
            guard = RecoveryGuard(self.data_dir)
            call(guard, Tool(), "c1")
            guard.close()
        self.assertEqual(self.settle_everything(), ["checkpoint_ahead", "lost_in_crash"])


# A worker whose `returned` append stalls after replacing head.json, then fails.
STALLING_WORKER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery.guard import RecoveryGuard
    data_dir, signal_file = sys.argv[1], sys.argv[2]

    def hook(boundary, kind):
        if (boundary, kind) == ("checkpoint_replaced", "returned"):
            open(signal_file, "w").close()
            time.sleep(1.5)
            raise OSError(5, "Input/output error")

    durable.set_boundary_hook(hook)
    guard = RecoveryGuard(data_dir, busy_timeout=10)
    print(guard.tool_execution(tool_name="charge_card", args={{}}, next_call=lambda: "charged",
                               session_id="s", tool_call_id="c"), flush=True)
""").format(tests=TESTS)


class RestoreUnderTheLock(ReliabilityCase):

    def test_forced_resolution_during_a_failing_append_stands(self):
        signal_file = os.path.join(self.root, "stalled")
        worker = subprocess.Popen([sys.executable, "-c", STALLING_WORKER, self.data_dir,
                                   signal_file], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not os.path.exists(signal_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        operation = probe_lock(self.data_dir)["operation_id"]
        code, resolved, text = run_cli(self.data_dir, "resolve", operation, "--outcome",
                                       "completed", "--force", "--evidence",
                                       "worker hung; card processor shows the charge")
        self.assertEqual(code, 0, text)
        output, _ = worker.communicate(timeout=TIMEOUT_SECONDS)
        self.assertEqual(json.loads(output)["error"], "crash_recovery_record_failed")
        code, verified, text = run_cli(self.data_dir, "verify")
        self.assertEqual((code, verified["integrity"]), (0, "ok"), text)
        self.assertEqual(verified["checkpoint"], resolved["checkpoint"])
        self.assertEqual(reference.verify(self.data_dir).kinds(), ["started", "resolved"])
        self.assertEqual([name for name in os.listdir(self.data_dir) if "tmp" in name], [])


def _as_nobody():
    os.setgid(65534)
    os.setuid(65534)


@unittest.skipUnless(hasattr(os, "getuid") and os.getuid() == 0,
                     "needs root to run the operator CLI as another user")
class ReadOnlyOperator(ReliabilityCase):
    """Finding 5: inspection by a user who may read, not write, the data directory."""

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
                                   text=True, preexec_fn=_as_nobody, timeout=TIMEOUT_SECONDS)
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


class InterruptingBinding:
    """The guard's ContextVar, but ``reset`` is interrupted (KeyboardInterrupt)."""

    def __init__(self, real):
        self.real = real

    def get(self):
        return self.real.get()

    def set(self, value):
        return self.real.set(value)

    def reset(self, token):
        self.real.reset(token)
        raise KeyboardInterrupt


class Tidy(ReliabilityCase):

    def test_an_interrupt_while_releasing_never_leaves_a_lock_held(self):
        for step in ("reset", "owner"):
            with self.subTest(step):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                guard = RecoveryGuard(self.data_dir)
                self.addCleanup(guard.close)
                call(guard, Tool(), "warm")
                target = (mock.patch.object(guard_module, "ADMISSION",
                                            InterruptingBinding(guard_module.ADMISSION))
                          if step == "reset"
                          else mock.patch.object(type(guard._owner), "release",
                                                 side_effect=KeyboardInterrupt))
                with target, self.assertRaises(KeyboardInterrupt):
                    call(guard, Tool(), "c1")
                self.assertFalse(guard._in_flight.locked())
                if step == "reset":
                    self.assertIsNone(probe_lock(self.data_dir))
                guard._owner.release()
                self.assertEqual(call(guard, Tool(), "c2"), '{"status": "booked"}')

    def test_bookkeeping_failing_after_commit_does_not_say_nothing_ran(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c0")
        tool = Tool()
        after_commit = {"on": False}
        real_files_now = Database.files_now

        def files_now(database):  # fails only between the started COMMIT and the tool
            if after_commit["on"]:
                raise OSError(5, "Input/output error")
            return real_files_now(database)

        def hook(boundary, kind):
            after_commit["on"] = (boundary, kind) == ("committed", "started")

        durable.set_boundary_hook(hook)
        self.addCleanup(durable.set_boundary_hook, None)
        with mock.patch.object(Database, "files_now", files_now):
            self.assertEqual(call(guard, tool, "c1"), '{"status": "booked"}')
        self.assertEqual(tool.calls, 1)  # the started was durable: the call ran normally
        self.assertEqual(reference.verify(self.data_dir).kinds(),
                         ["started", "returned", "started", "returned"])


if __name__ == "__main__":
    unittest.main()
