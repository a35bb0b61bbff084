"""SIGKILL at every durable boundary (docs/guard.md §Execution contract, docs/format.md §Append).

Each case runs ``tests/crash_worker.py`` in a real subprocess that SIGKILLs
itself at one named boundary of one step: the ``started`` append, downstream
(after its side effect), after downstream before the outcome append, each
step of the outcome append (``returned`` and ``uncertain``), each step of an
operator ``resolve`` (``operator_cli.main`` in the worker), and journal
creation.  Fresh processes then check what is left:

* either the journal verifies (the independent verifier) with the operation
  pending/uncertain -- or closed when the kill came after COMMIT -- or it is in
  the one blocking integrity state ``checkpoint_ahead`` (kill between
  ``os.replace`` and COMMIT), which nothing repairs silently;
* no new protected call is admitted while anything is open or ahead (a second
  worker process is refused, its hook blocks, the files stay byte-identical);
* no side effect happens twice (the service database counts them), and a call
  killed before COMMIT of ``started`` never reached downstream;
* no temp files accumulate (at most one ``head.json.<writer>.tmp``: the next writer
  removes a dead writer's).

Then the operator settles it (repair-checkpoint where ahead, resolve from the
service's evidence) and the next protected call is admitted.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import unittest

from reliability_support import ReliabilityCase as JournalTestCase, logical_snapshot
from support import run_cli, reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crash_worker  # noqa: E402
from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_worker.py")
APPEND_BOUNDARIES = ("begin", "inserted", "checkpoint_written", "checkpoint_fsynced",
                     "checkpoint_replaced", "directory_fsynced", "committed")
# Before os.replace the INSERT is rolled back and head.json still matches.
BEFORE_REPLACE = APPEND_BOUNDARIES[:4]
# Between os.replace and COMMIT head.json is one event ahead of the database.
AHEAD = ("checkpoint_replaced", "directory_fsynced")
CREATION_KILLS = ("tables_committed:genesis",
                  "checkpoint_written:genesis", "checkpoint_fsynced:genesis",
                  "checkpoint_replaced:genesis", "directory_fsynced:genesis",
                  "checkpoint_written:marker", "checkpoint_fsynced:marker",
                  "checkpoint_replaced:marker", "directory_fsynced:marker")
# Names the data directory may hold; anything else is an accumulated temp file.
ALLOWED_FILES = {"journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm", "head.json",
                 "initialized", "calls", "operator.log"}
# A writer's temp file: <target>.<pid>-<random>.tmp (docs/format.md §Files).
TEMP_FILE = re.compile(r"(head\.json|initialized)\.\d+-[0-9a-f]{8}\.tmp")


def temp_files(data_dir, target):
    """The temp files of ``target`` in data_dir."""
    return [name for name in os.listdir(data_dir)
            if TEMP_FILE.fullmatch(name) and name.startswith(target + ".")]

# Expected verdicts after a kill.
CLEAN = "clean"          # verifies, nothing open (the killed event never happened / closed)
PENDING = "pending"
UNCERTAIN = "uncertain"
AHEAD_STATE = "checkpoint_ahead"


def run_worker(*words, timeout=60):
    completed = subprocess.run([sys.executable, WORKER, *words], capture_output=True,
                               text=True, timeout=timeout)
    output = None
    if completed.stdout.strip():
        output = json.loads(completed.stdout.strip().splitlines()[-1])
    return completed.returncode, output, completed.stderr


class CrashMatrix(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.service = os.path.join(self.root, "service.sqlite3")

    # ------------------------------------------------------------ helpers --

    def seed(self, *, uncertain=False):
        """A journal with one returned call (and optionally one uncertain)."""
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("book_flight", {"request": "seed"},
                                              lambda: {"status": "confirmed"},
                                              session_id="s", tool_call_id="seed"),
                         {"status": "confirmed"})
        operation = None
        if uncertain:
            def boom():
                raise RuntimeError("reset")
            with self.assertRaises(RuntimeError):
                guard.tool_execution("book_flight", {"request": "u"}, boom,
                                     session_id="s", tool_call_id="u")
            operation = guard.gate.opened_journal.unresolved()[0].operation_id
        guard.close()
        return operation

    def kill(self, *words):
        code, output, stderr = run_worker(*words)
        self.assertEqual(code, -signal.SIGKILL,
                         f"worker was not killed at {words}: exit {code}, {output}, {stderr[-500:]}")

    def check_files(self):
        names = {name for name in os.listdir(self.data_dir) if not TEMP_FILE.fullmatch(name)}
        self.assertLessEqual(names, ALLOWED_FILES, f"unexpected files {names - ALLOWED_FILES}")
        for target in ("head.json", "initialized"):  # at most the killed writer's own
            self.assertLessEqual(len(temp_files(self.data_dir, target)), 1)

    def check_after_kill(self, expected, *, request, side_effects, creation=False):
        """The fresh-process checks shared by every case; returns the open ops."""
        self.check_files()
        self.assertEqual(crash_worker.side_effects(self.service, request), side_effects)
        before = logical_snapshot(self)
        code, status, text = run_cli(self.data_dir, "status")
        report = reference.verify(self.data_dir, require_head=not creation)
        if expected == AHEAD_STATE:
            self.assertEqual(code, 1, text)
            self.assertEqual(status["integrity"], "checkpoint_ahead")
            self.assertEqual(status["error"]["checkpoint_count"],
                             status["error"]["journal_count"] + 1)
            self.assertFalse(report.ok)  # the reference reading agrees it does not match
            self.assertEqual(len(report.errors), 1, report.errors)
            self.assertIn("head.json", report.errors[0])
            self.cross_check(self.data_dir, False, require_head=not creation)
            open_ids = None
        else:
            self.assertEqual(code, 0, text)
            self.assertEqual(status["integrity"], "ok")
            self.assertTrue(report.ok, report.errors)
            self.cross_check(self.data_dir, True, require_head=not creation)
            open_ids = [operation["operation_id"] for operation in status["unresolved"]]
            states = sorted(report.state_of(op) for op in open_ids)
            if expected == CLEAN:
                self.assertEqual(open_ids, [])
            else:
                self.assertEqual(states, [expected])
        # A fresh process may not run a new protected call while anything is open.
        code, second, stderr = run_worker("call", self.data_dir, self.service, "--request", "next")
        self.assertEqual(code, 0, stderr[-2000:])
        if expected == CLEAN:
            self.assertEqual(second["result"], {"status": "confirmed", "booking": second["result"]["booking"]})
            self.assertIsNone(second["hook"])
            self.assertEqual(second["side_effects"], 1)
            self.assertTrue(self.assertVerifies().ok)
        else:
            blocked = json.loads(second["result"])
            self.assertEqual(blocked["error"], "crash_recovery_blocked")
            wanted = AHEAD_STATE if expected == AHEAD_STATE else "unresolved_operations"
            self.assertEqual(blocked["code"], wanted)
            self.assertEqual(json.loads(second["hook"]["message"])["code"], wanted)
            self.assertEqual(second["side_effects"], 0)
            if open_ids is not None:
                self.assertEqual(blocked["operation_ids"], open_ids)
            self.assertEqual(logical_snapshot(self), before, "a refused call changed the journal")
        self.assertEqual(crash_worker.side_effects(self.service, request), side_effects,
                         "a side effect happened twice")
        self.check_files()
        return open_ids

    def settle_and_continue(self):
        """The operator's procedure, then the next protected call is admitted."""
        with Journal(self.data_dir, create=False) as journal:
            try:
                journal.status()
            except Exception as exc:  # noqa: BLE001 - only checkpoint_ahead is expected here
                self.assertEqual(getattr(exc, "code", None), "checkpoint_ahead")
                journal.repair_checkpoint()
            for operation in journal.unresolved():
                booked = crash_worker.side_effects(self.service, operation.tool_call_id)
                journal.resolve(operation.operation_id,
                                outcome="completed" if booked else "not_applied",
                                evidence=f"service shows {booked} booking(s) for "
                                         f"{operation.tool_call_id}")
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("book_flight", {"request": "after"},
                                              lambda: {"status": "confirmed"},
                                              session_id="s", tool_call_id="after"),
                         {"status": "confirmed"})
        guard.close()
        self.assertVerifies()


