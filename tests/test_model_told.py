"""What the model is told names no command that changes the journal
(docs/guard.md §What the model is told): every refusal code, on both paths
(the middleware's blocked result and the ``pre_tool_call`` hook's message),
and the status and verify tools, tell the user that a person must check and
settle, and how to look (``show``, ``status``, ``verify``); never
``resolve``, ``acknowledge``, ``repair-checkpoint``, ``restart-journal``,
``archive`` or ``--force``.  The operator's surfaces keep the full commands.
"""
from __future__ import annotations

import contextvars
import json
import os
import re
import threading
import unittest
from unittest import mock

from support import JournalTestCase
from test_guard import Downstream

from crash_recovery.admission import gate as gate_module
from crash_recovery.guard import RecoveryGuard
from crash_recovery.host.hermes import summary_text
from crash_recovery.journal import Journal
from crash_recovery.reports.messages import INTEGRITY_VERDICTS
from crash_recovery.storage.errors import IntegrityError, JournalUnavailable

PREFIX = ("hermes", "-p", "work", "crash-recovery")
WRITING = re.compile(r"\b(resolve|acknowledge|repair-checkpoint|restart-journal)\b"
                     r"|crash-recovery archive|--(force|outcome|evidence)")


class ModelFacingTexts(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.seen = {}

    def guard(self, data_dir=None, **options):
        guard = RecoveryGuard(data_dir or self.data_dir, command_prefix=lambda: PREFIX, **options)
        self.addCleanup(lambda: guard.gate.opened_journal is not None and guard.close())
        return guard

    def both_paths(self, guard, tool="send_payment", args=None, call_id="c", next_call=None):
        """The middleware's result and the hook's message for one call."""
        args = {"cents": 5} if args is None else args
        hook = guard.pre_tool_call(tool_name=tool, args=args, session_id="s",
                                   tool_call_id=call_id + "-hook")
        result = guard.tool_execution(tool, args, next_call or Downstream(), session_id="s",
                                      tool_call_id=call_id)
        return result, (hook or {}).get("message")

    def record(self, texts):
        for text in texts:
            if text is None:
                continue
            document = json.loads(text)
            if document.get("error") == "crash_recovery_blocked":
                self.seen.setdefault(document["code"], []).append(text)

    def assertNamesNoWritingCommand(self, text):
        found = WRITING.search(text)
        self.assertIsNone(found, f"{found and found.group(0)!r} in: {text}")

    def fail_once(self, guard, tool="send_payment"):
        with self.assertRaises(TimeoutError):
            guard.tool_execution(tool, {}, Downstream(error=TimeoutError("lost")),
                                 session_id="s", tool_call_id="first")

    def test_every_refusal_code_on_both_paths(self):
        guard = self.guard(protected_tools=["send_payment", "delegate_task"])
        self.record(self.both_paths(guard, tool="tool_call", args={"name": "send_payment"}))
        self.record(self.both_paths(guard, args=["not", "an", "object"]))
        self.record(self.both_paths(guard, tool=None, args={}))
        self.record(self.both_paths(guard, args={"amount": float("nan")}))
        self.record([guard.tool_execution("send_payment", {}, None)])  # isolation mode
        guard.isolation_problem = None

        inside = {}

        def nested_and_sibling():
            inside["nested"] = self.both_paths(guard, call_id="nested")
            thread = threading.Thread(target=lambda: inside.update(
                sibling=self.both_paths(guard, call_id="sibling")))
            thread.start()
            thread.join()
            return "paid"
        guard.tool_execution("delegate_task", {}, nested_and_sibling, session_id="s",
                             tool_call_id="outer")
        self.record(inside["nested"] + inside["sibling"])

        self.fail_once(guard)
        self.record(self.both_paths(guard, call_id="after"))
        self.record(self.both_paths(guard, tool="terminal", args={"command": "ls"}))
        guard.poisoned = "Recording the outcome of operation X failed (commit_failed)."
        self.record(self.both_paths(guard, call_id="poisoned"))
        self.record(self.both_paths(guard, tool="terminal", args={"command": "ls"}))

        platform = self.guard(settings={}, busy_timeout=1,
                              data_dir=os.path.join(self.root, "elsewhere"))
        with mock.patch.object(gate_module, "platform_problem", return_value="no fcntl here"):
            self.record(self.both_paths(platform))

        broken = self.guard(data_dir=os.path.join(self.root, "a-file"))
        with open(os.path.join(self.root, "a-file"), "w", encoding="utf-8") as stream:
            stream.write("not a directory")
        self.record(self.both_paths(broken))

        failing = self.guard()
        with mock.patch.object(RecoveryGuard, "_identity", side_effect=RuntimeError("bug")):
            self.record([failing.pre_tool_call(tool_name="send_payment", args={})["message"]])

        # Every verdict the journal can give, as both gates turn it into a refusal.
        for code in sorted(INTEGRITY_VERDICTS | {"database_locked", "commit_failed",
                                                 "storage_unavailable", "wal_unavailable",
                                                 "read_access_only", "database_error"}):
            error = (IntegrityError if code in INTEGRITY_VERDICTS else JournalUnavailable)(
                code, f"head.json and journal.sqlite3 disagree ({code}); step COMMIT")
            verdict = self.guard()
            with mock.patch.object(Journal, "status", side_effect=error):
                self.record(self.both_paths(verdict, call_id=code))
                self.record(self.both_paths(verdict, tool="terminal", args={}, call_id=code))
                for tool in (verdict.status_tool({}), verdict.verify_tool({})):
                    self.assertNamesNoWritingCommand(tool)
                    self.assertNotIn("head.json", tool)

        expected = {"unresolved_operations", "operation_in_flight", "nested_call",
                    "bridge_call_unresolved", "isolation_unsupported", "platform_unsupported",
                    "guard_poisoned", "non_canonical_arguments", "invalid_arguments",
                    "invalid_request", "storage_unavailable", "internal_error",
                    "database_locked", "commit_failed", "wal_unavailable", "read_access_only",
                    "database_error"} | INTEGRITY_VERDICTS
        self.assertEqual(sorted(expected - set(self.seen)), [])
        for code, texts in self.seen.items():
            for text in texts:
                with self.subTest(code=code):
                    self.assertNamesNoWritingCommand(text)

    def test_the_status_tool_points_a_person_at_show_and_the_operator_keeps_the_commands(self):
        guard = self.guard()
        self.fail_once(guard)
        status = json.loads(guard.status_tool({}))
        operation_id = status["unresolved"][0]["operation_id"]
        self.assertEqual(status["next"], f"hermes -p work crash-recovery show {operation_id}")
        self.assertNamesNoWritingCommand(json.dumps(status))
        self.assertNamesNoWritingCommand(guard.verify_tool({}))
        # The operator's surfaces (the slash command a person reads) keep the command.
        self.assertIn(f"crash-recovery resolve {operation_id} --outcome",
                      summary_text(guard.status_report(), PREFIX))

    def test_a_late_outcome_is_shown_not_acknowledged(self):
        guard = self.guard()
        release = threading.Event()
        started = threading.Event()

        def hangs():
            started.set()
            release.wait(30)
            return "paid"
        worker = threading.Thread(target=contextvars.copy_context().run,
                                  args=(guard.tool_execution, "send_payment", {}, hangs))
        worker.start()
        self.assertTrue(started.wait(30))
        with Journal(self.data_dir, readonly=True) as reader:
            [operation] = reader.unresolved()
        with Journal(self.data_dir) as journal:
            journal.resolve(operation.operation_id, outcome="completed", evidence="paid P-1",
                            operator={"user": "ops"}, forced=True)
        release.set()
        worker.join(30)
        status = json.loads(guard.status_tool({}))
        self.assertEqual(status["next"],
                         f"hermes -p work crash-recovery show {operation.operation_id}")
        self.assertIn("late outcome", status["needs_a_person"])
        self.assertNamesNoWritingCommand(json.dumps(status))


if __name__ == "__main__":
    unittest.main()
