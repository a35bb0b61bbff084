"""While the gate is closed only read-only tools run, in every mode
(docs/guard.md §While the gate is closed), on real journals.

Which calls are journaled is the mode's; which calls run while an operation
awaits a person is the closed gate's: a shell, code execution, file writes or
a delegation could settle the operation, switch the plugin off or change its
settings, so they are refused (not journaled) with the code a protected call
gets, until a person has settled it.  While a protected call is still running
(the gate is busy), unprotected tools run as before.
"""
from __future__ import annotations

import json
import os
import threading
import unittest
from unittest import mock

from test_guard import Downstream, GuardTestCase

from crash_recovery.admission import gate as gate_module
from crash_recovery.admission.settings import settings_view
from crash_recovery.host.hermes import summary_text
from crash_recovery.reports.render import render_text
from crash_recovery.reports.status import prometheus_text
from crash_recovery.journal import Journal

# Tools a coding profile leaves unprotected, none of them read-only.
REACHING_TOOLS = ("terminal", "execute_code", "write_file", "patch", "process", "delegate_task",
                  "browser_navigate", "mcp_files_write", "skill_manage", "cronjob")
RUN_WHILE_CLOSED = ("read_file", "search_files", "crash_recovery_status", "crash_recovery_verify",
                    "tool_search", "tool_describe")
PREFIX = ("hermes", "-p", "work", "crash-recovery")
WRITING_WORDS = ("resolve", "acknowledge", "repair-checkpoint", "restart-journal", "--force",
                 "--outcome", "--evidence")


