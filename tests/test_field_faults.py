"""Faults from the field (issue 10, cases 1-3), with real processes and files.

1. A protected tool forks a long-lived child (multiprocessing's fork start
   method, os.fork): the child must not keep the owner lock or use the
   connection; later calls from this process and from a fresh worker run.
2. A long full verification in one worker never holds the writer lock, so a
   second worker's outcome append inside that window is recorded.
3. Something else in the worker process opens and closes journal.sqlite3,
   dropping the process's POSIX locks; another process's clean close then
   removes the WAL.  No protected call is ever admitted into the lost WAL.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest

from reliability_support import ReliabilityCase
from support import REPO, reference, run_cli

from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal
from crash_recovery.storage.owner import probe_lock

BULK_JOURNAL = os.path.join(REPO, "bench", "bulk_journal.py")
TIMEOUT_SECONDS = 60


def _sleep_forever():
    time.sleep(3600)


# One protected call in a fresh process: argv DATA_DIR TOOL_SECONDS BUSY_TIMEOUT
# [SIGNAL_FILE].  Prints the guard's result as JSON.
WORKER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.guard import RecoveryGuard
    data_dir, seconds, busy = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    signal_file = sys.argv[4] if len(sys.argv) > 4 else None

    def tool():
        if signal_file:
            open(signal_file, "w").close()
        time.sleep(seconds)
        return '{{"status": "booked"}}'

    guard = RecoveryGuard(data_dir, busy_timeout=busy)
    hook = guard.pre_tool_call(tool_name="book_trip", args={{"n": os.getpid()}},
                               session_id="s", tool_call_id="c")
    result = guard.tool_execution(tool_name="book_trip", args={{"n": os.getpid()}},
                                  next_call=tool, session_id="s", tool_call_id="c")
    print(json.dumps({{"hook": hook, "result": result}}))
""").format(tests=os.path.dirname(os.path.abspath(__file__)))

# A worker that keeps its guard open and obeys lines on stdin:
#   call NAME   -- a protected call whose tool appends NAME to the service file
#   sniff       -- another component reads 100 bytes of journal.sqlite3 (plain open/close)
#   hook_sniff  -- the next append does the sniff right after replacing head.json
LIVE_WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery.guard import RecoveryGuard
    data_dir, service = sys.argv[1], sys.argv[2]
    guard = RecoveryGuard(data_dir)

    def sniff():
        with open(os.path.join(data_dir, "journal.sqlite3"), "rb") as stream:
            stream.read(100)

    for line in sys.stdin:
        word, _, name = line.strip().partition(" ")
        if word == "sniff":
            sniff()
            print(json.dumps({{"sniffed": True}}), flush=True)
        elif word == "hook_sniff":
            def hook(boundary, kind):
                if (boundary, kind) == ("checkpoint_replaced", "started"):
                    sniff()
                    print(json.dumps({{"sniffed": True}}), flush=True)
                    sys.stdin.readline()  # wait until another process closed the journal
            durable.set_boundary_hook(hook)
            print(json.dumps({{"armed": True}}), flush=True)
        elif word == "call":
            def tool(name=name):
                with open(service, "a") as stream:
                    stream.write(name + "\\n")
                return '{{"status": "booked"}}'
            result = guard.tool_execution(tool_name="book_trip", args={{"n": name}},
                                          next_call=tool, session_id="s", tool_call_id=name)
            durable.set_boundary_hook(None)
            print(json.dumps({{"result": result}}), flush=True)
