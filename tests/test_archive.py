"""Archives: sealing, anchors, reading across segments,
refusals, tampering, and a SIGKILL at every step of the switch.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ReliabilityCase
from support import TESTS, reference, run_cli, workspace_verifier

from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal

TIMEOUT_SECONDS = 60


def book(guard, name, result='{"status": "booked"}'):
    return guard.tool_execution(tool_name="book_trip", args={"n": name},
                                next_call=lambda: result, session_id="s", tool_call_id=name)


def all_events(data_dir):
    """Every event of every segment (``log --all``), as (journal_id, kind, operation_id)."""
    code, output, text = run_cli(data_dir, "log", "--all")
    assert code == 0, text
    return [(event["journal_id"], event["kind"], event.get("operation_id"))
            for event in output["events"]]


class ArchiveRoundTrip(ReliabilityCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        for name in ("a", "b", "c"):
            book(guard, name)
        guard.close()  # before reading the file directly (see support.py's hazard note)
        self.exported = run_cli(self.data_dir, "checkpoint")[1]
        self.early = dict(self.exported, count=2,
                          head=reference.verify(self.data_dir).hash_at(2))
        self.guard = RecoveryGuard(self.data_dir)
        self.addCleanup(self.guard.close)

    def test_seal_read_and_verify_across_the_archive(self):
        code, sealed, text = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, text)
        anchor = sealed["archived"]
        self.assertEqual((anchor["journal_id"], anchor["count"], anchor["head"]),
                         (self.exported["journal_id"], 6, self.exported["head"]))
        path = os.path.join(self.data_dir, anchor["file"])
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o400)  # read-only, private
        self.assertEqual(sealed["checkpoint_after"]["count"], 1)
        self.assertEqual(book(self.guard, "d"), '{"status": "booked"}')  # the live guard goes on
        fresh = RecoveryGuard(self.data_dir)
        self.assertEqual(book(fresh, "e"), '{"status": "booked"}')
        fresh.close()
        live = self.assertVerifies()  # the live segment alone, as any reader sees it
        self.assertEqual(live.kinds(), ["archived"] + ["started", "returned"] * 2)
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, [a["journal_id"] for a in verified["archives_verified"]]),
                         (0, [anchor["journal_id"]]), text)
        events = all_events(self.data_dir)
        self.assertEqual([kind for _, kind, _ in events],
                         ["started", "returned"] * 3 + ["archived"] + ["started", "returned"] * 2)
        first = events[0][2]
        shown = run_cli(self.data_dir, "show", first)[1]
        self.assertEqual((shown["archive"], shown["operation"]["state"]), (anchor["file"], "returned"))
        for checkpoint in (self.exported, self.early):  # exports from before still prove their prefix
            with open(os.path.join(self.root, "cp.json"), "w") as stream:
                json.dump(checkpoint, stream)
            code, result, text = run_cli(self.data_dir, "verify", "--checkpoint",
                                         os.path.join(self.root, "cp.json"))
            self.assertEqual((code, result["external_checkpoint"]), (0, "ancestor"), text)
        with open(os.path.join(self.root, "cp.json"), "w") as stream:
            json.dump(dict(self.early, head="0" * 64), stream)
        code, result, _ = run_cli(self.data_dir, "verify", "--checkpoint",
                                  os.path.join(self.root, "cp.json"))
        self.assertEqual((code, result["integrity"]), (1, "checkpoint_not_ancestor"))
        # A second archive chains to the first.
        self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)
        verified = run_cli(self.data_dir, "verify", "--all")[1]
        self.assertEqual(len(verified["archives_verified"]), 2)
        self.assertEqual(len(all_events(self.data_dir)), 6 + 5 + 1)
        with open(os.path.join(self.data_dir, "operator.log")) as stream:
            self.assertEqual([json.loads(line)["action"] for line in stream],
                             ["archive", "archive"])
        # The text forms read an anchor event (no operation id) and every segment.
        code, _, text = run_cli(self.data_dir, "--format", "text", "log")
        self.assertEqual(code, 0, text)
        [anchor_line] = [line for line in text.splitlines() if " archived " in line]
        self.assertIn("archive/", anchor_line)
        code, _, text = run_cli(self.data_dir, "--format", "text", "log", "--all")
        self.assertEqual(code, 0, text)
        self.assertEqual(len(text.splitlines()), 2 + 1 + 6 + 5 + 1)
        self.assertEqual(sum(1 for line in text.splitlines() if " archived " in line), 2)

    def test_refusals(self):
        with self.assertRaises(RuntimeError):
            self.guard.tool_execution(tool_name="pay", args={}, next_call=_boom, session_id="s",
                                      tool_call_id="x")
        self.guard.close()
        before = self.snapshot()
        code, refused, _ = run_cli(self.data_dir, "archive")
        self.assertEqual((code, refused["error"]["code"]), (1, "archive_refused"))
        self.assertEqual(self.snapshot(), before)
        [operation] = run_cli(self.data_dir, "status")[1]["unresolved"]
        run_cli(self.data_dir, "resolve", operation["operation_id"], "--outcome", "not_applied",
                "--evidence", "no charge")
        self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)
        code, refused, _ = run_cli(self.data_dir, "archive")  # only the anchor is live
        self.assertEqual((code, refused["error"]["code"]), (1, "archive_refused"))

    def test_refused_while_a_call_runs(self):
        seen = {}

        def tool():
            seen["archive"] = run_cli(self.data_dir, "archive")
            return "ok"

        self.assertEqual(self.guard.tool_execution(tool_name="pay", args={}, next_call=tool,
                                                   session_id="s", tool_call_id="x"), "ok")
        code, refused, _ = seen["archive"]
        self.assertEqual((code, refused["error"]["code"]), (1, "owner_running"))

    def test_tampered_or_missing_archives_close_the_gate(self):
        anchor = run_cli(self.data_dir, "archive")[1]["archived"]
        path = os.path.join(self.data_dir, anchor["file"])
        saved = os.path.join(self.root, "saved.sqlite3")
        shutil.copy(path, saved)
        os.chmod(path, 0o644)
        for case, damage, code in (
                ("missing", lambda: os.remove(path), "archive_missing"),
                ("tail removed", lambda: _edit(path, "DELETE FROM events WHERE seq = 6"),
                 "archive_mismatch")):
            with self.subTest(case):
                shutil.copy(saved, path)
                damage()
                fresh = RecoveryGuard(self.data_dir)
                calls = []
                blocked = json.loads(fresh.tool_execution(tool_name="pay", args={},
                                                          next_call=lambda: calls.append(1),
                                                          session_id="s", tool_call_id="t"))
                fresh.close()
                self.assertEqual((blocked["code"], calls), (code, []))
                self.assertEqual(run_cli(self.data_dir, "verify")[1]["integrity"], code)
        shutil.copy(saved, path)
        _edit(path, "UPDATE events SET payload = replace(payload, 'book_trip', 'book_trap') "
                    "WHERE seq = 3")  # the middle: only a full check of the archive sees it
        self.assertEqual(run_cli(self.data_dir, "verify")[0], 0)
        code, result, _ = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, result["integrity"]), (1, "archive_mismatch"))
        self.assertIn("hash_mismatch", result["error"]["message"])

    def test_automatic_archive(self):
        guard = RecoveryGuard(self.data_dir, archive_after_events=8)
        self.addCleanup(guard.close)
        book(guard, "d")  # 8 events: archived right after the call
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual(status["checkpoint"]["count"], 1)
        self.assertEqual(len(run_cli(self.data_dir, "verify", "--all")[1]["archives_verified"]), 1)
        book(guard, "e")
        self.assertEqual(len(all_events(self.data_dir)), 8 + 3)


def _boom():
    raise RuntimeError("gateway")


def _edit(path, statement):
    import sqlite3
    connection = sqlite3.connect(path)
    try:
        for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            connection.execute(f'DROP TRIGGER "{name}"')
        connection.execute(statement)
        connection.commit()
    finally:
        connection.close()


# Archive in a fresh process and SIGKILL it at the N-th boundary BOUNDARY:KIND.
ARCHIVER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery.journal import Journal
    data_dir, wanted = sys.argv[1], tuple(sys.argv[2].split(":"))

    def hook(boundary, kind):
        if (boundary, kind) == wanted:
            os.kill(os.getpid(), signal.SIGKILL)

    durable.set_boundary_hook(hook)
    Journal(data_dir, create=False).archive()
""").format(tests=TESTS)

