"""Host tests: what a person meets around the plugin's life in a real Hermes
(tests/host/check_plugin_lifecycle.py): a typo in ``protected_tools`` said by
every surface, and ``plugins disable`` / ``plugins remove`` with an operation
open -- what each host does to the settings and the journal, and the recovery
the README gives.

Runs under the interpreter that has Hermes installed; skips without it unless
CRASH_RECOVERY_REQUIRE_HOST=1.  Which checks run depends on the host: 0.22
forgets a removed plugin's settings and, offline, cannot enable or disable a
plugin (its package manager needs the network); 0.19 and 0.20 keep both.
"""
from __future__ import annotations

import unittest

from test_host import TESTS_DIR, CheckerReport, evidence

CHECKER = TESTS_DIR / "host" / "check_plugin_lifecycle.py"
NEWER = evidence.hermes_release() >= (0, 22, 0) if evidence.hermes_version() else False


class PluginLifecycle(CheckerReport):
    checker = CHECKER

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_a_typo_in_protected_tools_needs_a_person_on_every_surface(self) -> None:
        self.assert_checks("typo_in_protected_tools.booking_ran_unrecorded",
                           "typo_in_protected_tools.worker_recorded_the_host_tools",
                           "typo_in_protected_tools.slash_leads_with_the_typo",
                           "typo_in_protected_tools.hermes_check_text_says_why_first",
                           "typo_in_protected_tools.standalone_check_text_says_why_first",
                           "typo_in_protected_tools.hermes_check_json_reasons")

    def test_disable_with_an_operation_open(self) -> None:
        if NEWER:
            if self.report.get("network", "").startswith("unshare"):
                self.assert_checks("disable_and_remove.disable_offline_prints_the_hosts_"
                                   "traceback_and_changes_nothing")
        else:
            self.assert_checks("disable_and_remove.disable_moves_it_to_disabled_and_keeps_the_"
                               "settings", "disable_and_remove.disabled_plugin_has_no_hermes_"
                               "command", "disable_and_remove.standalone_cli_still_reads_the_"
                               "open_operation")
        self.assert_checks("disable_and_remove.disable_left_the_journal_as_it_was")

    def test_remove_with_an_operation_open_and_the_recovery(self) -> None:
        self.assert_checks("disable_and_remove.remove_deletes_the_plugin_directory",
                           "disable_and_remove.remove_left_the_journal_as_it_was",
                           "disable_and_remove.booking_ran_again_unrecorded",
                           "disable_and_remove.recovered_config",
                           "disable_and_remove.booking_refused_unresolved",
                           "disable_and_remove.status_check_says_the_operation_is_still_open",
                           "disable_and_remove.independent_verifier")
        if NEWER:
            self.assert_checks("disable_and_remove.remove_wipes_the_settings_and_the_enabled_"
                               "entry", "disable_and_remove.the_hosts_config_backups_keep_the_"
                               "settings", "disable_and_remove.config_set_enabled",
                               "disable_and_remove.config_set_protected_tools")
        else:
            self.assert_checks("disable_and_remove.remove_keeps_the_settings_and_the_enabled_"
                               "entry")


if __name__ == "__main__":
    unittest.main()
