"""Concurrency (issue 4 part 5; docs/guard.md §Settings, §Inside Hermes): threads in one process and a
small multi-process run (``tests/stress.py`` does the big one).

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
import threading
import unittest

from reliability_support import ReliabilityCase

import stress
from crash_recovery.admission.binding import ADMISSION
from crash_recovery.guard import RecoveryGuard

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
        stop_status = threading.Event()
        statuses = []

        def downstream(index):
            binding = ADMISSION.get()
            with lock:
                downstream_calls.append(index)
                bindings["inside"] = binding
            # the admitted call's own context passes the hook; same ids elsewhere do not
            hook_verdicts["own"] = guard.pre_tool_call(tool_name="pay", args={"i": index},
                                                      session_id="s", tool_call_id=f"c{index}")
            # hold the call open until every other thread has been refused
            refusals_done.wait(20)
            return {"ok": index}

        def call(index):
            try:
                barrier.wait(10)
                result = guard.tool_execution("pay", {"i": index}, lambda: downstream(index),
                                              session_id="s", tool_call_id=f"c{index}")
                with lock:
                    results[index] = result
                    if isinstance(result, str):
                        done = sum(1 for value in results.values() if isinstance(value, str))
                        if done == THREADS - 1:
                            refusals_done.set()
                    bindings[index] = ADMISSION.get()
            except BaseException as exc:  # noqa: BLE001 - must be none
                escaped.append(exc)

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
            thread.join(30)
        stop_status.set()
        watcher.join(10)
        self.assertEqual(escaped, [])
        self.assertEqual(len(downstream_calls), 1)
        admitted = downstream_calls[0]
        self.assertEqual(results[admitted], {"ok": admitted})
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
            thread.join(10)
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


if __name__ == "__main__":
    unittest.main()
