"""Every integrity verdict has a way forward: ``restart-journal`` keeps the
broken journal as evidence, byte for byte, and starts a new one in which every
operation that may have run stays open (docs/cli.md §restart-journal)."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import unittest

from support import OPERATOR_CLI, JournalTestCase, run_cli

TESTS = os.path.dirname(os.path.abspath(__file__))
EVIDENCE = "a cleanup script deleted journal.sqlite3-wal at 07:40 (cron log)"
# Lock files and the operator's log stay in place: they are not the journal.
LOCK_AND_LOG = ("calls", "operator.log")


class LiveWorker:
    """tests/live_worker.py: one guard kept open between calls, like a gateway."""

    def __init__(self, test: unittest.TestCase, data_dir: str, service: str):
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(TESTS, "live_worker.py"), data_dir, service],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        test.addCleanup(self.kill)
        ready = json.loads(self.process.stdout.readline())
        test.assertIn("ready", ready)

    def ask(self, line: str) -> dict:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def call(self, request: str, *, error: bool = False) -> dict:
        """The call's answer; a refusal's result is decoded to a dict."""
        answer = self.ask(f"call {request}" + (" error" if error else ""))
        if isinstance(answer["result"], str):
            answer["result"] = json.loads(answer["result"])
        return answer

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
        for stream in (self.process.stdin, self.process.stdout):
            if not stream.closed:
                stream.close()


def files_below(directory: str, skip=()) -> dict:
    """``{relative path: bytes}`` of every regular file below ``directory``."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory)
            if relative.split(os.sep)[0] not in skip:
                with open(path, "rb") as stream:
                    found[relative] = stream.read()
    return found


class WalLossCase(JournalTestCase):
    """The WAL of a live profile is deleted while it holds committed events."""

    def setUp(self):
        super().setUp()
        self.service = os.path.join(self.root, "service.sqlite3")

    def open_operations(self) -> list:
        code, document, _ = run_cli(self.data_dir, "status")
        self.assertEqual(code, 0, document)
        return document["unresolved"]

    def resolve(self, operation_id: str) -> None:
        code, document, _ = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                    "not_applied", "--evidence", "no booking row for it")
        self.assertEqual(code, 0, document)

    def lose_the_wal(self) -> str:
        """Leave a journal whose main file ends with an open operation (op3)
        while the deleted WAL held its resolution and a later uncertain call;
        returns op3's id."""
        first = LiveWorker(self, self.data_dir, self.service)
        first.call("r1", error=True)  # op1 uncertain; folded into the main file on exit
        first.stop()
        worker = LiveWorker(self, self.data_dir, self.service)
        self.assertEqual(worker.call("r2")["result"]["code"], "unresolved_operations")
        self.resolve(self.open_operations()[0]["operation_id"])
        worker.call("r3", error=True)  # op3 uncertain
        # SQLite folds the WAL into the main file now and then; here, now.
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
        connection.close()
        op3 = self.open_operations()[0]["operation_id"]
        self.resolve(op3)
        worker.call("r4", error=True)  # op4 uncertain: its events live only in the WAL
        os.unlink(os.path.join(self.data_dir, "journal.sqlite3-wal"))
        self.assertTrue(worker.call("r5")["result"]["blocked"])
        worker.kill()  # every worker stopped, as the runbook says
        return op3


