"""What monitoring sees (README §Monitoring, docs/cli.md §status): a profile
with no protected call yet is open, not alarming; an operation dated in the
future still has an age; the documented cron line writes node-exporter's
textfile as the agent's own user, in a home only that user can read."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import unittest

from support import OPERATOR_CLI, JournalTestCase, run_cli
from crash_recovery import operator_cli
from crash_recovery.guard import RecoveryGuard
from crash_recovery.reports.messages import operation_view
from crash_recovery.reports.render import render_text


class FreshProfile(JournalTestCase):
    """Inside Hermes the data directory comes from the profile: no journal
    there means no protected call yet."""

    def status_inside_hermes(self, *words):
        args = operator_cli.build_parser().parse_args(["status", *words])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = operator_cli.execute(args, lambda: self.data_dir,
                                        lambda _: ("hermes", "-p", "work", "crash-recovery"),
                                        lambda: None, lambda: None)
        return code, stdout.getvalue()

    def test_no_journal_yet_is_an_open_gate_for_status_check_and_gauges(self):
        code, stdout = self.status_inside_hermes()
        shown = json.loads(stdout)
        self.assertEqual((code, shown["ok"], shown["journal"], shown["gate"], shown["next"]),
                         (0, True, "absent", "open", None))
        self.assertEqual(self.status_inside_hermes("--check")[0], 0)
        code, gauges = self.status_inside_hermes("--format", "prometheus")
        label = '{data_dir="%s"}' % self.data_dir
        self.assertIn(f"crash_recovery_gate_closed{label} 0\n", gauges)
        self.assertIn(f"crash_recovery_gate_open{label} 1\n", gauges)
        self.assertIn("none yet", self.status_inside_hermes("--format", "text")[1])
        self.assertFalse(os.path.exists(self.data_dir))  # status created nothing

    def test_a_typed_data_dir_without_a_journal_stays_an_error(self):
        code, document, _ = run_cli(self.data_dir, "status", "--check")
        self.assertEqual((code, document["error"]["code"]), (1, "journal_absent"))
        self.assertIn("-p PROFILE", document["error"]["hint"])


class FutureDatedOperation(unittest.TestCase):

    def test_a_start_in_the_future_keeps_its_distance_as_age(self):
        view = operation_view({"operation_id": "op", "started_ns": 7_200 * 10**9,
                               "state": "pending"}, "/nonexistent", now_ns=3_600 * 10**9,
                              with_owner=False)
        self.assertEqual((view["age_seconds"], view["clock_ahead_seconds"]), (3600.0, 3600.0))
        view = operation_view({"operation_id": "op", "started_ns": 0, "state": "pending"},
                              "/nonexistent", now_ns=60 * 10**9, with_owner=False)
        self.assertEqual(view["age_seconds"], 60.0)
        self.assertNotIn("clock_ahead_seconds", view)

    def test_the_text_status_says_a_start_is_dated_in_the_future(self):
        ahead = dict(operation_view({"operation_id": "op-ahead", "started_ns": 7_200 * 10**9,
                                     "state": "uncertain"}, "/nonexistent",
                                    now_ns=3_600 * 10**9, with_owner=False), owner="gone")
        text = render_text("status", {"ok": True, "integrity": "ok", "gate": "closed",
                                      "data_dir": "/d", "unresolved": [ahead]}, ("hermes",))
        self.assertIn("op-ahead is dated 60 min in the future (the clock of the process that "
                      "started it was ahead); AGE is its distance from now", text)


# README §Monitoring: the cron line, with the stand-alone CLI in place of
# `hermes -p work crash-recovery` (the same command and output).
CRON_LINE = ('{cli} status --format prometheus > "$TEXTFILE.$$"; '
             'mv "$TEXTFILE.$$" "$TEXTFILE"')


class CronTextfile(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.home = os.path.join(self.root, "home")
        os.makedirs(self.home, mode=0o700)
        os.chmod(self.home, 0o700)  # Hermes keeps a profile's home 0700
        self.data_dir = os.path.join(self.home, "plugin-data", "crash-recovery")
        self.textfile = os.path.join(self.root, "textfile", "crash_recovery_work.prom")
        os.makedirs(os.path.dirname(self.textfile))

    def run_cron_line(self):
        command = CRON_LINE.format(cli=f"{sys.executable} {OPERATOR_CLI} --data-dir "
                                       f"{self.data_dir}")
        subprocess.run(["sh", "-c", command], env={**os.environ, "TEXTFILE": self.textfile},
                       check=True, timeout=60)
        with open(self.textfile, encoding="utf-8") as stream:
            gauges = stream.read()
        self.assertEqual(os.listdir(os.path.dirname(self.textfile)),
                         ["crash_recovery_work.prom"])
        return gauges

    def test_the_textfile_follows_the_gate_and_is_written_when_the_journal_breaks(self):
        guard = RecoveryGuard(self.data_dir)

        def fails():
            raise RuntimeError("connection reset")
        with self.assertRaises(RuntimeError), self.assertLogs("crash_recovery", "WARNING"):
            guard.tool_execution("send_payment", {"cents": 500}, fails)
        guard.close()
        label = '{data_dir="%s"}' % self.data_dir
        gauges = self.run_cron_line()
        self.assertIn(f"crash_recovery_gate_closed{label} 1", gauges)
        self.assertIn(f"crash_recovery_unresolved_operations{label} 1", gauges)
        os.unlink(os.path.join(self.data_dir, "head.json"))
        gauges = self.run_cron_line()
        self.assertIn(f"crash_recovery_gate_closed{label} 1", gauges)
        self.assertIn(f"crash_recovery_last_verification_ok{label} 0", gauges)


if __name__ == "__main__":
    unittest.main()


class CheckReasonsName(unittest.TestCase):
    """``status --check`` reasons (docs/cli.md §status) name each waiting call."""

    def test_a_call_without_a_start_time_reads_start_time_unknown_not_none(self):
        from crash_recovery.reports.status import check_reasons
        waiting = [{"operation_id": "3260ff19-0000-4000-8000-000000000001", "tool": "unknown",
                    "state": "uncertain", "started_at": None},
                   {"operation_id": "9cf4aaaa-0000-4000-8000-000000000002", "tool": "book_trip",
                    "state": "pending", "started_at": "2026-12-03T07:41:02Z"}]
        reasons = check_reasons({"ok": True, "gate": "closed", "unresolved": waiting})
        self.assertEqual([reason for reason in reasons
                          if reason["code"] == "unresolved_operations"], [{
            "code": "unresolved_operations",
            "message": "2 protected call(s) with an unknown outcome block every protected call "
                       "in this profile: 3260ff19-0000-4000-8000-000000000001 (unknown, "
                       "uncertain, start time unknown); 9cf4aaaa-0000-4000-8000-000000000002 "
                       "(book_trip, pending, started 2026-12-03T07:41:02Z). Check the real "
                       "service, then resolve each"}])
