"""A journal file's name holding something else than a regular file -- a
symbolic link, a directory, a FIFO, a device -- reads ``foreign_file`` on
every surface, and ``restart-journal`` moves the journal forward, keeping the
odd file itself, untouched and never followed, in the evidence folder
(docs/cli.md §Verdict codes, §restart-journal)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import unittest

from support import JournalTestCase, run_cli

from crash_recovery.guard import RecoveryGuard

NAMES = ("head.json", "initialized", "journal.sqlite3", "journal.sqlite3-wal",
         "journal.sqlite3-shm")
KINDS = {"symbolic link": stat.S_ISLNK, "directory": stat.S_ISDIR, "FIFO": stat.S_ISFIFO,
         "character device": stat.S_ISCHR}
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_worker.py")


class ForeignFiles(JournalTestCase):

    def setUp(self):
        super().setUp()
        # A journal with a pending call (its tool ran), copied for each case.
        self.base = os.path.join(self.root, "base")
        service = os.path.join(self.root, "service.sqlite3")
        for words in (("--request", "r1"), ("--request", "r2", "--kill", "side_effect:downstream")):
            subprocess.run([sys.executable, WORKER, "call", self.base, service, *words],
                           capture_output=True, timeout=60)

    def plant(self, name: str, kind: str) -> str:
        """A copy of the base journal with ``kind`` at ``name``."""
        self.data_dir = os.path.join(self.root, f"{name}-{kind.replace(' ', '-')}")
        shutil.copytree(self.base, self.data_dir)
        path = os.path.join(self.data_dir, name)
        if os.path.lexists(path):
            os.rename(path, os.path.join(self.root, f"{name}-{kind}.moved-away"))
        target = os.path.join(self.root, "the link's target")
        with open(target, "w", encoding="utf-8") as stream:
            stream.write("never written through the link\n")
        if kind == "symbolic link":
            os.symlink(target, path)
        elif kind == "directory":
            os.mkdir(path)
        elif kind == "FIFO":
            os.mkfifo(path)
        else:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null
        return target

    def test_every_surface_says_foreign_file_and_restart_keeps_it(self):
        if os.getuid() != 0:
            self.skipTest("a device node needs root")
        kinds = list(KINDS)
        # head.json as every kind; each other file as one, in turn.
        cases = [("head.json", kind) for kind in kinds] + [
            (name, kinds[index % len(kinds)]) for index, name in enumerate(NAMES[1:])]
        for name, kind in cases:
            is_kind = KINDS[kind]
            with self.subTest(name=name, kind=kind):
                target = self.plant(name, kind)
                code, status, _ = run_cli(self.data_dir, "status")
                error = status["error"]
                self.assertEqual((code, status["integrity"], error["file"], error["file_type"]),
                                 (1, "foreign_file", name, kind))
                self.assertIn(" restart-journal --evidence ", error["next"])
                guard = RecoveryGuard(self.data_dir)
                try:
                    refused = json.loads(guard.tool_execution(
                        "send_payment", {"to": "bob"}, lambda: "RAN", session_id="s",
                        tool_call_id="c"))
                finally:
                    guard.close()
                self.assertEqual((refused["blocked"], refused["code"]), (True, "foreign_file"))
                code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence",
                                             f"a {kind} planted as {name}")
                self.assertEqual((code, restarted["found"]), (0, "foreign_file"), restarted)
                kept = os.path.join(self.data_dir, restarted["evidence_directory"], name)
                self.assertTrue(is_kind(os.lstat(kept).st_mode), kept)
                with open(target, encoding="utf-8") as stream:
                    self.assertEqual(stream.read(), "never written through the link\n")
                code, status, _ = run_cli(self.data_dir, "status")
                self.assertEqual((code, status["gate"]), (0, "closed"), status)
                self.assertTrue(restarted["carried_over"] or name == "journal.sqlite3"
                                or restarted["lost_operation"])
                self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
