"""operator_cli.py (docs/cli.md): every command and exit code, in a subprocess."""
from __future__ import annotations

import contextlib
import io
import json
import os
import uuid

from support import JournalTestCase, run_cli, reference

from crash_recovery import operator_cli
from crash_recovery.guard import RecoveryGuard

CHECKPOINT_KEYS = {"schema", "journal_id", "count", "head"}


class CliTestCase(JournalTestCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution(tool_name="send_payment", args={"amount": 5}, next_call=lambda: "paid",
                             session_id="s-1", tool_call_id="call-1")

        def explode():
            raise TimeoutError("gateway timeout")

        with self.assertRaises(TimeoutError):
            guard.tool_execution(tool_name="book_trip", args={"to": "LIS"}, next_call=explode,
                                 session_id="s-1", tool_call_id="call-2")
        guard.close()  # the worker stops before the operator acts
        report = self.assertVerifies()
        self.returned_op = report.events[0]["operation_id"]
        [self.open_op] = report.unresolved()

    def assertFailsWithoutChange(self, code, *words, data_dir=None):
        data_dir = data_dir or self.data_dir
        before = self.snapshot(data_dir) if os.path.exists(data_dir) else None
        exit_code, result, stdout = run_cli(data_dir, *words)
        self.assertEqual(exit_code, 1, stdout)
        self.assertIsNotNone(result, stdout)
        self.assertIs(result["ok"], False)
        self.assertEqual(result["error"]["code"], code, stdout)
        self.assertTrue(result["error"]["message"])
        if before is not None:
            self.assertEqual(self.snapshot(data_dir), before)
        else:
            self.assertFalse(os.path.exists(data_dir))
        return result


class ReadCommandTests(CliTestCase):

    def test_status_lists_unresolved_and_exits_zero(self):
        before = self.snapshot()
        exit_code, result, _ = run_cli(self.data_dir, "status")
        self.assertEqual(exit_code, 0)
        self.assertEqual((result["ok"], result["integrity"], result["journal"]), (True, "ok", "present"))
        [operation] = result["unresolved"]
        self.assertEqual((operation["operation_id"], operation["state"], operation["tool"],
                          operation["reason"], operation["session_id"], operation["tool_call_id"]),
                         (self.open_op, "uncertain", "book_trip", "exception", "s-1", "call-2"))
        self.assertEqual(result["checkpoint"]["count"], 4)
        self.assertEqual(self.snapshot(), before)

    def test_verify(self):
        before = self.snapshot()
        exit_code, result, _ = run_cli(self.data_dir, "verify")
        self.assertEqual(exit_code, 0)
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            head = json.loads(stream.read())
        self.assertEqual((result["ok"], result["integrity"], result["count"],
                          result["unresolved_count"], result["checkpoint"]),
                         (True, "ok", 4, 1, head))
        self.assertIsNone(result["external_checkpoint"])
        self.assertEqual(self.snapshot(), before)

    def test_verify_with_external_checkpoint(self):
        report = reference.verify(self.data_dir)
        ancestors = {"genesis": report.summary() | {"count": 0, "head": report.genesis},
                     "older": report.summary() | {"count": 2, "head": report.hash_at(2)}}
        for label, checkpoint in ancestors.items():
            with self.subTest(label):
                path = os.path.join(self.root, f"{label}.json")
                with open(path, "w") as stream:
                    json.dump(checkpoint, stream)
                exit_code, result, stdout = run_cli(self.data_dir, "verify", "--checkpoint", path)
                self.assertEqual(exit_code, 0, stdout)
                self.assertEqual(result["external_checkpoint"], "ancestor")
        not_ancestors = {"ahead": report.summary() | {"count": 5},
                         "wrong head": report.summary() | {"count": 2, "head": report.hash_at(1)},
                         "foreign": report.summary() | {"journal_id": str(uuid.uuid4())}}
        for label, checkpoint in not_ancestors.items():
            with self.subTest(label):
                path = os.path.join(self.root, f"{label}.json")
                with open(path, "w") as stream:
                    json.dump(checkpoint, stream)
                before = self.snapshot()
                exit_code, result, stdout = run_cli(self.data_dir, "verify", "--checkpoint", path)
                self.assertEqual(exit_code, 1, stdout)
                self.assertEqual(result["integrity"], "checkpoint_not_ancestor")
                self.assertEqual(result["error"]["code"], "checkpoint_not_ancestor")
                self.assertEqual(self.snapshot(), before)
        garbage = os.path.join(self.root, "garbage.json")
        with open(garbage, "w") as stream:
            stream.write("{nope")
        self.assertFailsWithoutChange("checkpoint_unreadable", "verify", "--checkpoint", garbage)

    def test_verify_reports_tampering(self):
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = "
                              "replace(payload, 'book_trip', 'book_car') WHERE seq = 3")
        for command in ("verify", "status", "checkpoint"):
            with self.subTest(command):
                before = self.snapshot()
                exit_code, result, _ = run_cli(self.data_dir, command)
                self.assertEqual(exit_code, 1)
                self.assertEqual((result["ok"], result["integrity"]), (False, "hash_mismatch"))
                self.assertEqual(self.snapshot(), before)

    def test_checkpoint_prints_exactly_the_head(self):
        exit_code, result, _ = run_cli(self.data_dir, "checkpoint")
        self.assertEqual(exit_code, 0)
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            self.assertEqual(result, json.loads(stream.read()))
        self.assertEqual(set(result), CHECKPOINT_KEYS)
        self.assertEqual(result, reference.verify(self.data_dir).summary())

    def test_text_format(self):
        exit_code, _, stdout = run_cli(self.data_dir, "--format", "text", "status")
        self.assertEqual(exit_code, 0)
        self.assertIn("integrity: ok", stdout)
        self.assertIn(self.open_op, stdout)
        self.assertIn("book_trip", stdout)
        self.assertIn("uncertain", stdout)
        with self.assertRaises(ValueError):
            json.loads(stdout)  # a table, not JSON
        exit_code, _, stdout = run_cli(self.data_dir, "--format", "text", "log")
        self.assertEqual(exit_code, 0)
        lines = stdout.splitlines()
        self.assertEqual(sum(1 for line in lines if self.open_op in line), 2)  # started, uncertain

    def test_log_jsonl(self):
        exit_code, _, stdout = run_cli(self.data_dir, "log", "--jsonl")
        self.assertEqual(exit_code, 0)
        events = [json.loads(line) for line in stdout.splitlines()]
        self.assertEqual([(event["seq"], event["kind"]) for event in events],
                         [(1, "started"), (2, "returned"), (3, "started"), (4, "uncertain")])
        self.assertEqual(events[3]["operation_id"], self.open_op)
        exit_code, _, stdout = run_cli(self.data_dir, "log", "--jsonl", "--since", "2")
        self.assertEqual([json.loads(line)["seq"] for line in stdout.splitlines()], [3, 4])
        exit_code, result, _ = run_cli(self.data_dir, "log")
        self.assertEqual((exit_code, len(result["events"])), (0, 4))

    def test_read_commands_never_create_files(self):
        absent = os.path.join(self.root, "absent", "data")
        # No journal is an error for every read command, status included: a
        # mistyped --data-dir must never read as "nothing is blocked".
        for words in (["status"], ["verify"], ["checkpoint"], ["log"], ["log", "--jsonl"]):
            with self.subTest(words):
                exit_code, result, _ = run_cli(absent, *words)
                self.assertEqual(exit_code, 1)
        self.assertFalse(os.path.exists(os.path.join(self.root, "absent")))
        empty = os.path.join(self.root, "empty")
        os.makedirs(empty)
        for words in (["status"], ["checkpoint"]):
            run_cli(empty, *words)
        self.assertEqual(os.listdir(empty), [])
        self.assertFailsWithoutChange("journal_absent", "verify", data_dir=absent)


