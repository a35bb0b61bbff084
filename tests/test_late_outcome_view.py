"""A late outcome is shown beside the resolution it must be compared with, in
``status``, ``show`` (JSON and text) and ``/crash-recovery`` (docs/cli.md
§acknowledge)."""
from __future__ import annotations

import contextlib
import io
import json
import unittest

from support import JournalTestCase, run_cli
from crash_recovery import operator_cli
from crash_recovery.admission.binding import ADMISSION
from crash_recovery.guard import RecoveryGuard
from crash_recovery.host.hermes import summary_text


class ResolvedThenReturned(JournalTestCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)

        def pays_while_an_operator_resolves():
            self.operation_id = ADMISSION.get().operation_id
            with contextlib.redirect_stdout(io.StringIO()):
                code = operator_cli.main([
                    "--data-dir", self.data_dir, "resolve", self.operation_id, "--outcome",
                    "not_applied", "--force", "--evidence", "worker hung on a dead socket"])
            self.assertEqual(code, 0)
            return {"status": "paid"}
        with self.assertLogs("crash_recovery", "WARNING"):
            self.assertEqual(guard.tool_execution("send_payment", {"cents": 500},
                                                  pays_while_an_operator_resolves),
                             {"status": "paid"})
        self.status_text = summary_text(guard.status_report(), ("hermes", "crash-recovery"))
        guard.close()

    def test_status_and_show_give_the_resolution_beside_the_late_outcome(self):
        code, status, _ = run_cli(self.data_dir, "status")
        [late] = status["attention"]
        self.assertEqual((late["outcome"], late["late_reason"]), ("not_applied", "returned"))
        code, shown, _ = run_cli(self.data_dir, "show", self.operation_id)
        self.assertEqual((shown["operation"]["outcome"], shown["operation"]["late_reason"]),
                         ("not_applied", "returned"))
        code, _, text = run_cli(self.data_dir, "show", self.operation_id, "--format", "text")
        self.assertRegex(text, r"outcome:\s+not_applied")
        self.assertRegex(text, r"late_reason:\s+returned")
        code, _, text = run_cli(self.data_dir, "status", "--format", "text")
        self.assertRegex(text, r"send_payment\s+not_applied\s+returned")
        self.assertIn("resolved as not_applied", self.status_text)

    def test_gauges_count_the_late_outcome_until_it_is_acknowledged(self):
        def gauges():
            code, _, text = run_cli(self.data_dir, "--format", "prometheus", "status")
            return code, {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
                          if line.startswith("crash_recovery_")}
        code, values = gauges()
        # started, resolved (forced), late outcome: three events
        self.assertEqual((code, values["crash_recovery_late_outcomes_unacknowledged"],
                          values["crash_recovery_events"], values["crash_recovery_gate_open"],
                          values["crash_recovery_unresolved_operations"]), (0, "1", "3", "1", "0"))
        self.assertEqual(run_cli(self.data_dir, "acknowledge", self.operation_id, "--evidence",
                                 "refunded the second payment")[0], 0)
        code, values = gauges()
        self.assertEqual((code, values["crash_recovery_late_outcomes_unacknowledged"],
                          values["crash_recovery_events"]), (0, "0", "4"))

    def test_after_acknowledgement_show_keeps_both(self):
        code, _, _ = run_cli(self.data_dir, "acknowledge", self.operation_id, "--evidence",
                             "refunded the second payment")
        self.assertEqual(code, 0)
        code, shown, _ = run_cli(self.data_dir, "show", self.operation_id)
        self.assertEqual((shown["operation"]["state"], shown["operation"]["outcome"],
                          shown["operation"]["late_reason"]), ("resolved", "not_applied",
                                                               "returned"))
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
