"""The WAL's index (``journal.sqlite3-shm``) deleted under a live worker, alone
or with the WAL (docs/guard.md §In-process code, docs/format.md §Files), with
real processes and files.

* WAL and ``-shm`` deleted, then a ``status`` makes new empty ones: the worker
  refuses (``wal_missing``), and its exit -- ``guard.close()`` or the exit of a
  host that never closes it -- still folds the events of the WAL it holds
  back into the database.
* ``-shm`` deleted alone: a worker that opens the journal afterwards builds a
  second index of the same WAL, and SQLite's WAL locks live in the index, so
  the two would neither see each other's commits nor exclude each other as
  writers.  The worker that lost its index refuses (``wal_missing``) instead
  of writing, and its exit never folds the WAL through its stale index: no
  committed event is lost, whichever worker exits first.
"""
from __future__ import annotations

import json
import os
import sqlite3
import unittest

from reliability_support import (WORKER_TIMEOUT_SECONDS, ReliabilityCase, next_message,
                                 start_worker, tell)
from support import run_cli
from test_lost_locks import LIVE_WORKER

BOOKED = '{"status": "booked"}'


class WalIndexLost(ReliabilityCase):

    def setUp(self):
        super().setUp()
        self.service = os.path.join(self.root, "service.txt")
        self.database = os.path.join(self.data_dir, "journal.sqlite3")

    def start(self):
        return start_worker(self, LIVE_WORKER, self.data_dir, self.service)

    def say(self, worker, line):
        tell(worker, line)
        return next_message(self, worker)

    def calls(self, worker, *names):
        for name in names:
            self.assertEqual(self.say(worker, f"call {name}")["result"], BOOKED)

    def refused(self, worker, name):
        """The code of the refusal of a call (None: it was admitted)."""
        return json.loads(self.say(worker, f"call {name}")["result"]).get("code")

    def exit(self, worker, close):
        """The worker exits: after ``guard.close()``, or (``close`` false) as a
        host that never closes its guard does (the guard's finalizer)."""
        if close:
            self.assertEqual(self.say(worker, "close"), {"closed": True})
        worker.stdin.close()
        self.assertEqual(worker.wait(timeout=WORKER_TIMEOUT_SECONDS), 0)

    def bookings(self):
        with open(self.service) as stream:
            return stream.read().split()

    def events_counted_by_sqlite(self):
        """The number of rows in ``events``, read by plain SQLite (the database
        and whatever WAL lies beside it), not by the product."""
        connection = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True)
        try:
            return connection.execute("SELECT count(*) FROM events").fetchone()[0]
        finally:
            connection.close()

    def head_count(self):
        with open(os.path.join(self.data_dir, "head.json")) as stream:
            return json.load(stream)["count"]

    def assertNothingLost(self, count):
        self.assertEqual(self.head_count(), count)
        self.assertEqual(self.events_counted_by_sqlite(), count)
        code, status, stdout = run_cli(self.data_dir, "status")
        self.assertEqual((code, status["integrity"]), (0, "ok"), stdout)
        self.assertEqual(self.assertVerifies().count, count)

    def test_wal_and_index_deleted_then_a_status_the_exit_folds_every_event_back(self):
        for close in (True, False):
            with self.subTest(close=close):
                self.data_dir = os.path.join(self.root, f"data-{close}")
                self.database = os.path.join(self.data_dir, "journal.sqlite3")
                self.service = os.path.join(self.root, f"service-{close}.txt")
                worker = self.start()
                self.calls(worker, "a", "b", "c")
                os.unlink(self.database + "-wal")
                os.unlink(self.database + "-shm")
                run_cli(self.data_dir, "status")  # opens the journal: a new empty -wal and -shm
                self.assertEqual(os.path.getsize(self.database + "-wal"), 0)
                self.assertTrue(os.path.exists(self.database + "-shm"))
                self.assertEqual(self.refused(worker, "d"), "wal_missing")
                self.exit(worker, close)
                # Folded into the database file: no WAL or -shm is left.
                self.assertEqual(sorted(name for name in os.listdir(self.data_dir)
                                        if name.startswith("journal.sqlite3")),
                                 ["journal.sqlite3"])
                self.assertEqual(self.bookings(), ["a", "b", "c"])
                self.assertNothingLost(6)

    def test_a_worker_whose_index_was_deleted_refuses_and_its_exit_keeps_the_wal(self):
        worker = self.start()
        self.calls(worker, "a", "b")
        wal = os.stat(self.database + "-wal")
        os.unlink(self.database + "-shm")
        for name in ("c", "d"):  # not one call is admitted through the lost index
            self.assertEqual(self.refused(worker, name), "wal_missing")
        self.exit(worker, True)
        self.assertEqual(self.bookings(), ["a", "b"])
        self.assertEqual(os.stat(self.database + "-wal").st_ino, wal.st_ino)  # never folded
        self.assertNothingLost(4)

    def test_index_deleted_under_a_worker_then_another_worker_writes_nothing_is_lost(self):
        for first, a_calls in (("A", True), ("B", True), ("A", False), ("B", False)):
            with self.subTest(exits_first=first, a_calls_after=a_calls):
                self.data_dir = os.path.join(self.root, f"data-{first}-{a_calls}")
                self.database = os.path.join(self.data_dir, "journal.sqlite3")
                self.service = os.path.join(self.root, f"service-{first}-{a_calls}.txt")
                worker_a = self.start()
                self.calls(worker_a, "a1", "a2", "a3")
                os.unlink(self.database + "-shm")
                worker_b = self.start()  # its index: a new -shm, rebuilt from the WAL
                self.calls(worker_b, "b1", "b2", "b3")
                self.assertEqual(self.head_count(), 12)
                if a_calls:  # A would write through its stale index, beside B through B's
                    self.assertEqual(self.refused(worker_a, "a4"), "wal_missing")
                # (Else A stays idle, last seen healthy: its exit must not fold either.)
                order = (worker_a, worker_b) if first == "A" else (worker_b, worker_a)
                for worker in order:
                    self.exit(worker, True)
                self.assertEqual(sorted(self.bookings()), ["a1", "a2", "a3", "b1", "b2", "b3"])
                self.assertNothingLost(12)

if __name__ == "__main__":
    unittest.main()
