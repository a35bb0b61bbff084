"""Deployment host tests: run tests/host/check_deployment.py against real Hermes.

Protection modes from config.yaml (and from the real ``hermes config set``),
``hermes [-p PROFILE] crash-recovery ...`` against ``operator_cli.py``,
``/crash-recovery`` through Hermes' own dispatch, the blocked text the model
receives, the WARNING in Hermes' log, and re-entry on the concurrent path and
through execute_code's RPC bridge.

The checker runs as a subprocess of this interpreter (``sys.executable``),
which must import Hermes (any packaging). Without it the tests skip with the
reason, unless ``CRASH_RECOVERY_REQUIRE_HOST=1`` (set by CI), which turns the
skip into a failure.
"""
from __future__ import annotations

import sys
import unittest
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR))
sys.path.insert(0, str(TESTS_DIR / "host"))

from test_host import CheckerReport  # noqa: E402
from check_deployment import config_set_stores_lists  # noqa: E402

CHECK_DEPLOYMENT = TESTS_DIR / "host" / "check_deployment.py"
CHECK_DEPLOYMENT_TIMEOUT_SECONDS = 1200
REGISTRATION_CHECKS = ("plugin_loaded", "plugin_source", "tools_registered", "hook_registered",
                       "middleware_registered", "tools_in_registry")