class RestartAfterDeletedWal(WalLossCase):
    """restart-journal after the WAL was lost, and where it does not apply."""

    def test_old_files_kept_byte_identical_and_gate_stays_closed_until_settled(self):
        op3 = self.lose_the_wal()
        code, document, _ = run_cli(self.data_dir, "status")
        # One state, one verdict: the WAL was deleted (-shm remains), and no
        # process has the journal open any more, so its events are lost.
        self.assertEqual((code, document["integrity"], document["error"]["workers_running"]),
                         (1, "wal_missing", []))
        self.assertEqual(document["error"]["next"], f"{sys.executable} {OPERATOR_CLI} "
                         f"--data-dir {self.data_dir} restart-journal --evidence "
                         f'"<what happened, what you checked>"')
        before = files_below(self.data_dir, skip=LOCK_AND_LOG)

        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)

        self.assertEqual(code, 0, restarted)
        self.assertEqual(restarted["found"], "wal_missing")
        self.assertEqual(restarted["last_verified_checkpoint"]["count"], 5)
        self.assertEqual(restarted["carried_over"], [op3])
        self.assertIsNotNone(restarted["lost_operation"])
        kept = files_below(os.path.join(self.data_dir, restarted["evidence_directory"]))
        self.assertEqual(kept, before)
        # Exactly what the loss left (no command of ours made a new, empty WAL).
        self.assertEqual(sorted(kept), ["head.json", "initialized", "journal.sqlite3",
                                        "journal.sqlite3-shm"])
        self.assertEqual(json.loads(kept["head.json"])["count"], 8)
        # The new journal: the bookkeeping operation, op3 carried over, the lost one.
        self.assertVerifies()
        code, log, _ = run_cli(self.data_dir, "log")
        events = log["events"]
        self.assertEqual([(event["kind"], event.get("tool")) for event in events], [
            ("started", "crash-recovery.restart-journal"), ("resolved", None),
            ("started", "book_flight"), ("uncertain", None),
            ("started", "unknown"), ("uncertain", None)])
        replaced = events[0]["restarted_from"]
        self.assertEqual(replaced["journal_id"], restarted["replaced_journal_id"])
        self.assertEqual(replaced["verdict"], "wal_missing")
        self.assertEqual(replaced["last_verified_checkpoint"],
                         restarted["last_verified_checkpoint"])
        self.assertEqual(replaced["head_json"]["count"], 8)
        self.assertEqual(events[1]["evidence"], EVIDENCE)
        self.assertEqual(events[2]["carried_over"]["journal_id"], replaced["journal_id"])
        self.assertEqual((events[3]["reason"], events[5]["reason"]),
                         ("error_response", "lost_in_crash"))
        self.assertLessEqual(events[4]["lost_window"]["before_ns"], events[4]["timestamp_ns"])
        self.assertLess(events[4]["lost_window"]["after_ns"], events[4]["timestamp_ns"])
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            audit = [json.loads(line) for line in stream][-1]
        self.assertEqual((audit["action"], audit["evidence"], audit["found"]),
                         ("restart-journal", EVIDENCE, "wal_missing"))

        worker = LiveWorker(self, self.data_dir, self.service)
        refused = worker.call("r6")
        self.assertEqual((refused["result"]["code"], refused["side_effects"]),
                         ("unresolved_operations", 0))
        self.resolve(op3)
        self.assertEqual(worker.call("r6")["result"]["code"], "unresolved_operations")
        self.resolve(restarted["lost_operation"])
        admitted = worker.call("r6")
        self.assertEqual((admitted["result"], admitted["side_effects"]),
                         ({"booking": 4, "status": "confirmed"}, 1))
        worker.stop()
        self.assertVerifies()

    def test_refused_with_nothing_changed_when_the_journal_verifies(self):
        worker = LiveWorker(self, self.data_dir, self.service)
        worker.call("r1")
        worker.stop()
        before = self.snapshot()
        code, document, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, document["error"]["code"], document["integrity"]),
                         (1, "restart_not_applicable", "ok"))
        self.assertEqual(self.snapshot(), before)
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "replaced")))

    def test_refused_with_nothing_changed_while_a_worker_has_the_journal_open(self):
        worker = LiveWorker(self, self.data_dir, self.service)
        worker.call("r1")
        os.unlink(os.path.join(self.data_dir, "head.json"))
        before = self.snapshot()
        code, document, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, document["error"]["code"]), (1, "workers_running"))
        self.assertEqual(self.snapshot(), before)
        worker.stop()
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, restarted["found"]), (0, "checkpoint_missing"))

    def test_unreadable_database_is_replaced_by_one_lost_operation(self):
        worker = LiveWorker(self, self.data_dir, self.service)
        worker.call("r1")
        worker.stop()
        database = os.path.join(self.data_dir, "journal.sqlite3")
        with open(database, "r+b") as stream:
            stream.write(b"not a database at all" * 100)
        with open(database, "rb") as stream:
            damaged = stream.read()
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual(code, 0, restarted)
        self.assertEqual((restarted["carried_over"], restarted["replaced_journal_id"]), ([], None))
        self.assertIn("journal.sqlite3", restarted["moved"])
        with open(os.path.join(self.data_dir, restarted["evidence_directory"],
                               "journal.sqlite3"), "rb") as stream:
            self.assertEqual(stream.read(), damaged)
        self.assertEqual([operation["tool"] for operation in self.open_operations()],
                         ["unknown"])
        self.assertVerifies()