def _call_case(boundary, kind, expected, side_effects, extra=()):
    def test(self):
        self.seed()
        self.kill("call", self.data_dir, self.service, "--request", "req-1",
                  "--kill", f"{boundary}:{kind}", *extra)
        self.check_after_kill(expected, request="req-1", side_effects=side_effects)
        self.settle_and_continue()
    return test


def _resolve_case(boundary, expected):
    def test(self):
        operation = self.seed(uncertain=True)
        self.kill("resolve", self.data_dir, operation, "--kill", f"{boundary}:resolved")
        self.check_after_kill(expected, request="u", side_effects=0)
        self.settle_and_continue()
    return test


def _creation_case(spec):
    def test(self):
        self.kill("call", self.data_dir, self.service, "--request", "req-1", "--kill", spec)
        self.assertEqual(crash_worker.side_effects(self.service), 0)
        # An interrupted creation is never reported as corrupt, and the next
        # call completes it.
        self.check_after_kill(CLEAN, request="req-1", side_effects=0, creation=True)
        with open(os.path.join(self.data_dir, "initialized"), "rb") as stream:
            self.assertTrue(stream.read().endswith(b"\n"))
    return test


def _build():
    for boundary in APPEND_BOUNDARIES:
        # started: killed before COMMIT -> never happened, downstream never ran.
        expected = CLEAN if boundary in BEFORE_REPLACE else (
            AHEAD_STATE if boundary in AHEAD else PENDING)
        setattr(CrashMatrix, f"test_started_{boundary}", _call_case(boundary, "started", expected, 0))
        # outcome append after a normal response / a raise: the side effect happened once.
        for kind, extra in (("returned", ()), ("uncertain", ("--raise",))):
            expected = PENDING if boundary in BEFORE_REPLACE else (
                AHEAD_STATE if boundary in AHEAD else (CLEAN if kind == "returned" else UNCERTAIN))
            setattr(CrashMatrix, f"test_{kind}_{boundary}",
                    _call_case(boundary, kind, expected, 1, extra))
        expected = UNCERTAIN if boundary in BEFORE_REPLACE else (
            AHEAD_STATE if boundary in AHEAD else CLEAN)
        setattr(CrashMatrix, f"test_resolve_{boundary}", _resolve_case(boundary, expected))
    setattr(CrashMatrix, "test_inside_downstream_after_side_effect",
            _call_case("side_effect", "downstream", PENDING, 1))
    setattr(CrashMatrix, "test_after_downstream_before_outcome",
            _call_case("downstream_returned", "started", PENDING, 1))
    setattr(CrashMatrix, "test_error_response_before_outcome_commit",
            _call_case("checkpoint_fsynced", "uncertain", PENDING, 1, ("--error",)))
    for spec in CREATION_KILLS:
        name = spec.replace(":", "_")
        setattr(CrashMatrix, f"test_creation_{name}", _creation_case(spec))


