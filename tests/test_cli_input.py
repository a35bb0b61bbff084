"""The operator command line answers every input with one document and a
documented exit code: usage errors inside Hermes, --format text for every
command, shortened operation ids, evidence from a file or stdin, refusals that
say why, and Ctrl-C at any point (docs/cli.md §Output)."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import unittest

from support import OPERATOR_CLI, JournalTestCase, run_cli
from crash_recovery import operator_cli
from crash_recovery.journal import NO_RESPONSE_HASH, Journal

TESTS = os.path.dirname(os.path.abspath(__file__))


class NewerHermesParser(argparse.ArgumentParser):
    """Like Hermes 0.22's parser: an unknown command is reported through
    ``exit(2, text)``, not ``error()``."""

    def _check_value(self, action, value):
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            self.exit(2, f"{self.prog}: '{value}' is not a `{self.prog}` command.\n"
                         f"Run `{self.prog} --help` to see all commands.\n")
        super()._check_value(action, value)


def hermes_parse(words, parser_class=argparse.ArgumentParser):
    """Parse like Hermes: its own top parser, ``crash-recovery`` set up by the
    plugin; returns (exit code or None, stdout, stderr)."""
    top = parser_class(prog="hermes")
    operator_cli.setup_hermes_command(top.add_subparsers(dest="top").add_parser(
        "crash-recovery"))
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            top.parse_args(["crash-recovery", *words])
            code = None
        except SystemExit as exc:
            code = exc.code
    return code, stdout.getvalue(), stderr.getvalue()


class UsageErrorsInsideHermes(unittest.TestCase):

    def test_every_usage_error_is_one_json_document_and_exit_1(self):
        # (Each error differs: Hermes parses twice, so one process prints each once.)
        for words in (["--bogus-before", "status"], ["status", "--bogus-after"], ["nosuch"],
                      ["--format", "xml", "status"], ["resolve"],
                      ["resolve", "x", "--outcome", "completed", "--evidence", "e",
                       "--evidence-file", "f"]):
            with self.subTest(words=words):
                code, stdout, stderr = hermes_parse(words)
                self.assertEqual(code, 1, stderr)
                self.assertEqual(json.loads(stdout)["error"]["code"], "usage")
                self.assertEqual(stderr, "")

    def test_a_newer_hermes_reporting_an_unknown_command_gets_json_too(self):
        code, stdout, stderr = hermes_parse(["no-such-command"], NewerHermesParser)
        self.assertEqual((code, stderr), (1, ""))
        error = json.loads(stdout)["error"]
        self.assertEqual(error["code"], "usage")
        self.assertIn("'no-such-command' is not a", error["message"])

    def test_a_correct_line_parses(self):
        self.assertEqual(hermes_parse(["status", "--format", "text"])[0], None)


class Operations(JournalTestCase):
    """Two closed operations whose ids share their first four characters."""

    FIRST = "abcd1111-0000-4000-8000-000000000001"
    SECOND = "abcd2222-0000-4000-8000-000000000002"

    def setUp(self):
        super().setUp()
        with Journal(self.data_dir) as journal:
            for operation_id in (self.FIRST, self.SECOND):
                journal.admit(operation_id=operation_id, tool="send_payment",
                              args_hash=NO_RESPONSE_HASH, fingerprint=NO_RESPONSE_HASH,
                              session_id="s", tool_call_id=operation_id[:8])
                if operation_id == self.FIRST:
                    journal.record_outcome(operation_id, uncertain=False,
                                           result_hash=NO_RESPONSE_HASH, reason="returned")
                else:
                    journal.record_outcome(operation_id, uncertain=True,
                                           result_hash=NO_RESPONSE_HASH, reason="exception")

    def test_a_unique_prefix_names_the_operation(self):
        code, shown, _ = run_cli(self.data_dir, "show", "ABCD2")
        self.assertEqual((code, shown["operation"]["operation_id"]), (0, self.SECOND))
        code, resolved, _ = run_cli(self.data_dir, "resolve", "abcd2222", "--outcome",
                                    "not_applied", "--evidence", "no charge in the ledger")
        self.assertEqual((code, resolved["resolved"]), (0, self.SECOND))

    def test_an_ambiguous_prefix_is_refused_with_its_candidates(self):
        before = self.snapshot()
        code, refused, _ = run_cli(self.data_dir, "resolve", "abcd", "--outcome", "completed",
                                   "--evidence", "x")
        self.assertEqual((code, refused["error"]["code"], refused["error"]["candidates"]),
                         (1, "ambiguous_operation_id", [self.FIRST, self.SECOND]))
        code, refused, _ = run_cli(self.data_dir, "show", "ffff")
        self.assertEqual((code, refused["error"]["code"]), (1, "unknown_operation"))
        self.assertEqual(self.snapshot(), before)

    def test_operation_not_open_says_how_it_closed(self):
        code, refused, _ = run_cli(self.data_dir, "resolve", self.FIRST, "--outcome",
                                   "completed", "--evidence", "x")
        self.assertEqual((code, refused["error"]["code"], refused["error"]["closed_by"]),
                         (1, "operation_not_open", "returned"))
        self.assertIn("its tool returned (returned)", refused["error"]["message"])
        self.assertTrue(refused["error"]["next"].endswith(f"show {self.FIRST}"))

    def test_text_format_summarises_write_commands(self):
        code, _, text = run_cli(self.data_dir, "--format", "text", "resolve", self.SECOND,
                                "--outcome", "not_applied", "--evidence", "no charge")
        self.assertEqual(code, 0)
        self.assertTrue(text.startswith(f"resolved {self.SECOND} (send_payment, was "
                                        "uncertain) as not_applied\n"), text)
        code, _, text = run_cli(self.data_dir, "archive", "--format", "text")
        self.assertEqual(code, 0)
        self.assertTrue(text.startswith("archived 5 events into archive/"), text)

    def test_evidence_from_a_file_and_from_stdin(self):
        evidence = os.path.join(self.root, "receipt.txt")
        with open(evidence, "w", encoding="utf-8") as stream:
            stream.write("ledger row 7781: no charge\nchecked 07:55 UTC\n")
        code, _, _ = run_cli(self.data_dir, "resolve", self.SECOND, "--outcome", "not_applied",
                             "--evidence-file", evidence)
        self.assertEqual(code, 0)
        code, log, _ = run_cli(self.data_dir, "log")
        self.assertEqual(log["events"][-1]["evidence"],
                         "ledger row 7781: no charge\nchecked 07:55 UTC")
        completed = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir", self.data_dir,
                                    "archive"], capture_output=True, text=True, timeout=60)
        self.assertEqual(completed.returncode, 0, completed.stdout)
        with Journal(self.data_dir) as journal:
            late = "abcd3333-0000-4000-8000-000000000003"
            journal.admit(operation_id=late, tool="book_trip", args_hash=NO_RESPONSE_HASH,
                          fingerprint=NO_RESPONSE_HASH, session_id=None, tool_call_id=None)
        piped = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir", self.data_dir,
                                "resolve", "abcd3", "--outcome", "completed",
                                "--evidence-file", "-"], input="PNR ABC123\n",
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(piped.returncode, 0, piped.stdout)
        self.assertEqual(json.loads(piped.stdout)["resolved"], late)

    def test_any_output_encoding_gives_one_whole_document(self):
        evidence = "Quittung für Zoë, 中文 — checked"
        run_cli(self.data_dir, "resolve", self.SECOND, "--outcome", "completed", "--evidence",
                evidence)
        environment = {**os.environ, "PYTHONIOENCODING": "ascii"}
        for words in (("show", self.SECOND), ("--format", "text", "show", self.SECOND),
                      ("log", "--jsonl")):
            with self.subTest(words=words):
                completed = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir",
                                            self.data_dir, *words], capture_output=True,
                                           env=environment, timeout=60)
                self.assertEqual((completed.returncode, completed.stderr), (0, b""))
                completed.stdout.decode("ascii")  # nothing the encoding could not take
                if words[0] == "show":
                    shown = json.loads(completed.stdout)
                    self.assertEqual(shown["events"][-1]["evidence"], evidence)

    def test_unreadable_evidence_files_are_refused(self):
        binary = os.path.join(self.root, "binary")
        with open(binary, "wb") as stream:
            stream.write(b"\xff\xfe not text")
        huge = os.path.join(self.root, "huge")
        with open(huge, "w", encoding="utf-8") as stream:
            stream.write("x" * 70000)
        before = self.snapshot()
        for path in (binary, huge, self.root, os.path.join(self.root, "missing")):
            with self.subTest(path=path):
                code, refused, _ = run_cli(self.data_dir, "resolve", self.SECOND, "--outcome",
                                           "completed", "--evidence-file", path)
                self.assertEqual((code, refused["error"]["code"]), (1, "invalid_evidence"))
        self.assertEqual(self.snapshot(), before)


class ProgressOnATerminal(unittest.TestCase):
    """Long read-only commands show progress on stderr, only on a terminal."""

    def progress(self, command, terminal):
        read_end, write_end = os.pipe()
        handler = signal.getsignal(signal.SIGALRM)
        try:
            with operator_cli.progress_on_terminal(command, fd=write_end, interval=3600,
                                                   terminal=terminal):
                if signal.getsignal(signal.SIGALRM) is not handler:
                    signal.raise_signal(signal.SIGALRM)  # the timer's tick, now
            self.assertIs(signal.getsignal(signal.SIGALRM), handler)  # put back
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as stream:
            return stream.read()

    def test_a_tick_rewrites_one_line_and_clears_it_at_the_end(self):
        shown = self.progress("verify", True)
        self.assertEqual(shown, b"\rcrash-recovery verify: verifying the journal, 0 s (Ctrl-C "
                                b"stops it; nothing is changed)\r\x1b[K")

    def test_nothing_off_a_terminal_or_for_a_write_command(self):
        self.assertEqual(self.progress("verify", False), b"")
        self.assertEqual(self.progress("resolve", True), b"")


# Runs one operator command that gets SIGINT (Ctrl-C) at one durable step.
INTERRUPTED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import support
from crash_recovery import operator_cli
from crash_recovery.storage import durable
# A person's Ctrl-C: Python's own handler, even where this child was started
# with SIGINT ignored (a background job of a shell without job control).
signal.signal(signal.SIGINT, signal.default_int_handler)
def hook(boundary, kind):
    if (boundary, kind) == ({boundary!r}, {kind!r}):
        os.kill(os.getpid(), signal.SIGINT)
durable.set_boundary_hook(hook)
sys.exit(operator_cli.main({words!r}))
"""


