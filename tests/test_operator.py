"""Operator experience, on real processes and files.

* the call lock across a real child process that runs a protected call
  through RecoveryGuard and blocks inside downstream: ``running`` while it
  runs (``resolve`` refuses unless ``--force``), ``gone`` after SIGKILL;
* ``repair-checkpoint`` after a real crash injected between the checkpoint's
  ``os.replace`` and the COMMIT, for every kind of lost event, and refused for
  every other mismatch with the files unchanged;
* ``show``, ``log --since/--jsonl``, ``--format text`` tables (checked column
  by column), ``operator.log`` and ``verify``'s list of repairs;
* a model retrying a blocked call 10 times changes nothing, and the blocked
  explanation's operator command works when a person runs it.
"""
from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import sqlite3
import subprocess
import sys
import unicodedata
import uuid

from support import REPO, JournalTestCase, reference, run_cli

from crash_recovery.guard import RecoveryGuard  # noqa: E402  (tests.support puts REPO on sys.path)

# Seconds a child may take to reach its downstream call, or to exit.
CHILD_TIMEOUT_SECONDS = 30
SIGKILL_EXIT = -signal.SIGKILL

# One child program, several modes (argv: REPO MODE DATA_DIR [KIND [OPERATION_ID]]).
#   hang  -- a protected call whose downstream prints "running" and waits for a
#            line on stdin, then returns; the child prints the guard's result.
#   crash -- SIGKILL itself at checkpoint_replaced of an event of kind KIND:
#            started/returned/uncertain through a guarded call, resolved through
#            operator_cli.main resolving OPERATION_ID.
CHILD_PROGRAM = r'''
import json, os, signal, sys
sys.path.insert(0, sys.argv[1] + "/tests")
from checkout import load_package; load_package()
from crash_recovery.storage import durable
from crash_recovery.guard import RecoveryGuard

mode, data_dir = sys.argv[2], sys.argv[3]
ran_marker = os.path.join(os.path.dirname(data_dir), "downstream_ran")

def note_downstream_ran():
    with open(ran_marker, "a") as stream:
        stream.write("%d\n" % os.getpid())

if mode == "hang":
    def downstream():
        note_downstream_ran()
        print("running", flush=True)
        sys.stdin.readline()
        return {"status": "paid"}
    result = RecoveryGuard(data_dir).tool_execution(
        tool_name="send_payment", args={"amount": 5}, next_call=downstream,
        session_id="session-A", tool_call_id="call-1")
    print(json.dumps({"result": result}), flush=True)
elif mode == "crash":
    kind = sys.argv[4]
    def kill_at_replace(boundary, event_kind):
        if boundary == "checkpoint_replaced" and event_kind == kind:
            os.kill(os.getpid(), signal.SIGKILL)
    durable.set_boundary_hook(kill_at_replace)
    if kind == "resolved":
        from crash_recovery import operator_cli
        operator_cli.main(["--data-dir", data_dir, "resolve", sys.argv[5],
                           "--outcome", "not_applied", "--evidence", "checked the ledger"])
    else:
        def downstream():
            note_downstream_ran()
            if kind == "uncertain":
                raise RuntimeError("gateway timeout")
            return {"status": "booked"}
        RecoveryGuard(data_dir).tool_execution(
            tool_name="book_flight", args={"to": "LIS"}, next_call=downstream,
            session_id="session-B", tool_call_id="call-9")
sys.exit(3)  # a crash child must never get here
'''


