"""The gate on every path (docs/guard.md §Inside Hermes, "The gate on every
path"): a protected call whose ``pre_tool_call`` hook fires while the host's
tool-execution middleware runs it, with no admission of ours bound, was not
wrapped by our middleware -- the host read its middleware list before the
plugin had registered.  The hook refuses it (``middleware_not_run``) and logs
it; nothing runs, nothing is journaled.  Where the hook runs before the
middleware (Hermes 0.19; 0.20+'s ``model_tools.handle_function_call``) the
host's runner is not running the call yet and the middleware still decides.

The host fact (host/hermes.py ``execution_chain_running``) reads the live
frames of Hermes' ``run_tool_execution_middleware``; here a runner with that
name and signature stands in for it (tests/host/check_discovery_race.py
proves it on the real hosts).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import types
import unittest
from unittest import mock

from support import JournalTestCase, reference
from test_guard import Downstream

from crash_recovery.guard import RecoveryGuard
from crash_recovery.host import hermes

RUNNER_MODULE = "crash_recovery_test_runner"


def run_tool_execution_middleware(tool_name, args, next_call, **context):
    """The host's runner, as Hermes writes it: the callbacks, then next_call."""
    callbacks = context.pop("callbacks")
    if not callbacks:
        return next_call(args)
    callback = callbacks[0]
    return callback(tool_name=tool_name, args=args, next_call=lambda: next_call(args),
                    session_id=context.get("session_id"),
                    tool_call_id=context.get("tool_call_id"))


class HookInsideTheHostsRunner(JournalTestCase):

    def setUp(self):
        super().setUp()
        runner = types.ModuleType(RUNNER_MODULE)
        runner.run_tool_execution_middleware = run_tool_execution_middleware
        sys.modules[RUNNER_MODULE] = runner
        self.addCleanup(sys.modules.pop, RUNNER_MODULE, None)
        patcher = mock.patch.object(hermes, "EXECUTION_RUNNER_MODULE", RUNNER_MODULE)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.guard = RecoveryGuard(self.data_dir,
                                   execution_chain_running=hermes.execution_chain_running)
        self.addCleanup(self.guard.close)

    def dispatch(self, callbacks, downstream, call_id="call-1", tool="send_payment"):
        """A call as Hermes 0.20+'s agent loop runs it: the runner, and inside
        its next_call the pre_tool_call hook, then the tool."""
        def authorized(args):
            verdict = self.guard.pre_tool_call(tool_name=tool, args=args, session_id="s",
                                               tool_call_id=call_id)
            if verdict is not None:
                return json.dumps({"error": verdict["message"]})
            return downstream()
        return run_tool_execution_middleware(tool, {"cents": 5}, authorized,
                                             callbacks=callbacks, session_id="s",
                                             tool_call_id=call_id)

    def test_a_call_our_middleware_did_not_wrap_is_refused_and_logged(self):
        downstream = Downstream()
        with self.assertLogs("crash_recovery", "WARNING") as logs:
            result = self.dispatch([], downstream)
        refusal = json.loads(json.loads(result)["error"])
        self.assertEqual((refusal["code"], downstream.calls), ("middleware_not_run", 0))
        self.assertIn("send_payment was refused and not run", refusal["explanation"])
        self.assertIn("without crash-recovery's middleware", "\n".join(logs.output))
        self.assertFalse(os.path.exists(self.data_dir))  # nothing journaled, nothing made

    def test_the_same_call_wrapped_by_our_middleware_runs_once_journaled(self):
        downstream = Downstream()
        self.assertEqual(self.dispatch([self.guard.tool_execution], downstream), downstream.result)
        self.assertEqual(downstream.calls, 1)
        self.assertEqual(reference.verify(self.data_dir).kinds(), ["started", "returned"])

    def test_the_hook_on_another_thread_sees_the_runner_of_its_call(self):
        # Hermes 0.22 runs each hook on a hermes-hook-* thread while the
        # runner's thread waits for it.
        def authorized(args):
            verdict = {}
            worker = threading.Thread(target=lambda: verdict.update(
                answer=self.guard.pre_tool_call(tool_name="send_payment", args=args,
                                                session_id="s", tool_call_id="call-2")))
            worker.start()
            worker.join()
            return verdict["answer"]
        answer = run_tool_execution_middleware("send_payment", {}, authorized, callbacks=[],
                                               session_id="s", tool_call_id="call-2")
        self.assertEqual(json.loads(answer["message"])["code"], "middleware_not_run")

    def test_where_the_hook_runs_first_the_middleware_still_decides(self):
        # Hermes 0.19, and 0.20+'s model_tools.handle_function_call: the hook,
        # then the runner with our middleware.
        self.assertIsNone(self.guard.pre_tool_call(tool_name="send_payment", args={},
                                                   session_id="s", tool_call_id="call-3"))
        self.assertFalse(hermes.execution_chain_running(("send_payment", "s", "call-3")))

    def test_another_calls_runner_or_a_call_without_an_id_is_not_this_call(self):
        seen = {}

        def authorized(args):
            seen["other"] = hermes.execution_chain_running(("send_payment", "s", "call-5"))
            seen["no_id"] = hermes.execution_chain_running(("send_payment", "s", None))
            seen["other_tool"] = hermes.execution_chain_running(("book_trip", "s", "call-4"))
            seen["this"] = hermes.execution_chain_running(("send_payment", "s", "call-4"))
            return "ran"
        run_tool_execution_middleware("send_payment", {}, authorized, callbacks=[],
                                      session_id="s", tool_call_id="call-4")
        self.assertEqual(seen, {"other": False, "no_id": False, "other_tool": False,
                                "this": True})

    def test_outside_hermes_there_is_no_runner(self):
        sys.modules.pop(RUNNER_MODULE)
        self.assertFalse(hermes.execution_chain_running(("send_payment", "s", "call-1")))


if __name__ == "__main__":
    unittest.main()
