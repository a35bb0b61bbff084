"""Host tests: the guarded agent never settles its own calls, in a real
Hermes (tests/host/check_agent_boundary.py), on 0.19, 0.20 and 0.22.

Runs under the interpreter that has Hermes installed; skips without it unless
CRASH_RECOVERY_REQUIRE_HOST=1.  Where the hosts differ (0.22.2's dashboard
crashes at start-up, so its route is tried on 0.19 and 0.20 only), the
checker says so.
"""
from __future__ import annotations

import unittest

from test_host import TESTS_DIR, CheckerReport

CHECKER = TESTS_DIR / "host" / "check_agent_boundary.py"
REGISTRATIONS = ("plugin_loaded", "plugin_source", "tools_registered", "hook_registered",
                 "middleware_registered", "tools_in_registry", "conversation_finished")


class AgentNeverSettles(CheckerReport):
    """While its payment's outcome is unknown, nothing the agent runs changes
    the journal or the protection; a person's own shell still can."""

    checker = CHECKER

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_plugin_loaded_and_conversations_finished(self) -> None:
        self.assert_checks(*(f"closed_gate.{name}" for name in REGISTRATIONS))
        self.assert_checks(*(f"busy_gate.{name}" for name in REGISTRATIONS))

    def test_while_closed_every_tool_that_could_undo_the_gate_is_refused_and_never_ran(self):
        self.assert_checks("closed_gate.every_attempt_refused_while_closed",
                           "closed_gate.no_attempt_ran",
                           "closed_gate.refusal_says_why_this_tool_and_names_no_writing_command",
                           "closed_gate.file_tool_option_refused_naming_the_argument",
                           "closed_gate.read_only_and_inspection_tools_answer")

    def test_the_payment_ran_once_and_nothing_changed(self) -> None:
        self.assert_checks("closed_gate.payment_refused_and_ran_once",
                           "closed_gate.journal_and_settings_unchanged",
                           "closed_gate.config_unchanged_after_the_agent",
                           "closed_gate.independent_verifier")

    def test_while_a_call_runs_the_agents_other_session_cannot_settle_it(self) -> None:
        self.assert_checks("busy_gate.payment_hangs_inside_its_tool",
                           "busy_gate.every_writing_command_refused_run_by_agent",
                           "busy_gate.dashboard_route_tried_where_it_starts",
                           "busy_gate.hung_call_still_open", "busy_gate.independent_verifier")

    def test_the_operators_own_shell_settles_and_says_who(self) -> None:
        for scenario in ("closed_gate", "busy_gate"):
            self.assert_checks(f"{scenario}.operator_shell_settles",
                               f"{scenario}.operator_event_records_via_and_os_identity")

    def test_log_lines_carry_no_raw_control_character(self) -> None:
        self.assert_checks("closed_gate.plugin_log_lines_carry_no_raw_control_character",
                           "busy_gate.plugin_log_lines_carry_no_raw_control_character")


if __name__ == "__main__":
    unittest.main()
