"""A mistake in the settings never fails open silently: values that cannot
mean a list of tool names are settings problems (every tool protected), names
that match no registered tool are reported, ``archive_after_events`` spelled
off means off, and an open operation whose tool is no longer protected is
warned about (docs/guard.md §Settings)."""
from __future__ import annotations

import contextlib
import io
import json
import unittest

from support import JournalTestCase
from crash_recovery import operator_cli
from crash_recovery.admission.settings import parse_settings
from crash_recovery.guard import RecoveryGuard

REGISTERED = ["send_payment", "book_trip", "terminal", "read_file"]


class ValuesThatAreNotToolNames(unittest.TestCase):

    def test_nothing_everything_and_space_separated_lists_are_problems(self):
        for text in ("null", "none", "~", "*", "None", "send_payment book_trip", "send_*",
                     '["send payment"]'):
            for key in ("protected_tools", "read_only_tools"):
                with self.subTest(key=key, text=text):
                    parsed = parse_settings({key: text})
                    self.assertIsNotNone(parsed.problem)
                    self.assertIn(key, parsed.problem)
                    # Fail closed: every tool is protected.
                    self.assertTrue(parsed.is_protected("send_payment"))
                    self.assertTrue(parsed.is_protected("terminal"))

    def test_names_separated_by_commas_still_read(self):
        parsed = parse_settings({"protected_tools": "send_payment, book_trip"})
        self.assertIsNone(parsed.problem)
        self.assertEqual(parsed.tools, frozenset({"send_payment", "book_trip"}))

    def test_archive_after_events_off_in_any_spelling(self):
        for value in (False, "false", "off", "no", "none", "null", "~", None):
            with self.subTest(value=value):
                parsed = parse_settings({"archive_after_events": value})
                self.assertEqual((parsed.problem, parsed.archive_after_events), (None, None))
        self.assertEqual(parse_settings({"archive_after_events": "5000"}).archive_after_events,
                         5000)


class BusyTimeoutBeyondSQLite(JournalTestCase):
    """A busy_timeout SQLite cannot take (a 32-bit count of milliseconds) is a
    settings problem shown on the surfaces, not an internal_error refusal of
    every protected call behind a healthy status."""

    def test_a_huge_busy_timeout_is_a_problem_and_calls_still_run(self):
        for value in (1e306, 2147484):
            with self.subTest(value=value):
                data_dir = f"{self.data_dir}-{value}"
                guard = RecoveryGuard(data_dir, settings={"busy_timeout": value})
                self.addCleanup(guard.close)
                self.assertIn("busy_timeout must be at most 2147483 seconds",
                              guard.settings().problem)
                self.assertEqual(guard.settings().busy_timeout, 5.0)
                result = guard.tool_execution(tool_name="send_payment", args={"cents": 5},
                                              next_call=lambda: "paid", session_id="s",
                                              tool_call_id="c")
                self.assertEqual(result, "paid")
                status = json.loads(guard.status_tool())
                self.assertEqual((status["integrity"], status["gate"], status["events"]),
                                 ("ok", "open", 2))
                self.assertIn("busy_timeout", status["settings"]["problem"])
                guard.close()
                self.assertVerifies(data_dir)
        self.assertEqual(parse_settings({"busy_timeout": 2147483}).problem, None)


