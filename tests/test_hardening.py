"""Regression tests for problems found by adversarial review and a newcomer's run.

Each test names the problem it pins: an error-shaped response classified as
normal, a re-entry binding surviving in a copied context, special files planted
in the data directory (FIFOs hang, symlinks redirect writes), an oversized
head.json, a foreign database rewritten, and CLI input that crashed or misled.
"""
import contextvars
import json
import os
import subprocess
import sys
import textwrap

from support import REPO, JournalTestCase, reference, run_cli

from crash_recovery.classify import is_error_response
from crash_recovery.guard import RecoveryGuard

# Seconds a subprocess may take before a FIFO is taken to have hung it.
HANG_TIMEOUT_SECONDS = 30


class Downstream:
    """A downstream that counts its calls and returns a fixed response."""

    def __init__(self, response='{"status": "ok"}'):
        self.calls = 0
        self.response = response

    def __call__(self):
        self.calls += 1
        return self.response


class HardeningCase(JournalTestCase):

    def call(self, guard, downstream, call_id="call-1", tool="send_payment"):
        return guard.tool_execution(tool_name=tool, args={"to": "bob"}, next_call=downstream,
                                    session_id="session-1", tool_call_id=call_id)

    def blocked_code(self, result):
        parsed = json.loads(result)
        self.assertEqual(parsed["error"], "crash_recovery_blocked", result)
        return parsed["code"]


class UndecodableErrorResponses(HardeningCase):
    """JSON that Python cannot decode must not open the gate (classified normal)."""

    HUGE_INT = '{"error": "payment declined", "trace_id": ' + "1" * 5000 + "}"
    DEEP = '{"status": "failed", "detail": ' + "[" * 1000 + "]" * 1000 + "}"

    def test_classifier_is_conservative(self):
        self.assertTrue(is_error_response(self.HUGE_INT))
        self.assertTrue(is_error_response(self.DEEP))
        # A syntax error means plain text, as before.
        self.assertFalse(is_error_response("{not json"))
        self.assertFalse(is_error_response("{'a': 1}"))

    def test_exotic_objects_never_raise(self):
        class Raising(dict):
            def __contains__(self, key):
                raise RuntimeError("boom")

            def items(self):
                raise RuntimeError("boom")

        self.assertTrue(is_error_response(Raising(a=1)))
        guard = RecoveryGuard(self.data_dir)
        result = self.call(guard, Downstream(Raising(a=1)))
        self.assertIsInstance(result, Raising)
        states = [operation.state for operation in guard._journal.unresolved()]
        self.assertEqual(states, ["uncertain"])
        guard.close()
        self.assertVerifies()

    def test_gate_closes_after_undecodable_error(self):
        guard = RecoveryGuard(self.data_dir)
        for index, response in enumerate((self.HUGE_INT, self.DEEP)):
            with self.subTest(index):
                if index:
                    operation = guard._journal.unresolved()[0].operation_id
                    guard._journal.resolve(operation, outcome="not_applied", evidence="checked")
                self.assertEqual(self.call(guard, Downstream(response), f"call-{index}"), response)
                again = Downstream()
                self.assertEqual(self.blocked_code(self.call(guard, again, f"retry-{index}")),
                                 "unresolved_operations")
                self.assertEqual(again.calls, 0)
        guard.close()
        self.assertVerifies()


class CopiedContextBinding(HardeningCase):
    """A context copied during a call must not pass as re-entry after it ended."""

    def test_stale_binding_is_refused(self):
        guard = RecoveryGuard(self.data_dir)
        captured = {}

        def downstream():
            captured["context"] = contextvars.copy_context()
            raise TimeoutError("gateway timeout")

        with self.assertRaises(TimeoutError):
            self.call(guard, downstream)
        again = Downstream()
        result = captured["context"].run(self.call, guard, again)
        self.assertEqual(self.blocked_code(result), "unresolved_operations")
        directive = captured["context"].run(guard.pre_tool_call, tool_name="send_payment",
                                            args={"to": "bob"}, session_id="session-1",
                                            tool_call_id="call-1")
        self.assertEqual(directive["action"], "block")
        self.assertEqual(again.calls, 0)
        kinds = [event["kind"] for _, event in guard._journal.events()]
        self.assertEqual(kinds, ["started", "uncertain"])
        guard.close()
        self.assertVerifies()