class DeploymentChecks(CheckerReport):
    """crash-recovery as an operator deploys and runs it inside Hermes (0.19.0, 0.20.1, 0.22.2)."""

    checker = CHECK_DEPLOYMENT
    timeout = CHECK_DEPLOYMENT_TIMEOUT_SECONDS

    def assert_checks(self, prefix: str, *names: str) -> None:  # type: ignore[override]
        """Each ``prefix.name`` check ran and passed (a missing check fails too)."""
        super().assert_checks(*(f"{prefix}.{name}" for name in names))

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_registrations_through_plugin_manager(self) -> None:
        for label in ("mode_default", "mode_protected", "mode_config_set", "mode_unknown_key",
                      "reentry", "profiles.default", "profiles.named"):
            self.assert_checks(label, *REGISTRATION_CHECKS)

    # -- 1. protection modes ------------------------------------------------

    def test_default_mode_protects_unlisted_tools(self) -> None:
        self.assert_checks("mode_default", "status_shows_default_mode",
                           "error_response_returned_unchanged", "success_false_leaves_uncertain",
                           "unlisted_tool_refused_by_middleware", "refused_by_hook",
                           "refused_handlers_not_run", "read_file_exempt_while_blocked",
                           "status_lists_uncertain", "refusals_and_exempt_calls_append_nothing")

    def test_protected_tools_mode(self) -> None:
        for label in ("mode_protected", "mode_config_set"):
            self.assert_checks(label, "status_shows_protected_mode",
                               "unprotected_success_false_returned_unchanged",
                               "unprotected_error_returned_unchanged",
                               "unprotected_errors_leave_no_journal_entry",
                               "unprotected_handler_ran_each_time", "other_tool_runs_unjournaled",
                               "protected_tool_journaled", "protected_failure_uncertain",
                               "unprotected_tool_refused_while_closed",
                               "read_only_tool_runs_while_closed",
                               "protected_tool_refused_middleware", "protected_tool_refused_hook",
                               "refused_booking_not_run", "journal_holds_only_protected_calls")

    def test_hermes_config_set_value_the_plugin_reads(self) -> None:
        # 0.19 and 0.20 store the typed list as a string, 0.22 as a list.
        stored = ("config_set_stores_a_list" if config_set_stores_lists()
                  else "config_set_stores_a_string")
        self.assert_checks("mode_config_set", "config_set_exit_0", stored,
                           "config_set_keeps_enabled_plugins", "status_shows_protected_mode")

    def test_unknown_setting_reported_and_fails_closed(self) -> None:
        self.assert_checks("mode_unknown_key", "status_reports_settings_problem",
                           "intended_read_only_tool_is_protected",
                           "default_read_only_tool_is_protected", "inspection_tools_still_exempt",
                           "slash_command_names_settings_problem")

    # -- 2. hermes crash-recovery ... ------------------------------------------

    def test_hermes_cli_named_profile_matches_operator_cli(self) -> None:
        self.assert_checks("profiles", "profile_create", "status_named_profile",
                           "status_names_named_operation", "show_named_profile",
                           "status_text_names_profile_command", "usage_error_changed_nothing",
                           "resolve_again_refused", "show_resolved")

    def test_hermes_cli_usage_error_is_one_json_document(self) -> None:
        self.assert_checks("profiles", "usage_error_json_exit_1")

    def test_hermes_cli_default_profile_and_hermes_home(self) -> None:
        self.assert_checks("profiles", "status_default_profile", "status_hermes_home",
                           "show_hermes_home")
        self.assert_checks("mode_default", "hermes_home_status_same", "hermes_home_show_same",
                           "hermes_status_shows_settings",
                           "hermes_home_resolve", "hermes_home_status_check_clear")

    def test_default_profile_command_survives_sticky_profile(self) -> None:
        self.assert_checks("profiles",
                           "default_command_reaches_default_profile_when_another_is_sticky")

    def test_status_check_and_prometheus(self) -> None:
        self.assert_checks("profiles", "status_check_exit_3", "prometheus_same",
                           "status_check_exit_0_when_clear",
                           "status_check_default_exit_0_when_clear", "prometheus_clear")
        self.assert_checks("mode_default", "hermes_home_status_check_same")

    def test_printed_show_command_works_and_the_operator_settles(self) -> None:
        for name in ("named", "default"):
            self.assert_checks("profiles", f"printed_show_command_{name}",
                               f"printed_show_command_shows_{name}",
                               f"operator_resolve_settles_{name}",
                               f"resolution_journaled_{name}")

    # -- 3. /crash-recovery ------------------------------------------------------

    def test_slash_command_through_plugin_registry(self) -> None:
        self.assert_checks("profiles.named", "slash_command_registered",
                           "slash_names_gate_tool_age_owner", "slash_exact_resolve_command",
                           "slash_says_never_resolves", "slash_no_path",
                           "slash_with_resolve_words_changes_nothing")

    def test_slash_command_through_cli_process_command(self) -> None:
        self.assert_checks("profiles", "process_command_answered",
                           "process_command_names_gate_tool_age_owner",
                           "process_command_exact_resolve_command",
                           "process_command_says_never_resolves", "process_command_no_path")

    # -- 4. what the model is told -------------------------------------------------

    def test_blocked_text_relayed_to_model_names_profile_command(self) -> None:
        self.assert_checks("profiles.named", "conversation_finished", "failure_uncertain",
                           "model_sent_blocked_result", "relayed_operator_command",
                           "relayed_show_command", "relayed_no_path",
                           "relayed_message_no_path", "blocked_booking_not_run")
        self.assert_checks("profiles.default", "failure_uncertain", "blocked_operator_command",
                           "blocked_show_command", "blocked_no_path")

    # -- 5. re-entry: coerced arguments, the RPC bridge ----------------------------

    def test_reentry_with_arguments_coerced_by_the_host(self) -> None:
        self.assert_checks("reentry", "conversation_finished", "web_one_admitted_one_refused",
                           "web_host_arg_types_per_entry",
                           "web_inner_entry_passed_as_reentry", "web_handler_ran_once_with_list",
                           "web_no_nested_call", "read_file_admitted_calls_ran_once",
                           "read_file_host_arg_types_per_entry",
                           "no_uncertain_operation", "profile_not_blocked_after",
                           "book_trip_after_runs")

    def test_concurrent_sibling_refused_as_in_flight(self) -> None:
        self.assert_checks("reentry", "web_sibling_refused_operation_in_flight",
                           "read_file_others_refused_in_flight")

    def test_execute_code_rpc_bridge_call_refused_as_nested(self) -> None:
        self.assert_checks("reentry", "execute_code_ran", "execute_code_inner_call_refused",
                           "execute_code_parent_returned", "execute_code_inner_call_not_journaled",
                           "execute_code_inner_call_nested_call")

    # -- 6. Hermes' own log -------------------------------------------------------

    def test_uncertain_warning_in_hermes_log(self) -> None:
        self.assert_checks("profiles.named", "uncertain_warning_in_agent_log",
                           "uncertain_warning_in_errors_log", "warning_names_profile_command")

    def test_journals_pass_independent_verifier(self) -> None:
        for label in ("mode_default", "mode_protected", "mode_config_set", "mode_unknown_key",
                      "reentry", "profiles.default", "profiles.named"):
            self.assert_checks(label, "independent_verifier")


if __name__ == "__main__":
    unittest.main()
