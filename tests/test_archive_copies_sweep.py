"""Looking for dead archivers' copies costs the same however many archives
there are (docs/format.md §Files, §Archives): unfinished copies live in
``archive/copies/``, and a writer never lists ``archive/`` itself -- counted
by the directory listings a real process makes, never by the clock.  An
intent left by an earlier version, which made its copies in ``archive/``,
is still settled.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ReliabilityCase, Tool, call
from support import TESTS, run_cli
from test_archive import ARCHIVER

from crash_recovery.guard import RecoveryGuard
from crash_recovery.storage import archive

TIMEOUT_SECONDS = 120
DEAD_PID = "999999999"
ARCHIVES = 4

# A fresh worker process: every os.listdir / os.scandir it makes is recorded;
# its first protected call, then a dead archiver's copy planted in
# archive/copies/, then a second call.  Prints the directories each call listed.
COUNTING_WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import support
    from reliability_support import Tool, call
    from crash_recovery.guard import RecoveryGuard
    data_dir, planted = sys.argv[1], sys.argv[2]
    listed = []
    for name in ("listdir", "scandir"):
        def counting(path=".", _real=getattr(os, name)):
            listed.append(os.path.abspath(os.fsdecode(path)))
            return _real(path)
        setattr(os, name, counting)
    guard = RecoveryGuard(data_dir)
    first = call(guard, Tool(), "first")
    at_first = list(listed)
    with open(planted, "wb") as stream:
        stream.write(b"half")
    second = call(guard, Tool(), "second")
    guard.close()
    print(json.dumps({{"results": [first, second], "first": at_first,
                      "second": listed[len(at_first):]}}))
""").format(tests=TESTS)


class SweepIndependentOfArchives(ReliabilityCase):
    """A data directory with several archives: a fresh worker's first call and
    a long-running one's next call look only in archive/copies/."""

    def setUp(self):
        super().setUp()
        self.data_dir = os.path.abspath(self.data_dir)
        for number in range(ARCHIVES):
            guard = RecoveryGuard(self.data_dir)
            call(guard, Tool(), f"call-{number}")
            guard.close()
            code, _, text = run_cli(self.data_dir, "archive")
            self.assertEqual(code, 0, text)
        self.archive_dir = os.path.join(self.data_dir, "archive")
        self.copies = os.path.join(self.archive_dir, "copies")

    def test_a_writer_never_lists_the_archives(self):
        dead = os.path.join(self.copies, f"copy.{DEAD_PID}-0a1b2c3d.tmp")
        with open(dead, "wb") as stream:
            stream.write(b"half")
        planted = os.path.join(self.copies, f"copy.{DEAD_PID}-1b2c3d4e.tmp")
        worker = subprocess.run([sys.executable, "-c", COUNTING_WORKER, self.data_dir, planted],
                                capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        self.assertEqual(worker.returncode, 0, worker.stderr)
        report = json.loads(worker.stdout)
        self.assertEqual(report["results"], ['{"status": "booked"}'] * 2)
        for moment in ("first", "second"):
            under_archive = [path for path in report[moment]
                             if path == self.archive_dir or path.startswith(self.archive_dir + "/")]
            # archive/copies/ (it changed since the last look), archive/ never.
            self.assertEqual(set(under_archive), {self.copies}, (moment, report[moment]))
        self.assertEqual(os.listdir(self.copies), [])  # both dead copies removed
        self.assertEqual(len([name for name in os.listdir(self.archive_dir)
                              if name.endswith(".sqlite3")]), ARCHIVES)

    def test_a_dead_archivers_copy_is_removed_by_a_running_and_by_a_fresh_writer(self):
        worker = RecoveryGuard(self.data_dir)
        self.addCleanup(worker.close)
        self.assertEqual(call(worker, Tool(), "early"), '{"status": "booked"}')
        for writer in ("running", "fresh"):
            with self.subTest(writer=writer):
                killed = subprocess.run([sys.executable, "-c", ARCHIVER, self.data_dir,
                                         "archive_copied:archived"],
                                        capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
                self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
                [copy] = os.listdir(self.copies)
                self.assertRegex(copy, r"^copy\.\d+-[0-9a-f]{8}\.tmp$")
                guard = worker if writer == "running" else RecoveryGuard(self.data_dir)
                self.assertEqual(call(guard, Tool(), writer), '{"status": "booked"}')
                if guard is not worker:
                    guard.close()
                self.assertEqual(os.listdir(self.copies), [])
        worker.close()
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, len(verified["archives_verified"])), (0, ARCHIVES), text)


