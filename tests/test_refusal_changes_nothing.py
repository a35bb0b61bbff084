"""A refusal changes no file (docs/cli.md §Verdict codes: "files are left as
found"): the bytes and modification time of every file in the data directory
-- the database, its -wal and -shm, head.json, the marker -- before and after
each read-only command (status, show, log, verify, checkpoint) and each
protected call a guard refuses, on each kind of damage.

Found by issue 28 (item 4): a guard whose journal failed verification lets
SQLite fold the WAL into the database when its connection closes (and delete
it), and read-only commands rewrite -shm or create an empty -wal where the WAL
was deleted.  That lives in the storage layer; the tests that still fail are
marked ``expectedFailure`` until it is fixed there.
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
DAMAGE = {"wal_deleted": (_drop_wal, "checkpoint_ahead"),
          "row_edited": (_edit_row, "hash_mismatch"),
          "database_truncated": (_truncate_database, "database_corrupt"),
          "head_edited": (_edit_head, "checkpoint_mismatch"),
          "marker_overwritten": (_corrupt_marker, "marker_corrupt"),
          "head_deleted": (_lose_head, "checkpoint_missing")}


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
        data_dir = os.path.join(self.root, name)
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
                after = files_as_found(data_dir)
                changed = sorted(key for key in before.keys() | after.keys()
                                 if before.get(key) != after.get(key))
                self.assertEqual(changed, [], f"{name}: {outcome[:200]}")

    def cli(self, *words: str):
        def surface(data_dir: str) -> str:
            return run_cli(data_dir, *words)[2]
        return surface

    # issue 28 item 4, storage layer: a refused call's connection folds the
    # WAL into the database (and may delete it) when it closes.
    @unittest.expectedFailure
    def test_a_refused_protected_call(self):
        def refused(data_dir: str) -> str:
            completed = subprocess.run([sys.executable, "-c", REFUSED_CALL, data_dir],
                                       capture_output=True, text=True, timeout=60, cwd=REPO)
            self.assertNotIn("RAN", completed.stdout)
            return completed.stdout
        self.check(refused)

    # issue 28 item 4, storage layer: read-only commands rewrite -shm and
    # create an empty -wal where the WAL was deleted.
    @unittest.expectedFailure
    def test_read_only_commands(self):
        pending = reference.verify(self.base, require_head=False).unresolved()[0]
        for words in (("status",), ("verify",), ("log",), ("checkpoint",), ("show", pending)):
            with self.subTest(command=words[0]):
                self.check(self.cli(*words))

    # issue 28 item 4, storage layer: restart-journal's refusal writes nothing
    # itself (tests/test_restart_failures.py), but the read-only reading of
    # the verdict it starts with rewrites -shm / creates an empty -wal.
    @unittest.expectedFailure
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
                after = files_as_found(data_dir)
                before.pop("owner.lock", None)  # the lock's own tag, cleared on release
                after.pop("owner.lock", None)
                self.assertEqual(sorted(key for key in before.keys() | after.keys()
                                        if before.get(key) != after.get(key)), [])


if __name__ == "__main__":
    unittest.main()
