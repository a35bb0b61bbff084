"""A protected tool that forks (docs/guard.md §Child processes), with real
processes: a long-lived child started by multiprocessing's fork start method
or by os.fork keeps neither a call lock nor the journal's connection, so
later calls from this process and from a fresh worker run; a forked child that
calls the guard itself is refused and leaves the parent's call intact.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import unittest

from reliability_support import ReliabilityCase, one_call_in_a_fresh_worker
from support import run_cli

from crash_recovery.guard import RecoveryGuard
from crash_recovery.storage.call_lock import held_calls


def _sleep_forever():
    time.sleep(3600)  # a long-lived server the test kills


class ChildProcesses(ReliabilityCase):
    """Nothing of ours crosses into a forked child."""

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
        self.assertEqual(held_calls(self.data_dir), [], "a child still holds a call lock")
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual((status["gate"], status["in_flight"], status["unresolved"]),
                         ("open", None, []))
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=lambda: "ok",
                                              session_id="s", tool_call_id="c2"), "ok")
        self.assertEqual(one_call_in_a_fresh_worker(self)["result"], '{"status": "booked"}')
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


if __name__ == "__main__":
    unittest.main()