class ClosedGate(GuardTestCase):
    """``protected_tools: [send_payment]``, the mode a coding profile uses."""

    def setUp(self):
        super().setUp()
        self.guard = self.make_guard(protected_tools=["send_payment"])

    def close_gate(self, guard=None):
        """A payment that raised: its operation is uncertain.  Returns its id."""
        with self.assertRaises(TimeoutError), self.assertLogs("crash_recovery", "WARNING"):
            self.call(tool="send_payment", guard=guard or self.guard,
                      downstream=Downstream(error=TimeoutError("gateway timeout")))
        with Journal(self.data_dir, readonly=True) as journal:
            [operation] = journal.unresolved()
        return operation.operation_id

    def assertRefusedWhileClosed(self, tool, code, operation_ids, args=None, guard=None):
        guard = guard or self.guard
        downstream = Downstream()
        result = self.call(tool=tool, args=args if args is not None else {"command": "ls"},
                           downstream=downstream, guard=guard, call_id=f"c-{tool}")
        self.assertBlocked(result, code, operation_ids)
        hook = self.hook(tool=tool, args=args if args is not None else {"command": "ls"},
                         guard=guard, call_id=f"h-{tool}")
        self.assertEqual(hook["action"], "block")
        from_hook = json.loads(hook["message"])
        self.assertEqual((from_hook["code"], from_hook["operation_ids"]),
                         (code, operation_ids))
        self.assertEqual(downstream.calls, 0)
        return json.loads(result)

    def test_every_tool_but_the_read_only_ones_is_refused_and_not_journaled(self):
        operation_id = self.close_gate()
        before = self.snapshot()
        for tool in REACHING_TOOLS:
            with self.subTest(tool=tool):
                refused = self.assertRefusedWhileClosed(tool, "unresolved_operations",
                                                        [operation_id])
                explanation = refused["explanation"]
                self.assertTrue(explanation.startswith(
                    f"{tool} was refused and not run: while the gate is closed, only read-only "
                    f"tools run in this profile (crash_recovery_status, crash_recovery_verify, "
                    f"read_file, search_files, tool_describe, tool_search)"), explanation)
                self.assertIn(f"settle operation {operation_id}", explanation)
                for word in WRITING_WORDS:
                    self.assertNotIn(word, explanation)
        self.assertEqual(self.snapshot(), before)  # nothing journaled, no file touched
        self.assertEqual(self.events(), [("started", None), ("uncertain", "exception")])

    def test_read_only_inspection_and_catalog_tools_run_while_closed(self):
        self.close_gate()
        for tool in RUN_WHILE_CLOSED:
            with self.subTest(tool=tool):
                downstream = Downstream()
                self.assertEqual(self.call(tool=tool, args={}, downstream=downstream),
                                 downstream.result)
                self.assertEqual(downstream.calls, 1)
                self.assertIsNone(self.hook(tool=tool, args={}))
        self.assertEqual(len(self.events()), 2)

    def test_tool_search_bridge_calls_are_decided_on_the_tools_they_name(self):
        operation_id = self.close_gate()
        for args in ({"name": "read_file", "arguments": {"path": "a"}},
                     {"calls": [{"name": "read_file", "arguments": {}},
                                {"name": "search_files", "arguments": {}}]},
                     {"calls": [{"name": "connectors__mail__list", "arguments": {}}]}):
            with self.subTest(args=args):
                downstream = Downstream()
                self.assertEqual(self.call(tool="tool_call", args=args, downstream=downstream),
                                 downstream.result)
                self.assertIsNone(self.hook(tool="tool_call", args=args))
        for args in ({"name": "terminal", "arguments": {"command": "ls"}},
                     {"calls": [{"name": "read_file", "arguments": {}},
                                {"name": "write_file", "arguments": {}}]}):
            with self.subTest(args=args):
                self.assertRefusedWhileClosed("tool_call", "unresolved_operations",
                                              [operation_id], args=args)

    def test_a_file_tool_argument_its_command_reads_as_an_option_is_refused_while_closed(self):
        # Hermes puts these arguments on an rg/grep/find/sed command line: rg --pre=sh runs
        # every file under the path as a script, so the model could settle its own call.
        while_open = Downstream()
        self.assertEqual(self.call(tool="search_files", args={"pattern": "--pre=sh"},
                                   downstream=while_open, call_id="c-open"), while_open.result)
        self.assertEqual(while_open.calls, 1)  # the gate only narrows what runs while closed
        operation_id = self.close_gate()
        before = self.snapshot()
        unreadable = "the arguments of read_file are not a JSON object, so they cannot be checked"
        for tool, args, problem in (
                ("search_files", {"pattern": "--pre=sh", "path": "."},
                 "its argument 'pattern' begins with \"-\""),
                ("search_files", {"pattern": "x", "path": "-delete", "target": "files"},
                 "its argument 'path' begins with \"-\""),
                ("search_files", {"pattern": "x", "file_glob": " \t-x"},
                 "its argument 'file_glob' begins with \"-\""),
                ("read_file", {"path": "-f/tmp/script.sed", "offset": 1},
                 "its argument 'path' begins with \"-\""),
                ("tool_call", {"name": "search_files", "arguments": {"pattern": "--pre=rm"}},
                 "its argument 'pattern' begins with \"-\""),
                ("tool_call", {"calls": [{"name": "read_file", "arguments": {"path": "a"}},
                                         {"name": "read_file", "arguments": '{"path": "-i"}'}]},
                 "its argument 'path' begins with \"-\""),
                ("tool_call", {"name": "read_file", "arguments": "not JSON"}, unreadable),
                ("read_file", ["-i"], unreadable)):
            with self.subTest(tool=tool, args=args):
                refused = self.assertRefusedWhileClosed(tool, "unresolved_operations",
                                                        [operation_id], args=args)
                explanation = refused["explanation"]
                self.assertTrue(explanation.startswith(
                    f"{tool} was refused and not run: while the gate is closed, {problem}. The "
                    f"host puts these arguments on a search or read command line, where a value "
                    f"that begins with \"-\" is taken as an option, and some options run "
                    f"programs. To search for text that begins with \"-\", write it as "
                    f"\"[-]...\"; name a path that begins with \"-\" as \"./-...\". "),
                    explanation)
                self.assertIn(f"settle operation {operation_id}", explanation)
        for tool, args in (("search_files", {"pattern": "[-]-pre=sh", "path": "./-delete",
                                             "limit": -1, "context": None}),
                           ("search_files", {"pattern": "a--b", "file_glob": "*-x.py"}),
                           ("read_file", {"path": "notes/-draft.md"}),
                           ("tool_call", {"name": "read_file", "arguments": {"path": "a-b"}})):
            with self.subTest(tool=tool, args=args):
                downstream = Downstream()
                self.assertEqual(self.call(tool=tool, args=args, downstream=downstream),
                                 downstream.result)
                self.assertEqual(downstream.calls, 1)
                self.assertIsNone(self.hook(tool=tool, args=args))
        self.assertEqual(self.snapshot(), before)
        self.assertEqual(self.events()[-2:], [("started", None), ("uncertain", "exception")])

    def test_a_failing_unprotected_call_never_closes_the_gate(self):
        failing = Downstream(result='{"exit_code": 2, "error": "ls: no such file"}')
        self.assertEqual(self.call(tool="terminal", args={"command": "ls x"}, downstream=failing),
                         failing.result)
        self.assertFalse(os.path.exists(self.data_dir))  # nothing read, nothing created
        self.assertEqual(self.call(tool="send_payment", call_id="c2"), '{"status": "confirmed"}')
        self.assertEqual(self.call(tool="terminal", args={"command": "ls x"}, downstream=failing,
                                   call_id="c3"), failing.result)
        self.assertEqual(self.events(), [("started", None), ("returned", "returned")])

    def test_unprotected_tools_run_while_the_gate_is_busy(self):
        ran = {}

        def in_another_session():
            ran["terminal"] = self.call(tool="terminal", args={"command": "ls"},
                                        session="s-2", call_id="c-other")
            ran["hook"] = self.hook(tool="terminal", args={"command": "ls"}, session="s-2",
                                    call_id="c-other-hook")

        def pays():
            worker = threading.Thread(target=in_another_session)  # a fresh context
            worker.start()
            worker.join()

        self.assertEqual(self.call(tool="send_payment", downstream=Downstream(during=pays)),
                         '{"status": "confirmed"}')
        self.assertEqual(ran, {"terminal": '{"status": "confirmed"}', "hook": None})

    def test_a_pending_operation_whose_worker_is_gone_closes_the_gate(self):
        with Journal(self.data_dir) as journal:  # a worker that died after its start
            journal.admit(operation_id="0b7f4f0e-4a9c-4d3e-9a51-6a3c2a4b1e10", tool="send_payment",
                          args_hash="0" * 64, fingerprint="1" * 64, session_id="s",
                          tool_call_id="c")
        self.assertRefusedWhileClosed("terminal", "unresolved_operations",
                                      ["0b7f4f0e-4a9c-4d3e-9a51-6a3c2a4b1e10"])

    def test_an_integrity_failure_refuses_them_with_its_code(self):
        self.call(tool="send_payment")
        self.guard.close()
        os.unlink(os.path.join(self.data_dir, "head.json"))
        guard = self.make_guard(protected_tools=["send_payment"])
        refused = self.assertRefusedWhileClosed("terminal", "checkpoint_missing", [], guard=guard)
        self.assertIn("failed its integrity check", refused["explanation"])
        self.assertTrue(refused["explanation"].endswith(" verify"), refused["explanation"])
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "head.json")))

    def test_a_poisoned_guard_refuses_them(self):
        self.call(tool="send_payment")
        self.guard.poisoned = "Recording the outcome of operation X failed."
        refused = self.assertRefusedWhileClosed("terminal", "guard_poisoned", [])
        self.assertIn("Recording the outcome of operation X failed.", refused["explanation"])

    def test_an_unsupported_platform_leaves_them_running(self):
        self.close_gate()
        guard = self.make_guard(protected_tools=["send_payment"])
        with mock.patch.object(gate_module, "platform_problem",
                               return_value="this file system refuses directory fsync"):
            self.assertEqual(self.call(tool="terminal", args={}, guard=guard),
                             '{"status": "confirmed"}')

    def test_settling_the_operation_opens_the_gate_again(self):
        operation_id = self.close_gate()
        with Journal(self.data_dir) as journal:
            journal.resolve(operation_id, outcome="not_applied", evidence="no charge in ledger",
                            operator={"user": "ops"})
        self.assertEqual(self.call(tool="terminal", args={}), '{"status": "confirmed"}')


