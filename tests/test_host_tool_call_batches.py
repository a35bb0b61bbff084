"""Host tests: several calls in one Tool Search ``tool_call``, in a real
Hermes (tests/host/check_tool_call_batches.py).

Runs under the interpreter that has Hermes installed; skips without it unless
CRASH_RECOVERY_REQUIRE_HOST=1.  0.19 and 0.20 have no batches (checked on the
host's own parser); 0.22 batches connector calls and splits any batch naming
a local tool into one call per entry.
"""
from __future__ import annotations

import unittest

from test_host import TESTS_DIR, CheckerReport, evidence

CHECKER = TESTS_DIR / "host" / "check_tool_call_batches.py"


class ToolCallBatches(CheckerReport):
    """Every entry of a batch is guarded as its own call, or the batch is
    refused whole with nothing run; never run unjournaled."""

    checker = CHECKER

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_host_parser_says_which_batches_exist(self) -> None:
        if evidence.hermes_release() < (0, 22, 0):
            self.assert_checks("batch_shape.no_batches_on_this_host")
            return
        self.assert_checks("batch_shape.local_batch_refused_whole",
                           "batch_shape.connector_batch_kept_as_one_dispatch")

    def test_local_batch_is_guarded_entry_by_entry_or_refused_whole(self) -> None:
        if evidence.hermes_release() < (0, 20, 0):
            # 0.19 offers plugin tools directly: the model has no tool_call.
            self.assertNotIn("local_batch.handler_runs", self.outcomes)
            return
        spelled = ("each_entry_ran_once_as_its_own_call"
                   if evidence.hermes_release() >= (0, 22, 0) else "batch_refused_whole")
        self.assert_checks(f"local_batch.{spelled}",
                           "local_batch.each_protected_entry_journaled_under_its_own_name",
                           "local_batch.oversized_batch_refused_whole",
                           "local_batch.handler_runs", "local_batch.rome_booked_gate_stayed_open",
                           "local_batch.independent_verifier")

    def test_connector_batch_is_journaled_entry_by_entry(self) -> None:
        if evidence.hermes_release() < (0, 22, 0):
            self.assertNotIn("connector_batch.gate_open", self.outcomes)
            return  # connector batches exist from Hermes 0.22
        self.assert_checks("connector_batch.each_entry_executed_once_at_the_gateway",
                           "connector_batch.batch_result_holds_every_entry",
                           "connector_batch.each_protected_entry_journaled_under_its_own_name",
                           "connector_batch.no_bridge_name_in_journal",
                           "connector_batch.oversized_batch_refused_by_the_host",
                           "connector_batch.mixed_batch_local_entries_ran_once",
                           "connector_batch.gate_open", "connector_batch.independent_verifier")


if __name__ == "__main__":
    unittest.main()
