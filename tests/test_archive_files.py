"""The archive's own files (docs/format.md §Archives): an archive intent
(``archive.json``) names no path the plugin will act on, so a crafted one can
neither delete a sealed archive nor reach outside the data directory, and an
unusable one is ``archive_interrupted`` for readers and writers alike; sealed
archives are never reached through a symbolic link; the leftovers of dead
archivers are removed, those of live ones kept.
"""
from __future__ import annotations

import json
import os
import unittest

from reliability_support import ReliabilityCase, Tool, call
from support import run_cli

from crash_recovery.guard import RecoveryGuard

DEAD_PID = "999999999"


class ArchiveIntentNamesNothing(ReliabilityCase):
    """A sealed archive, then one more call: the archive's files, crafted or left
    behind, as the plugin finds them."""

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "a")
        guard.close()
        code, sealed, text = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, text)
        self.sealed_file = os.path.join(self.data_dir, sealed["archived"]["file"])
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "b")
        guard.close()
        self.victim = os.path.join(self.root, "victim", "archive", "precious.txt")
        os.makedirs(os.path.dirname(self.victim))
        with open(self.victim, "w") as stream:
            stream.write("precious")

    def write_intent(self, intent):
        with open(os.path.join(self.data_dir, "archive.json"), "w") as stream:
            stream.write(intent if isinstance(intent, str) else json.dumps(intent))

    def test_a_crafted_intent_deletes_nothing_it_names(self):
        with open(os.path.join(self.data_dir, "head.json")) as stream:
            current = json.load(stream)
        self.write_intent({"from": current, "to": "6513270e-269e-4d37-b2a7-0123456789ab",
                           "file": os.path.relpath(self.victim, self.data_dir),
                           "temp": os.path.relpath(self.sealed_file, self.data_dir)})
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(call(guard, Tool(), "c"), '{"status": "booked"}')  # the writer undid it
        self.assertTrue(os.path.exists(self.victim))
        self.assertTrue(os.path.exists(self.sealed_file))
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "archive.json")))
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, len(verified["archives_verified"])), (0, 1), text)

    def test_an_unusable_intent_is_interrupted_for_readers_and_writers(self):
        for intent in ("garbage", "", {"from": {"count": 1}, "to": "x"}):
            with self.subTest(intent=intent):
                self.write_intent(intent)
                before = self.snapshot()
                for words in (("status",), ("status", "--check"), ("verify",)):
                    code, result, text = run_cli(self.data_dir, *words)
                    self.assertEqual((code, result["integrity"]), (1, "archive_interrupted"),
                                     text)
                code, _, text = run_cli(self.data_dir, "status", "--format", "prometheus")
                self.assertIn("crash_recovery_gate_closed{", text)
                self.assertIn(f'data_dir="{os.path.abspath(self.data_dir)}"}} 1', text)
                guard = RecoveryGuard(self.data_dir)
                tool = Tool()
                blocked = json.loads(call(guard, tool, "x"))
                guard.close()
                self.assertEqual((blocked["code"], tool.calls), ("archive_interrupted", 0))
                self.assertEqual(self.snapshot(), before)
                self.assertTrue(os.path.exists(self.sealed_file))

    def test_archives_are_never_reached_through_a_symbolic_link(self):
        moved = os.path.join(self.root, "elsewhere.sqlite3")
        os.rename(self.sealed_file, moved)
        os.symlink(moved, self.sealed_file)
        code, result, text = run_cli(self.data_dir, "verify")
        self.assertEqual((code, result["integrity"]), (1, "archive_missing"), text)
        os.unlink(self.sealed_file)
        os.rename(moved, self.sealed_file)
        archive_dir = os.path.dirname(self.sealed_file)
        os.rename(archive_dir, archive_dir + ".real")
        os.symlink(archive_dir + ".real", archive_dir)
        code, result, text = run_cli(self.data_dir, "verify")
        self.assertEqual((code, result["integrity"]), (1, "archive_missing"), text)

    def plant(self, directory, pid):
        """A half-written copy of process ``pid`` in ``directory`` (and its
        SQLite -journal); returns both paths."""
        paths = [os.path.join(directory, f"copy.{pid}-0a1b2c3d.tmp" + suffix)
                 for suffix in ("", "-journal")]
        for path in paths:
            with open(path, "wb") as stream:
                stream.write(b"half")
        return paths

    def test_leftovers_of_dead_archivers_are_removed(self):
        copies = os.path.join(os.path.dirname(self.sealed_file), "copies")
        leftovers = self.plant(copies, DEAD_PID) + [
            os.path.join(self.data_dir, f"archive.json.{DEAD_PID}-0a1b2c3d.tmp")]
        with open(leftovers[-1], "wb") as stream:
            stream.write(b"half")
        live = self.plant(copies, os.getpid())
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "c")
        guard.close()
        self.assertEqual([path for path in leftovers if os.path.exists(path)], [])
        self.assertEqual(sorted(os.listdir(copies)), sorted(map(os.path.basename, live)))
        self.assertTrue(os.path.exists(self.sealed_file))

    def test_a_long_running_workers_next_write_removes_a_dead_archivers_copy(self):
        copies = os.path.join(os.path.dirname(self.sealed_file), "copies")
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c")  # its first write is behind it
        dead = self.plant(copies, DEAD_PID)
        call(guard, Tool(), "d")
        self.assertEqual(os.listdir(copies), [])
        self.assertTrue(all(not os.path.exists(path) for path in dead))

    def test_a_copy_left_in_archive_by_an_earlier_version_is_removed_by_archive(self):
        # Copies were once made in archive/ itself: a dead archiver's is removed
        # by the next archive (which copies the journal anyway), never looked
        # for by a worker's call.
        archive_dir = os.path.dirname(self.sealed_file)
        dead = self.plant(archive_dir, DEAD_PID)
        live = self.plant(archive_dir, os.getpid())
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "c")
        guard.close()
        self.assertTrue(all(os.path.exists(path) for path in dead + live))
        code, sealed, text = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, text)
        self.assertEqual(sorted(os.listdir(archive_dir)), sorted(
            ["copies", os.path.basename(self.sealed_file),
             os.path.basename(sealed["archived"]["file"])] + [os.path.basename(p) for p in live]))
        self.assertEqual(os.listdir(os.path.join(archive_dir, "copies")), [])
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, len(verified["archives_verified"])), (0, 2), text)


if __name__ == "__main__":
    unittest.main()
