"""Host tests: ``delegate_task`` subagents in a real Hermes
(tests/host/check_subagents.py), on 0.19, 0.20 and 0.22.

Runs under the interpreter that has Hermes installed; skips without it unless
CRASH_RECOVERY_REQUIRE_HOST=1.  Where the hosts differ (the context a
subagent runs in), the expected refusal branches on the imported Hermes.
"""
from __future__ import annotations

import unittest

from test_host import TESTS_DIR, CheckerReport

CHECKER = TESTS_DIR / "host" / "check_subagents.py"
REGISTRATIONS = ("plugin_loaded", "plugin_source", "tools_registered", "hook_registered",
                 "middleware_registered", "tools_in_registry")


class Subagents(CheckerReport):
    """A subagent's protected call runs and is journaled when no protected call
    of its parent is running, and is refused, never run, while one is."""

    checker = CHECKER

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_plugin_loaded_in_every_scenario(self) -> None:
        for scenario in ("outside_protected_call", "inside_protected_call", "background"):
            self.assert_checks(*(f"{scenario}.{name}" for name in
                                 REGISTRATIONS + ("conversation_finished",)))

    def test_subagent_call_outside_a_protected_call_runs_once_journaled_by_tool(self) -> None:
        self.assert_checks("outside_protected_call.subagent_ran_inside_the_delegating_call",
                           "outside_protected_call.subagent_call_ran_once",
                           "outside_protected_call.journaled_under_tool_name_in_subagent_session",
                           "outside_protected_call.no_bridge_name_in_journal",
                           "outside_protected_call.reached_as_the_host_offers_it",
                           "outside_protected_call.journal_outcomes",
                           "outside_protected_call.independent_verifier")

    def test_subagent_call_inside_the_delegating_protected_call_is_refused_not_run(self) -> None:
        # nested_call on 0.20+ (the subagent runs in a copy of the delegating
        # call's context), operation_in_flight on 0.19 (a fresh context).
        self.assert_checks("inside_protected_call.subagent_call_refused_naming_the_delegation",
                           "inside_protected_call.only_the_parents_booking_ran",
                           "inside_protected_call.journal_outcomes",
                           "inside_protected_call.independent_verifier")

    def test_background_subagent_call_after_the_delegation_ended_runs_once(self) -> None:
        self.assert_checks("background.delegation_dispatched_in_background",
                           "background.subagent_completed",
                           "background.subagent_call_ran_once",
                           "background.journaled_under_tool_name_in_subagent_session",
                           "background.no_bridge_name_in_journal",
                           "background.journal_outcomes", "background.independent_verifier")


if __name__ == "__main__":
    unittest.main()