class AllowedWhileClosed(GuardTestCase):
    """An operator who names more tools gets them while closed, and every
    status says the agent can then reach the journal."""

    def test_named_tools_run_while_closed_and_status_says_they_reach_the_journal(self):
        guard = self.make_guard(protected_tools=["send_payment"],
                                allowed_while_closed="terminal, web_search")
        with self.assertRaises(TimeoutError), self.assertLogs("crash_recovery", "WARNING"):
            self.call(tool="send_payment", guard=guard,
                      downstream=Downstream(error=TimeoutError("gateway timeout")))
        for tool in ("terminal", "web_search"):
            self.assertEqual(self.call(tool=tool, args={}, guard=guard), '{"status": "confirmed"}')
        refused = self.call(tool="write_file", args={}, guard=guard)
        self.assertEqual(json.loads(refused)["code"], "unresolved_operations")
        settings = guard.status_report()["settings"]
        self.assertEqual((settings["allowed_while_closed"], settings["agent_reaches_journal"]),
                         (["terminal", "web_search"], ["terminal"]))
        self.assertEqual(json.loads(guard.status_tool({}))["settings"]["agent_reaches_journal"],
                         ["terminal"])
        # Every status surface says so: the CLI's text, the gauges, the slash command.
        report = guard.status_report()
        warning = ("THE AGENT CAN REACH THE JOURNAL: while the gate is closed it may still run "
                   "terminal, which may change the journal's files and the plugin's settings")
        self.assertIn(warning, render_text("status", report, PREFIX))
        self.assertIn(warning, summary_text(report, PREFIX))
        self.assertRegex(prometheus_text(report),
                         r"(?m)^crash_recovery_agent_reaches_journal\{[^}]*\} 1$")
        self.assertEqual(settings_view(lambda: {"protected_tools": ["send_payment"],
                                                "allowed_while_closed": ["terminal"]})
                         ["agent_reaches_journal"], ["terminal"])  # the dashboard's and CLI's

    def test_in_read_only_tools_mode_the_configured_list_runs_while_closed(self):
        guard = self.make_guard(read_only_tools=["read_file", "lookup_receipt"])
        with self.assertRaises(TimeoutError), self.assertLogs("crash_recovery", "WARNING"):
            self.call(tool="book_trip", guard=guard,
                      downstream=Downstream(error=TimeoutError("gateway timeout")))
        self.assertEqual(self.call(tool="lookup_receipt", args={}, guard=guard),
                         '{"status": "confirmed"}')
        self.assertEqual(guard.status_report()["settings"]["agent_reaches_journal"],
                         ["lookup_receipt"])

    def test_naming_a_protected_tool_there_is_a_settings_problem(self):
        for settings in ({"protected_tools": ["send_payment"],
                          "allowed_while_closed": ["send_payment"]},
                         {"read_only_tools": ["read_file"], "allowed_while_closed": ["terminal"]},
                         {"protected_tools": ["send_payment"], "allowed_while_closed": "*"}):
            with self.subTest(settings=settings):
                guard = self.make_guard(settings=settings)
                self.assertIn("allowed_while_closed", guard.settings().problem)
                self.assertTrue(guard.is_protected("terminal"))  # fail closed
                self.assertEqual(guard.settings().reaching_tools(), [])


if __name__ == "__main__":
    unittest.main()
