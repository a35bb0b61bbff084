"""Lost POSIX locks and a vanished WAL (docs/guard.md §In-process code), with
real processes: something else in the worker process opens and closes
``journal.sqlite3``, which drops every POSIX lock the process holds on it.

* A process that does not run the plugin (the ``sqlite3`` shell, a backup
  tool) then opens the journal and closes it: SQLite would fold and delete the
  WAL at that close, but the worker's WAL keeper (an open file description lock
  no close elsewhere drops) stops it.  The WAL stays, and so does every event.
* Someone deletes the WAL by hand under the worker: no protected call is ever
  admitted into the lost file -- neither by an idle worker nor inside a
  ``started`` append -- and the operator's path brings the lost ``started``
  back as an open operation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import unittest

from reliability_support import (WORKER_TIMEOUT_SECONDS, ReliabilityCase, next_message,
                                 one_call_in_a_fresh_worker, start_worker, tell)
from support import TESTS, run_cli

# A worker that keeps its guard open and obeys lines on stdin:
#   call NAME   -- a protected call whose tool appends NAME to the service file
#   sniff       -- another component reads 100 bytes of journal.sqlite3 (plain open/close)
#   hook_sniff  -- the next append does the sniff right after replacing head.json
#   close       -- guard.close() (at the end of stdin the worker exits without it)
LIVE_WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.storage import durable
    from crash_recovery.guard import RecoveryGuard
    data_dir, service = sys.argv[1], sys.argv[2]
    guard = RecoveryGuard(data_dir)

    def sniff():
        with open(os.path.join(data_dir, "journal.sqlite3"), "rb") as stream:
            stream.read(100)

    for line in sys.stdin:
        word, _, name = line.strip().partition(" ")
        if word == "sniff":
            sniff()
            print(json.dumps({{"sniffed": True}}), flush=True)
        elif word == "hook_sniff":
            def hook(boundary, kind):
                if (boundary, kind) == ("checkpoint_replaced", "started"):
                    sniff()
                    print(json.dumps({{"sniffed": True}}), flush=True)
                    sys.stdin.readline()  # wait until another process closed the journal
            durable.set_boundary_hook(hook)
            print(json.dumps({{"armed": True}}), flush=True)
        elif word == "close":
            guard.close()
            print(json.dumps({{"closed": True}}), flush=True)
        elif word == "call":
            def tool(name=name):
                with open(service, "a") as stream:
                    stream.write(name + "\\n")
                return '{{"status": "booked"}}'
            result = guard.tool_execution(tool_name="book_trip", args={{"n": name}},
                                          next_call=tool, session_id="s", tool_call_id=name)
            durable.set_boundary_hook(None)
            print(json.dumps({{"result": result}}), flush=True)
""").format(tests=TESTS)


def close_once(data_dir, statement="SELECT count(*) FROM events"):
    """A process that does not run the plugin opens the journal, runs
    ``statement`` and closes it cleanly: if it believes it is the last
    connection, SQLite checkpoints and removes the WAL on close."""
    subprocess.run([sys.executable, "-c", "import sqlite3, sys\n"
                    "c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]).fetchall(); "
                    "c.close()", os.path.join(data_dir, "journal.sqlite3"), statement],
                   check=True, timeout=WORKER_TIMEOUT_SECONDS)


class LostPosixLocks(ReliabilityCase):
    """The WAL outlives lost locks; a call is never admitted into a WAL that is gone."""

    def start_worker(self):
        self.service = os.path.join(self.root, "service.txt")
        return start_worker(self, LIVE_WORKER, self.data_dir, self.service)

    def say(self, worker, line):
        tell(worker, line)
        return next_message(self, worker)

    def bookings(self):
        with open(self.service) as stream:
            return stream.read().split()

    def wal_identity(self):
        found = os.stat(os.path.join(self.data_dir, "journal.sqlite3-wal"))
        return found.st_dev, found.st_ino

    def test_a_foreign_close_after_lost_locks_keeps_the_wal_and_every_event(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        wal = self.wal_identity()
        self.assertEqual(self.say(worker, "sniff"), {"sniffed": True})
        close_once(self.data_dir)
        self.assertEqual(self.wal_identity(), wal, "the foreign close deleted the WAL")
        self.assertEqual(self.say(worker, "hook_sniff"), {"armed": True})
        self.assertEqual(self.say(worker, "call b"), {"sniffed": True})
        close_once(self.data_dir)  # inside the started append, head.json already replaced
        self.assertEqual(self.say(worker, "go")["result"], '{"status": "booked"}')
        self.assertEqual(self.wal_identity(), wal)
        self.assertEqual(self.bookings(), ["a", "b"])
        worker.kill()
        worker.wait()  # no clean close: every event must be in the files as they are
        code, log, stdout = run_cli(self.data_dir, "log")
        self.assertEqual(code, 0, stdout)
        self.assertEqual([(event["kind"], event.get("tool_call_id")) for event in log["events"]],
                         [("started", "a"), ("returned", None), ("started", "b"),
                          ("returned", None)])
        self.assertVerifies()

    def test_idle_worker_refuses_after_its_wal_was_deleted(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        self.assertEqual(self.say(worker, "sniff"), {"sniffed": True})
        os.unlink(os.path.join(self.data_dir, "journal.sqlite3-wal"))
        for name in ("b", "c", "d"):  # not one call is admitted into the lost WAL
            refused = json.loads(self.say(worker, f"call {name}")["result"])
            self.assertEqual(refused["code"], "wal_missing")
        self.assertEqual(self.bookings(), ["a"])

    def test_wal_deleted_inside_a_started_append_never_runs_the_tool(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        self.assertEqual(self.say(worker, "hook_sniff"), {"armed": True})
        self.assertEqual(self.say(worker, "call b"), {"sniffed": True})
        close_once(self.data_dir, "PRAGMA wal_checkpoint(PASSIVE)")  # copies what is committed
        os.unlink(os.path.join(self.data_dir, "journal.sqlite3-wal"))
        refused = json.loads(self.say(worker, "go")["result"])
        self.assertEqual(refused["code"], "wal_missing")
        self.assertEqual(self.bookings(), ["a"])  # b never ran
        worker.kill()
        worker.wait()
        # The operator's path: the started event is lost with the WAL; head.json
        # names it.  The repair brings it back as an open operation.
        os.unlink(os.path.join(self.data_dir, "journal.sqlite3-shm"))  # the dead worker's
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, status["integrity"]), (1, "checkpoint_ahead"))
        code, repaired, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence",
                                    "worker lost its locks; WAL removed")
        self.assertEqual(code, 0, repaired)
        lost = repaired["lost_operation"]
        status = run_cli(self.data_dir, "status")[1]
        self.assertEqual([(op["operation_id"], op["reason"]) for op in status["unresolved"]],
                         [(lost, "lost_in_crash")])
        self.assertEqual(json.loads(one_call_in_a_fresh_worker(self)["result"])["code"],
                         "unresolved_operations")
        self.assertVerifies()

if __name__ == "__main__":
    unittest.main()
