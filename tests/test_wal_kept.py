"""The WAL is never lost to our own processes (docs/guard.md §In-process
code), with real processes and kill -9.

Code inside a worker opens and closes ``journal.sqlite3`` itself, which drops
every POSIX lock the worker holds on it.  Then other processes of ours open
the journal and close it cleanly -- a worker making one call and exiting, an
operator command that writes (``acknowledge``), a reader (``status``).  None
of them folds and deletes the WAL: it is the same file afterwards, the
worker's calls go on being admitted and recorded (no ``wal_missing``), and
after the worker is killed with SIGKILL every event is still in the journal.
Also when the locks are dropped *inside* a ``started`` append, between
``head.json`` and the COMMIT, and a process closes the journal meanwhile.
"""
from __future__ import annotations

import os

from reliability_support import (ReliabilityCase, next_message, one_call_in_a_fresh_worker,
                                 start_worker, tell)
from support import run_cli
# A worker that keeps its guard open and obeys "call NAME", "sniff" (other code
# in it reads journal.sqlite3 with a plain open/close) and "hook_sniff" (the
# next started append sniffs right after replacing head.json, then waits).
from test_lost_locks import LIVE_WORKER, close_once

BOOKED = '{"status": "booked"}'


class WalKeptForOurProcesses(ReliabilityCase):

    def setUp(self):
        super().setUp()
        self.service = os.path.join(self.root, "service.txt")
        self.wal = os.path.join(self.data_dir, "journal.sqlite3-wal")

    def say(self, worker, line):
        tell(worker, line)
        return next_message(self, worker)

    def others_close_cleanly(self):
        """Our other processes open the journal and close it: a worker's call,
        an operator command that writes, a reader."""
        self.assertEqual(one_call_in_a_fresh_worker(self)["result"], BOOKED)
        code, refused, _ = run_cli(self.data_dir, "acknowledge",
                                   "00000000-0000-4000-8000-000000000000", "--evidence", "x")
        self.assertEqual((code, refused["error"]["code"]), (1, "nothing_to_acknowledge"))
        self.assertEqual(run_cli(self.data_dir, "status")[0], 0)

    def wal_identity(self):
        found = os.stat(self.wal)
        return found.st_dev, found.st_ino

    def events_after_a_crash(self, worker):
        worker.kill()
        worker.wait()
        code, log, stdout = run_cli(self.data_dir, "log")
        self.assertEqual(code, 0, stdout)
        return [(event["kind"], event.get("tool_call_id")) for event in log["events"]]

    def test_an_idle_worker_that_lost_its_locks_keeps_its_wal(self):
        worker = start_worker(self, LIVE_WORKER, self.data_dir, self.service)
        self.assertEqual(self.say(worker, "call w1")["result"], BOOKED)
        wal = self.wal_identity()
        for name in ("w2", "w3", "w4"):
            self.assertEqual(self.say(worker, "sniff"), {"sniffed": True})
            self.others_close_cleanly()
            self.assertEqual(self.wal_identity(), wal, "a process of ours deleted the WAL")
            self.assertEqual(self.say(worker, f"call {name}")["result"], BOOKED)
        with open(self.service) as stream:
            self.assertEqual(stream.read().split(), ["w1", "w2", "w3", "w4"])
        events = self.events_after_a_crash(worker)
        started = sorted(call for kind, call in events if kind == "started")
        # The worker's four calls and one call by each fresh worker ("c"), all kept.
        self.assertEqual(started, ["c", "c", "c", "w1", "w2", "w3", "w4"])
        self.assertEqual(sum(kind == "returned" for kind, _ in events), 7)
        self.assertVerifies()

    def test_locks_lost_inside_a_started_append_keep_the_event(self):
        worker = start_worker(self, LIVE_WORKER, self.data_dir, self.service)
        self.assertEqual(self.say(worker, "call w1")["result"], BOOKED)
        wal = self.wal_identity()
        self.assertEqual(self.say(worker, "hook_sniff"), {"armed": True})
        self.assertEqual(self.say(worker, "call w2"), {"sniffed": True})
        # The append is half-way (its head lock held): a connection closes meanwhile.
        close_once(self.data_dir)
        self.assertEqual(self.wal_identity(), wal)
        self.assertEqual(self.say(worker, "go")["result"], BOOKED)
        self.assertEqual(self.wal_identity(), wal)
        self.others_close_cleanly()
        self.assertEqual(self.say(worker, "call w3")["result"], BOOKED)
        with open(self.service) as stream:
            self.assertEqual(stream.read().split(), ["w1", "w2", "w3"])
        events = self.events_after_a_crash(worker)
        started = sorted(call for kind, call in events if kind == "started")
        self.assertEqual(started, ["c", "w1", "w2", "w3"])
        self.assertEqual(sum(kind == "returned" for kind, _ in events), 4)
        self.assertEqual(run_cli(self.data_dir, "status", "--check")[0], 0)
        self.assertVerifies()