ARCHIVE_BOUNDARIES = (
    ("archive_copied", "archived"), ("begin", "archived"), ("archive_completed", "archived"),
    ("checkpoint_written", "archive_intent"), ("checkpoint_replaced", "archive_intent"),
    ("directory_fsynced", "archive_intent"), ("archive_sealed", "archived"),
    ("inserted", "archived"), ("checkpoint_written", "archived"),
    ("checkpoint_replaced", "archived"), ("directory_fsynced", "archived"),
    ("checkpoint_replaced", "archived_marker"), ("directory_fsynced", "archived_marker"),
    ("committed", "archived"), ("intent_removed", "archived"))


class ArchiveCrashMatrix(ReliabilityCase):
    """A SIGKILL at every step of ``archive``: afterwards the history is the old
    state or the new one, every event exactly once -- never both, never neither."""

    def test_kill_at_every_step(self):
        for boundary in ARCHIVE_BOUNDARIES:
            with self.subTest(boundary=":".join(boundary)):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                guard = RecoveryGuard(self.data_dir)
                for name in ("a", "b"):
                    book(guard, name)
                guard.close()
                original = reference.verify(self.data_dir)
                killed = subprocess.run([sys.executable, "-c", ARCHIVER, self.data_dir,
                                         ":".join(boundary)], capture_output=True, text=True,
                                        timeout=TIMEOUT_SECONDS)
                self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
                # A reader: a valid state, or the documented interruption verdict.
                code, status, text = run_cli(self.data_dir, "status")
                self.assertTrue(code == 0 or status["integrity"] == "archive_interrupted", text)
                # The next writer finishes or undoes the switch, then works.
                guard = RecoveryGuard(self.data_dir)
                self.assertEqual(book(guard, "c"), '{"status": "booked"}')
                guard.close()
                code, verified, text = run_cli(self.data_dir, "verify", "--all")
                self.assertEqual(code, 0, text)
                archived = len(verified["archives_verified"])
                self.assertIn(archived, (0, 1))
                events = all_events(self.data_dir)
                counts = collections.Counter((kind, op) for _, kind, op in events)
                for event in original.events:  # each old event exactly once
                    self.assertEqual(counts[(event["kind"], event["operation_id"])], 1)
                self.assertEqual(len(events), len(original.events) + 2 + archived)
                # archive/ holds the archives and copies/ (made at step 1); the
                # killed archiver's copy is gone: undone, sealed, or swept.
                archive_dir = os.path.join(self.data_dir, "archive")
                self.assertEqual(sorted(os.listdir(archive_dir)), sorted(
                    ["copies"] + [os.path.basename(anchor["file"])
                                  for anchor in verified["archives_verified"]]))
                self.assertEqual(os.listdir(os.path.join(archive_dir, "copies")), [])
                self.assertFalse(os.path.exists(os.path.join(self.data_dir, "archive.json")))
                checker = workspace_verifier()
                if checker is not None:
                    self.assertTrue(checker.verify(self.data_dir, allow_unknown_kinds=True).ok)


if __name__ == "__main__":
    unittest.main()