class OperatorTestCase(JournalTestCase):
    """Children, guards and CLI helpers shared by the operator tests."""

    def setUp(self):
        super().setUp()
        self.child_path = os.path.join(self.root, "child.py")
        with open(self.child_path, "w", encoding="utf-8") as stream:
            stream.write(CHILD_PROGRAM)
        self.ran_marker = os.path.join(self.root, "downstream_ran")

    # -------------------------------------------------------------- helpers --

    def guard(self, **options):
        """A RecoveryGuard on self.data_dir whose journal is closed at cleanup."""
        guard = RecoveryGuard(self.data_dir, **options)
        self.addCleanup(lambda: guard.gate.opened_journal is not None and guard.close())
        return guard

    def cli(self, *words, expect=0):
        """Run the CLI; assert its exit code; return the parsed JSON."""
        code, document, stdout = run_cli(self.data_dir, *words)
        self.assertEqual(code, expect, f"operator_cli {' '.join(words)} -> {stdout}")
        return document

    def cli_text(self, *words):
        code, _, stdout = run_cli(self.data_dir, *words)
        self.assertEqual(code, 0, stdout)
        return stdout

    def start_hanging_child(self):
        """A child inside a protected call's downstream; returns the Popen."""
        child = subprocess.Popen([sys.executable, self.child_path, REPO, "hang", self.data_dir],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        self.addCleanup(self._reap, child)
        ready, _, _ = select.select([child.stdout], [], [], CHILD_TIMEOUT_SECONDS)
        self.assertTrue(ready, "the child never reached downstream")
        self.assertEqual(child.stdout.readline().strip(), "running")
        return child

    @staticmethod
    def _reap(child):
        if child.poll() is None:
            child.kill()
        child.wait(CHILD_TIMEOUT_SECONDS)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream:
                stream.close()

    def crash_child(self, kind, operation_id=None):
        """Run a child that SIGKILLs itself between head.json's replace and COMMIT."""
        words = [sys.executable, self.child_path, REPO, "crash", self.data_dir, kind]
        if operation_id:
            words.append(operation_id)
        completed = subprocess.run(words, capture_output=True, text=True,
                                   timeout=CHILD_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, SIGKILL_EXIT,
                         f"the {kind} crash child was not killed: {completed.stderr}")

    def make_uncertain(self, guard=None):
        """A committed uncertain operation made in this process; returns its id.

        A guard made here is closed at once: the independent verifier's snapshot
        copies the database with open()/close(), which drops this process's
        SQLite locks, and a live connection must not depend on them."""
        own_guard = guard is None
        guard = guard or self.guard()

        def failing():
            raise RuntimeError("connection reset")
        with self.assertRaises(RuntimeError):
            guard.tool_execution(tool_name="book_flight", args={"to": "OPO"}, next_call=failing,
                                 session_id="session-U", tool_call_id="call-U")
        if own_guard:
            guard.close()
        return self.cli("status")["unresolved"][0]["operation_id"]

    def operator_log(self):
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            return [json.loads(line) for line in stream]

    def assertBlocks(self, operation_id):
        """A new protected call is refused by both gates, naming operation_id."""
        guard = self.guard()
        verdict = guard.pre_tool_call(tool_name="post_message", args={"text": "hi"},
                                      session_id="s", tool_call_id="c")
        self.assertEqual(verdict["action"], "block")
        self.assertIn(operation_id, json.loads(verdict["message"])["operation_ids"])
        calls = []
        result = json.loads(guard.tool_execution(
            tool_name="post_message", args={"text": "hi"}, next_call=lambda: calls.append(1),
            session_id="s", tool_call_id="c"))
        self.assertEqual(result["error"], "crash_recovery_blocked")
        self.assertEqual(calls, [])


# ------------------------------------------------------------- call lock --

class CallLockOwnerTest(OperatorTestCase):

    def test_running_owner_blocks_resolve_unless_forced(self):
        child = self.start_hanging_child()
        status = self.cli("status")
        [operation] = status["unresolved"]
        operation_id = operation["operation_id"]
        self.assertEqual((operation["owner"], operation["owner_pid"]), ("running", child.pid))
        self.assertEqual(self.cli("show", operation_id)["operation"]["owner"], "running")
        self.assertIn(f"running (pid {child.pid})", self.cli_text("status", "--format", "text"))

        before = self.snapshot()
        refused = self.cli("resolve", operation_id, "--outcome", "completed",
                           "--evidence", "payment visible in the bank portal", expect=1)
        self.assertEqual(refused["error"]["code"], "owner_running")
        self.assertIn("still runs", refused["error"]["message"])
        self.assertIn("`resolve --force`", refused["error"]["hint"])  # the CLI's words
        self.assertEqual(refused["error"]["owner"]["pid"], child.pid)
        self.assertEqual(self.snapshot(), before, "a refused resolve changed files")

        forced = self.cli("resolve", operation_id, "--outcome", "completed", "--force",
                          "--evidence", "worker hung on a dead socket; bank shows payment P-7")
        self.assertTrue(forced["forced"])
        [entry] = self.operator_log()
        self.assertEqual((entry["action"], entry["forced"], entry["owner"]),
                         ("resolve", True, "running"))
        self.assertIn("dead socket", entry["evidence"])

        # The worker finishes after all: the real outcome is not lost.  It is a
        # durable late_outcome event, logged as a WARNING, shown as needing
        # attention until an operator acknowledges it; the gate stays as the
        # resolution left it.
        child.stdin.write("go\n")
        child.stdin.flush()
        output, errors = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
        # (logging's last-resort handler prints WARNINGs and above, bare.)
        self.assertIn("after an operator had resolved it", errors)
        self.assertEqual(json.loads(output)["result"], {"status": "paid"})
        status = self.cli("status", "--check", expect=3)
        self.assertEqual((status["gate"], status["unresolved"]), ("open", []))
        [late] = status["attention"]
        self.assertEqual((late["operation_id"], late["late_reason"], late["tool"]),
                         (operation_id, "returned", "send_payment"))
        shown = self.cli("show", operation_id)
        self.assertEqual([event["kind"] for event in shown["events"]],
                         ["started", "resolved", "late_outcome"])
        self.assertEqual(shown["events"][1]["operator"]["uid"], os.getuid())
        self.assertIs(shown["events"][1]["forced"], True)
        self.assertIn("acknowledge", self.cli_text("status", "--format", "text"))
        refused = self.cli("acknowledge", operation_id, "--evidence", " ", expect=1)
        self.assertEqual(refused["error"]["code"], "invalid_evidence")
        acknowledged = self.cli("acknowledge", operation_id, "--evidence",
                                "bank shows one payment P-7; the forced resolution stands")
        self.assertEqual((acknowledged["acknowledged"], acknowledged["late_reason"]),
                         (operation_id, "returned"))
        self.assertEqual(self.cli("status", "--check")["attention"], [])
        again = self.cli("acknowledge", operation_id, "--evidence", "again", expect=1)
        self.assertEqual(again["error"]["code"], "nothing_to_acknowledge")
        self.assertEqual([entry["action"] for entry in self.operator_log()],
                         ["resolve", "acknowledge"])
        self.assertEqual(self.cli("verify")["unresolved_count"], 0)
        self.assertVerifies()

    def test_owner_gone_after_sigkill_and_resolve_works(self):
        child = self.start_hanging_child()
        operation_id = self.cli("status")["unresolved"][0]["operation_id"]
        child.send_signal(signal.SIGKILL)
        self.assertEqual(child.wait(CHILD_TIMEOUT_SECONDS), SIGKILL_EXIT)

        [operation] = self.cli("status")["unresolved"]
        self.assertEqual((operation["owner"], operation["state"]), ("gone", "pending"))
        self.assertEqual(self.cli("show", operation_id)["operation"]["owner"], "gone")
        # The dead worker's call lock stays as evidence: it names the pid that ran it.
        with open(os.path.join(self.data_dir, "calls", operation_id), encoding="utf-8") as stream:
            self.assertEqual(json.load(stream)["pid"], child.pid)
        self.assertBlocks(operation_id)

        resolved = self.cli("resolve", operation_id, "--outcome", "not_applied",
                            "--evidence", "no payment P-7 in the bank portal")
        self.assertEqual((resolved["previous_state"], resolved["forced"]), ("pending", False))
        self.assertEqual(self.cli("status")["unresolved"], [])
        self.assertEqual(self.guard().tool_execution(
            tool_name="send_payment", args={"amount": 5}, next_call=lambda: "paid"), "paid")
        self.assertVerifies()


# ---------------------------------------------------------------- repair --

class RepairTest(OperatorTestCase):

    def crash_and_repair(self, kind, operation_id=None):
        """Crash a child between replace and COMMIT, check the blocked state,
        repair, and return (repair result, status after)."""
        self.crash_child(kind, operation_id)
        ahead = self.cli("status", expect=1)
        self.assertEqual(ahead["integrity"], "checkpoint_ahead")
        self.assertIn("repair-checkpoint", ahead["error"]["hint"])
        before = self.snapshot()
        missing = self.cli("repair-checkpoint", expect=1)
        self.assertEqual(missing["error"]["code"], "usage")
        blank = self.cli("repair-checkpoint", "--evidence", "  ", expect=1)
        self.assertEqual(blank["error"]["code"], "invalid_evidence")
        self.assertEqual(self.snapshot(), before)

        repaired = self.cli("repair-checkpoint", "--evidence",
                            f"host lost power while a {kind} event was written")
        # A lost event that may have been a started comes back as an open
        # operation (two events); any other lost event is just dropped.
        self.assertEqual(repaired["checkpoint_after"]["count"] - repaired["checkpoint_before"]["count"],
                         1 if kind == "started" else -1)
        [entry] = [entry for entry in self.operator_log() if entry["action"] == "repair-checkpoint"]
        self.assertEqual({"time", "action", "evidence", "checkpoint_before", "checkpoint_after"}
                         - set(entry), set())
        self.assertEqual((entry["checkpoint_before"], entry["checkpoint_after"]),
                         (repaired["checkpoint_before"], repaired["checkpoint_after"]))
        self.assertRegex(entry["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        verified = self.cli("verify")
        self.assertEqual(verified["repairs"], [entry])
        self.assertVerifies()
        self.cli("repair-checkpoint", "--evidence", "twice", expect=1)  # nothing left to repair
        return repaired, self.cli("status")

    def test_lost_started_comes_back_as_an_open_operation(self):
        # head.json one ahead with nothing open: the lost event may have been a
        # started whose tool ran (e.g. committed into a WAL that was lost).  The
        # repair never opens the gate for it: a person settles it.
        repaired, status = self.crash_and_repair("started")
        self.assertFalse(os.path.exists(self.ran_marker), "downstream ran before COMMIT")
        [operation] = status["unresolved"]
        self.assertEqual((operation["operation_id"], operation["tool"], operation["state"],
                          operation["reason"]),
                         (repaired["lost_operation"], "unknown", "uncertain", "lost_in_crash"))
        self.assertEqual(status["checkpoint"]["count"], 2)
        self.assertIn("lost_in_crash", repaired["lost_event"])
        shown = self.cli("show", operation["operation_id"])
        self.assertEqual(shown["events"][0]["lost_in_crash"], repaired["checkpoint_before"])
        self.assertBlocks(operation["operation_id"])
        self.cli("resolve", operation["operation_id"], "--outcome", "not_applied",
                 "--evidence", "no booking in the airline portal at that time")
        self.assertEqual(self.guard().tool_execution(
            tool_name="book_flight", args={"to": "LIS"}, next_call=lambda: "booked"), "booked")

    def test_lost_returned_or_uncertain_leaves_the_operation_pending(self):
        for kind in ("returned", "uncertain"):
            with self.subTest(kind=kind):
                self.setUp()  # a fresh directory per kind
                repaired, status = self.crash_and_repair(kind)
                self.assertTrue(os.path.exists(self.ran_marker))
                [operation] = status["unresolved"]
                self.assertEqual((operation["state"], operation["tool"]), ("pending", "book_flight"))
                self.assertEqual(repaired["unresolved"][0]["operation_id"],
                                 operation["operation_id"])
                self.assertIn("keeps blocking", repaired["lost_event"])
                self.assertBlocks(operation["operation_id"])

    def test_lost_resolved_leaves_the_operation_unresolved(self):
        operation_id = self.make_uncertain()
        self.crash_and_repair("resolved", operation_id)
        [operation] = self.cli("status")["unresolved"]
        self.assertEqual((operation["operation_id"], operation["state"]), (operation_id, "uncertain"))
        self.assertBlocks(operation_id)
        self.cli("resolve", operation_id, "--outcome", "not_applied", "--evidence", "no booking")
        self.assertEqual(self.cli("status")["unresolved"], [])

    def test_every_other_mismatch_is_refused_unchanged(self):
        guard = self.guard()
        self.assertEqual(guard.tool_execution(tool_name="book_flight", args={"to": "LIS"},
                                              next_call=lambda: "booked"), "booked")
        self.make_uncertain(guard)
        guard.close()
        checkpoint = self.cli("checkpoint")
        head_path = os.path.join(self.data_dir, "head.json")
        with sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3")) as connection:
            hash_at_3 = connection.execute("SELECT hash FROM events WHERE seq = 3").fetchone()[0]
        connection.close()
        count = checkpoint["count"]
        cases = {
            "two_ahead": (dict(checkpoint, count=count + 2, head="a" * 64), "journal_rolled_back"),
            "behind": (dict(checkpoint, count=count - 1, head=hash_at_3), "checkpoint_behind"),
            "foreign": (dict(checkpoint, count=count + 1, journal_id=str(uuid.uuid4())),
                        "checkpoint_foreign"),
            "head_mismatch": (dict(checkpoint, head="b" * 64), "checkpoint_mismatch"),
            "matches": (checkpoint, "ok"),
        }
        for name, (written, found) in cases.items():
            with self.subTest(case=name):
                with open(head_path, "w", encoding="utf-8") as stream:
                    json.dump(written, stream)
                before = self.snapshot()
                refused = self.cli("repair-checkpoint", "--evidence", "a crash, I think", expect=1)
                self.assertEqual(refused["error"]["code"], "repair_not_applicable")
                self.assertEqual((refused["error"]["found"], refused["integrity"]), (found, found))
                self.assertEqual(self.snapshot(), before)
        with self.subTest(case="database_chain_broken"):
            # The crash state (one ahead) on top of an edited row: refused too.
            with open(head_path, "w", encoding="utf-8") as stream:
                json.dump(dict(checkpoint, count=count + 1, head="c" * 64), stream)
            reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                                 "'book_flight', 'book_hotel') WHERE seq = 1")
            before = self.snapshot()
            refused = self.cli("repair-checkpoint", "--evidence", "a crash, I think", expect=1)
            self.assertEqual(refused["error"]["code"], "hash_mismatch")
            self.assertEqual(self.snapshot(), before)
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "operator.log")))


