"""What reaches a chat: the model's status tool and every refusal carry what a
person needs (codes, tools, times, the command to run) and no operator detail
(paths, pids, hashes, file names, internal steps); what they echo is bounded
(docs/guard.md §Inspection tools, §Blocked result)."""
from __future__ import annotations

import json
import os

from support import JournalTestCase
from crash_recovery.guard import RecoveryGuard

PREFIX = ("hermes", "-p", "work", "crash-recovery")
OPERATOR_WORDS = ("head.json", "os.replace", "COMMIT", "journal.sqlite3", "fsync")


class ChatView(JournalTestCase):

    def guard(self):
        guard = RecoveryGuard(self.data_dir, command_prefix=lambda: PREFIX)
        self.addCleanup(guard.close)
        return guard

    def fail_once(self, guard, tool="send_payment"):
        def fails():
            raise RuntimeError("connection reset")
        with self.assertRaises(RuntimeError), self.assertLogs("crash_recovery", "WARNING"):
            guard.tool_execution(tool, {"cents": 500}, fails, session_id="s", tool_call_id="c1")

    def test_the_status_tool_gives_what_a_person_needs_and_no_path(self):
        guard = self.guard()
        self.fail_once(guard)
        text = guard.status_tool({})
        status = json.loads(text)
        self.assertNotIn(self.root, text)
        for hidden in ("data_dir", "in_flight", "checkpoint"):
            self.assertNotIn(hidden, status)
        [operation] = status["unresolved"]
        self.assertEqual(sorted(operation), ["age_seconds", "late_reason", "operation_id",
                                             "outcome", "owner", "reason", "session_id",
                                             "started_at", "state", "tool", "tool_call_id"])
        self.assertEqual((status["gate"], status["events"], status["call_running"]),
                         ("closed", 2, False))
        self.assertEqual(status["operator_command"], "hermes -p work crash-recovery status")
        # The model is told how a person looks at it, never the command that settles it.
        self.assertEqual(status["next"],
                         f"hermes -p work crash-recovery show {operation['operation_id']}")
        self.assertEqual(status["needs_a_person"],
                         f"A person must check the real service and settle operation "
                         f"{operation['operation_id']}; until then protected calls are refused "
                         f"and only read-only tools run.")

    def test_integrity_refusals_speak_of_the_journal_not_its_files(self):
        guard = self.guard()
        guard.tool_execution("send_payment", {}, lambda: "paid")
        guard.close()
        os.unlink(os.path.join(self.data_dir, "head.json"))
        fresh = self.guard()
        with self.assertLogs("crash_recovery", "WARNING") as logs:
            blocked = json.loads(fresh.tool_execution("send_payment", {}, lambda: "paid"))
        status = fresh.status_tool({})
        for text in (blocked["explanation"], status):
            for word in OPERATOR_WORDS:
                self.assertNotIn(word, text)
            self.assertNotIn(self.root, text)
        self.assertEqual(blocked["code"], "checkpoint_missing")
        self.assertIn("failed its integrity check", blocked["explanation"])
        self.assertEqual(json.loads(status)["error"]["code"], "checkpoint_missing")
        # The operator's log keeps the detail and the way forward.
        logged = "\n".join(logs.output)
        self.assertIn("head.json is missing", logged)
        self.assertIn("hermes -p work crash-recovery restart-journal", logged)

    def test_a_megabyte_tool_name_is_not_echoed_whole(self):
        guard = self.guard()
        huge = "x" * (1 << 20)
        refused = guard.tool_execution(huge, ["not", "an", "object"], lambda: "ran")
        self.assertLess(len(refused), 5000)
        self.assertIn("invalid_arguments", refused)
        self.fail_once(guard, tool=huge)
        refused = guard.tool_execution("send_payment", {}, lambda: "ran")
        self.assertLess(len(refused), 5000)
        self.assertEqual(json.loads(refused)["code"], "unresolved_operations")
        self.assertLess(len(guard.status_tool({})), 5000)
