"""Concurrency (docs/guard.md §Settings, §Inside Hermes): threads in one process, a small
multi-process run (``tests/stress.py`` does the big one), and a long verification beside
another worker's append.

Threads: 8 protected calls at once -- on plain threads and, like Hermes'
concurrent path, each in a copied context -- while another thread runs
status: exactly one is admitted, the others are refused
(``operation_in_flight``), no exception escapes, and the ContextVar binding
never leaks to another thread, to another context with the same ids, or to a
later call in the same thread.
"""
from __future__ import annotations

import contextvars
import json
import os
import sqlite3
import subprocess
import sys
import threading
import unittest
from unittest import mock

from reliability_support import ONE_CALL_WORKER, ReliabilityCase, next_message, start_worker, tell
from support import REPO

import stress
from crash_recovery.admission.binding import ADMISSION
from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal

THREADS = 8


class Threads(ReliabilityCase):

    def run_burst(self, copied_context: bool):
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("warm", {}, lambda: "ok", session_id="s",
                                              tool_call_id="warm"), "ok")
        barrier = threading.Barrier(THREADS)
        refusals_done = threading.Event()
        lock = threading.Lock()
        results, escaped, bindings, downstream_calls, hook_verdicts = {}, [], {}, [], {}
        answered = []
        stop_status = threading.Event()
        statuses = []

        def downstream(index):
            binding = ADMISSION.get()
            with lock:
                downstream_calls.append(index)
                bindings["inside"] = binding
                if len(downstream_calls) > 1:  # a second admission: stop holding, and fail
                    refusals_done.set()
            # the admitted call's own context passes the hook; same ids elsewhere do not
            hook_verdicts["own"] = guard.pre_tool_call(tool_name="pay", args={"i": index},
                                                      session_id="s", tool_call_id=f"c{index}")
            # hold the call open until every other thread has its answer, however long
            refusals_done.wait()
            return {"paid": index}  # ("ok": 0 would be an error-shaped response)

        def call(index):
            try:
                barrier.wait()
                result = guard.tool_execution("pay", {"i": index}, lambda: downstream(index),
                                              session_id="s", tool_call_id=f"c{index}")
                with lock:
                    results[index] = result
                    bindings[index] = ADMISSION.get()
            except BaseException as exc:  # noqa: BLE001 - must be none
                escaped.append(exc)
            finally:
                with lock:
                    answered.append(index)
                    if len(answered) == THREADS - 1:
                        refusals_done.set()  # everyone but the admitted call has answered

        def run(index):
            if copied_context:
                contextvars.copy_context().run(call, index)
            else:
                call(index)

        def status_loop():
            while not stop_status.is_set():
                try:
                    statuses.append(guard.status_report()["integrity"])
                except BaseException as exc:  # noqa: BLE001
                    escaped.append(exc)

        watcher = threading.Thread(target=status_loop)
        watcher.start()
        threads = [threading.Thread(target=run, args=(index,)) for index in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop_status.set()
        watcher.join()
        self.assertEqual(escaped, [])
        self.assertEqual(len(downstream_calls), 1)
        admitted = downstream_calls[0]
        self.assertEqual(results[admitted], {"paid": admitted})
        refused = [json.loads(value) for index, value in results.items() if index != admitted]
        self.assertEqual(len(refused), THREADS - 1)
        self.assertEqual({blocked["code"] for blocked in refused}, {"operation_in_flight"})
        self.assertIsNotNone(bindings["inside"])
        self.assertIsNone(hook_verdicts["own"])
        self.assertTrue(all(bindings[index] is None for index in range(THREADS)),
                        "the binding leaked out of the call")
        self.assertTrue(statuses)
        self.assertEqual(set(statuses), {"ok"})
        # a later call in this thread is a normal admission, not a re-entry
        self.assertIsNone(ADMISSION.get())
        self.assertEqual(guard.tool_execution("pay", {"i": admitted}, lambda: "again",
                                              session_id="s", tool_call_id=f"c{admitted}"), "again")
        guard.close()
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"] * 3)

    def test_eight_threads_plain(self):
        self.run_burst(copied_context=False)

    def test_eight_threads_copied_contexts(self):
        self.run_burst(copied_context=True)

    def test_same_ids_in_another_context_do_not_pass_the_hook(self):
        guard = RecoveryGuard(self.data_dir)
        seen = {}

        def downstream():
            def elsewhere():
                seen["other"] = guard.pre_tool_call(tool_name="pay", args={}, session_id="s",
                                                    tool_call_id="c")
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
            # The same call re-entered in this context (the host may have
            # rewritten its arguments): it passes through.
            seen["reentry"] = guard.tool_execution(
                "pay", {"x": 1}, lambda: "nested ran", session_id="s", tool_call_id="c")
            return "ok"

        self.assertEqual(guard.tool_execution("pay", {}, downstream, session_id="s",
                                              tool_call_id="c"), "ok")
        # Another thread has no binding: the same ids are a sibling there, which waits.
        self.assertEqual(json.loads(seen["other"]["message"])["code"], "operation_in_flight")
        self.assertEqual(seen["reentry"], "nested ran")
        guard.close()
        self.assertVerifies()


class Processes(ReliabilityCase):

    def test_four_processes_small_run(self):
        result = stress.run_processes(self.root, processes=4, calls=15)
        self.assertTrue(result["ok"], result)
        self.assertEqual(result["max_in_flight"], 1)
        self.assertEqual(result["escaped_exceptions"], 0)
        self.assertGreaterEqual(result["admitted"], 1)
        self.assertEqual(result["admitted"] + sum(result["refused"].values()), 60)
        self.assertEqual(result["integrity_check"], "ok")

    def test_random_kills_small_run(self):
        result = stress.run_kills(self.root, kills_wanted=25, seed=7)
        self.assertTrue(result["ok"], result)
        self.assertEqual((result["re_executions"], result["lost_operations"]), (0, 0))
        self.assertLessEqual(result["max_in_flight"], 1)


class LongVerification(ReliabilityCase):
    """A fresh worker's full verification holds no writer lock: another
    worker's outcome append made while it verifies is recorded.  The
    verification is held open at its first event, so no process has to
    outrun another."""

    HISTORY_EVENTS = 1000
    # A writer lock held by the verification would make the outcome append
    # wait this long and then fail: the test then fails instead of hanging.
    BUSY_TIMEOUT_SECONDS = 10

    def test_outcome_is_recorded_while_another_worker_verifies(self):
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "bulk_journal.py"),
                        self.data_dir, "--events", str(self.HISTORY_EVENTS)],
                       check=True, capture_output=True, timeout=300)
        booked = {"hook": None, "result": '{"status": "booked"}'}
        first = start_worker(self, ONE_CALL_WORKER, self.data_dir, self.BUSY_TIMEOUT_SECONDS,
                             "hold")
        self.assertEqual(next_message(self, first), {"in_tool": True})
        second = start_worker(self, ONE_CALL_WORKER, self.data_dir, self.BUSY_TIMEOUT_SECONDS,
                              "pause")
        self.assertEqual(next_message(self, second), {"verifying": True})
        tell(first)  # its tool returns; the outcome append meets the verification
        self.assertEqual(next_message(self, first), booked)
        tell(second)
        self.assertEqual(next_message(self, second), booked)
        with Journal(self.data_dir, readonly=True) as journal:
            status = journal.status()
        self.assertEqual((status.checkpoint["count"], status.unresolved),
                         (self.HISTORY_EVENTS + 4, ()))
        self.assertVerifies()