class CtrlC(Operations):

    def interrupt(self, boundary, kind, *words):
        completed = subprocess.run([sys.executable, "-c", INTERRUPTED.format(
            tests=TESTS, boundary=boundary, kind=kind,
            words=["--data-dir", self.data_dir, *words])], capture_output=True, text=True,
            timeout=60)
        self.assertEqual(completed.stderr, "")  # no traceback
        return completed.returncode, json.loads(completed.stdout)

    def test_resolve_interrupted_before_commit_changes_nothing(self):
        before = self.snapshot()
        code, document = self.interrupt("inserted", "resolved", "resolve", self.SECOND,
                                        "--outcome", "completed", "--evidence", "x")
        self.assertEqual((code, document["error"]["code"], document["error"]["changed"]),
                         (1, "interrupted", False))
        self.assertIn("before it changed anything", document["error"]["message"])
        self.assertEqual(self.snapshot(), before)

    def test_resolve_interrupted_after_commit_says_it_was_recorded(self):
        code, document = self.interrupt("committed", "resolved", "resolve", self.SECOND,
                                        "--outcome", "completed", "--evidence", "x")
        self.assertEqual((code, document["error"]["changed"]), (1, True))
        self.assertTrue(document["error"]["next"].endswith(" status"))
        code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual(status["unresolved"], [])

    def test_archive_interrupted_in_its_switch_says_what_happens_next(self):
        run_cli(self.data_dir, "resolve", self.SECOND, "--outcome", "completed",
                "--evidence", "x")
        code, before, _ = run_cli(self.data_dir, "checkpoint")
        code, document = self.interrupt("archive_sealed", "archived", "archive")
        self.assertEqual((code, document["error"]["code"]), (1, "interrupted"))
        code, after, _ = run_cli(self.data_dir, "checkpoint")
        # The switch was settled (undone) before the answer: it says so, truly.
        self.assertEqual((code, after), (0, before))
        self.assertEqual(document["error"]["changed"], False)
        self.assertIn("Run it again", document["error"]["message"])
        code, archived, _ = run_cli(self.data_dir, "archive")
        self.assertEqual((code, archived["archived"]["count"]), (0, before["count"]))
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
