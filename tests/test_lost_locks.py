"""Lost POSIX locks (docs/guard.md §In-process code), with real processes:
something else in the worker process opens and closes ``journal.sqlite3``,
which drops every POSIX lock the process holds on it; then another process
opens and closes the journal cleanly.

What that close does is SQLite's choice, and it varies: SQLite 3.40 (Python
3.11 here) believes it is the last connection, checkpoints and removes the WAL;
SQLite 3.53 (Debian sid) keeps it.  Each test reports which happened and checks
what the plugin promises in that case:

* the WAL was removed: no protected call is ever admitted into the lost WAL --
  neither by an idle worker nor inside a ``started`` append -- and the
  operator's path brings a lost ``started`` back as an open operation;
* the WAL was kept: it is still the journal's, so the worker's calls are
  admitted, run once and journaled as usual.

In both, every tool that ran has its ``started`` event in a journal that
verifies, and no tool ran without one.
"""
from __future__ import annotations

import json
import os
import sqlite3
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


def close_once(data_dir, label):
    """Another process opens the journal and closes it cleanly (a CLI, a
    worker exiting).  Returns whether the WAL is still there afterwards (SQLite
    removes it on close when it believes it is the last connection) and says
    which happened on stderr."""
    subprocess.run([sys.executable, "-c", "import sqlite3, sys\n"
                    "c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM events')"
                    ".fetchone(); c.close()", os.path.join(data_dir, "journal.sqlite3")],
                   check=True, timeout=WORKER_TIMEOUT_SECONDS)
    kept = os.path.exists(os.path.join(data_dir, "journal.sqlite3-wal"))
    sys.stderr.write(f"\n  {label}: SQLite {sqlite3.sqlite_version} "
                     f"{'kept' if kept else 'removed'} the WAL on another process's close ")
    return kept


class LostPosixLocks(ReliabilityCase):
    """A protected call is never admitted into a WAL that is gone."""

    def start_worker(self):
        self.service = os.path.join(self.root, "service.txt")
        return start_worker(self, LIVE_WORKER, self.data_dir, self.service)

    def say(self, worker, line):
        tell(worker, line)
        return next_message(self, worker)

    def bookings(self):
        with open(self.service) as stream:
            return stream.read().split()

    def started_calls(self):
        """The tool-call ids of the journal's ``started`` events; the journal
        verifies."""
        report = self.assertVerifies()
        return [event["tool_call_id"] for event in report.events if event["kind"] == "started"]

    def test_idle_worker_after_another_process_closed_the_journal(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        self.assertEqual(self.say(worker, "sniff"), {"sniffed": True})
        wal_kept = close_once(self.data_dir, "idle worker")
        results = [self.say(worker, f"call {name}")["result"] for name in ("b", "c", "d")]
        worker.kill()
        worker.wait()
        if wal_kept:  # the journal's WAL: the calls are admitted and journaled as usual
            self.assertEqual(results, ['{"status": "booked"}'] * 3)
            self.assertEqual(self.bookings(), ["a", "b", "c", "d"])
        else:  # not one call is admitted into the lost WAL
            self.assertEqual([json.loads(result)["code"] for result in results],
                             ["wal_missing"] * 3)
            self.assertEqual(self.bookings(), ["a"])
        self.assertEqual(self.started_calls(), self.bookings())

    def test_another_process_closes_the_journal_inside_a_started_append(self):
        worker = self.start_worker()
        self.assertEqual(self.say(worker, "call a")["result"], '{"status": "booked"}')
        self.assertEqual(self.say(worker, "hook_sniff"), {"armed": True})
        self.assertEqual(self.say(worker, "call b"), {"sniffed": True})
        # Checkpoints the committed events and, where SQLite removes it, the WAL.
        wal_kept = close_once(self.data_dir, "inside a started append")
        result = self.say(worker, "go")["result"]
        worker.kill()
        worker.wait()
        if wal_kept:  # b's started is in the journal's WAL: b ran once, journaled
            self.assertEqual(result, '{"status": "booked"}')
            self.assertEqual(self.bookings(), ["a", "b"])
            self.assertEqual(self.started_calls(), ["a", "b"])
            code, status, _ = run_cli(self.data_dir, "status")
            self.assertEqual((code, status["integrity"], status["unresolved"]), (0, "ok", []))
            return
        self.assertEqual(json.loads(result)["code"], "wal_missing")
        self.assertEqual(self.bookings(), ["a"])  # b never ran
        # The operator's path: the started event is lost with the WAL; head.json
        # names it.  The repair brings it back as an open operation.
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
        self.assertEqual(self.started_calls(), ["a", None])  # a, and the lost one re-created


if __name__ == "__main__":
    unittest.main()