_build()


class TempFilesDoNotAccumulate(JournalTestCase):

    def test_repeated_kills_before_replace_leave_one_temp_file(self):
        service = os.path.join(self.root, "service.sqlite3")
        for attempt in range(3):
            code, _, _ = run_worker("call", self.data_dir, service, "--request", f"r{attempt}",
                                    "--kill", "checkpoint_written:started")
            self.assertEqual(code, -signal.SIGKILL)
            self.assertEqual(len(temp_files(self.data_dir, "head.json")), 1)
            self.assertEqual(crash_worker.side_effects(service), 0)
            self.assertVerifies()
        code, output, _ = run_worker("call", self.data_dir, service, "--request", "ok")
        self.assertEqual(output["side_effects"], 1)
        self.assertEqual(temp_files(self.data_dir, "head.json"), [])  # removed by the next writer
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"])

    def test_repeated_kills_while_creating_leave_one_marker_temp(self):
        service = os.path.join(self.root, "service.sqlite3")
        for _ in range(2):
            code, _, _ = run_worker("call", self.data_dir, service, "--kill",
                                    "checkpoint_written:marker")
            self.assertEqual(code, -signal.SIGKILL)
            self.assertEqual(len(temp_files(self.data_dir, "initialized")), 1)
        code, output, _ = run_worker("call", self.data_dir, service)
        self.assertEqual(output["side_effects"], 1)
        self.assertEqual(temp_files(self.data_dir, "initialized"), [])
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