""").format(tests=os.path.dirname(os.path.abspath(__file__)))


def close_once(data_dir):
    """Another process opens the journal and closes it cleanly (a CLI, a
    worker exiting): if it believes it is the last connection, SQLite
    checkpoints and removes the WAL on close."""
    subprocess.run([sys.executable, "-c", "import sqlite3, sys\n"
                    "c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM events')"
                    ".fetchone(); c.close()", os.path.join(data_dir, "journal.sqlite3")],
                   check=True, timeout=TIMEOUT_SECONDS)


class ChildProcesses(ReliabilityCase):
    """Case 1: nothing of ours crosses into a forked child."""

    def make_guard(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        return guard

    def start_child_in_tool(self, guard, start):
        children = []

        def tool():
            children.append(start())
            return '{"status": "server started"}'

        result = guard.tool_execution(tool_name="start_server", args={}, next_call=tool,
                                      session_id="s", tool_call_id="c1")
        self.assertEqual(result, '{"status": "server started"}')
        return children[0]

    def assert_later_calls_run(self, guard):
        self.assertIsNone(probe_lock(self.data_dir), "a child still holds owner.lock")
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual((status["gate"], status["in_flight"], status["unresolved"]),
                         ("open", None, []))
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=lambda: "ok",
                                              session_id="s", tool_call_id="c2"), "ok")
        fresh = subprocess.run([sys.executable, "-c", WORKER, self.data_dir, "0", "5"],
                               capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        self.assertEqual(json.loads(fresh.stdout)["result"], '{"status": "booked"}', fresh.stderr)
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"] * 3)

    def test_multiprocessing_fork_child_keeps_nothing(self):
        guard = self.make_guard()
        context = multiprocessing.get_context("fork")

        def start():
            child = context.Process(target=_sleep_forever, daemon=True)
            child.start()
            return child

        child = self.start_child_in_tool(guard, start)
        self.addCleanup(child.kill)
        self.assertTrue(child.is_alive())
        self.assert_later_calls_run(guard)
        self.assertTrue(child.is_alive())

    def test_os_fork_child_keeps_nothing(self):
        guard = self.make_guard()

        def start():
            pid = os.fork()
            if pid == 0:  # the child: sleeps holding whatever it inherited
                try:
                    time.sleep(3600)
                finally:
                    os._exit(0)
            return pid

        pid = self.start_child_in_tool(guard, start)
        self.addCleanup(lambda: (os.kill(pid, signal.SIGKILL), os.waitpid(pid, 0)))
        self.assert_later_calls_run(guard)

    def test_forked_child_calling_the_guard_is_refused_and_leaves_the_parent_intact(self):
        guard = self.make_guard()
        outcome = os.path.join(self.root, "child.json")

        def tool():
            pid = os.fork()
            if pid == 0:
                try:  # the child tries a protected call of its own
                    result = guard.tool_execution(tool_name="pay", args={}, next_call=lambda: "RAN",
                                                  session_id="s", tool_call_id="child")
                    with open(outcome, "w") as stream:
                        json.dump({"result": result}, stream)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            return '{"status": "done"}'

        self.assertEqual(guard.tool_execution(tool_name="start_server", args={}, next_call=tool,
                                              session_id="s", tool_call_id="c1"),
                         '{"status": "done"}')
        with open(outcome) as stream:
            child = json.loads(json.load(stream)["result"])
        self.assertEqual(child["code"], "nested_call")  # the parent's call was still running
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=lambda: "ok",
                                              session_id="s", tool_call_id="c2"), "ok")
        guard.close()
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"] * 2)


class LongVerification(ReliabilityCase):
    """Case 2: a fresh worker's full verification holds no writer lock."""

    def test_outcome_is_recorded_while_another_worker_verifies(self):
        subprocess.run([sys.executable, BULK_JOURNAL, self.data_dir, "--events", "300000"],
                       check=True, capture_output=True, timeout=300)
        with Journal(self.data_dir, readonly=True) as journal:
            began = time.monotonic()
            journal.verify()
            verification_seconds = time.monotonic() - began
        # Worker 1's tool runs longer than worker 2's verification; its busy
        # timeout is shorter than that verification.
        busy = min(0.5, verification_seconds / 2)
        signal_file = os.path.join(self.root, "worker1.in_tool")
        worker1 = subprocess.Popen([sys.executable, "-c", WORKER, self.data_dir,
                                    str(verification_seconds + 1.0), str(busy), signal_file],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not os.path.exists(signal_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        worker2 = subprocess.run([sys.executable, "-c", WORKER, self.data_dir, "0", str(busy)],
                                 capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        output1, errors1 = worker1.communicate(timeout=TIMEOUT_SECONDS)
        first = json.loads(output1)
        self.assertEqual(first["result"], '{"status": "booked"}', errors1)
        second = json.loads(worker2.stdout)
        self.assertEqual(json.loads(second["result"])["code"], "operation_in_flight")
        with Journal(self.data_dir, readonly=True) as journal:
            status = journal.status()
        self.assertEqual((status.checkpoint["count"], status.unresolved), (300002, ()))


class LostPosixLocks(ReliabilityCase):
    """Case 3: a protected call is never admitted into a WAL that is gone."""

    def start_worker(self):
        self.service = os.path.join(self.root, "service.txt")
        worker = subprocess.Popen([sys.executable, "-c", LIVE_WORKER, self.data_dir, self.service],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (worker.kill(), worker.wait(), worker.stdin.close(),
                                 worker.stdout.close()))
        return worker

    @staticmethod
    def say(worker, line):
        worker.stdin.write(line + "\n")
        worker.stdin.flush()
        return json.loads(worker.stdout.readline())

    def bookings(self):
        with open(self.service) as stream:
            return stream.read().split()

    def test_idle_worker_refuses_after_its_wal_was_removed(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        self.say(worker, "sniff")
        close_once(self.data_dir)
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "journal.sqlite3-wal")))
        for name in ("b", "c", "d"):  # not one call is admitted into the lost WAL
            refused = json.loads(self.say(worker, f"call {name}")["result"])
            self.assertEqual(refused["code"], "wal_missing")
        self.assertEqual(self.bookings(), ["a"])

    def test_wal_removed_inside_a_started_append_never_runs_the_tool(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        self.say(worker, "hook_sniff")
        worker.stdin.write("call b\n")
        worker.stdin.flush()
        self.assertEqual(json.loads(worker.stdout.readline()), {"sniffed": True})
        close_once(self.data_dir)  # checkpoints the committed events, removes the WAL
        worker.stdin.write("go\n")
        worker.stdin.flush()
        refused = json.loads(json.loads(worker.stdout.readline())["result"])
        self.assertEqual(refused["code"], "wal_missing")
        self.assertEqual(self.bookings(), ["a"])  # b never ran
        worker.kill()
        worker.wait()
        # The operator's path: the started event is lost with the WAL; head.json
        # names it.  The repair brings it back as an open operation.
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, status["integrity"]), (1, "checkpoint_ahead"))
        code, repaired, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence",
                                    "worker lost its locks; WAL removed")
        self.assertEqual(code, 0, repaired)
        lost = repaired["lost_operation"]
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual([(op["operation_id"], op["reason"]) for op in status["unresolved"]],
                         [(lost, "lost_in_crash")])
        fresh = subprocess.run([sys.executable, "-c", WORKER, self.data_dir, "0", "5"],
                               capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        self.assertEqual(json.loads(json.loads(fresh.stdout)["result"])["code"],
                         "unresolved_operations")
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
