"""Plugin settings (docs/guard.md §Settings): whatever they hold, the
middleware never raises before the tool runs (Hermes would run the tool
unrecorded), and settings that would silently protect nothing are a settings
problem that protects every tool.
"""
from __future__ import annotations

import shutil
import unittest

from reliability_support import ReliabilityCase
from support import reference

from crash_recovery.admission.settings import parse_settings
from crash_recovery.guard import RecoveryGuard


class SettingsNeverRaise(ReliabilityCase):
    """Unusable settings are a settings problem that protects every tool; the
    middleware and the hook never raise because of them."""

    class RaisingMapping(dict):
        def __iter__(self):
            raise RuntimeError("a broken config loader")

    def test_unreadable_settings_fail_closed_without_raising(self):
        for raw in ({"busy_timeout": 10 ** 400}, {"archive_after_events": 10 ** 400},
                    {"full_verification_interval": 10 ** 400},
                    self.RaisingMapping(busy_timeout=1)):
            with self.subTest(raw=type(raw).__name__ + str(list(dict.items(raw)))[:60]):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                guard = RecoveryGuard(self.data_dir, settings=raw)
                self.addCleanup(guard.close)
                ran = []
                result = guard.tool_execution(tool_name="pay", args={},
                                              next_call=lambda: ran.append(1) or "paid",
                                              session_id="s", tool_call_id="c")
                self.assertEqual((result, ran), ("paid", [1]))  # protected, journaled, run once
                self.assertIsNone(guard.pre_tool_call(tool_name="pay", args={}, session_id="s",
                                                      tool_call_id="d"))
                self.assertTrue(guard.status_report()["settings"]["problem"])
                self.assertEqual(reference.verify(self.data_dir).kinds(), ["started", "returned"])

    def test_lists_that_would_protect_nothing_are_problems(self):
        for value in ('{"pay": 1}', "", [], '"pay"', "[1, 2]"):
            with self.subTest(value=value):
                settings = parse_settings({"protected_tools": value})
                self.assertTrue(settings.problem)
                self.assertTrue(settings.is_protected("pay"))
                self.assertTrue(settings.is_protected("anything_else"))
        self.assertEqual(sorted(parse_settings({"protected_tools": "pay, book"}).tools),
                         ["book", "pay"])


if __name__ == "__main__":
    unittest.main()