# Runs restart-journal in a process that SIGKILLs itself at one step of the switch.
KILLED_RESTART = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import support
from crash_recovery import operator_cli
from crash_recovery.storage import durable
def hook(boundary, kind):
    if kind == "restart" and boundary == {boundary!r}:
        os.kill(os.getpid(), signal.SIGKILL)
durable.set_boundary_hook(hook)
operator_cli.main(["--data-dir", {data_dir!r}, "restart-journal", "--evidence", "first try"])
"""


class RestartKilledMidway(WalLossCase):
    """A crash at a step of the switch leaves a closed gate that reads
    ``restart_interrupted``, and running the command again finishes the first
    run's restart: the same evidence folder, the same operations carried over
    (tests/test_restart_killed.py kills it before every system call)."""

    def kill_restart_at(self, boundary: str) -> None:
        killed = subprocess.run([sys.executable, "-c", KILLED_RESTART.format(
            tests=TESTS, boundary=boundary, data_dir=self.data_dir)], capture_output=True)
        self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr)

    def refused_then_restarted(self, request: str) -> dict:
        """A new worker's call is refused and runs nothing; then, every worker
        stopped, restart-journal finishes the first run's restart."""
        worker = LiveWorker(self, self.data_dir, self.service)
        refused = worker.call(request)
        self.assertEqual((refused["result"]["blocked"], refused["side_effects"]), (True, 0))
        worker.kill()
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence", EVIDENCE)
        self.assertEqual((code, restarted["resumed"]), (0, True), restarted)
        return restarted

    def check_killed_at(self, boundary: str) -> None:
        op3 = self.lose_the_wal()
        self.kill_restart_at(boundary)
        code, document, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, document["integrity"]), (1, "restart_interrupted"), document)
        self.assertIn("restart-journal", document["error"]["next"])
        code, _, text = run_cli(self.data_dir, "status", "--format", "text")
        self.assertEqual(text.splitlines()[0], "error: restart_interrupted")
        self.assertIn("hint: restart-journal stopped half-way", text)
        self.assertIn(f"next: {document['error']['next']}", text)
        restarted = self.refused_then_restarted("r9")
        tools = {operation["operation_id"]: operation["tool"]
                 for operation in self.open_operations()}
        self.assertEqual(tools, {op3: "book_flight", restarted["lost_operation"]: "unknown"})
        self.assertEqual(restarted["carried_over"], [op3])
        self.assertEqual(os.listdir(os.path.join(self.data_dir, "replaced")),
                         [os.path.basename(restarted["evidence_directory"])])
        # The WAL was lost, and the refused worker made no new one (a refusal
        # changes no file): what is moved is what the crash left.
        self.assertEqual(sorted(restarted["moved"]), ["head.json", "initialized",
                                                      "journal.sqlite3", "journal.sqlite3-shm"])
        self.assertEqual([name for name in os.listdir(self.data_dir)
                          if name.endswith(".tmp") or name == "restart.json"], [])
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            actions = [json.loads(line)["action"] for line in stream]
        self.assertEqual(actions.count("restart-journal"), 1)
        self.assertVerifies()

    def test_killed_after_moving_the_old_database(self):
        self.check_killed_at("moved_journal.sqlite3")

    def test_killed_after_placing_the_new_database(self):
        self.check_killed_at("placed_initialized")

    def test_a_journal_without_head_json_never_looks_fresh_midway(self):
        worker = LiveWorker(self, self.data_dir, self.service)
        worker.call("r1")
        worker.stop()
        os.unlink(os.path.join(self.data_dir, "head.json"))
        self.kill_restart_at("moved_journal.sqlite3")
        code, document, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, document["integrity"], document["error"]["found"]),
                         (1, "restart_interrupted", "missing_database"))
        self.refused_then_restarted("r2")
        self.assertEqual([operation["tool"] for operation in self.open_operations()],
                         ["unknown"])
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
