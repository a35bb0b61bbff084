"""A protected tool that forks (docs/guard.md §Child processes), with real
processes: a long-lived child started by multiprocessing's fork start method
or by os.fork keeps neither a call lock nor the journal's connection, so
later calls from this process and from a fresh worker run; a forked child that
calls the guard itself is refused and leaves the parent's call intact, and one
that comes back through the guard records and releases nothing.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

from reliability_support import ReliabilityCase, one_call_in_a_fresh_worker
from support import TESTS, run_cli

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

    def test_a_child_coming_back_through_the_guard_records_and_releases_nothing(self):
        """A child forked inside the call that returns from the tool, calls
        ``sys.exit`` or raises unwinds through the guard: the call is its
        parent's, so the child writes no outcome and leaves the parent's call
        lock where it is."""
        parent = os.getpid()
        for ending in ("return", "exit", "raise"):
            with self.subTest(ending=ending):
                guard = self.make_guard()
                held_after_child = []

                def tool():
                    pid = os.fork()
                    if pid == 0:
                        if ending == "exit":
                            sys.exit(0)
                        if ending == "raise":
                            raise RuntimeError("the child failed")
                        return '{"status": "from the child"}'
                    os.waitpid(pid, 0)
                    held_after_child.extend(call["operation_id"] for call in held_calls(self.data_dir))
                    return '{"status": "done"}'

                try:
                    result = guard.tool_execution(tool_name="pay", args={"ending": ending},
                                                  next_call=tool, session_id="s", tool_call_id=ending)
                except BaseException:  # the child's SystemExit or RuntimeError
                    result = None
                if os.getpid() != parent:
                    os._exit(0)  # the child, back from the guard: nothing more of the test
                self.assertEqual((result, len(held_after_child)), ('{"status": "done"}', 1))
                guard.close()
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"] * 3)


class ForkWhileALockIsOpened(unittest.TestCase):
    """A fork in another thread between a lock descriptor's open and its
    registration (storage/forksafe.py ``open_registered``) waits for both, so
    the child closes the descriptor: it never shares a lock taken later."""

    def test_a_child_forked_during_the_open_closes_the_descriptor(self):
        from crash_recovery.storage import forksafe
        path = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "lock")
        opened, proceed = threading.Event(), threading.Event()
        descriptors = []

        def opener():
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            descriptors.append(descriptor)
            opened.set()
            proceed.wait(60)  # the window: open, not yet registered
            return descriptor

        opening = threading.Thread(target=lambda: forksafe.open_registered(opener))
        opening.start()
        self.assertTrue(opened.wait(60))
        reading, writing = os.pipe()
        children = []

        def fork():
            pid = os.fork()
            if pid == 0:  # the child: is the parent's descriptor still open here?
                try:
                    os.fstat(descriptors[0])
                    answer = b"open"
                except OSError:
                    answer = b"closed"
                os.write(writing, answer)
                os._exit(0)
            children.append(pid)

        forking = threading.Thread(target=fork)
        forking.start()
        # Code without the gate forks now, inside the window; with it the fork
        # waits for the registration, however long this pause.
        forking.join(0.5)
        proceed.set()
        opening.join(60)
        forking.join(60)
        os.close(writing)
        with os.fdopen(reading, "rb") as stream:
            answer = stream.read()
        os.waitpid(children[0], 0)
        forksafe.forget(descriptors[0])
        os.close(descriptors[0])
        self.assertEqual(answer, b"closed")


class ForkInsideTheOpeningThread(unittest.TestCase):
    """A fork made by the thread that is itself between a lock descriptor's
    open and its registration -- a signal handler's, which runs in whatever
    the main thread was doing -- goes ahead (storage/forksafe.py)."""

    def test_a_fork_from_inside_open_registered_does_not_hang(self):
        script = textwrap.dedent("""
            import os, sys
            sys.path.insert(0, {tests!r})
            import support
            from crash_recovery.storage import forksafe

            def opener():
                pid = os.fork()  # as a signal handler arriving here would
                if pid == 0:
                    os._exit(7)
                print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                return os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

            descriptor = forksafe.open_registered(opener)
            forksafe.forget(descriptor)
            os.close(descriptor)
            print("registered")
        """).format(tests=TESTS)
        path = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "lock")
        completed = subprocess.run([sys.executable, "-c", script, path], capture_output=True,
                                   text=True, timeout=120)
        self.assertEqual((completed.returncode, completed.stdout),
                         (0, "child exit 7\nregistered\n"), completed.stderr)


if __name__ == "__main__":
    unittest.main()