class PlantedFiles(HardeningCase):
    """FIFOs must refuse, never hang; symlinks must never redirect a write."""

    SCRIPT = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, {repo!r} + "/tests")
        from checkout import load_module
        RecoveryGuard = load_module("guard").RecoveryGuard
        guard = RecoveryGuard({data_dir!r}, busy_timeout=1)
        hook = guard.pre_tool_call(tool_name="t", args={{}}, session_id="s", tool_call_id="c")
        result = guard.tool_execution(tool_name="t", args={{}}, next_call=lambda: "RAN",
                                      session_id="s", tool_call_id="c")
        print(json.dumps({{"hook": hook, "result": result}}))
    """)

    def prepared(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Downstream())
        guard.close()

    def run_fresh_process(self):
        completed = subprocess.run(
            [sys.executable, "-c", self.SCRIPT.format(repo=REPO, data_dir=self.data_dir)],
            capture_output=True, text=True, timeout=HANG_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, 0, completed.stderr)
        return json.loads(completed.stdout)

    def test_fifo_instead_of_journal_files_refuses(self):
        for name in ("head.json", "initialized", "journal.sqlite3"):
            with self.subTest(name):
                self.prepared()
                path = os.path.join(self.data_dir, name)
                os.rename(path, path + ".saved")
                os.mkfifo(path)
                outcome = self.run_fresh_process()
                self.assertEqual(self.blocked_code(outcome["result"]), "storage_unavailable")
                self.assertEqual(outcome["hook"]["action"], "block")
                code, result, _ = run_cli(self.data_dir, "verify", timeout=HANG_TIMEOUT_SECONDS)
                self.assertEqual((code, result["integrity"]), (1, "storage_unavailable"))
                os.unlink(path)
                os.rename(path + ".saved", path)
                self.assertVerifies()

    def test_fifo_owner_lock_refuses_and_status_answers(self):
        self.prepared()
        os.mkfifo(os.path.join(self.data_dir, "owner.lock.new"))
        os.replace(os.path.join(self.data_dir, "owner.lock.new"),
                   os.path.join(self.data_dir, "owner.lock"))
        outcome = self.run_fresh_process()
        self.assertEqual(self.blocked_code(outcome["result"]), "storage_unavailable")
        code, result, _ = run_cli(self.data_dir, "status", timeout=HANG_TIMEOUT_SECONDS)
        self.assertEqual((code, result["unresolved"]), (0, []))

    def test_symlinked_owner_lock_never_truncates_the_database(self):
        self.prepared()
        database = os.path.join(self.data_dir, "journal.sqlite3")
        size = os.path.getsize(database)
        owner_lock = os.path.join(self.data_dir, "owner.lock")
        os.unlink(owner_lock)
        os.symlink(database, owner_lock)
        outcome = self.run_fresh_process()
        self.assertEqual(self.blocked_code(outcome["result"]), "storage_unavailable")
        self.assertEqual(os.path.getsize(database), size)
        os.unlink(owner_lock)
        self.assertVerifies()

    def test_dangling_owner_lock_symlink_creates_nothing(self):
        self.prepared()
        owner_lock = os.path.join(self.data_dir, "owner.lock")
        target = os.path.join(self.root, "created-by-mistake")
        os.unlink(owner_lock)
        os.symlink(target, owner_lock)
        self.run_fresh_process()
        self.assertFalse(os.path.exists(target))

    def test_symlinked_temp_file_is_replaced_not_written_through(self):
        self.prepared()
        precious = os.path.join(self.root, "precious.txt")
        with open(precious, "w") as stream:
            stream.write("important data\n")
        os.symlink(precious, os.path.join(self.data_dir, "head.json.tmp"))
        outcome = self.run_fresh_process()
        self.assertEqual(outcome["result"], "RAN")
        with open(precious) as stream:
            self.assertEqual(stream.read(), "important data\n")
        self.assertFalse(os.path.islink(os.path.join(self.data_dir, "head.json")))
        self.assertVerifies()


class OversizedCheckpoint(HardeningCase):

    def test_junk_after_a_valid_checkpoint_is_refused(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Downstream())
        guard.close()
        head = os.path.join(self.data_dir, "head.json")
        with open(head, "rb") as stream:
            valid = stream.read()
        with open(head, "wb") as stream:
            stream.write(valid + b" " * 70000 + b"junk")
        code, result, _ = run_cli(self.data_dir, "verify")
        self.assertEqual((code, result["integrity"]), (1, "checkpoint_corrupt"))
        downstream = Downstream()
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(self.blocked_code(self.call(guard, downstream, "call-2")),
                         "checkpoint_corrupt")
        self.assertEqual(downstream.calls, 0)
        guard.close()


class ForeignDatabase(HardeningCase):
    """A database that is not a journal is refused and never rewritten."""

    def test_foreign_database_bytes_unchanged(self):
        import sqlite3
        os.makedirs(self.data_dir)
        database = os.path.join(self.data_dir, "journal.sqlite3")
        connection = sqlite3.connect(database)
        connection.execute("CREATE TABLE t(x)")
        connection.commit()
        connection.close()
        with open(database, "rb") as stream:
            before = stream.read()
        guard = RecoveryGuard(self.data_dir)
        downstream = Downstream()
        self.assertEqual(self.blocked_code(self.call(guard, downstream)), "invalid_metadata")
        code, result, _ = run_cli(self.data_dir, "resolve", "8a93e01c-6a86-42e9-bc56-df324bf1161f",
                                  "--outcome", "completed", "--evidence", "x")
        self.assertEqual((code, result["integrity"]), (1, "invalid_metadata"))
        with open(database, "rb") as stream:
            self.assertEqual(stream.read(), before)
        self.assertEqual(downstream.calls, 0)
        self.assertEqual(sorted(os.listdir(self.data_dir)), ["journal.sqlite3"])


class OperatorInput(HardeningCase):

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Downstream())
        guard.close()

    def test_huge_since_is_not_a_traceback(self):
        code, result, output = run_cli(self.data_dir, "log", "--since", "9" * 30)
        self.assertEqual((code, result["events"]), (0, []), output)

    def test_empty_data_dir_and_checkpoint_paths_are_errors(self):
        code, result, _ = run_cli("", "status")
        self.assertEqual((code, result["error"]["code"]), (1, "usage"))
        code, result, _ = run_cli(self.data_dir, "verify", "--checkpoint", "")
        self.assertEqual((code, result["error"]["code"]), (1, "checkpoint_unreadable"))

    def test_options_after_the_command(self):
        completed = subprocess.run(
            [sys.executable, os.path.join(REPO, "operator_cli.py"), "status", "--data-dir",
             self.data_dir, "--format", "text"], capture_output=True, text=True, timeout=60)
        self.assertEqual(completed.returncode, 0, completed.stdout + completed.stderr)
        self.assertIn("no unresolved operations", completed.stdout)

    def test_status_of_a_missing_journal_is_not_all_clear(self):
        code, result, _ = run_cli(os.path.join(self.root, "typo"), "status")
        self.assertEqual((code, result["error"]["code"]), (1, "journal_absent"))
        self.assertIn("hint", result["error"])


class VerifyToolReadsTheFiles(HardeningCase):

    def test_verify_tool_reports_an_edit_made_through_another_connection(self):
        import sqlite3
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Downstream())
        self.assertTrue(guard.verify_report()["ok"])
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'send_payment', 'send_paymenX') WHERE seq = 1")
        report = guard.verify_report()
        self.assertEqual((report["ok"], report["integrity"]), (False, "hash_mismatch"))
        guard.close()


class EditsBehindTheWorkersBack(HardeningCase):
    """Raw file edits that SQLite's data_version cannot see (second review)."""

    def edit_session_in_file(self, guard):
        import sqlite3
        # Move every page into the main file, as SQLite's autocheckpoint does.
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.close()
        guard.pre_tool_call(tool_name="send_payment", args={"to": "bob"},
                            session_id="session-1", tool_call_id="warm")  # cache the pages
        path = os.path.join(self.data_dir, "journal.sqlite3")
        with open(path, "rb") as stream:
            content = stream.read()
        at = content.find(b"session-1")
        self.assertGreater(at, 0)
        # A separate process does the raw edit: this process must keep its locks.
        subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            with open({path!r}, "r+b") as stream:
                stream.seek({at})
                stream.write(b"session-X")
        """)], check=True, timeout=60)

    def test_live_worker_refuses_after_a_raw_edit(self):
        for full in (False, True):
            with self.subTest(full_verification=full):
                self.setUp()
                guard = RecoveryGuard(self.data_dir, full_verification=full)
                self.call(guard, Downstream(), "call-0")
                self.edit_session_in_file(guard)
                downstream = Downstream()
                self.assertEqual(self.blocked_code(self.call(guard, downstream, "call-1")),
                                 "hash_mismatch")
                self.assertEqual(downstream.calls, 0)
                guard.close()
                code, result, _ = run_cli(self.data_dir, "verify")
                self.assertEqual((code, result["integrity"]), (1, "hash_mismatch"))

    def test_deleted_wal_under_a_live_worker_refuses(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Downstream(), "call-0")
        for suffix in ("-wal", "-shm"):
            os.unlink(os.path.join(self.data_dir, "journal.sqlite3" + suffix))
        downstream = Downstream()
        self.assertEqual(self.blocked_code(self.call(guard, downstream, "call-1")), "wal_missing")
        self.assertEqual(downstream.calls, 0)


class InterruptAfterAdmission(HardeningCase):

    def test_interrupt_before_the_binding_releases_everything(self):
        from unittest import mock
        from crash_recovery import guard as guard_module
        from crash_recovery.storage.owner import probe_owner
        guard = RecoveryGuard(self.data_dir)
        downstream = Downstream()
        with mock.patch.object(guard_module, "Admission", side_effect=KeyboardInterrupt):
            with self.assertRaises(KeyboardInterrupt):
                self.call(guard, downstream)
        self.assertEqual(downstream.calls, 0)
        [operation] = guard._journal.unresolved()
        self.assertEqual(operation.state, "pending")
        self.assertEqual(probe_owner(self.data_dir, operation.operation_id)["owner"], "gone")
        # Neither the in-process lock nor a binding leaked: the retry meets the gate.
        self.assertEqual(self.blocked_code(self.call(guard, downstream)), "unresolved_operations")
        self.assertEqual(downstream.calls, 0)
        guard.close()
        self.assertVerifies()


class FailedOperatorCommandsWriteNothing(HardeningCase):

    def test_half_created_journal_stays_as_it_is(self):
        import sqlite3
        import uuid
        os.makedirs(self.data_dir)
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        connection.execute("CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
                           "previous TEXT NOT NULL, hash TEXT NOT NULL)")
        connection.execute("INSERT INTO metadata VALUES ('journal_id', ?)", (str(uuid.uuid4()),))
        connection.execute("INSERT INTO metadata VALUES ('schema', 'hermes.crash-recovery.v1')")
        connection.commit()
        connection.close()
        for words, code in ((["resolve", str(uuid.uuid4()), "--outcome", "completed",
                              "--evidence", "x"], "unknown_operation"),
                            (["repair-checkpoint", "--evidence", "x"], "repair_not_applicable")):
            with self.subTest(words[0]):
                exit_code, result, _ = run_cli(self.data_dir, *words)
                self.assertEqual((exit_code, result["error"]["code"]), (1, code))
                self.assertEqual([name for name in os.listdir(self.data_dir)
                                  if not name.endswith(("-wal", "-shm"))], ["journal.sqlite3"])


class TrailingTextAndTerminalControls(HardeningCase):

    def test_an_object_followed_by_more_text_is_an_error(self):
        for text in ('{"status": "failed"}\n{"status": "retrying"}', '{"error": "x"}\x00',
                     '{"error": "timeout"} (request id 7f3a)', '{"ok": true} trailing'):
            with self.subTest(text=text):
                self.assertTrue(is_error_response(text))
        self.assertFalse(is_error_response('{"ok": true}  \n'))

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


class PlantedOperatorLog(HardeningCase):

    def test_symlinked_operator_log_is_reported_not_followed(self):
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution(tool_name="send_payment", args={}, next_call=lambda: '{"error": 1}',
                             session_id="s", tool_call_id="c")
        operation = guard._journal.unresolved()[0].operation_id
        guard.close()
        target = os.path.join(self.root, "elsewhere.txt")
        with open(target, "w") as stream:
            stream.write("unrelated\n")
        os.symlink(target, os.path.join(self.data_dir, "operator.log"))
        code, result, _ = run_cli(self.data_dir, "resolve", operation, "--outcome", "not_applied",
                                  "--evidence", "no charge in the ledger")
        self.assertEqual((code, result["resolved"]), (0, operation))  # the journal is the record
        self.assertIn("operator.log not written", result["operator_log_error"])
        with open(target) as stream:
            self.assertEqual(stream.read(), "unrelated\n")
        self.assertVerifies()
