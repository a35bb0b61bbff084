"""Readers wait for a live archive switch (docs/cli.md §status, docs/format.md
§Archives), on real processes and files.

An ``archive`` child pauses at each boundary of the switch in turn (the
boundary hook: it waits for a line on stdin, never for the clock).  While it
stays paused, readers in the test process -- ``status``, ``verify --all``, the
model's status tool, the hook and a second archive -- run to their end: each
answers ``ok`` or, inside the writer's lock, ``database_locked`` (the journal
is being written), never an integrity verdict.  Then readers in fresh
processes -- ``status``, ``verify``, a second ``archive`` and a protected call
-- start and the archiver is let go: whatever the interleaving, status and
verify answer ``ok``, the second archive is ``ok`` or refused for a plain
reason, and the call runs exactly once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from support import OPERATOR_CLI, TESTS, JournalTestCase, operator_argv, run_cli
from test_archive_concurrency import PAUSING_ARCHIVER  # pauses at BOUNDARY:KIND, says "paused"

from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402
from crash_recovery.reports.status import status_report  # noqa: E402
from crash_recovery.storage.errors import JournalError  # noqa: E402

TIMEOUT_SECONDS = 120
# Readers inside the paused switch give up waiting after this many seconds.
PAUSED_BUSY_TIMEOUT = 0.5

# One protected call in a fresh process; prints {"ran": n, "result": ...}.
ONE_CALL = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.guard import RecoveryGuard
    ran = []
    guard = RecoveryGuard(sys.argv[1])
    result = guard.tool_execution(tool_name="book_trip", args={{}}, session_id="s",
                                  tool_call_id=sys.argv[2],
                                  next_call=lambda: ran.append(1) or {{"pnr": "P"}})
    guard.close()
    print(json.dumps({{"ran": len(ran), "result": result}}))
""").format(tests=TESTS)

# Every boundary of an archive, in the order the switch reaches them.
BOUNDARIES = (
    ("archive_copied", "archived"), ("begin", "archived"), ("archive_completed", "archived"),
    ("checkpoint_replaced", "archive_intent"), ("archive_sealed", "archived"),
    ("checkpoint_replaced", "archived"), ("checkpoint_replaced", "archived_marker"),
    ("committed", "archived"), ("intent_removed", "archived"))
INTEGRITY_VERDICTS = ("identity_mismatch", "archive_interrupted", "checkpoint_ahead",
                      "journal_rolled_back", "checkpoint_behind", "checkpoint_foreign",
                      "checkpoint_mismatch", "marker_corrupt", "archive_missing",
                      "archive_mismatch")


class ReadersDuringALiveArchive(JournalTestCase):

    def test_no_reader_sees_a_verdict_at_any_step_of_a_live_switch(self):
        archiver_program = self.write("archiver.py", PAUSING_ARCHIVER)
        call_program = self.write("call.py", ONE_CALL)
        calls = 0
        for boundary in BOUNDARIES:
            with self.subTest(boundary=boundary):
                guard = RecoveryGuard(self.data_dir)  # something to archive
                self.assertEqual(guard.tool_execution(tool_name="book_trip", args={},
                                                      next_call=dict, session_id="s",
                                                      tool_call_id=":".join(boundary)), {})
                guard.close()
                archiver = subprocess.Popen(
                    [sys.executable, archiver_program, self.data_dir, ":".join(boundary)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True)
                paused = archiver.stderr.readline()
                if paused != "paused\n":
                    self.fail(f"the archiver did not pause: {paused}{archiver.communicate()} "
                              f"(this process: {os.getpid()})")
                # While the switch stays paused: each reader waits for it, then
                # answers honestly that the journal is being written -- or ok.
                paused_answers = self.read_while_paused()
                for name, code in paused_answers.items():
                    self.assertIn(code, ("ok", "database_locked"), (name, paused_answers))
                readers = {
                    "status": self.start([OPERATOR_CLI, "--data-dir", self.data_dir, "status"]),
                    "verify": self.start([OPERATOR_CLI, "--data-dir", self.data_dir, "verify"]),
                    # From the operator's own shell: this process may still
                    # hold a parked connection (an agent, to the command).
                    "archive": self.start(operator_argv(
                        [sys.executable, OPERATOR_CLI, "--data-dir", self.data_dir, "archive"],
                        ["archive"])),
                    "call": self.start([call_program, self.data_dir, "-".join(boundary)]),
                }
                archiver.stdin.write("go\n")
                archiver.stdin.flush()
                output, errors = archiver.communicate(timeout=TIMEOUT_SECONDS)
                # The second archive may have sealed everything first.
                self.assertTrue(archiver.returncode == 0 or json.loads(output)["error"]["code"]
                                == "archive_refused", output + errors)
                answers = {name: self.answer(process) for name, process in readers.items()}
                for name in ("status", "verify"):
                    self.assertEqual((answers[name].get("ok"), answers[name].get("integrity")),
                                     (True, "ok"), (name, answers[name]))
                second = answers["archive"]
                self.assertTrue(second.get("ok") or second["error"]["code"] in
                                ("archive_refused", "owner_running"), second)
                self.assertEqual(answers["call"]["ran"], 1, answers["call"])
                calls += 1
                seen = json.dumps(answers)
                self.assertEqual([code for code in INTEGRITY_VERDICTS if code in seen], [],
                                 seen)
        code, status, stdout = run_cli(self.data_dir, "verify", "--all")
        self.assertEqual(code, 0, stdout)
        self.assertEqual(calls, len(BOUNDARIES))
        self.assertVerifies()

    def read_while_paused(self):
        """``{reader: code}`` from in-process readers with a short busy timeout."""
        answers = {}
        with Journal(self.data_dir, readonly=True, busy_timeout=PAUSED_BUSY_TIMEOUT) as reader:
            report = status_report(reader, self.data_dir)
            answers["status"] = report["integrity"]
            try:
                reader.verify_all()
                answers["verify_all"] = "ok"
            except JournalError as exc:
                answers["verify_all"] = exc.code
        guard = RecoveryGuard(self.data_dir, busy_timeout=PAUSED_BUSY_TIMEOUT)
        answers["status_tool"] = json.loads(guard.status_tool({}))["integrity"]
        hook = guard.pre_tool_call(tool_name="book_trip", args={}, session_id="s",
                                   tool_call_id="paused")
        answers["hook"] = json.loads(hook["message"])["code"] if hook else "ok"
        guard.close()
        with Journal(self.data_dir, busy_timeout=PAUSED_BUSY_TIMEOUT) as second:
            try:
                second.archive()
                answers["archive"] = "ok"
            except JournalError as exc:
                answers["archive"] = "ok" if exc.code == "archive_refused" else exc.code
        return answers

    def write(self, name, text):
        path = f"{self.root}/{name}"
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return path

    def start(self, argv):
        argv = argv if argv[0] == sys.executable else [sys.executable, *argv]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: process.poll() is None and process.kill())
        return process

    def answer(self, process):
        output, errors = process.communicate(timeout=TIMEOUT_SECONDS)
        try:
            return json.loads(output)
        except ValueError:
            self.fail(f"no JSON document: {output!r} {errors!r}")
