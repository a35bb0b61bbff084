"""A refusal changes no file of the journal (docs/format.md §Files, "What
reading and refusing leave"): the bytes and modification time of every file in
the data directory -- the database, its -wal, head.json, the marker -- before
and after each read-only command (status, show, log, verify, checkpoint), each
protected call a guard refuses and each refused restart-journal, on each kind
of damage.  Only SQLite's -shm (the WAL's index, rebuilt by the first
connection) may change, and an empty -wal with its -shm may appear where the
journal had no -wal (all events in the database file).

Found by issue 28 (item 4): a guard whose journal failed verification let
SQLite fold the WAL into the database when its connection closed (and delete
it), writing WAL pages into a truncated database; read-only commands created
an empty -wal where the WAL was deleted.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

from support import REPO, JournalTestCase, reference, run_cli

TESTS = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS, "crash_worker.py")
# One protected call in a fresh process (the guard a restarted worker is).
REFUSED_CALL = (f"import json, sys; sys.path.insert(0, {TESTS!r}); import support\n"
                "from crash_recovery.guard import RecoveryGuard\n"
                "guard = RecoveryGuard(sys.argv[1], busy_timeout=1)\n"
                "result = guard.tool_execution('send_payment', {'to': 'bob'}, lambda: 'RAN', "
                "session_id='s', tool_call_id='c')\n"
                "guard.close()\nprint(result)\n")


def _drop_wal(data_dir: str) -> None:
    os.unlink(os.path.join(data_dir, "journal.sqlite3-wal"))


def _edit_row(data_dir: str) -> None:
    connection = sqlite3.connect(os.path.join(data_dir, "journal.sqlite3"))
    connection.execute("DROP TRIGGER events_no_update")
    connection.execute("UPDATE events SET payload = replace(payload, 'book_flight', "
                       "'BOOK_FLIGHT') WHERE seq = 1")
    connection.commit()
    connection.close()


def _truncate_database(data_dir: str) -> None:
    with open(os.path.join(data_dir, "journal.sqlite3"), "r+b") as stream:
        stream.truncate(4096)


def _edit_head(data_dir: str) -> None:
    path = os.path.join(data_dir, "head.json")
    with open(path, encoding="utf-8") as stream:
        checkpoint = json.load(stream)
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(dict(checkpoint, head="0" * 64), stream)


def _corrupt_marker(data_dir: str) -> None:
    with open(os.path.join(data_dir, "initialized"), "w", encoding="utf-8") as stream:
        stream.write("not the marker\n")


def _lose_head(data_dir: str) -> None:
    os.unlink(os.path.join(data_dir, "head.json"))


# name -> (damage, the verdict it reads as)
DAMAGE = {"wal_deleted": (_drop_wal, "wal_missing"),
          "row_edited": (_edit_row, "hash_mismatch"),
          "database_truncated": (_truncate_database, "database_corrupt"),
          "head_edited": (_edit_head, "checkpoint_mismatch"),
          "marker_overwritten": (_corrupt_marker, "marker_corrupt"),
          "head_deleted": (_lose_head, "checkpoint_missing")}


def changed_files(before: dict, after: dict) -> list:
    """The files that changed, but for what SQLite itself may change: the
    -shm, and an empty -wal (with its -shm) where there was no -wal."""
    changed = []
    for name in sorted(before.keys() | after.keys()):
        if name.endswith("-shm") or before.get(name) == after.get(name):
            continue
        if name.endswith("-wal") and name not in before and after[name][0] == b"":
            continue
        changed.append(name)
    return changed


def files_as_found(data_dir: str) -> dict:
    """``{name: (bytes, mtime_ns)}`` of every file in the data directory."""
    found = {}
    for name in sorted(os.listdir(data_dir)):
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as stream:
                found[name] = (stream.read(), os.stat(path).st_mtime_ns)
    return found


class RefusalsChangeNothing(JournalTestCase):
    """Each surface, on each damage: the files as found, byte for byte."""

    maxDiff = 2000

    @classmethod
    def setUpClass(cls):
        # A journal whose events are partly in its WAL: r1 returned (folded
        # into the database when its worker closed), r2 killed inside its tool.
        cls.base_root = tempfile.mkdtemp(prefix="crash-recovery-refusal-")
        cls.base = os.path.join(cls.base_root, "data")
        service = os.path.join(cls.base_root, "service.sqlite3")
        for words in (("--request", "r1"), ("--request", "r2", "--kill", "side_effect:downstream")):
            subprocess.run([sys.executable, WORKER, "call", cls.base, service, *words],
                           capture_output=True, timeout=60)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.base_root, ignore_errors=True)

    def damaged(self, name: str) -> str:
        data_dir = os.path.join(tempfile.mkdtemp(dir=self.root), name)  # one per surface
        shutil.copytree(self.base, data_dir)
        DAMAGE[name][0](data_dir)
        return data_dir

    def check(self, surface) -> None:
        for name, (_, verdict) in DAMAGE.items():
            with self.subTest(damage=name):
                data_dir = self.damaged(name)
                before = files_as_found(data_dir)
                outcome = surface(data_dir)
                self.assertIn(verdict, outcome)
                self.assertEqual(changed_files(before, files_as_found(data_dir)), [],
                                 f"{name}: {outcome[:200]}")

    def cli(self, *words: str):
        def surface(data_dir: str) -> str:
            return run_cli(data_dir, *words)[2]
        return surface

    def test_a_refused_protected_call(self):
        def refused(data_dir: str) -> str:
            completed = subprocess.run([sys.executable, "-c", REFUSED_CALL, data_dir],
                                       capture_output=True, text=True, timeout=60, cwd=REPO)
            self.assertNotIn("RAN", completed.stdout)
            return completed.stdout
        self.check(refused)

    def test_read_only_commands(self):
        pending = reference.verify(self.base, require_head=False).unresolved()[0]
        for words in (("status",), ("verify",), ("log",), ("checkpoint",), ("show", pending)):
            with self.subTest(command=words[0]):
                self.check(self.cli(*words))

    def test_a_refused_restart_journal(self):
        for name in DAMAGE:
            with self.subTest(damage=name):
                data_dir = self.damaged(name)
                os.mkdir(os.path.join(data_dir, "replaced.blocker"))
                with open(os.path.join(data_dir, "replaced"), "w", encoding="utf-8") as stream:
                    stream.write("in the way\n")
                before = files_as_found(data_dir)
                code, document, _ = run_cli(data_dir, "restart-journal", "--evidence", "x")
                self.assertEqual((code, document["error"]["code"]), (1, "storage_unavailable"))
                self.assertEqual(changed_files(before, files_as_found(data_dir)), [])


if __name__ == "__main__":
    unittest.main()
