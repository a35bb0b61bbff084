"""A coding profile left in the default mode learns how to switch from its
first warning: a failing shell command blocks every protected call there
(README §Choose what to protect)."""
from __future__ import annotations

from support import JournalTestCase
from crash_recovery.guard import RecoveryGuard


def fails():
    raise RuntimeError("exit status 2")


class DefaultModeHint(JournalTestCase):

    def warnings(self, guard, tool, calls=1):
        self.addCleanup(guard.close)
        with self.assertLogs("crash_recovery", "WARNING") as logs:
            for _ in range(calls):
                try:
                    guard.tool_execution(tool, {"command": "ls"}, fails)
                except RuntimeError:
                    pass
        return [line for line in logs.output if "uncertain" in line or "is pending" in line
                or "refused" in line]

    def test_the_first_warning_about_a_shell_call_says_how_to_switch(self):
        logs = self.warnings(RecoveryGuard(self.data_dir), "terminal", calls=2)
        self.assertIn("the default mode", logs[0])
        self.assertIn("hermes config set plugins.entries.crash-recovery.settings."
                      "protected_tools", logs[0])
        self.assertFalse(any("default mode" in line for line in logs[1:]))  # said once

    def test_no_hint_for_other_tools_or_in_the_protected_tools_mode(self):
        logs = self.warnings(RecoveryGuard(self.data_dir), "send_payment")
        self.assertFalse(any("default mode" in line for line in logs))
        other = RecoveryGuard(self.data_dir + "-2", settings={"protected_tools": ["terminal"]})
        logs = self.warnings(other, "terminal")
        self.assertFalse(any("default mode" in line for line in logs))
