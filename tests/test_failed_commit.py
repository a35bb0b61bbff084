"""A failed append after the tool ran or after its COMMIT, with real files and
processes (docs/format.md §Append, docs/guard.md §Execution contract).

* A COMMIT that fails can still be durable: for each event kind, a COMMIT
  that fails after SQLite committed and one that fails before; every end
  state blocks the profile and has an operator path that opens the gate.
* A failing append puts ``head.json`` back under the writer lock, so a
  forced resolution waiting for that lock stands.
* Bookkeeping that fails after a successful COMMIT does not turn a durable
  ``started`` into "nothing ran".
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import unittest
from unittest import mock

from reliability_support import ReliabilityCase, Tool, call, next_message, start_worker, tell
from support import OPERATOR_CLI, TESTS, reference, run_cli

from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal
from crash_recovery.storage import durable
from crash_recovery.storage.database import Database
from crash_recovery.storage.call_lock import held_calls

REAL_CONNECT = sqlite3.connect
TIMEOUT_SECONDS = 60


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
                code, _, text = run_cli(self.data_dir, "repair-checkpoint", "--evidence",
                                        "COMMIT failed with EIO")
                self.assertEqual(code, 0, text)
                continue
            if not status["unresolved"]:
                return met
            for operation in status["unresolved"]:
                met.append(operation["reason"] or operation["state"])
                code, _, text = run_cli(self.data_dir, "resolve", operation["operation_id"],
                                        "--outcome", "not_applied", "--evidence",
                                        "checked the service")
                self.assertEqual(code, 0, text)
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


# A worker whose `returned` append stalls right after replacing head.json (the
# writer lock held) until a line arrives on stdin, then fails with EIO.
STALLING_WORKER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery.guard import RecoveryGuard
    data_dir = sys.argv[1]

    def hook(boundary, kind):
        if (boundary, kind) == ("checkpoint_replaced", "returned"):
            print(json.dumps({{"stalled": True}}), flush=True)
            sys.stdin.readline()
            raise OSError(5, "Input/output error")

    durable.set_boundary_hook(hook)
    guard = RecoveryGuard(data_dir, busy_timeout=60)
    print(json.dumps({{"result": guard.tool_execution(
        tool_name="charge_card", args={{}}, next_call=lambda: "charged", session_id="s",
        tool_call_id="c")}}), flush=True)
""").format(tests=TESTS)

# The operator CLI (argv[2:] are its words) that writes one line to the file
# descriptor argv[1] as its writer starts to read the journal: from there it
# waits for the stalled append's locks (the head lock, then the writer lock).
ANNOUNCING_CLI = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery import operator_cli
    from crash_recovery.storage import store
    announce = int(sys.argv[1])
    real_snapshot = store.JournalStore.snapshot

    def snapshot(self, **options):
        if options.get("check_files") is False:  # the writer's read before BEGIN IMMEDIATE
            os.write(announce, b"waiting_for_the_journal\\n")
        return real_snapshot(self, **options)

    store.JournalStore.snapshot = snapshot
    sys.exit(operator_cli.main(sys.argv[2:]))
""").format(tests=TESTS)


class RestoreUnderTheLock(ReliabilityCase):
    """A failing append puts head.json back before it releases the writer lock:
    a forced resolution waiting for that lock stands."""

    def test_forced_resolution_during_a_failing_append_stands(self):
        worker = start_worker(self, STALLING_WORKER, self.data_dir)
        self.assertEqual(next_message(self, worker), {"stalled": True})
        [operation] = [call["operation_id"] for call in held_calls(self.data_dir)]
        announcements, announce = os.pipe()
        resolver = subprocess.Popen(
            [sys.executable, "-c", ANNOUNCING_CLI, str(announce), "--data-dir", self.data_dir,
             "resolve", operation, "--outcome", "completed", "--force", "--evidence",
             "worker hung; card processor shows the charge"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(announce,))
        self.addCleanup(lambda: resolver.poll() is None and resolver.kill())
        os.close(announce)
        with os.fdopen(announcements) as stream:
            announced = stream.readline()
        if announced != "waiting_for_the_journal\n":
            output, errors = resolver.communicate(timeout=TIMEOUT_SECONDS)
            self.fail(f"the resolve said {announced!r} on its lock pipe; stdout {output!r}, "
                      f"stderr {errors!r}")
        tell(worker)  # the append fails while the resolve waits for its locks
        self.assertEqual(json.loads(next_message(self, worker)["result"])["error"],
                         "crash_recovery_record_failed")
        output, errors = resolver.communicate(timeout=TIMEOUT_SECONDS)
        self.assertEqual(resolver.returncode, 0, output + errors)
        resolved = json.loads(output)
        code, verified, text = run_cli(self.data_dir, "verify")
        self.assertEqual((code, verified["integrity"]), (0, "ok"), text)
        self.assertEqual(verified["checkpoint"], resolved["checkpoint"])
        self.assertEqual(reference.verify(self.data_dir).kinds(), ["started", "resolved"])
        self.assertEqual([name for name in os.listdir(self.data_dir) if "tmp" in name], [])


class BookkeepingAfterCommit(ReliabilityCase):
    """Once ``started`` is committed the call runs, whatever fails afterwards in
    the bookkeeping."""

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
