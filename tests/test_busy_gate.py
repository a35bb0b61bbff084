"""A resolved operation never keeps the profile busy (docs/cli.md §Owner,
§resolve), on real processes and files.

A worker hangs inside a protected call (a real child process blocked in its
downstream).  The operator follows the README's step 6 and resolves it with
``--force``.  From then on protected calls of other processes run, ``status``
says ``open`` (exit 0 with ``--check``) and lists the still running worker
under ``resolved_running``; ``archive`` is refused while that worker may
still record its late outcome; when it finally ends, its late outcome is
recorded and its call lock (``calls/<operation id>``, held by that worker
alone all along: nothing is moved) disappears.  The same holds for a
resolution appended through the journal directly, not the CLI.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from support import REPO, run_cli
from test_operator import CHILD_TIMEOUT_SECONDS, OperatorTestCase

from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402

# argv: REPO DATA_DIR.  One protected call in a fresh process; prints the result.
ONE_CALL = r'''
import json, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from checkout import load_package; load_package()
from crash_recovery.guard import RecoveryGuard

ran = []
result = RecoveryGuard(sys.argv[2]).tool_execution(
    tool_name="book_trip", args={"to": "LIS"}, next_call=lambda: ran.append(1) or {"pnr": "P1"},
    session_id="session-B", tool_call_id="call-2")
print(json.dumps({"result": result, "ran": len(ran)}), flush=True)
'''


class ResolvedCallNeverKeepsTheProfileBusy(OperatorTestCase):
    """The hanging worker is test_operator's child in ``hang`` mode: a
    ``send_payment`` call that waits for a line on stdin, then returns
    ``{"status": "paid"}``."""

    def setUp(self):
        super().setUp()
        self.call_program = os.path.join(self.root, "call.py")
        with open(self.call_program, "w", encoding="utf-8") as stream:
            stream.write(ONE_CALL)

    def one_call(self):
        completed = subprocess.run([sys.executable, self.call_program, REPO, self.data_dir],
                                   capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        return json.loads(completed.stdout)

    def call_files(self):
        """The call locks in the data directory (storage/call_lock.py)."""
        calls = os.path.join(self.data_dir, "calls")
        return sorted(os.listdir(calls)) if os.path.isdir(calls) else []

    def finish(self, child, operation_id):
        """Let the hung worker end; its late outcome is recorded."""
        child.stdin.write("go\n")
        child.stdin.flush()
        output, _ = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
        self.assertEqual(json.loads(output)["result"], {"status": "paid"})
        status = self.cli("status", "--check", expect=3)
        self.assertEqual([late["operation_id"] for late in status["attention"]], [operation_id])
        self.assertEqual((status["gate"], status["resolved_running"]), ("open", []))

    def assertProfileOpenWhileWorkerRuns(self, child, operation_id):
        status = self.cli("status", "--check")
        self.assertEqual((status["gate"], status["unresolved"], status["in_flight"]),
                         ("open", [], None))
        self.assertEqual([(entry["operation_id"], entry["pid"])
                          for entry in status["resolved_running"]], [(operation_id, child.pid)])
        metrics = run_cli(self.data_dir, "--format", "prometheus", "status")[2]
        self.assertIn('crash_recovery_gate_open{data_dir="%s"} 1' % self.data_dir, metrics)
        # Two protected calls of fresh processes run, each exactly once.
        for _ in range(2):
            called = self.one_call()
            self.assertEqual((called["ran"], called["result"]), (1, {"pnr": "P1"}))
        refused = self.cli("archive", expect=1)
        self.assertEqual((refused["error"]["code"], refused["error"]["owner"]["operation_id"]),
                         ("owner_running", operation_id))

    def test_force_resolution_opens_the_profile_while_the_worker_hangs(self):
        child = self.start_hanging_child()
        status = self.cli("status", "--check")
        self.assertEqual(status["gate"], "busy")
        [operation] = status["unresolved"]
        operation_id = operation["operation_id"]
        refused = self.one_call()
        self.assertEqual((refused["ran"], json.loads(refused["result"])["code"]),
                         (0, "operation_in_flight"))

        forced = self.cli("resolve", operation_id, "--outcome", "completed", "--force",
                          "--evidence", "worker hung on a dead socket; bank shows payment P-7")
        self.assertTrue(forced["forced"])
        self.assertEqual(self.call_files(), [operation_id])  # the hung call's own lock
        self.assertProfileOpenWhileWorkerRuns(child, operation_id)

        self.finish(child, operation_id)
        self.assertEqual(self.call_files(), [])
        self.assertEqual(self.one_call()["ran"], 1)
        self.cli("acknowledge", operation_id, "--evidence", "one payment P-7, as resolved")
        self.assertEqual(self.cli("archive")["archived"]["count"], 10)
        self.assertVerifies()

    def test_a_resolution_appended_through_the_journal_opens_the_profile_too(self):
        child = self.start_hanging_child()
        [operation] = self.cli("status")["unresolved"]
        operation_id = operation["operation_id"]
        with Journal(self.data_dir, create=False) as journal:  # not through the CLI
            journal.resolve(operation_id, outcome="not_applied", forced=True,
                            evidence="worker hung; no charge in the ledger")
        self.assertEqual(self.call_files(), [operation_id])
        status = self.cli("status", "--check")
        self.assertEqual((status["gate"], status["in_flight"]), ("open", None))
        self.assertEqual([entry["operation_id"] for entry in status["resolved_running"]],
                         [operation_id])
        # The model's own status tool in yet another process agrees.
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(guard.status_report()["gate"], "open")
        guard.close()

        self.assertEqual(self.one_call()["ran"], 1)
        self.assertEqual(self.call_files(), [operation_id])
        self.assertProfileOpenWhileWorkerRuns(child, operation_id)
        self.finish(child, operation_id)
        self.assertVerifies()

    def hang_in_thread(self, guard, tool_call_id):
        """A protected ``send_payment`` on its own thread of this process that
        waits until the returned event is set; ``(event, thread, results)``."""
        entered, release, results = threading.Event(), threading.Event(), []

        def hanging():
            entered.set()
            release.wait(CHILD_TIMEOUT_SECONDS)
            return {"status": "paid", "call": tool_call_id}

        worker = threading.Thread(target=lambda: results.append(guard.tool_execution(
            tool_name="send_payment", args={"call": tool_call_id}, next_call=hanging,
            session_id="s", tool_call_id=tool_call_id)))
        worker.start()
        self.addCleanup(worker.join, CHILD_TIMEOUT_SECONDS)
        self.addCleanup(release.set)
        self.assertTrue(entered.wait(CHILD_TIMEOUT_SECONDS))
        return release, worker, results

    def test_the_hung_worker_runs_its_other_calls_after_the_resolution(self):
        guard = self.guard()
        release_hung, hung_thread, hung_results = self.hang_in_thread(guard, "hung")
        [operation] = self.cli("status")["unresolved"]
        hung_id = operation["operation_id"]
        before = json.loads(guard.tool_execution(tool_name="book_trip", args={},
                                                 next_call=dict, session_id="s2",
                                                 tool_call_id="before"))
        self.assertEqual(before["code"], "operation_in_flight")
        self.cli("resolve", hung_id, "--outcome", "completed", "--force",
                 "--evidence", "thread hung on a dead socket; payment P-9 in the bank portal")

        # The same worker's other calls run again, each exactly once.
        ran = []
        for number in (1, 2):
            result = guard.tool_execution(tool_name="book_trip", args={"n": number},
                                          next_call=lambda: ran.append(1) or {"pnr": "P2"},
                                          session_id="s2", tool_call_id=f"sibling-{number}")
            self.assertEqual(result, {"pnr": "P2"})
        self.assertEqual(len(ran), 2)
        self.assertEqual(self.one_call()["ran"], 1)  # and other processes' calls
        status = self.cli("status", "--check")
        self.assertEqual((status["gate"], status["unresolved"]), ("open", []))
        self.assertEqual([(entry["operation_id"], entry["pid"])
                          for entry in status["resolved_running"]], [(hung_id, os.getpid())])
        told = json.loads(guard.status_tool({}))  # what the model may relay to the chat
        self.assertEqual((told["gate"], told["call_running"], told["resolved_calls_running"],
                          told["unresolved"]), ("open", False, 1, []))
        self.assertEqual(self.cli("archive", expect=1)["error"]["code"], "owner_running")

        # A sibling is running when the hung call returns: the hung call lets go
        # of its own lock only, so the sibling still keeps the profile busy.
        release_sibling, sibling_thread, sibling_results = self.hang_in_thread(guard, "late")
        release_hung.set()
        hung_thread.join(CHILD_TIMEOUT_SECONDS)
        self.assertEqual(hung_results, [{"status": "paid", "call": "hung"}])
        refused = self.one_call()
        self.assertEqual((refused["ran"], json.loads(refused["result"])["code"]),
                         (0, "operation_in_flight"))
        status = self.cli("status", "--check", expect=3)  # busy, and a late outcome to read
        [running] = status["unresolved"]
        self.assertEqual((status["gate"], running["owner"], status["resolved_running"]),
                         ("busy", "running", []))
        self.assertEqual([late["operation_id"] for late in status["attention"]], [hung_id])
        release_sibling.set()
        sibling_thread.join(CHILD_TIMEOUT_SECONDS)
        self.assertEqual(sibling_results, [{"status": "paid", "call": "late"}])
        self.assertEqual(self.one_call()["ran"], 1)
        self.assertEqual(self.call_files(), [])
        guard.close()
        self.assertVerifies()