# ---------------------------------------------------------- reading --

def display_columns(line):
    """Start column (terminal cells) of every character of ``line``."""
    columns, position = [], 0
    for character in line:
        columns.append(position)
        position += (0 if unicodedata.combining(character) else
                     2 if unicodedata.east_asian_width(character) in "WF" else 1)
    return columns


class ReadingTest(OperatorTestCase):

    def setUp(self):
        super().setUp()
        guard = self.guard()
        self.assertEqual(guard.tool_execution(tool_name="read_inbox", args={}, next_call=lambda: "3",
                                              session_id="会話-1", tool_call_id="call-0"), "3")
        self.operation_id = self.make_uncertain(guard)

    def assertAligned(self, table_lines):
        """Every row has a cell starting exactly where each column title starts
        (in terminal cells), preceded by at least two spaces."""
        header = table_lines[0]
        titles = list(re.finditer(r"\S+", header))
        starts = [match.start() for match in titles]  # the header is ASCII
        self.assertGreater(len(starts), 3)
        for line in table_lines[1:]:
            cells = list(re.finditer(r"\S+(?: \S+)*", line))
            self.assertEqual(len(cells), len(starts), f"cell count differs:\n{header}\n{line}")
            positions = display_columns(line)
            self.assertEqual([positions[cell.start()] for cell in cells], starts,
                             f"misaligned:\n{header}\n{line}")

    def test_show_gives_the_whole_verified_history(self):
        self.cli("resolve", self.operation_id, "--outcome", "completed",
                 "--evidence", "PNR ABC123 in the airline portal")
        shown = self.cli("show", self.operation_id)
        self.assertEqual([event["kind"] for event in shown["events"]],
                         ["started", "uncertain", "resolved"])
        self.assertEqual([event["seq"] for event in shown["events"]], [3, 4, 5])
        self.assertEqual(shown["events"][-1]["evidence"], "PNR ABC123 in the airline portal")
        self.assertEqual((shown["operation"]["state"], shown["operation"]["outcome"]),
                         ("resolved", "completed"))
        self.cli("show", str(uuid.uuid4()), expect=1)
        self.cli("show", "not-an-id", expect=1)
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'book_flight', 'book_hotel') WHERE seq = 3")
        self.assertEqual(self.cli("show", self.operation_id, expect=1)["integrity"],
                         "hash_mismatch")

    def test_log_since_and_jsonl(self):
        self.assertEqual([event["seq"] for event in self.cli("log")["events"]], [1, 2, 3, 4])
        self.assertEqual([event["seq"] for event in self.cli("log", "--since", "2")["events"]],
                         [3, 4])
        self.assertEqual(self.cli("log", "--since", "4")["events"], [])
        lines = self.cli_text("log", "--since", "1", "--jsonl").splitlines()
        self.assertEqual([json.loads(line)["seq"] for line in lines], [2, 3, 4])
        self.assertEqual(json.loads(lines[1])["kind"], "started")

    def test_text_tables_are_aligned(self):
        status = self.cli_text("--format", "text", "status").splitlines()
        self.assertEqual(re.sub(r"\d+ s ", "N s ", self.cli_text("status", "--format", "text")),
                         re.sub(r"\d+ s ", "N s ", "\n".join(status) + "\n"),
                         "--format after the command differs")
        table_start = next(index for index, line in enumerate(status)
                           if line.startswith("OPERATION_ID"))
        self.assertAligned(status[table_start:table_start + 2])
        self.assertIn("uncertain", status[table_start + 1])
        self.assertTrue(any(" resolve " in line and self.operation_id in line for line in status))

        # A multi-line evidence and a wide-character session id keep rows intact.
        self.cli("resolve", self.operation_id, "--outcome", "not_applied",
                 "--evidence", "no PNR\nchecked\tby 夜勤")
        log = self.cli_text("log", "--format", "text").splitlines()
        self.assertEqual(len(log), 2 + 1 + 5)
        self.assertAligned(log[2:])
        self.assertIn("no PNR\\nchecked\\tby 夜勤", log[-1])

        show = self.cli_text("show", self.operation_id, "--format", "text").splitlines()
        self.assertIn(f"operation_id: {self.operation_id}", show)
        table_start = next(index for index, line in enumerate(show) if line.startswith("SEQ"))
        self.assertAligned(show[table_start:])
        self.assertEqual(len(show) - table_start, 1 + 3)
        fields = dict(line.split(": ", 1) for line in show[2:table_start - 1])
        self.assertEqual(fields["state"].strip(), "resolved")
        value_starts = {len(line) - len(line.split(": ", 1)[1].lstrip())
                        for line in show[2:table_start - 1]}
        self.assertEqual(len(value_starts), 1, "show's field values are not aligned")

    def test_text_errors_are_readable(self):
        code, _, stdout = run_cli(self.data_dir, "--format", "text", "resolve",
                                  self.operation_id, "--outcome", "completed", "--evidence", " ")
        self.assertEqual(code, 1)
        self.assertTrue(stdout.startswith("error: invalid_evidence\n"), stdout)


