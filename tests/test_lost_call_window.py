"""An operation brought back for a lost event says when its call can have
happened: after the last recorded event, before the repair (or the restart)
that brought it back (docs/cli.md §repair-checkpoint, §restart-journal)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import unittest

from support import JournalTestCase, run_cli
from crash_recovery.guard import RecoveryGuard
from crash_recovery.reports.messages import iso_utc

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_worker.py")


class RepairedCheckpoint(JournalTestCase):

    def test_the_lost_operation_names_the_window_of_its_call(self):
        service = os.path.join(self.root, "service.sqlite3")
        for words in (("--request", "r1"),
                      ("--request", "r2", "--kill", "checkpoint_replaced:started")):
            subprocess.run([sys.executable, WORKER, "call", self.data_dir, service, *words],
                           capture_output=True, timeout=60)
        code, log, _ = run_cli(self.data_dir, "log")  # refused: checkpoint_ahead
        self.assertEqual(log["error"]["code"], "checkpoint_ahead")
        self.assertIn("repair-checkpoint", log["error"]["next"])
        code, repaired, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence",
                                    "worker killed (test)")
        self.assertEqual(code, 0, repaired)
        [lost] = repaired["unresolved"]
        code, events, _ = run_cli(self.data_dir, "log")
        last_recorded = events["events"][1]  # r1's returned
        self.assertEqual(lost["lost_window"]["after_ns"], last_recorded["timestamp_ns"])
        self.assertGreaterEqual(lost["lost_window"]["before_ns"], last_recorded["timestamp_ns"])
        self.assertEqual(lost["lost_after"], iso_utc(last_recorded["timestamp_ns"]))
        self.assertEqual(lost["lost_before"], iso_utc(lost["lost_window"]["before_ns"]))
        self.assertIn(f"after the last recorded event ({lost['lost_after']}) and before this "
                      f"repair ({lost['lost_before']})", repaired["lost_event"])
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual(status["unresolved"][0]["lost_before"], lost["lost_before"])
        self.assertVerifies()


# The operation a restart brings back when later events may be lost: the
# window of its call, on every surface a person (or a model) reads.
class RestartedJournal(JournalTestCase):

    def damaged(self) -> None:
        """r1 returned; r2's worker killed inside its tool (pending); head.json lost."""
        service = os.path.join(self.root, "service.sqlite3")
        for words in (("--request", "r1"), ("--request", "r2", "--kill", "side_effect:downstream")):
            subprocess.run([sys.executable, WORKER, "call", self.data_dir, service, *words],
                           capture_output=True, timeout=60)
        os.unlink(os.path.join(self.data_dir, "head.json"))

    def restart(self) -> dict:
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence",
                                     "head.json deleted (test)")
        self.assertEqual(code, 0, restarted)
        return restarted

    def lost_view(self, restarted: dict) -> dict:
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual(code, 0, status)
        return {view["operation_id"]: view for view in status["unresolved"]}[
            restarted["lost_operation"]]

    def test_every_surface_shows_the_window_never_a_start(self):
        self.damaged()
        code, log, _ = run_cli(self.data_dir, "log")  # refused: the events as they were
        restarted = self.restart()
        code, events, _ = run_cli(self.data_dir, "log")
        started = next(event for event in events["events"] if event.get("tool") == "unknown")
        view = self.lost_view(restarted)
        window = started["lost_window"]
        self.assertEqual(window["after_source"], "last_verified_event")
        self.assertEqual(view["lost_window"], window)
        self.assertEqual((view["started_at"], view["session_id"], view["tool_call_id"]),
                         (None, None, None))
        self.assertEqual(view["recorded_at"], iso_utc(started["timestamp_ns"]))
        self.assertEqual((view["lost_after"], view["lost_before"], view["lost_after_source"]),
                         (iso_utc(window["after_ns"]), iso_utc(window["before_ns"]),
                          "last_verified_event"))
        sentence = (f"if it happened, it started after {view['lost_after']} (the last verified "
                    f"event) and before {view['lost_before']} (when it was brought back); its "
                    "tool, session and tool call are unknown")
        # status --format text: the window where a start would be, and in words.
        code, _, text = run_cli(self.data_dir, "status", "--format", "text")
        row = next(line for line in text.splitlines() if line.startswith(view["operation_id"]))
        self.assertIn(f"lost {view['lost_after']}..{view['lost_before']}", row)
        self.assertIn("unknown     unknown", row)
        self.assertIn(sentence, text)
        # show, JSON and text.
        code, shown, _ = run_cli(self.data_dir, "show", view["operation_id"])
        self.assertEqual((shown["operation"]["started_at"], shown["operation"]["lost_before"]),
                         (None, view["lost_before"]))
        code, _, text = run_cli(self.data_dir, "show", view["operation_id"], "--format", "text")
        self.assertIn(f"lost_call:    a call lost in a crash: {sentence}", text)
        self.assertNotIn("started_at:", text)
        # The model's status tool and the refusal a protected call gets.
        guard = RecoveryGuard(self.data_dir)
        try:
            tool = json.loads(guard.status_tool({}))
            refused = json.loads(guard.tool_execution("send_payment", {"to": "bob"},
                                                      lambda: "RAN", session_id="s",
                                                      tool_call_id="c"))
        finally:
            guard.close()
        listed = {operation["operation_id"]: operation for operation in tool["unresolved"]}
        self.assertEqual((listed[view["operation_id"]]["started_at"],
                          listed[view["operation_id"]]["lost_after"]), (None, view["lost_after"]))
        self.assertIn(f"operation {view['operation_id']} (a call lost in a crash: {sentence}",
                      refused["explanation"])
        # Once resolved, show still says when its call can have happened.
        code, _, _ = run_cli(self.data_dir, "resolve", view["operation_id"], "--outcome",
                             "not_applied", "--evidence", "no call in that window (ledger)")
        code, shown, _ = run_cli(self.data_dir, "show", view["operation_id"])
        self.assertEqual((shown["operation"]["state"], shown["operation"]["started_at"],
                          shown["operation"]["lost_after"]), ("resolved", None, view["lost_after"]))
        self.assertVerifies()

    def test_a_journal_none_of_whose_events_verifies_starts_the_window_at_its_creation(self):
        self.damaged()
        database = os.path.join(self.data_dir, "journal.sqlite3")
        connection = sqlite3.connect(database)
        created = int(dict(connection.execute("SELECT key, value FROM metadata"))["created_ns"])
        connection.execute("DROP TRIGGER events_no_update")
        connection.execute("UPDATE events SET payload = replace(payload, 'book_flight', "
                           "'BOOK_FLIGHT') WHERE seq = 1")
        connection.commit()
        connection.close()
        restarted = self.restart()
        self.assertEqual((restarted["carried_over"], restarted["unverified"]), ([], "seq 1: hash_mismatch"))
        view = self.lost_view(restarted)
        self.assertEqual((view["lost_window"]["after_ns"], view["lost_after_source"]),
                         (created, "journal_created"))

    def test_an_unreadable_database_starts_the_window_when_its_marker_was_written(self):
        self.damaged()
        marker = os.stat(os.path.join(self.data_dir, "initialized")).st_mtime_ns
        with open(os.path.join(self.data_dir, "journal.sqlite3"), "r+b") as stream:
            stream.write(b"not a database at all" * 100)
        view = self.lost_view(self.restart())
        self.assertEqual((view["lost_window"]["after_ns"], view["lost_after_source"]),
                         (marker, "marker_written"))
        self.assertIn("(the journal's marker was written)",
                      run_cli(self.data_dir, "status", "--format", "text")[2])

    def test_with_nothing_to_date_it_the_window_says_so(self):
        self.damaged()
        os.unlink(os.path.join(self.data_dir, "initialized"))
        os.unlink(os.path.join(self.data_dir, "journal.sqlite3-wal"))
        with open(os.path.join(self.data_dir, "journal.sqlite3"), "wb") as stream:
            stream.write(b"garbage" * 1000)
        view = self.lost_view(self.restart())
        self.assertEqual((view["lost_after"], view.get("lost_after_source")), (None, None))
        self.assertIn("it started at a time nothing recorded bounds and before "
                      f"{view['lost_before']}", run_cli(self.data_dir, "status",
                                                         "--format", "text")[2])


class RepairedFirstEvent(JournalTestCase):

    def test_a_lost_first_event_dates_its_window_from_the_journal_creation(self):
        service = os.path.join(self.root, "service.sqlite3")
        subprocess.run([sys.executable, WORKER, "call", self.data_dir, service, "--request", "r1",
                        "--kill", "checkpoint_replaced:started"], capture_output=True, timeout=60)
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        created = int(dict(connection.execute("SELECT key, value FROM metadata"))["created_ns"])
        connection.close()
        code, repaired, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence", "killed (test)")
        self.assertEqual(code, 0, repaired)
        [lost] = repaired["unresolved"]
        self.assertEqual((lost["lost_window"]["after_ns"], lost["lost_after_source"]),
                         (created, "journal_created"))
        self.assertIn(f"after the journal's creation ({iso_utc(created)})", repaired["lost_event"])
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
