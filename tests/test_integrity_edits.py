"""Edits made behind the plugin's back (docs/format.md §Verification, docs/cli.md
§Verdict codes), with real files and processes: through SQLite (foreign
triggers, plain statements, dropped triggers, a database that is not a
journal), by raw bytes under a live worker, by deleting the WAL, by restoring
an older copy, by junk after a valid checkpoint.  Every process that would
append finds the edit and refuses; nothing runs, and nothing is rewritten.  A
mere reader in another process is not taken for an edit.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import unittest

from reliability_support import ProtectedCallCase, ReliabilityCase, Tool, call
from support import reference, run_cli

from crash_recovery.guard import RecoveryGuard

FOLD_WAL = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()")


class ForeignSchemaObjects(ReliabilityCase):
    """Triggers added or dropped, plain statements and an INSERT that stores
    nothing: the journal's schema is its own."""

    def test_swallowing_trigger_never_lets_a_booking_run(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.assertEqual(call(guard, Tool(), "c1"), '{"status": "booked"}')
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        connection.execute("CREATE TRIGGER t BEFORE INSERT ON events BEGIN SELECT RAISE(IGNORE); END")
        connection.commit()
        connection.close()
        for candidate in (guard, RecoveryGuard(self.data_dir)):
            tool = Tool()
            blocked = json.loads(call(candidate, tool, "c2"))
            self.assertEqual((blocked["code"], tool.calls), ("foreign_schema_object", 0))
        code, status, _ = run_cli(self.data_dir, "verify")
        self.assertEqual((code, status["integrity"]), (1, "foreign_schema_object"))
        code, refused, _ = run_cli(self.data_dir, "repair-checkpoint", "--evidence", "x")
        self.assertEqual((code, refused["error"]["code"]), (1, "foreign_schema_object"))

    def test_plain_edits_through_sqlite_are_impossible(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c1")
        for statement in ("UPDATE events SET payload = 'x' WHERE seq = 1",
                          "DELETE FROM events WHERE seq = 2", "DELETE FROM events",
                          "INSERT OR REPLACE INTO events VALUES (1, 'x', 'y', 'z')",
                          "INSERT INTO events VALUES (9, 'x', 'y', 'z')",
                          "UPDATE metadata SET value = 'v2' WHERE key = 'schema'",
                          "DELETE FROM metadata", "INSERT INTO metadata VALUES ('k', 'v')"):
            with self.subTest(statement):
                with self.assertRaises(sqlite3.IntegrityError):
                    reference.execute_sql(self.data_dir, statement, keep_triggers=True)
        self.assertEqual(call(guard, Tool(), "c2"), '{"status": "booked"}')
        self.assertVerifies()

    def test_dropped_triggers_mean_a_full_verification_and_come_back(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c1")
        reference.execute_sql(self.data_dir, "SELECT 1")  # drops every trigger, edits nothing
        with self.assertLogs("crash_recovery.storage.store", "WARNING") as logged:
            self.assertEqual(call(guard, Tool(), "c2"), '{"status": "booked"}')
        self.assertIn("re-created", logged.output[0])
        with sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3")) as connection:
            names = {row[0] for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        connection.close()
        self.assertEqual(len(names), 6)
        # ...and an edit made while they were gone is found by every process.
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'book_trip', 'book_trap') WHERE seq = 1")
        for candidate in (guard, RecoveryGuard(self.data_dir)):
            self.assertEqual(json.loads(call(candidate, Tool(), "c3"))["code"], "hash_mismatch")

    def test_an_insert_that_stores_nothing_is_refused_before_head_json_moves(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "c1")
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            head = stream.read()
        store = guard.gate.opened_journal._store
        real = store.database.connection

        class Swallowing:  # an INSERT that "succeeds" without storing the row
            def execute(self, sql, *args):
                if sql.startswith("INSERT INTO events"):
                    return real.execute("SELECT 1 WHERE 0")
                return real.execute(sql, *args)

            def __getattr__(self, name):
                return getattr(real, name)

        store.database.connection = Swallowing()
        try:
            tool = Tool()
            blocked = json.loads(call(guard, tool, "c2"))
        finally:
            store.database.connection = real
        self.assertEqual((blocked["code"], tool.calls), ("append_not_stored", 0))
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            self.assertEqual(stream.read(), head)
        self.assertEqual(call(guard, Tool(), "c3"), '{"status": "booked"}')


class ForeignDatabase(ProtectedCallCase):
    """A database that is not a journal is refused and never rewritten."""

    def test_foreign_database_bytes_unchanged(self):
        os.makedirs(self.data_dir)
        database = os.path.join(self.data_dir, "journal.sqlite3")
        connection = sqlite3.connect(database)
        connection.execute("CREATE TABLE t(x)")
        connection.commit()
        connection.close()
        with open(database, "rb") as stream:
            before = stream.read()
        guard = RecoveryGuard(self.data_dir)
        tool = Tool()
        self.assertEqual(self.blocked_code(self.call(guard, tool)), "invalid_metadata")
        code, result, _ = run_cli(self.data_dir, "resolve", "8a93e01c-6a86-42e9-bc56-df324bf1161f",
                                  "--outcome", "completed", "--evidence", "x")
        self.assertEqual((code, result["integrity"]), (1, "invalid_metadata"))
        with open(database, "rb") as stream:
            self.assertEqual(stream.read(), before)
        self.assertEqual(tool.calls, 0)
        self.assertEqual(sorted(os.listdir(self.data_dir)), ["journal.sqlite3"])


class OversizedCheckpoint(ProtectedCallCase):
    """A valid head.json followed by junk is corrupt, not valid."""

    def test_junk_after_a_valid_checkpoint_is_refused(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Tool())
        guard.close()
        head = os.path.join(self.data_dir, "head.json")
        with open(head, "rb") as stream:
            valid = stream.read()
        with open(head, "wb") as stream:
            stream.write(valid + b" " * 70000 + b"junk")
        code, result, _ = run_cli(self.data_dir, "verify")
        self.assertEqual((code, result["integrity"]), (1, "checkpoint_corrupt"))
        tool = Tool()
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(self.blocked_code(self.call(guard, tool, "call-2")),
                         "checkpoint_corrupt")
        self.assertEqual(tool.calls, 0)
        guard.close()


class VerifyToolReadsTheFiles(ProtectedCallCase):
    """The verify tool of a live worker reads the files, not its cache."""

    def test_verify_tool_reports_an_edit_made_through_another_connection(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Tool())
        self.assertTrue(guard.verify_report()["ok"])
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = replace(payload, "
                                             "'send_payment', 'send_paymenX') WHERE seq = 1")
        report = guard.verify_report()
        self.assertEqual((report["ok"], report["integrity"]), (False, "hash_mismatch"))
        guard.close()


class EditsBehindTheWorkersBack(ProtectedCallCase):
    """Raw file edits that SQLite's data_version cannot see, and a deleted WAL."""

    def edit_session_in_file(self, guard):
        self.fold_wal_and_warm(guard)
        self.raw_edit_session()

    def fold_wal_and_warm(self, guard):
        """Every page into the main file, as SQLite's autocheckpoint does;
        then the guard caches them."""
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.close()
        guard.pre_tool_call(tool_name="send_payment", args={"to": "bob"},
                            session_id="session-1", tool_call_id="warm")  # cache the pages

    def raw_edit_session(self):
        """``session-1`` rewritten in the database file's bytes."""
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
                self.call(guard, Tool(), "call-0")
                self.edit_session_in_file(guard)
                tool = Tool()
                self.assertEqual(self.blocked_code(self.call(guard, tool, "call-1")),
                                 "hash_mismatch")
                self.assertEqual(tool.calls, 0)
                guard.close()
                code, result, _ = run_cli(self.data_dir, "verify")
                self.assertEqual((code, result["integrity"]), (1, "hash_mismatch"))

    def test_an_edit_made_while_a_worker_reads_is_caught_at_its_next_call(self):
        # What a read remembers of the files is what it saw before the read
        # (unless a commit came in between), so an edit landing between that
        # look and the read counts as a change.
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.call(guard, Tool(), "call-0")
        self.fold_wal_and_warm(guard)
        database = guard.gate.opened_journal._store.database
        looked, edits = database.files_touched, []

        def look_then_edit(*args, **kwargs):
            touched = looked(*args, **kwargs)
            if not edits:  # the edit lands between the look and the read
                edits.append(self.raw_edit_session())
            return touched

        database.files_touched = look_then_edit
        guard.pre_tool_call(tool_name="send_payment", args={"to": "bob"},
                            session_id="session-1", tool_call_id="during")
        del database.files_touched
        self.assertEqual(edits, [None])
        tool = Tool()
        self.assertEqual(self.blocked_code(self.call(guard, tool, "call-1")), "hash_mismatch")
        self.assertEqual(tool.calls, 0)

    def test_a_checkpoint_costs_a_warm_worker_no_full_verification(self):
        # A SQLite checkpoint (any process's: a worker's autocheckpoint, the
        # sqlite3 shell) changes the database file and not data_version, as a
        # raw edit would; with the WAL holding frames it is taken for one.
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        self.call(guard, Tool(), "call-0")
        store = guard.gate.opened_journal._store
        full, verify_all = [], store._full_chain

        def counted(*args, **kwargs):
            full.append(1)
            return verify_all(*args, **kwargs)
        store._full_chain = counted
        self.addCleanup(vars(store).pop, "_full_chain", None)
        database = os.path.join(self.data_dir, "journal.sqlite3")
        subprocess.run([sys.executable, "-c", FOLD_WAL.replace("TRUNCATE", "PASSIVE"), database],
                       check=True, timeout=60)
        tool = Tool()
        self.assertEqual(self.call(guard, tool, "call-1"), '{"status": "booked"}')
        self.assertEqual((tool.calls, full), (1, []))
        # The price: a raw edit right after a checkpoint looks like part of it
        # to the warm worker until its next full verification; a new process,
        # verify and status see it at once.
        subprocess.run([sys.executable, "-c", FOLD_WAL, database], check=True, timeout=60)
        self.raw_edit_session()
        self.assertEqual(self.blocked_code(self.call(RecoveryGuard(self.data_dir), Tool(),
                                                     "call-2")), "hash_mismatch")
        code, result, _ = run_cli(self.data_dir, "verify")
        self.assertEqual((code, result["integrity"]), (1, "hash_mismatch"))

    def test_deleted_wal_under_a_live_worker_refuses(self):
        guard = RecoveryGuard(self.data_dir)
        self.call(guard, Tool(), "call-0")
        for suffix in ("-wal", "-shm"):
            os.unlink(os.path.join(self.data_dir, "journal.sqlite3" + suffix))
        tool = Tool()
        self.assertEqual(self.blocked_code(self.call(guard, tool, "call-1")), "wal_missing")
        self.assertEqual(tool.calls, 0)


class LiveProcessSeesRollback(ReliabilityCase):
    """A live worker refuses history that shrank under it."""

    def test_an_older_copy_restored_under_a_live_worker_is_refused(self):
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "a")
        old = os.path.join(self.root, "old")

        def copy(source, target):
            # In another process: opening journal.sqlite3 here would drop the live
            # guard's POSIX locks (tests/support.py, Hazard), and the fold would then
            # delete its WAL -- a different verdict (wal_missing) than the one tested.
            subprocess.run(["cp", source, target], check=True)

        # A consistent older copy: the database folded (another process) and head.json.
        subprocess.run([sys.executable, "-c", FOLD_WAL,
                        os.path.join(self.data_dir, "journal.sqlite3")], check=True)
        os.makedirs(old)
        for name in ("journal.sqlite3", "head.json"):
            copy(os.path.join(self.data_dir, name), os.path.join(old, name))
        call(guard, Tool(), "b")
        call(guard, Tool(), "c")
        subprocess.run([sys.executable, "-c", FOLD_WAL,
                        os.path.join(self.data_dir, "journal.sqlite3")], check=True)
        for name in ("journal.sqlite3", "head.json"):
            copy(os.path.join(old, name), os.path.join(self.data_dir, name))
        tool = Tool()
        for name in ("d", "e"):
            blocked = json.loads(call(guard, tool, name))
            self.assertEqual(blocked["code"], "journal_rolled_back")
        self.assertEqual(tool.calls, 0)


class ReadersDoNotCostWarmWorkers(ReliabilityCase):
    """A status from another process is a read, not an edit: warm workers need
    no full verification after it."""

    def test_a_status_from_another_process_needs_no_full_verification(self):
        # As root, SQLite fchowns the WAL when a connection opens it (a new
        # ctime); that alone must not look like an edit to a warm worker.
        from crash_recovery.storage import store
        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        call(guard, Tool(), "a")
        full = []
        original = store.JournalStore._full_chain

        def counting(self_, connection):
            full.append(1)
            return original(self_, connection)

        store.JournalStore._full_chain = counting
        try:
            for name in ("b", "c"):
                self.assertEqual(run_cli(self.data_dir, "status")[0], 0)
                self.assertEqual(call(guard, Tool(), name), '{"status": "booked"}')
        finally:
            store.JournalStore._full_chain = original
        self.assertEqual(full, [])


if __name__ == "__main__":
    unittest.main()
