"""Hints say what is true and name the command as the person runs it: a busy
gate refuses (nobody waits), every next step carries the profile's prefix,
read-only access is about the user, not the workers, and --help needs no file
the person does not have."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import unittest

from support import JournalTestCase, run_cli
from crash_recovery import operator_cli
from crash_recovery.guard import RecoveryGuard
from crash_recovery.reports.hints import ERROR_HINTS

HERMES_WORDS = ("hermes", "-p", "work", "crash-recovery")


class Hints(JournalTestCase):

    def inside_hermes(self, *words):
        args = operator_cli.build_parser().parse_args(list(words))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = operator_cli.execute(args, lambda: self.data_dir, lambda _: HERMES_WORDS,
                                        lambda: None, lambda: None)
        return code, stdout.getvalue()

    def test_a_busy_gate_says_other_calls_are_refused(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        seen = {}

        def running():
            seen["text"] = run_cli(self.data_dir, "status", "--format", "text")[2]
            return "done"
        self.assertEqual(guard.tool_execution("send_payment", {}, running), "done")
        self.assertIn("gate: busy", seen["text"])
        self.assertIn("other protected calls are refused (operation_in_flight)", seen["text"])
        self.assertNotIn("wait", seen["text"])

    def test_every_next_step_inside_hermes_carries_the_profile_prefix(self):
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution("send_payment", {}, lambda: "paid")
        guard.close()
        os.unlink(os.path.join(self.data_dir, "head.json"))
        code, stdout = self.inside_hermes("status")
        error = json.loads(stdout)["error"]
        self.assertEqual((code, error["code"]), (1, "checkpoint_missing"))
        self.assertEqual(error["next"], "hermes -p work crash-recovery restart-journal "
                                        '--evidence "<what happened, what you checked>"')
        code, text = self.inside_hermes("status", "--format", "text")
        self.assertIn("next: hermes -p work crash-recovery restart-journal", text)

    def test_hints_name_the_profile_and_the_user(self):
        self.assertIn("-p PROFILE", ERROR_HINTS["journal_absent"])
        self.assertNotIn("HERMES_HOME", ERROR_HINTS["journal_absent"])
        self.assertNotIn("stop the workers", ERROR_HINTS["read_access_only"])
        self.assertIn("`next`", ERROR_HINTS["checkpoint_ahead"])

    def test_the_next_resolve_names_an_operation_a_person_can_settle(self):
        from crash_recovery.reports.messages import status_next_step
        running = {"operation_id": "a" * 8, "state": "pending", "owner": "running"}
        waiting = {"operation_id": "b" * 8, "state": "uncertain", "owner": "gone"}
        document = {"ok": True, "gate": "closed", "unresolved": [running, waiting]}
        self.assertEqual(status_next_step(document)[:2], ("resolve", "b" * 8))
        self.assertIsNone(status_next_step({"ok": True, "gate": "busy", "unresolved": [running]}))

    def test_verdicts_whose_way_forward_is_a_new_journal_say_so(self):
        for code in ("journal_rolled_back", "wal_missing"):
            self.assertIn("`next` command (restart-journal)", ERROR_HINTS[code], code)
        # A repair refused on a healthy journal must not send anyone to a missing `next`.
        self.assertIn("`ok` needs no repair", ERROR_HINTS["repair_not_applicable"])
        self.assertIn("`resolve`", ERROR_HINTS["nothing_to_acknowledge"])

    def test_help_needs_no_file_and_names_every_way_forward(self):
        top = argparse.ArgumentParser(prog="hermes")
        parser = top.add_subparsers().add_parser("crash-recovery")
        operator_cli.setup_hermes_command(parser)
        for text in (parser.format_help(), operator_cli.build_parser().format_help()):
            self.assertNotIn("docs/", text)
            for words in ("resolve OP", "repair-checkpoint", "restart-journal", "acknowledge",
                          "--evidence-file", "hermes -p PROFILE sessions export", "status --check"):
                self.assertIn(words, text)


if __name__ == "__main__":
    unittest.main()