class ResolveTests(CliTestCase):

    def test_resolve_completed(self):
        evidence = "ledger row 8812: booking LIS confirmed"
        exit_code, result, stdout = run_cli(self.data_dir, "resolve", self.open_op,
                                            "--outcome", "completed", "--evidence", evidence)
        self.assertEqual(exit_code, 0, stdout)
        self.assertEqual((result["ok"], result["resolved"], result["outcome"],
                          result["previous_state"]), (True, self.open_op, "completed", "uncertain"))
        report = self.assertVerifies()
        self.assertEqual(report.kinds()[-1], "resolved")
        self.assertEqual((report.operations[self.open_op]["outcome"],
                          report.operations[self.open_op]["evidence"]), ("completed", evidence))
        self.assertEqual(result["checkpoint"], report.summary())
        exit_code, status, _ = run_cli(self.data_dir, "status")
        self.assertEqual((exit_code, status["unresolved"]), (0, []))

    def test_resolve_not_applied_opens_the_gate_and_replays_nothing(self):
        exit_code, result, _ = run_cli(self.data_dir, "resolve", self.open_op.upper(),
                                       "--outcome", "not_applied", "--evidence", "no booking found")
        self.assertEqual(exit_code, 0)
        self.assertEqual(result["resolved"], self.open_op)  # canonical lower-case id
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned", "started", "uncertain", "resolved"])
        self.assertEqual(report.operations[self.open_op]["outcome"], "not_applied")
        ran = []
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        guard.tool_execution(tool_name="book_trip", args={"to": "LIS"},
                             next_call=lambda: ran.append(1) or "booked")
        self.assertEqual(ran, [1])

    def test_refused_resolutions_change_nothing(self):
        self.assertFailsWithoutChange("invalid_evidence", "resolve", self.open_op, "--outcome",
                                      "completed", "--evidence", "")
        self.assertFailsWithoutChange("invalid_evidence", "resolve", self.open_op, "--outcome",
                                      "completed", "--evidence", "  \t\n ")
        self.assertFailsWithoutChange("unknown_operation", "resolve", str(uuid.uuid4()),
                                      "--outcome", "completed", "--evidence", "x")
        self.assertFailsWithoutChange("invalid_operation_id", "resolve", "not-a-uuid",
                                      "--outcome", "completed", "--evidence", "x")
        self.assertFailsWithoutChange("operation_not_open", "resolve", self.returned_op,
                                      "--outcome", "completed", "--evidence", "x")
        exit_code, _, _ = run_cli(self.data_dir, "resolve", self.open_op, "--outcome",
                                  "completed", "--evidence", "receipt 1")
        self.assertEqual(exit_code, 0)
        self.assertFailsWithoutChange("operation_not_open", "resolve", self.open_op,
                                      "--outcome", "not_applied", "--evidence", "again")
        self.assertVerifies()

    def test_resolution_never_repairs_integrity(self):
        with open(os.path.join(self.data_dir, "head.json"), "w") as stream:
            stream.write("{}")
        result = self.assertFailsWithoutChange("checkpoint_corrupt", "resolve", self.open_op,
                                               "--outcome", "completed", "--evidence", "x")
        self.assertEqual(result["integrity"], "checkpoint_corrupt")

    def test_resolve_on_absent_journal_creates_nothing(self):
        absent = os.path.join(self.root, "absent")
        self.assertFailsWithoutChange("journal_absent", "resolve", self.open_op, "--outcome",
                                      "completed", "--evidence", "x", data_dir=absent)


