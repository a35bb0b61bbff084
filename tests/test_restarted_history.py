"""What a restarted journal keeps reachable (docs/cli.md §restart-journal,
§verify; docs/format.md §Restarted journals): the archives sealed before the
restart, through the new journal's own commands, and exported checkpoints of
the journal it replaced, checked against what the restart verified of it."""
from __future__ import annotations

import json
import os
import unittest

from support import JournalTestCase, run_cli

from crash_recovery.guard import RecoveryGuard

EVIDENCE = "head.json deleted by a cleanup script at 07:40 (cron log)"


class RestartedJournal(JournalTestCase):
    """Three calls, an archive, two calls, an export of each state, then
    head.json lost and the journal restarted."""

    def calls(self, *names: str) -> None:
        guard = RecoveryGuard(self.data_dir)
        for name in names:
            guard.tool_execution("send_receipt", {"to": name}, lambda: {"status": "sent"},
                                 session_id="s", tool_call_id=name)
        guard.close()

    def export(self, name: str) -> str:
        code, checkpoint, _ = run_cli(self.data_dir, "checkpoint")
        self.assertEqual(code, 0, checkpoint)
        path = os.path.join(self.root, f"{name}.json")
        with open(path, "w", encoding="utf-8") as stream:
            json.dump(checkpoint, stream)
        return path

    def setUp(self):
        super().setUp()
        self.calls("a", "b", "c")
        self.before_archive = self.export("before-archive")
        code, archived, _ = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, archived)
        self.archive_anchor = archived["archived"]
        self.calls("d")
        self.early = self.export("early")      # 1 anchor + 2 events
        self.calls("e")
        self.late = self.export("late")        # every event the restart verifies
        os.unlink(os.path.join(self.data_dir, "head.json"))
        code, self.restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual(code, 0, self.restarted)

    def verify_export(self, path: str) -> tuple:
        code, document, _ = run_cli(self.data_dir, "verify", "--checkpoint", path)
        return code, document

    def test_archives_sealed_before_the_restart_stay_reachable(self):
        self.assertEqual(self.restarted["archive_anchor"], self.archive_anchor)
        self.assertNotIn("archive", self.restarted["moved"])
        code, log, _ = run_cli(self.data_dir, "log", "--all")
        self.assertEqual(code, 0, log)
        archived = [event for event in log["events"]
                    if event["journal_id"] == self.archive_anchor["journal_id"]]
        self.assertEqual([event.get("tool_call_id") for event in archived
                          if event["kind"] == "started"], ["a", "b", "c"])
        self.assertEqual(log["events"][len(archived)]["kind"], "archived")  # the new journal's event 1
        code, verified, _ = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, verified["archives_verified"]), (0, [self.archive_anchor]))
        code, shown, _ = run_cli(self.data_dir, "show", archived[0]["operation_id"])
        self.assertEqual((code, shown["archive"], shown["operation"]["tool_call_id"]),
                         (0, self.archive_anchor["file"], "a"))
        code, document = self.verify_export(self.before_archive)
        self.assertEqual((code, document["external_checkpoint"]), (0, "ancestor"))
        self.assertVerifies()

    def test_an_export_of_the_replaced_journal_is_checked_against_the_restart(self):
        for path in (self.early, self.late):
            with self.subTest(export=os.path.basename(path)):
                code, document = self.verify_export(path)
                self.assertEqual((code, document["external_checkpoint"]), (0, "replaced_ancestor"),
                                 document)
                replaced = document["replaced"]
                self.assertEqual((replaced["replaced_journal_id"], replaced["evidence_directory"],
                                  replaced["last_verified_count"]),
                                 (self.restarted["replaced_journal_id"],
                                  self.restarted["evidence_directory"],
                                  self.restarted["last_verified_checkpoint"]["count"]))
        code, _, text = run_cli(self.data_dir, "verify", "--checkpoint", self.late,
                                "--format", "text")
        self.assertEqual(code, 0, text)
        self.assertIn(f"the exported checkpoint is a prefix of journal "
                      f"{self.restarted['replaced_journal_id']}, which restart-journal replaced "
                      f"(kept in {self.restarted['evidence_directory']})", text.splitlines()[0])

    def test_an_export_beyond_what_the_restart_verified_names_the_lost_events(self):
        with open(self.late, encoding="utf-8") as stream:
            late = json.load(stream)
        # An export taken later than anything the restart could verify: the
        # events it anchors after that are the ones head.json's loss hid.
        beyond = dict(late, count=late["count"] + 2, head="0" * 64)
        path = os.path.join(self.root, "beyond.json")
        with open(path, "w", encoding="utf-8") as stream:
            json.dump(beyond, stream)
        code, document = self.verify_export(path)
        error = document["error"]
        self.assertEqual((code, error["code"], document["integrity"]),
                         (1, "checkpoint_lost_in_restart", "ok"), document)
        self.assertEqual((error["checkpoint_count"], error["last_verified_count"]),
                         (late["count"] + 2, late["count"]))
        self.assertIn(" show ", error["next"])
        self.assertNotIn("restart-journal", error["next"])
        code, _, text = run_cli(self.data_dir, "verify", "--checkpoint", path, "--format", "text")
        self.assertEqual(text.splitlines()[:2], [
            "error: checkpoint_lost_in_restart",
            f"  the export anchors {late['count'] + 2} events of journal "
            f"{self.restarted['replaced_journal_id']}, which restart-journal replaced; only its "
            f"first {late['count']} verified then. The events after them are the ones a crash "
            "or a damage lost: the operation of tool unknown that the restart brought back "
            "stands for them"])
        self.assertIn("hint: the restart brought back an operation of tool unknown", text)

    def test_an_export_that_disagrees_with_the_replaced_journal(self):
        with open(self.early, encoding="utf-8") as stream:
            forged = dict(json.load(stream), head="1" * 64)
        path = os.path.join(self.root, "forged.json")
        with open(path, "w", encoding="utf-8") as stream:
            json.dump(forged, stream)
        code, document = self.verify_export(path)
        self.assertEqual((code, document["error"]["code"], document["integrity"]),
                         (1, "checkpoint_replaced_mismatch", "ok"), document)
        self.assertNotIn("restart-journal", document["error"]["next"])
        # Without the evidence folder's database it cannot be checked at all.
        os.unlink(os.path.join(self.data_dir, self.restarted["evidence_directory"],
                               "journal.sqlite3"))
        code, document = self.verify_export(self.early)
        self.assertEqual((code, document["error"]["code"]),
                         (1, "checkpoint_replaced_unverifiable"), document)


if __name__ == "__main__":
    unittest.main()