class IntentOfAnEarlierVersion(ReliabilityCase):
    """A switch interrupted by an earlier version, whose intent names its copy
    in archive/ itself, is undone like any other; the copy goes with it."""

    ARCHIVER_KILLED_AFTER_INTENT = "directory_fsynced:archive_intent"

    def test_an_intent_naming_a_copy_in_archive_is_undone_and_the_copy_removed(self):
        guard = RecoveryGuard(self.data_dir)
        call(guard, Tool(), "a")
        guard.close()
        before = run_cli(self.data_dir, "checkpoint")[1]
        killed = subprocess.run([sys.executable, "-c", ARCHIVER, self.data_dir,
                                 self.ARCHIVER_KILLED_AFTER_INTENT],
                                capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)
        intent_path = os.path.join(self.data_dir, "archive.json")
        with open(intent_path) as stream:
            intent = json.load(stream)
        # What the earlier version left: the copy beside the archives, named so.
        copies = os.path.join(self.data_dir, "archive", "copies")
        [name] = os.listdir(copies)
        self.assertEqual(intent["temp"], f"archive/copies/{name}")
        os.rename(os.path.join(copies, name), os.path.join(self.data_dir, "archive", name))
        intent["temp"] = f"archive/{name}"
        with open(intent_path, "w") as stream:
            json.dump(intent, stream)
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(call(guard, Tool(), "b"), '{"status": "booked"}')
        guard.close()
        self.assertEqual(sorted(os.listdir(os.path.join(self.data_dir, "archive"))), ["copies"])
        self.assertFalse(os.path.exists(intent_path))
        code, verified, text = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual((code, verified["archives_verified"]), (0, []), text)
        self.assertEqual(run_cli(self.data_dir, "checkpoint")[1]["journal_id"],
                         before["journal_id"])
        self.assertVerifies()

    def test_only_a_copy_in_either_layout_is_ever_named(self):
        data_dir = os.path.join(self.root, "d")
        named = {relative: archive.copy_path(data_dir, relative) for relative in (
            "archive/copies/copy.12-0a1b2c3d.tmp", "archive/copy.12-0a1b2c3d.tmp",
            "archive/copies/copies/copy.12-0a1b2c3d.tmp", "archive/copies/../copy.12-0a1b2c3d.tmp",
            "copies/copy.12-0a1b2c3d.tmp", "archive/copies/copy.12-0a1b2c3d.tmp-journal",
            "archive/copies/x.sqlite3", "/archive/copy.12-0a1b2c3d.tmp", None)}
        self.assertEqual(named, {
            "archive/copies/copy.12-0a1b2c3d.tmp":
                os.path.join(data_dir, "archive", "copies", "copy.12-0a1b2c3d.tmp"),
            "archive/copy.12-0a1b2c3d.tmp":
                os.path.join(data_dir, "archive", "copy.12-0a1b2c3d.tmp"),
            "archive/copies/copies/copy.12-0a1b2c3d.tmp": None,
            "archive/copies/../copy.12-0a1b2c3d.tmp": None,
            "copies/copy.12-0a1b2c3d.tmp": None,
            "archive/copies/copy.12-0a1b2c3d.tmp-journal": None,
            "archive/copies/x.sqlite3": None,
            "/archive/copy.12-0a1b2c3d.tmp": None,
            None: None})


if __name__ == "__main__":
    unittest.main()
