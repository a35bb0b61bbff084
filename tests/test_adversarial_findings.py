"""Regression tests for an adversarial review of this round's features, one
class per kind of finding (each fixed for the whole kind):

* the middleware must never raise before the tool runs, whatever the settings
  hold (Hermes runs the tool unrecorded when a middleware raises);
* an archive intent names no path the plugin will act on: a crafted
  ``archive.json`` can neither delete a sealed archive nor reach outside the
  data directory; an unusable one is ``archive_interrupted`` for readers too;
* a user-supplied checkpoint file never gives a traceback or a hang;
* a running call makes the gate *busy*, not closed, for ``status --check``
  and the gauges, and a failing status keeps its gauge label;
* settings that would silently protect nothing are a settings problem;
* leftovers of dead archivers are removed; archives are never reached
  through a symbolic link;
* a live process refuses history that shrank or changed under it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

from reliability_support import ReliabilityCase
from support import reference, run_cli

from crash_recovery.guard import RecoveryGuard
from crash_recovery.admission.settings import parse_settings

DEAD_PID = "999999999"


def book(guard, name, tool=lambda: '{"status": "booked"}'):
    return guard.tool_execution(tool_name="book_trip", args={"n": name}, next_call=tool,
                                session_id="s", tool_call_id=name)


class SettingsNeverRaise(ReliabilityCase):

    class RaisingMapping(dict):
        def __iter__(self):
            raise RuntimeError("a broken config loader")

    def test_unreadable_settings_fail_closed_without_raising(self):
        for raw in ({"busy_timeout": 10 ** 400}, {"archive_after_events": 10 ** 400},
                    {"full_verification_interval": 10 ** 400},
                    self.RaisingMapping(busy_timeout=1)):
            with self.subTest(raw=type(raw).__name__ + str(list(dict.items(raw)))[:60]):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                guard = RecoveryGuard(self.data_dir, settings=raw)
                self.addCleanup(guard.close)
                ran = []
                result = guard.tool_execution(tool_name="pay", args={},
                                              next_call=lambda: ran.append(1) or "paid",
                                              session_id="s", tool_call_id="c")
                self.assertEqual((result, ran), ("paid", [1]))  # protected, journaled, run once
                self.assertIsNone(guard.pre_tool_call(tool_name="pay", args={}, session_id="s",
                                                      tool_call_id="d"))
                self.assertTrue(guard.status_report()["settings"]["problem"])
                self.assertEqual(reference.verify(self.data_dir).kinds(), ["started", "returned"])

    def test_lists_that_would_protect_nothing_are_problems(self):
        for value in ('{"pay": 1}', "", [], '"pay"', "[1, 2]"):
            with self.subTest(value=value):
                settings = parse_settings({"protected_tools": value})
                self.assertTrue(settings.problem)
                self.assertTrue(settings.is_protected("pay"))
                self.assertTrue(settings.is_protected("anything_else"))
        self.assertEqual(sorted(parse_settings({"protected_tools": "pay, book"}).tools),
                         ["book", "pay"])


class ArchiveIntentNamesNothing(ReliabilityCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        book(guard, "a")
        guard.close()
        code, sealed, text = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, text)
        self.sealed_file = os.path.join(self.data_dir, sealed["archived"]["file"])
        guard = RecoveryGuard(self.data_dir)
        book(guard, "b")
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
        self.assertEqual(book(guard, "c"), '{"status": "booked"}')  # the writer undid it
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
                ran = []
                blocked = json.loads(book(guard, "x", lambda: ran.append(1)))
                guard.close()
                self.assertEqual((blocked["code"], ran), ("archive_interrupted", []))
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

    def test_leftovers_of_dead_archivers_are_removed(self):
        archive_dir = os.path.dirname(self.sealed_file)
        leftovers = [os.path.join(archive_dir, f"copy.{DEAD_PID}-0a1b2c3d.tmp"),
                     os.path.join(archive_dir, f"copy.{DEAD_PID}-0a1b2c3d.tmp-journal"),
                     os.path.join(self.data_dir, f"archive.json.{DEAD_PID}-0a1b2c3d.tmp")]
        live = os.path.join(archive_dir, f"copy.{os.getpid()}-0a1b2c3d.tmp")
        for path in leftovers + [live]:
            with open(path, "wb") as stream:
                stream.write(b"half")
        guard = RecoveryGuard(self.data_dir)
        book(guard, "c")
        guard.close()
        self.assertEqual([path for path in leftovers if os.path.exists(path)], [])
        self.assertTrue(os.path.exists(live))  # its process still runs
        self.assertTrue(os.path.exists(self.sealed_file))


class CheckpointFiles(ReliabilityCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        book(guard, "a")
        guard.close()
        self.early = run_cli(self.data_dir, "checkpoint")[1]
        self.assertEqual(run_cli(self.data_dir, "archive")[0], 0)

    def verify_with(self, path):
        return run_cli(self.data_dir, "verify", "--checkpoint", path, timeout=20)

    def test_no_traceback_and_no_hang(self):
        huge = os.path.join(self.root, "huge.json")
        with open(huge, "w") as stream:
            json.dump(dict(self.early, count=2 ** 63), stream)
        code, result, text = self.verify_with(huge)
        self.assertEqual((code, result["integrity"]), (1, "checkpoint_not_ancestor"), text)
        deep = os.path.join(self.root, "deep.json")
        with open(deep, "w") as stream:
            stream.write("[" * 100000)
        code, result, text = self.verify_with(deep)
        self.assertEqual((code, result["error"]["code"]), (1, "checkpoint_unreadable"), text)
        fifo = os.path.join(self.root, "fifo")
        os.mkfifo(fifo)
        code, result, text = self.verify_with(fifo)
        self.assertEqual((code, result["error"]["code"]), (1, "checkpoint_unreadable"), text)
        exported = os.path.join(self.root, "early.json")
        with open(exported, "w") as stream:
            json.dump(self.early, stream)
        code, result, text = self.verify_with(exported)
        self.assertEqual((code, result["external_checkpoint"]), (0, "ancestor"), text)


class BusyGate(ReliabilityCase):

    def test_a_running_call_is_busy_not_closed(self):
        seen = {}
        started, finish = threading.Event(), threading.Event()

        def tool():
            started.set()
            finish.wait(20)
            return "ok"

        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        worker = threading.Thread(target=lambda: seen.setdefault("result", book(guard, "a",
                                                                                  tool)))
        worker.start()
        try:
            self.assertTrue(started.wait(20))
            code, status, text = run_cli(self.data_dir, "status", "--check")
            seen["status"] = (code, status["gate"], len(status["unresolved"]))
            seen["gauges"] = run_cli(self.data_dir, "status", "--format", "prometheus")[2]
            seen["text"] = run_cli(self.data_dir, "--format", "text", "status")[2]
        finally:
            finish.set()
            worker.join(20)
        self.assertEqual(seen["status"], (0, "busy", 1))
        self.assertIn("crash_recovery_gate_closed{", seen["gauges"])
        self.assertRegex(seen["gauges"], r"crash_recovery_gate_closed\{[^}]*\} 0")
        self.assertIn("running now", seen["text"])
        self.assertEqual(seen["result"], "ok")
        self.assertEqual(run_cli(self.data_dir, "status", "--check")[1]["gate"], "open")


class LiveProcessSeesRollback(ReliabilityCase):

    def test_an_older_copy_restored_under_a_live_worker_is_refused(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        book(guard, "a")
        old = os.path.join(self.root, "old")
        # A consistent older copy: the database folded (another process) and head.json.
        subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                        "c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
                        os.path.join(self.data_dir, "journal.sqlite3")], check=True)
        os.makedirs(old)
        for name in ("journal.sqlite3", "head.json"):
            shutil.copyfile(os.path.join(self.data_dir, name), os.path.join(old, name))
        book(guard, "b")
        book(guard, "c")
        subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                        "c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
                        os.path.join(self.data_dir, "journal.sqlite3")], check=True)
        for name in ("journal.sqlite3", "head.json"):
            shutil.copyfile(os.path.join(old, name), os.path.join(self.data_dir, name))
        ran = []
        for name in ("d", "e"):
            blocked = json.loads(book(guard, name, lambda: ran.append(1)))
            self.assertEqual(blocked["code"], "journal_rolled_back")
        self.assertEqual(ran, [])


class ReadersDoNotCostWarmWorkers(ReliabilityCase):

    def test_a_status_from_another_process_needs_no_full_verification(self):
        # As root, SQLite fchowns the WAL when a connection opens it (a new
        # ctime); that alone must not look like an edit to a warm worker.
        from crash_recovery.storage import store
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        book(guard, "a")
        full = []
        original = store.JournalStore._full_chain

        def counting(self_, connection):
            full.append(1)
            return original(self_, connection)

        store.JournalStore._full_chain = counting
        try:
            for name in ("b", "c"):
                self.assertEqual(run_cli(self.data_dir, "status")[0], 0)
                self.assertEqual(book(guard, name), '{"status": "booked"}')
        finally:
            store.JournalStore._full_chain = original
        self.assertEqual(full, [])
