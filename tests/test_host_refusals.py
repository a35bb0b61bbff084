"""Host tests: calls the host refuses, Tool Search bridge calls and the
concurrent path, in a real Hermes (tests/host/check_host_refusals.py).

Runs under the interpreter that has Hermes installed; skips without it unless
CRASH_RECOVERY_REQUIRE_HOST=1.  Which checks run depends on the host: 0.19
runs hooks before the middleware, so a plugin's block never reaches the
journal there; 0.20 and later run them inside it.
"""
from __future__ import annotations

import unittest

from test_host import TESTS_DIR, CheckerReport, evidence

CHECKER = TESTS_DIR / "host" / "check_host_refusals.py"


class HostRefusals(CheckerReport):
    """What the host refuses never closes the profile; what ran and failed does."""

    checker = CHECKER

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_another_plugins_block_is_recorded_not_run_and_gate_stays_open(self) -> None:
        self.assert_checks("refusals.plugin_loaded_with_both_hooks",
                           "refusals.policy_blocked_embargo", "refusals.journal_outcomes",
                           "refusals.lisbon_booked_gate_stayed_open", "refusals.handler_runs",
                           "refusals.independent_verifier")

    def test_tool_call_naming_an_unknown_tool_closes_nothing(self) -> None:
        self.assert_checks("refusals.unknown_tool_refused_not_journaled",
                           "refusals.no_bridge_name_in_journal")

    def test_handler_that_ran_and_failed_still_closes_the_gate(self) -> None:
        self.assert_checks("refusals.control_closes_gate", "refusals.status_lists_only_the_control")

    def test_concurrent_path_keeps_its_verdicts(self) -> None:
        self.assert_checks("concurrent_and_code.took_concurrent_path",
                           "concurrent_and_code.only_the_admitted_page_fetched",
                           "concurrent_and_code.read_files_untouched",
                           "concurrent_and_code.blocked_page_told_by_policy",
                           "concurrent_and_code.journal_outcomes",
                           "concurrent_and_code.independent_verifier")

    def test_execute_code_bridge_call_is_refused_as_nested(self) -> None:
        self.assert_checks("concurrent_and_code.inner_call_refused_as_nested")

    def test_bundled_security_guidance_block_is_recorded_not_run(self) -> None:
        if evidence.hermes_release() < (0, 22, 0):
            self.assertNotIn("security_guidance.journal_outcomes", self.outcomes)
            return  # the plugin is bundled from Hermes 0.22
        self.assert_checks("security_guidance.risky_write_refused_by_plugin",
                           "security_guidance.safe_write_done", "security_guidance.journal_outcomes",
                           "security_guidance.independent_verifier")

    def test_settings_mean_the_same_on_every_host(self) -> None:
        label = "settings_leftover_and_reference"
        spelled = ("settings_as_written_expanded" if evidence.hermes_release() >= (0, 20, 0)
                   else "unexpanded_reference_fails_closed")
        self.assert_checks(f"{label}.{spelled}", f"{label}.leftover_config_not_read_as_both_modes",
                           f"{label}.book_trip_protected", f"{label}.independent_verifier",
                           "settings_config_set.config_set_exit_0",
                           "settings_config_set.same_settings_as_written")

    def test_protected_tool_is_journaled_by_its_own_name_however_reached(self) -> None:
        self.assert_checks("settings_config_set.both_tools_ran",
                           "settings_config_set.only_the_protected_tool_journaled")

    def test_isolation_mode_refuses_protected_calls_and_runs_the_rest(self) -> None:
        if evidence.hermes_release() < (0, 22, 0):
            self.assertNotIn("isolation_mode.handler_never_ran", self.outcomes)
            return  # plugins.isolation exists from Hermes 0.22
        self.assert_checks("isolation_mode.plugin_loaded_with_both_hooks",
                           "isolation_mode.unprotected_tool_ran",
                           "isolation_mode.protected_call_refused_naming_the_setting",
                           "isolation_mode.handler_never_ran",
                           "isolation_mode.status_says_isolation_cannot_be_protected",
                           "isolation_mode.nothing_journaled")


if __name__ == "__main__":
    unittest.main()