class UsageErrorTests(CliTestCase):

    def test_usage_errors_are_json_exit_one(self):
        for words in ([], ["resolve", self.open_op, "--outcome", "done", "--evidence", "x"]):
            with self.subTest(words=words):
                self.assertFailsWithoutChange("usage", *words)  # in a real subprocess

    def test_more_usage_errors_in_process(self):
        cases = [
            ["frobnicate"],
            ["resolve"],
            ["resolve", self.open_op],
            ["resolve", self.open_op, "--outcome", "completed"],
            ["resolve", self.open_op, "--evidence", "x"],
            ["verify", "--checkpoint"],
            ["status", "--bogus"],
            ["log", "--since", "three"],
        ]
        for words in cases:
            with self.subTest(words=words):
                before = self.snapshot()
                stdout, stderr = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    exit_code = operator_cli.main(["--data-dir", self.data_dir, *words])
                self.assertEqual(exit_code, 1)
                result = json.loads(stdout.getvalue())
                self.assertEqual((result["ok"], result["error"]["code"]), (False, "usage"))
                self.assertEqual(self.snapshot(), before)

    def test_hermes_parser_prints_a_usage_error_once(self):
        # Hermes parses a failing command line twice (the first time with
        # stderr captured): stdout must still carry exactly one JSON document.
        import argparse
        parser = argparse.ArgumentParser(prog="hermes", exit_on_error=False)
        commands = parser.add_subparsers(dest="top")
        operator_cli.setup_hermes_command(commands.add_parser("crash-recovery"))
        words = ["crash-recovery", "resolve", self.open_op, "--outcome", "maybe-" + self.id()]
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            for _ in range(2):
                with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as caught:
                    parser.parse_args(words)
                self.assertEqual(caught.exception.code, 1)
        result = json.loads(stdout.getvalue())
        self.assertEqual((result["ok"], result["error"]["code"]), (False, "usage"))
        self.assertIn("maybe-", result["error"]["message"])


    def test_hermes_crash_recovery_without_a_command_is_a_usage_error_not_a_chat(self):
        # Hermes dispatches on its own args.command after our parser ran: the
        # subcommand must not be stored there (None would start Hermes' chat).
        import argparse
        parser = argparse.ArgumentParser(prog="hermes")
        commands = parser.add_subparsers(dest="command")
        operator_cli.setup_hermes_command(commands.add_parser("crash-recovery"))
        for words in (["crash-recovery"], ["crash-recovery", "--format", "text"],
                      ["crash-recovery", "status"]):
            with self.subTest(words=words):
                self.assertEqual(parser.parse_args(words).command, "crash-recovery")
        args = parser.parse_args(["crash-recovery", "--data-dir", self.data_dir])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            exit_code = operator_cli.execute(args, lambda: self.data_dir)
        self.assertEqual(exit_code, 1)
        self.assertEqual(json.loads(stdout.getvalue())["error"],
                         {"code": "usage", "message": "a command is required (see --help)"})


    def test_prometheus_format_on_another_command_prints_its_usage_error(self):
        before = self.snapshot()
        for words in (["show", self.open_op], ["verify"], ["checkpoint"],
                      ["resolve", self.open_op, "--outcome", "completed", "--evidence", "x"]):
            with self.subTest(words=words):
                stdout = io.StringIO()
                with contextlib.redirect_stdout(stdout):
                    exit_code = operator_cli.main(["--data-dir", self.data_dir, "--format",
                                                   "prometheus", *words])
                self.assertEqual(exit_code, 1)
                self.assertEqual(json.loads(stdout.getvalue())["error"],
                                 {"code": "usage",
                                  "message": "--format prometheus is for status only"})
        self.assertEqual(self.snapshot(), before)