class WaitingForTheWriterLock(ReliabilityCase):
    """A writer that found the writer lock taken reads again while it waits;
    the chain it then appends to is the one that read verified, never the one
    from before it began waiting (whose data_version no longer matches): a
    sibling that committed meanwhile is neither lost nor taken for a rollback."""

    def test_a_writer_appends_to_what_it_read_while_waiting(self):
        from crash_recovery.storage import store
        ours = RecoveryGuard(self.data_dir, full_verification=True)  # every read is a new chain
        sibling = RecoveryGuard(self.data_dir)
        self.addCleanup(ours.close)
        self.addCleanup(sibling.close)
        self.assertEqual(sibling.tool_execution("warm", {}, lambda: "ok", session_id="s",
                                                tool_call_id="warm"), "ok")
        holder = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"),
                                 isolation_level=None)
        self.addCleanup(holder.close)
        waits = [threading.Event(), threading.Event()]  # our writer met the lock taken
        goes = [threading.Event(), threading.Event()]
        real_sleep = store.time.sleep

        def sleep(seconds):  # our writer, between two tries of the writer lock
            if threading.current_thread() is ours_thread:
                step = next((index for index, event in enumerate(waits)
                             if not event.is_set()), None)
                if step is not None:
                    waits[step].set()
                    goes[step].wait(60)
            real_sleep(seconds)

        result = []
        ours_thread = threading.Thread(target=lambda: result.append(ours.tool_execution(
            "pay", {}, lambda: "paid", session_id="s", tool_call_id="ours")))
        holder.execute("BEGIN IMMEDIATE")  # someone holds the writer lock
        with mock.patch.object(store.time, "sleep", sleep):
            ours_thread.start()
            self.assertTrue(waits[0].wait(60))  # read (nothing open), met the lock
            holder.execute("ROLLBACK")
            self.assertEqual(sibling.tool_execution("book", {}, lambda: "booked",
                                                    session_id="s", tool_call_id="b"), "booked")
            holder.execute("BEGIN IMMEDIATE")
            goes[0].set()
            self.assertTrue(waits[1].wait(60))  # read again: the sibling's call is in it
            holder.execute("ROLLBACK")
            goes[1].set()
            ours_thread.join(60)
        self.assertEqual((result, ours.poisoned), (["paid"], None))
        ours.close()
        sibling.close()
        self.assertEqual(self.assertVerifies().kinds(), ["started", "returned"] * 3)

    def test_a_waiting_writer_reads_again_only_after_a_commit(self):
        """With ``full_verification`` too: while nothing commits, the tries of
        a waiting writer reuse the chain its write verified (no read, no head
        lock taken from the writer it waits for)."""
        from crash_recovery.storage import store
        ours = RecoveryGuard(self.data_dir, full_verification=True)
        self.addCleanup(ours.close)
        self.assertEqual(ours.tool_execution("warm", {}, lambda: "ok", session_id="s",
                                             tool_call_id="warm"), "ok")
        journal_store = ours.gate.opened_journal._store
        reads = []
        real_snapshot = journal_store.snapshot
        journal_store.snapshot = lambda **options: reads.append(options) or real_snapshot(**options)
        holder = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"),
                                 isolation_level=None, check_same_thread=False)
        self.addCleanup(holder.close)
        tries, reads_while_waiting = [], []
        real_sleep = store.time.sleep

        def sleep(seconds):  # our writer, between two tries of the writer lock
            if threading.current_thread() is ours_thread:
                tries.append(len(reads))
                if len(tries) == 50:
                    reads_while_waiting.append(len(reads) - tries[0])
                    holder.execute("ROLLBACK")
            real_sleep(seconds)

        result = []
        ours_thread = threading.Thread(target=lambda: result.append(ours.tool_execution(
            "pay", {}, lambda: "paid", session_id="s", tool_call_id="ours")))
        holder.execute("BEGIN IMMEDIATE")
        with mock.patch.object(store.time, "sleep", sleep):
            ours_thread.start()
            ours_thread.join(60)
        self.assertEqual((result, len(tries), reads_while_waiting), (["paid"], 50, [0]))
        self.assertEqual(reads[:1], [{"check_files": False}])  # the write's full verification
        ours.close()
        self.assertEqual(self.assertVerifies().kinds(), ["started", "returned"] * 2)


if __name__ == "__main__":
    unittest.main()
