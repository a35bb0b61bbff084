"""Host tests: delayed plugin discovery never lets a protected tool run
unjournaled, in a real Hermes (tests/host/check_discovery_race.py), on 0.19,
0.20 and 0.22.

Runs under the interpreter that has Hermes installed; skips without it unless
CRASH_RECOVERY_REQUIRE_HOST=1.  Where the hosts differ (0.19 has no
background discovery and runs its hooks before the middleware list is read),
the expectations branch on the imported Hermes.
"""
from __future__ import annotations

import unittest

from test_host import TESTS_DIR, CheckerReport, evidence

CHECKER = TESTS_DIR / "host" / "check_discovery_race.py"


class DelayedDiscovery(CheckerReport):
    """A session started, or a call made, while plugin discovery is still
    running: the protected call is journaled, or refused and never run."""

    checker = CHECKER

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_a_session_started_during_discovery_journals_its_first_call(self) -> None:
        self.assert_checks("startup.background_discovery_where_the_host_has_it",
                           "startup.conversation_finished",
                           "startup.discovery_was_running_when_the_session_started",
                           "startup.first_call_journaled_and_ran_once",
                           "startup.independent_verifier")

    def test_a_call_made_during_a_plugin_reload_is_refused_by_the_hook(self) -> None:
        if evidence.hermes_release() < (0, 20, 0):
            # 0.19 reads its hooks before its middleware list: not run there.
            self.assertNotIn("forced_rediscovery.unwrapped_call_refused_by_the_hook",
                             self.outcomes)
            return
        self.assert_checks("forced_rediscovery.conversation_finished",
                           "forced_rediscovery.reload_in_flight_when_the_call_arrived",
                           "forced_rediscovery.unwrapped_call_refused_by_the_hook",
                           "forced_rediscovery.refused_call_never_ran_the_next_ran_once_journaled",
                           "forced_rediscovery.refusal_logged",
                           "forced_rediscovery.independent_verifier")


if __name__ == "__main__":
    unittest.main()
