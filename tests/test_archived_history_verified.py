"""Every command that prints history says whether what it printed verified,
archives included (docs/cli.md §show, §log), on real files and processes.

A journal is archived, then its archive is edited (a payload rewritten with a
self-consistent hash), damaged (garbage bytes), removed, or changed *between*
the verification and the printing of a streamed ``log --all``.  ``show`` and
``log --all`` (JSON, ``--jsonl``, text) never print edited history as
verified: each answers exit 1 with ``archive_mismatch``/``archive_missing``,
as one complete document (or, streamed, a document that closes with
``"verified": false`` and the error), and never a traceback.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3

from support import JournalTestCase, run_cli

from crash_recovery import operator_cli  # noqa: E402
from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402
from crash_recovery.reconciliation.commands import run_command  # noqa: E402
from crash_recovery.storage.record import canonical_text, event_hash  # noqa: E402


class ArchivedHistoryIsVerifiedBeforeItIsPrinted(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.build()

    def build(self):
        """Three calls, archived, then one more call in the live segment."""
        guard = RecoveryGuard(self.data_dir)
        for index in range(3):
            self.assertEqual(guard.tool_execution(tool_name="book_trip", args={"n": index},
                                                  next_call=dict, session_id="s",
                                                  tool_call_id=f"old-{index}"), {})
        guard.close()
        code, sealed, stdout = run_cli(self.data_dir, "archive")
        self.assertEqual(code, 0, stdout)
        self.archive_file = os.path.join(self.data_dir, sealed["archived"]["file"])
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution(tool_name="book_trip", args={}, next_call=dict,
                                              session_id="s", tool_call_id="new"), {})
        guard.close()
        with Journal(self.data_dir, readonly=True) as journal:
            archived = list(journal.archived_history())
        self.archived_operation = archived[0][2]["operation_id"]
        self.assertEqual(len(archived), 6)

    def edit_archive(self):
        """Rewrite the first event's payload and hash so the row is consistent
        on its own (the next row's link and the anchor still tell)."""
        os.chmod(self.archive_file, 0o644)
        connection = sqlite3.connect(self.archive_file)
        payload, previous = connection.execute(
            "SELECT payload, previous FROM events WHERE seq = 1").fetchone()
        edited = canonical_text({**json.loads(payload), "tool": "refund_everything"})
        connection.execute("DROP TRIGGER IF EXISTS events_no_update")
        for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            connection.execute(f'DROP TRIGGER "{name}"')
        connection.execute("UPDATE events SET payload = ?, hash = ? WHERE seq = 1",
                           (edited, event_hash(previous, edited)))
        connection.commit()
        connection.close()

    def assertRefusedEverywhere(self, codes):
        for words in (("show", self.archived_operation), ("log", "--all"),
                      ("log", "--all", "--jsonl")):
            with self.subTest(words=words):
                code, document, stdout = run_cli(self.data_dir, *words)
                self.assertEqual(code, 1, stdout)
                self.assertIsNotNone(document, f"not one JSON document: {stdout!r}")
                self.assertIn(document["error"]["code"], codes)
                self.assertNotIn("refund_everything", stdout)
                self.assertNotIn("Traceback", stdout)
        code, _, stdout = run_cli(self.data_dir, "--format", "text", "log", "--all")
        self.assertEqual(code, 1, stdout)
        self.assertNotIn("Traceback", stdout)
        self.assertNotIn("refund_everything", stdout)

    def test_healthy_archives_print_as_verified(self):
        code, shown, stdout = run_cli(self.data_dir, "show", self.archived_operation)
        self.assertEqual((code, shown["verified"], len(shown["events"])), (0, True, 2), stdout)
        code, log, stdout = run_cli(self.data_dir, "log", "--all")
        self.assertEqual((code, log["ok"], log["verified"], len(log["events"])),
                         (0, True, True, 6 + 3), stdout)

    def test_an_edited_archive_is_never_printed_as_verified(self):
        self.edit_archive()
        self.assertRefusedEverywhere({"archive_mismatch"})

    def test_a_damaged_archive_is_refused_without_a_traceback(self):
        os.chmod(self.archive_file, 0o644)
        with open(self.archive_file, "r+b") as stream:
            stream.seek(4096)
            stream.write(b"\xff" * 4096)
        self.assertRefusedEverywhere({"archive_mismatch", "archive_missing"})

    def test_a_missing_archive_is_refused_without_a_traceback(self):
        os.unlink(self.archive_file)
        self.assertRefusedEverywhere({"archive_missing"})

    def test_a_read_error_while_printing_ends_every_form_unverified_alike(self):
        # An I/O error after the first event: the text form names it as the others do.
        codes = {}
        for form in ("json", "jsonl", "text"):
            with self.subTest(form=form):
                args = operator_cli.build_parser().parse_args(
                    ["--data-dir", self.data_dir, "log", "--all"]
                    + (["--jsonl"] if form == "jsonl" else []))
                result, ok = run_command("log", args, self.data_dir, Journal)
                self.assertTrue(ok)

                def failing(events=result["events"]):
                    yield next(events)
                    raise OSError(5, "Input/output error")
                result["events"] = failing()
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    code = operator_cli._print_log(result, jsonl=form == "jsonl",
                                                   text=form == "text")
                self.assertEqual(code, 1)
                last = printed.getvalue().splitlines()[-1]
                if form == "json":
                    codes[form] = json.loads(printed.getvalue())["error"]["code"]
                elif form == "jsonl":
                    codes[form] = json.loads(last)["error"]["code"]
                else:
                    self.assertTrue(last.startswith("NOT VERIFIED: "), last)
                    codes[form] = last.split(": ")[1]
        self.assertEqual(codes, dict.fromkeys(("json", "jsonl", "text"), "storage_unavailable"))

    def test_an_archive_changed_while_it_is_printed_ends_the_document_unverified(self):
        for form in ("json", "jsonl", "text"):
            with self.subTest(form=form):
                self.data_dir = os.path.join(self.root, form)  # a fresh journal per form
                self.build()
                args = operator_cli.build_parser().parse_args(
                    ["--data-dir", self.data_dir, "log", "--all"]
                    + (["--jsonl"] if form == "jsonl" else []))
                result, ok = run_command("log", args, self.data_dir, Journal)
                self.assertTrue(ok)  # verified: nothing printed yet
                self.edit_archive()  # ... and changed before the printing
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    code = operator_cli._print_log(result, jsonl=form == "jsonl",
                                                   text=form == "text")
                self.assertEqual(code, 1)
                output = printed.getvalue()
                if form == "json":
                    document = json.loads(output)
                    self.assertEqual((document["ok"], document["verified"],
                                      document["error"]["code"]),
                                     (False, False, "archive_mismatch"))
                elif form == "jsonl":
                    last = json.loads(output.splitlines()[-1])
                    self.assertEqual((last["verified"], last["error"]["code"]),
                                     (False, "archive_mismatch"))
                else:
                    self.assertTrue(output.splitlines()[-1].startswith(
                        "NOT VERIFIED: archive_mismatch"), output)