class NamesMatchingNoRegisteredTool(JournalTestCase):

    def run_status(self, raw, *words, registered=lambda: REGISTERED):
        args = operator_cli.build_parser().parse_args(["--data-dir", self.data_dir, "status",
                                                       *words])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = operator_cli.execute(args, lambda: self.data_dir, None, lambda: raw,
                                        registered)
        return code, stdout.getvalue()

    def setUp(self):
        super().setUp()
        with RecoveryGuard(self.data_dir).journal_class(self.data_dir) as journal:
            journal.status()  # an empty, verified journal

    def test_a_typo_is_shown_by_status_check_and_gauges(self):
        raw = {"protected_tools": ["send_paymnet", "book_trip"]}
        code, stdout = self.run_status(raw)
        shown = json.loads(stdout)["settings"]
        self.assertEqual((code, shown["tool_list"], shown["unmatched_tools"]),
                         (0, "host", ["send_paymnet"]))
        self.assertEqual(self.run_status(raw, "--check")[0], 3)
        code, gauges = self.run_status(raw, "--format", "prometheus")
        self.assertIn('crash_recovery_unmatched_tools{data_dir="%s"} 1' % self.data_dir, gauges)
        self.assertIn('crash_recovery_settings_problem{data_dir="%s"} 0' % self.data_dir, gauges)
        self.assertIn('crash_recovery_settings_attention{data_dir="%s"} 1' % self.data_dir, gauges)

    def test_an_unmatched_read_only_name_is_counted_but_needs_nobody(self):
        # A read-only name that matches nothing leaves every other tool protected.
        raw = {"read_only_tools": ["web_serch"]}
        code, stdout = self.run_status(raw, "--check")
        shown = json.loads(stdout)["settings"]
        self.assertEqual((code, shown["unmatched_tools"], shown["needs_attention"]),
                         (0, ["web_serch"], False))
        code, gauges = self.run_status(raw, "--format", "prometheus")
        self.assertIn('crash_recovery_unmatched_tools{data_dir="%s"} 1' % self.data_dir, gauges)
        self.assertIn('crash_recovery_settings_attention{data_dir="%s"} 0' % self.data_dir, gauges)

    def test_unknown_tool_list_is_said_and_never_counted(self):
        code, stdout = self.run_status({"protected_tools": ["send_paymnet"]},
                                       registered=lambda: None)
        shown = json.loads(stdout)["settings"]
        self.assertEqual((code, shown["tool_list"], shown["unmatched_tools"]),
                         (0, "unknown", None))
        code, gauges = self.run_status({"protected_tools": ["send_paymnet"]}, "--format",
                                       "prometheus", registered=lambda: None)
        self.assertIn('crash_recovery_unmatched_tools{data_dir="%s"} -1' % self.data_dir, gauges)

    def test_a_settings_problem_is_visible_to_check_and_gauges(self):
        raw = {"protected_tools": "send_payment book_trip"}
        self.assertEqual(self.run_status(raw, "--check")[0], 3)
        code, gauges = self.run_status(raw, "--format", "prometheus")
        self.assertIn('crash_recovery_settings_problem{data_dir="%s"} 1' % self.data_dir, gauges)
        self.assertIn('crash_recovery_settings_attention{data_dir="%s"} 1' % self.data_dir, gauges)

    def test_the_worker_logs_the_typo_at_its_first_call_and_its_status_shows_it(self):
        guard = RecoveryGuard(self.data_dir, settings={"protected_tools": ["send_paymnet"]},
                              registered_tools=lambda: REGISTERED)
        self.addCleanup(guard.close)
        with self.assertLogs("crash_recovery", "WARNING") as logs:
            self.assertEqual(guard.tool_execution("send_payment", {}, lambda: "paid"), "paid")
        self.assertIn("send_paymnet", "\n".join(logs.output))
        self.assertIn("protect nothing", "\n".join(logs.output))
        status = json.loads(guard.status_tool({}))
        self.assertEqual(status["settings"]["unmatched_tools"], ["send_paymnet"])


class ModeSwitchedWhileAnOperationIsOpen(JournalTestCase):

    def test_an_open_operation_of_a_tool_no_longer_protected_is_warned_about(self):
        first = RecoveryGuard(self.data_dir)  # the default mode protects send_payment

        def fails():
            raise RuntimeError("connection reset")
        with self.assertRaises(RuntimeError), self.assertLogs("crash_recovery", "WARNING"):
            first.tool_execution("send_payment", {"cents": 500}, fails)
        first.close()
        switched = RecoveryGuard(self.data_dir, settings={"protected_tools": ["book_trip"]})
        self.addCleanup(switched.close)
        calls = []
        with self.assertLogs("crash_recovery", "WARNING") as logs:
            # Unprotected now, so the gate's first read (is it closed?) finds the operation.
            result = switched.tool_execution("send_payment", {"cents": 500},
                                             lambda: calls.append("paid"))
        text = "\n".join(logs.output)
        self.assertIn("send_payment", text)
        self.assertIn("no longer protect", text)
        self.assertEqual(calls, [])  # while the operation is open the gate stays closed
        self.assertEqual(json.loads(result)["code"], "unresolved_operations")


if __name__ == "__main__":
    unittest.main()