# ------------------------------------------------- what the model sees --

class ModelFacingTest(OperatorTestCase):

    def test_ten_retries_change_nothing(self):
        child = self.start_hanging_child()
        child.send_signal(signal.SIGKILL)
        child.wait(CHILD_TIMEOUT_SECONDS)
        os.unlink(self.ran_marker)
        operation_id = self.cli("status")["unresolved"][0]["operation_id"]
        before = self.snapshot()
        guard = self.guard()
        calls = []
        for attempt in range(10):
            with self.subTest(attempt=attempt):
                verdict = guard.pre_tool_call(tool_name="send_payment", args={"amount": 5},
                                              session_id="session-A", tool_call_id=f"retry-{attempt}")
                self.assertEqual(verdict["action"], "block")
                hook_message = json.loads(verdict["message"])
                result = json.loads(guard.tool_execution(
                    tool_name="send_payment", args={"amount": 5},
                    next_call=lambda: calls.append("paid") or "paid",
                    session_id="session-A", tool_call_id=f"retry-{attempt}"))
                for blocked in (hook_message, result):
                    self.assertEqual((blocked["error"], blocked["blocked"], blocked["operation_ids"]),
                                     ("crash_recovery_blocked", True, [operation_id]))
        self.assertEqual(calls, [])
        self.assertFalse(os.path.exists(self.ran_marker))
        self.assertEqual(self.snapshot(), before, "retries changed the journal or its files")
        self.assertEqual(self.cli("log")["checkpoint"]["count"], 1)

    def test_blocked_explanation_and_its_command_work(self):
        operation_id = self.make_uncertain()
        guard = self.guard()
        blocked = json.loads(guard.tool_execution(tool_name="book_flight", args={"to": "OPO"},
                                                  next_call=lambda: "booked"))
        hook = json.loads(guard.pre_tool_call(tool_name="book_flight", args={"to": "OPO"})["message"])
        self.assertEqual((hook["code"], hook["operation_ids"]), (blocked["code"], [operation_id]))
        explanation = blocked["explanation"]
        self.assertIn(operation_id, explanation)
        self.assertIn("book_flight", explanation)
        self.assertRegex(explanation, r"started \d+ (s|min|h|d) ago")
        self.assertIn("outcome is unknown", explanation)
        self.assertIn("a person must check", explanation)
        self.assertIn("Do not retry", explanation)

        status_words = shlex.split(blocked["operator_command"])
        self.assertEqual(subprocess.run(status_words, capture_output=True,
                                        timeout=CHILD_TIMEOUT_SECONDS).returncode, 0)
        # The model is told how the person looks at it, never how to settle it.
        command = explanation.split("they can look at it with: ", 1)[1]
        self.assertEqual(shlex.split(command)[-2:], ["show", operation_id])
        for word in ("resolve", "--outcome", "--evidence", "--force"):
            self.assertNotIn(word, explanation)
        completed = subprocess.run(shlex.split(command), capture_output=True, text=True,
                                   cwd="/", env={"PATH": os.environ.get("PATH", "")},
                                   timeout=CHILD_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stdout + completed.stderr)
        self.assertEqual(json.loads(completed.stdout)["operation"]["operation_id"], operation_id)
        self.cli("resolve", operation_id, "--outcome", "not_applied", "--evidence",
                 "no booking for OPO in the airline portal")
        self.assertEqual(guard.tool_execution(tool_name="book_flight", args={"to": "OPO"},
                                              next_call=lambda: "booked"), "booked")
        self.assertVerifies()


if __name__ == "__main__":
    import unittest
    unittest.main()