class HermesPrefixTests(JournalTestCase):

    def test_every_named_profile_is_explicit(self):
        # `-p default` too: a sticky `hermes profile use NAME` would otherwise
        # run the printed command in NAME.
        from crash_recovery.reports import messages as report
        self.assertEqual(report.hermes_prefix("default"), ("hermes", "-p", "default", "crash-recovery"))
        self.assertEqual(report.hermes_prefix("work"), ("hermes", "-p", "work", "crash-recovery"))
        self.assertEqual(report.hermes_prefix("custom"), ("hermes", "crash-recovery"))
        self.assertEqual(report.hermes_prefix(None), ("hermes", "crash-recovery"))


class HermesStatusSettingsTests(CliTestCase):

    def run_status(self, raw, *words):
        parser = operator_cli.build_parser()
        args = parser.parse_args(["--data-dir", self.data_dir, *words, "status"])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = operator_cli.execute(args, lambda: self.data_dir, None, lambda: raw)
        return code, stdout.getvalue()

    def test_status_inside_hermes_shows_the_settings_and_their_problem(self):
        code, stdout = self.run_status({"protected_tools": '["book_trip"]'})
        self.assertEqual(code, 0)
        self.assertEqual(json.loads(stdout)["settings"]["mode"], "protected_tools")
        self.assertEqual(json.loads(stdout)["settings"]["protected_tools"], ["book_trip"])
        code, stdout = self.run_status({"read_only_tool": ["lookup_receipt"]})
        shown = json.loads(stdout)["settings"]
        self.assertEqual((shown["mode"], shown["read_only_tools"]), ("read_only_tools", []))
        self.assertIn("read_only_tool", shown["problem"])
        code, stdout = self.run_status({"read_only_tool": ["lookup_receipt"]}, "--format", "text")
        self.assertIn("SETTINGS PROBLEM", stdout)
        self.assertIn("read_only_tool", stdout)

    def test_stand_alone_status_has_no_settings(self):
        self.assertNotIn("settings", run_cli(self.data_dir, "status")[1])


class TerminalControlTests(JournalTestCase):
    """C1 and bidirectional control characters from the model (here in a tool
    call id) never reach the operator's terminal; the JSON keeps them exact."""

    def test_c1_and_bidi_controls_never_reach_the_terminal(self):
        guard = RecoveryGuard(self.data_dir)
        hostile = "call_1\u009b2J\u202eOWNER GONE"
        guard.tool_execution(tool_name="send_payment", args={}, next_call=lambda: '{"error": 1}',
                             session_id="s", tool_call_id=hostile)
        guard.close()
        for words in (["status"], ["status", "--format", "text"], ["log", "--jsonl"]):
            with self.subTest(words):
                _, _, output = run_cli(self.data_dir, *words)
                self.assertNotIn("\u009b", output)
                self.assertNotIn("\u202e", output)
        _, result, _ = run_cli(self.data_dir, "status")
        self.assertEqual(result["unresolved"][0]["tool_call_id"], hostile)  # still exact JSON
