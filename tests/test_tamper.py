"""Tamper catalogue with named verdicts (docs/format.md §Verification, docs/cli.md §Verdict codes).

Every case is applied to a journal written by a *live* guard (its connection
still open, its WAL still present), in both verification modes
(``full_verification=True`` and the incremental mode, which must notice an
edit made through another sqlite3 connection between two admissions through
``PRAGMA data_version``).  Each case must show its own code

* in ``operator_cli.py verify`` and ``status`` (exit 1, ``integrity`` = code),
* in the blocked result of a fresh guard and of the live guard (downstream
  never called) and in the ``pre_tool_call`` hook's block message,

and every file must be left exactly as it was (no repair, no re-creation).

Stray WAL files (SQLite binds a ``-wal`` file to nothing but its path):
beside an *empty* database file SQLite deletes the WAL on open -- even
read-only -- and beside a non-SQLite file or another journal's database it
shows the WAL's pages.  The product now refuses all three before trusting
them (``stray_wal``).  Beside an older copy of the *same* journal the WAL's
newer pages show through; that view is the real journal and verifies against
head.json, so it is reported as ok (pinned below).
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import unittest
import uuid

from reliability_support import ReliabilityCase as JournalTestCase, logical_snapshot
from support import run_cli, reference

from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal

V = reference


def _rows(database):
    connection = sqlite3.connect(database)
    try:
        return connection.execute("SELECT seq, payload, previous, hash FROM events ORDER BY seq").fetchall()
    finally:
        connection.close()


def _sql(database, *statements):
    """Edit through another sqlite3 connection (the live guard keeps its own),
    as a determined editor would: the append-only triggers are dropped first."""
    connection = sqlite3.connect(database, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            connection.execute(f'DROP TRIGGER "{name}"')
        for statement, parameters in statements:
            connection.execute(statement, parameters)
        connection.execute("COMMIT")
    finally:
        connection.close()


def _write(path, content: bytes):
    with open(path, "wb") as stream:
        stream.write(content)


class Fixture:
    """A journal of 9 events written through a live guard."""

    def __init__(self, case: JournalTestCase, full: bool):
        self.case = case
        self.data_dir = case.data_dir
        self.database = os.path.join(self.data_dir, "journal.sqlite3")
        self.head = os.path.join(self.data_dir, "head.json")
        self.marker = os.path.join(self.data_dir, "initialized")
        self.guard = RecoveryGuard(self.data_dir, full_verification=full)
        self.call("c0")
        self.call("c1")
        self.older = os.path.join(case.root, "older.sqlite3")
        self.backup(self.older)  # a copy at 4 events
        with self.case.assertRaises(RuntimeError):
            self.guard.tool_execution("book_flight", {"n": "c2"}, self._boom,
                                      session_id="s", tool_call_id="c2")
        operation = self.guard.gate.opened_journal.unresolved()[0].operation_id
        self.guard.gate.opened_journal.resolve(operation, outcome="not_applied", evidence="no row in service")
        self.call("c3")
        self.call("c4")
        self.count = len(_rows(self.database))
        case.assertEqual(self.count, 11)
        with open(self.head) as stream:
            self.journal_id = json.load(stream)["journal_id"]

    @staticmethod
    def _boom():
        raise RuntimeError("reset")

    def call(self, name):
        result = self.guard.tool_execution("book_flight", {"n": name}, lambda: {"ok": True},
                                           session_id="s", tool_call_id=name)
        self.case.assertEqual(result, {"ok": True})

    def backup(self, path):
        source = sqlite3.connect(self.database)
        target = sqlite3.connect(path)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()

    def hash_at(self, count):
        rows = _rows(self.database)
        return rows[count - 1][3] if count else V.genesis(self.journal_id)

    def checkpoint(self, count, head=None, journal_id=None):
        return {"schema": V.SCHEMA, "journal_id": journal_id or self.journal_id, "count": count,
                "head": head or (self.hash_at(count) if count <= self.count else "ab" * 32)}


# ------------------------------------------------------------------ cases --
# Each returns nothing; expected codes: (cli, fresh guard, live guard).

def payload_edited(f):
    _sql(f.database, ("UPDATE events SET payload = replace(payload, 'book_flight', 'book_hotel') "
                      "WHERE seq = 3", ()))


def payload_edited_rehashed(f):
    rows = _rows(f.database)
    previous = rows[1][3]
    statements = []
    for seq, payload, _, _ in rows[2:]:
        if seq == 3:
            payload = payload.replace("book_flight", "book_hotel")
        new_hash = V.link(previous, payload)
        statements.append(("UPDATE events SET payload = ?, previous = ?, hash = ? WHERE seq = ?",
                           (payload, previous, new_hash, seq)))
        previous = new_hash
    _sql(f.database, *statements)


def row_deleted_in_middle(f):
    _sql(f.database, ("DELETE FROM events WHERE seq = 5", ()))


def tail_truncated_by_one(f):
    _sql(f.database, ("DELETE FROM events WHERE seq = ?", (f.count,)))


def tail_truncated(f):
    _sql(f.database, ("DELETE FROM events WHERE seq > ?", (f.count - 3,)))


def restored_older_copy(f):
    """``sqlite3 journal.sqlite3 ".restore older"``: the live file, older content."""
    source = sqlite3.connect(f.older)
    target = sqlite3.connect(f.database)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def head_older(f):
    _write(f.head, V.canonical(f.checkpoint(f.count - 2)).encode())


def head_newer_by_one(f):
    _write(f.head, V.canonical(f.checkpoint(f.count + 1)).encode())


def head_newer(f):
    _write(f.head, V.canonical(f.checkpoint(f.count + 4)).encode())


def head_missing(f):
    os.remove(f.head)


def head_empty(f):
    _write(f.head, b"")


def head_not_json(f):
    _write(f.head, b"{\"count\": 11, \"head\": ")


def head_other_journal(f):
    other = str(uuid.uuid4())
    _write(f.head, V.canonical(f.checkpoint(f.count, head=f.hash_at(f.count),
                                                 journal_id=other)).encode())


def metadata_journal_id_changed(f):
    _sql(f.database, ("UPDATE metadata SET value = ? WHERE key = 'journal_id'", (str(uuid.uuid4()),)))


def metadata_schema_changed(f):
    _sql(f.database, ("UPDATE metadata SET value = 'hermes.crash-recovery.v2' WHERE key = 'schema'", ()))


def marker_missing(f):
    os.remove(f.marker)


def marker_corrupt(f):
    _write(f.marker, b"garbage\n")


def foreign_trigger(f):
    # Every later append would "commit" no row.
    _sql(f.database, ("CREATE TRIGGER t BEFORE INSERT ON events BEGIN SELECT RAISE(IGNORE); END",
                      ()))


def foreign_trigger_keeping_ours(f):
    connection = sqlite3.connect(f.database)
    try:  # without dropping the plugin's triggers
        connection.execute("CREATE TRIGGER audit AFTER INSERT ON events BEGIN "
                           "SELECT 1; END")
        connection.commit()
    finally:
        connection.close()


def view_shadowing_events(f):
    _sql(f.database, ("ALTER TABLE events RENAME TO events_kept", ()),
         ("CREATE VIEW events AS SELECT * FROM events_kept", ()),
         ("CREATE TRIGGER v INSTEAD OF INSERT ON events BEGIN SELECT 1; END", ()))


def extra_index(f):
    _sql(f.database, ("CREATE INDEX by_payload ON events(payload)", ()))


def database_deleted(f):
    os.remove(f.database)  # the live connection keeps the WAL (and -shm) beside it


CASES = {
    # name: (tamper, cli code, fresh-guard code, live-guard code)
    "payload_edited": (payload_edited, "hash_mismatch", "hash_mismatch", "hash_mismatch"),
    "payload_edited_and_rehashed": (payload_edited_rehashed, "checkpoint_mismatch",
                                    "checkpoint_mismatch", "checkpoint_mismatch"),
    "row_deleted_in_middle": (row_deleted_in_middle, "sequence_gap", "sequence_gap", "sequence_gap"),
    # The live guard wrote (and committed) the last event: to it, losing that
    # event is a rollback, not a crash between head.json and COMMIT.
    "tail_truncated_by_one": (tail_truncated_by_one, "checkpoint_ahead", "checkpoint_ahead",
                              "journal_rolled_back"),
    "tail_truncated": (tail_truncated, "journal_rolled_back", "journal_rolled_back",
                       "journal_rolled_back"),
    "restored_older_copy": (restored_older_copy, "journal_rolled_back", "journal_rolled_back",
                            "journal_rolled_back"),
    "head_older": (head_older, "checkpoint_behind", "checkpoint_behind", "checkpoint_behind"),
    "head_newer_by_one": (head_newer_by_one, "checkpoint_ahead", "checkpoint_ahead",
                          "checkpoint_ahead"),
    "head_newer": (head_newer, "journal_rolled_back", "journal_rolled_back", "journal_rolled_back"),
    "head_missing": (head_missing, "checkpoint_missing", "checkpoint_missing", "checkpoint_missing"),
    "head_empty": (head_empty, "checkpoint_empty", "checkpoint_empty", "checkpoint_empty"),
    "head_not_json": (head_not_json, "checkpoint_corrupt", "checkpoint_corrupt",
                      "checkpoint_corrupt"),
    "head_of_other_journal": (head_other_journal, "checkpoint_foreign", "checkpoint_foreign",
                              "checkpoint_foreign"),
    "metadata_journal_id_changed": (metadata_journal_id_changed, "identity_mismatch",
                                    "identity_mismatch", "identity_mismatch"),
    "metadata_schema_changed": (metadata_schema_changed, "schema_mismatch", "schema_mismatch",
                                "schema_mismatch"),
    "marker_missing": (marker_missing, "marker_missing", "marker_missing", "marker_missing"),
    "marker_corrupt": (marker_corrupt, "marker_corrupt", "marker_corrupt", "marker_corrupt"),
    "database_deleted": (database_deleted, "missing_database", "missing_database",
                         "missing_database"),
    "foreign_trigger": (foreign_trigger, "foreign_schema_object", "foreign_schema_object",
                        "foreign_schema_object"),
    "foreign_trigger_keeping_ours": (foreign_trigger_keeping_ours, "foreign_schema_object",
                                     "foreign_schema_object", "foreign_schema_object"),
    "view_shadowing_events": (view_shadowing_events, "foreign_schema_object",
                              "foreign_schema_object", "foreign_schema_object"),
    "extra_index": (extra_index, "foreign_schema_object", "foreign_schema_object",
                    "foreign_schema_object"),
}


class TamperCatalogue(JournalTestCase):

    def assert_blocked(self, guard, code):
        calls = []
        result = guard.tool_execution("book_flight", {"n": "new"}, lambda: calls.append(1),
                                      session_id="s", tool_call_id="new")
        self.assertIsInstance(result, str, result)
        blocked = json.loads(result)
        self.assertEqual((blocked["error"], blocked["blocked"], blocked["code"]),
                         ("crash_recovery_blocked", True, code), blocked)
        self.assertEqual(calls, [])
        hook = guard.pre_tool_call(tool_name="book_flight", args={"n": "new"}, session_id="s",
                                   tool_call_id="new")
        self.assertEqual(hook["action"], "block")
        self.assertEqual(json.loads(hook["message"])["code"], code)

    def run_case(self, name, full):
        tamper, cli_code, fresh_code, live_code = CASES[name]
        fixture = Fixture(self, full)
        tamper(fixture)
        database_existed = os.path.exists(fixture.database)
        before = logical_snapshot(self)
        if full:  # the CLI does not depend on the guard's mode
            for command in ("verify", "status"):
                code, output, text = run_cli(self.data_dir, command)
                self.assertEqual(code, 1, text)
                self.assertEqual(output["integrity"], cli_code, text)
                self.assertEqual(output["error"]["code"], cli_code)
        if not name.startswith("marker_"):  # the independent checker ignores the marker
            self.assertFalse(V.verify(self.data_dir).ok)
        fresh = RecoveryGuard(self.data_dir, full_verification=full)
        self.assert_blocked(fresh, fresh_code)
        self.assertEqual(fresh.status_report()["integrity"], fresh_code)
        self.assert_blocked(fixture.guard, live_code)
        self.assert_blocked(fixture.guard, live_code)  # and again: nothing healed meanwhile
        self.assertEqual(fixture.guard.verify_report()["integrity"], live_code)
        self.assertEqual(logical_snapshot(self), before, "a refusal changed the files")
        self.assertEqual(os.path.exists(fixture.database), database_existed,
                         "the database was re-created")
        fresh.close()
        fixture.guard.close()


def _make(name, full):
    def test(self):
        self.run_case(name, full)
    return test


for _name in CASES:
    setattr(TamperCatalogue, f"test_{_name}_full", _make(_name, True))
    setattr(TamperCatalogue, f"test_{_name}_incremental", _make(_name, False))


class StrayWal(JournalTestCase):
    """A WAL left by a killed process beside a replaced database file."""

    def crashed_copy(self):
        """A data directory as a SIGKILLed worker leaves it: WAL with every frame."""
        live = os.path.join(self.root, "live")
        guard = RecoveryGuard(live)
        for index in range(3):
            guard.tool_execution("book_flight", {"n": index}, lambda: {"ok": True},
                                 session_id="s", tool_call_id=str(index))
        shutil.copytree(live, self.data_dir)
        guard.close()
        self.assertGreater(os.path.getsize(os.path.join(self.data_dir, "journal.sqlite3-wal")), 0)
        return os.path.join(self.data_dir, "journal.sqlite3")

    def other_journal(self):
        other = os.path.join(self.root, "other")
        guard = RecoveryGuard(other)
        guard.tool_execution("send", {}, lambda: {"ok": True}, session_id="s", tool_call_id="x")
        guard.close()
        return os.path.join(other, "journal.sqlite3")

    def assert_stray(self, code="stray_wal"):
        wal = os.path.join(self.data_dir, "journal.sqlite3-wal")
        with open(wal, "rb") as stream:
            wal_bytes = stream.read()
        before = self.snapshot()
        for command in ("verify", "status"):
            exit_code, output, text = run_cli(self.data_dir, command)
            self.assertEqual((exit_code, output["integrity"]), (1, code), text)
        for full in (True, False):
            guard = RecoveryGuard(self.data_dir, full_verification=full)
            calls = []
            blocked = json.loads(guard.tool_execution("book_flight", {}, lambda: calls.append(1),
                                                      session_id="s", tool_call_id="n"))
            self.assertEqual((blocked["code"], calls), (code, []))
            hook = guard.pre_tool_call(tool_name="book_flight", args={}, session_id="s",
                                       tool_call_id="n")
            self.assertEqual(json.loads(hook["message"])["code"], code)
            if guard.gate.opened_journal is not None:
                guard.close()
        self.assertEqual(self.snapshot(), before)
        with open(wal, "rb") as stream:  # SQLite did not delete or rewrite the WAL
            self.assertEqual(stream.read(), wal_bytes)

    def test_empty_database_beside_wal_keeps_the_wal(self):
        database = self.crashed_copy()
        _write(database, b"")
        self.assert_stray()

    def test_non_sqlite_file_beside_wal(self):
        database = self.crashed_copy()
        _write(database, b"not a database at all\n" * 50)
        self.assert_stray()

    def test_other_journal_beside_wal(self):
        database = self.crashed_copy()
        shutil.copyfile(self.other_journal(), database)
        self.assert_stray()

    def test_fresh_journal_without_events_beside_wal(self):
        # The replacement holds only its metadata: the WAL's first event links
        # to another journal's genesis hash, not to this one's.
        other = os.path.join(self.root, "fresh")
        with Journal(other) as journal:
            self.assertEqual(journal.checkpoint()["count"], 0)
        database = self.crashed_copy()
        shutil.copyfile(os.path.join(other, "journal.sqlite3"), database)
        self.assert_stray()

    def test_live_guard_sees_replacement_then_fresh_process_sees_stray_wal(self):
        guard = RecoveryGuard(self.data_dir)
        for index in range(2):
            guard.tool_execution("book_flight", {"n": index}, lambda: {"ok": True},
                                 session_id="s", tool_call_id=str(index))
        replacement = os.path.join(self.root, "replacement.sqlite3")
        shutil.copyfile(self.other_journal(), replacement)
        os.replace(replacement, os.path.join(self.data_dir, "journal.sqlite3"))
        code, output, text = run_cli(self.data_dir, "verify")  # another process, first
        self.assertEqual((code, output["integrity"]), (1, "stray_wal"), text)
        calls = []
        blocked = json.loads(guard.tool_execution("book_flight", {}, lambda: calls.append(1),
                                                  session_id="s", tool_call_id="n"))
        self.assertEqual((blocked["code"], calls), ("database_replaced", []))

    def test_older_copy_of_same_journal_beside_its_wal_reads_through_the_wal(self):
        """Pinned limitation: SQLite cannot tell this from a normal
        un-checkpointed WAL; the view is the newest journal and it verifies."""
        live = os.path.join(self.root, "live")
        guard = RecoveryGuard(live)
        guard.tool_execution("book_flight", {"n": 0}, lambda: {"ok": True},
                             session_id="s", tool_call_id="0")
        older = os.path.join(self.root, "older.sqlite3")
        source, target = sqlite3.connect(os.path.join(live, "journal.sqlite3")), sqlite3.connect(older)
        source.backup(target)
        source.close()
        target.close()
        guard.tool_execution("book_flight", {"n": 1}, lambda: {"ok": True},
                             session_id="s", tool_call_id="1")
        shutil.copytree(live, self.data_dir)
        guard.close()
        shutil.copyfile(older, os.path.join(self.data_dir, "journal.sqlite3"))
        code, output, text = run_cli(self.data_dir, "verify")
        self.assertEqual((code, output["integrity"], output["count"]), (0, "ok", 4), text)
        self.assertTrue(self.assertVerifies().ok)


class ExternalCheckpoint(JournalTestCase):

    def test_not_an_ancestor(self):
        fixture = Fixture(self, True)
        fixture.guard.close()
        good = fixture.checkpoint(5)
        cases = {
            "ahead": fixture.checkpoint(fixture.count + 1),
            "wrong_head": dict(good, head="cd" * 32),
            "other_journal": dict(good, journal_id=str(uuid.uuid4())),
            "other_schema": dict(good, schema="other"),
            "not_a_checkpoint": {"count": 1},
            "negative": dict(good, count=-1),
        }
        before = logical_snapshot(self)
        for label, checkpoint in cases.items():
            with self.subTest(label):
                path = os.path.join(self.root, f"{label}.json")
                _write(path, json.dumps(checkpoint).encode())
                code, output, text = run_cli(self.data_dir, "verify", "--checkpoint", path)
                guard = RecoveryGuard(self.data_dir)
                report = guard.verify_report(checkpoint)
                guard.close()
                if label in ("not_a_checkpoint", "negative"):
                    # A malformed file, not a verdict on the journal (which verified).
                    self.assertEqual((code, output["integrity"], output["error"]["code"]),
                                     (1, "ok", "invalid_checkpoint"), text)
                    self.assertEqual((report["integrity"], report["error"]["code"]),
                                     ("ok", "invalid_checkpoint"))
                else:
                    self.assertEqual((code, output["integrity"]), (1, "checkpoint_not_ancestor"),
                                     text)
                    self.assertEqual(report["integrity"], "checkpoint_not_ancestor")
        path = os.path.join(self.root, "good.json")
        _write(path, json.dumps(good).encode())
        code, output, _ = run_cli(self.data_dir, "verify", "--checkpoint", path)
        self.assertEqual((code, output["external_checkpoint"]), (0, "ancestor"))
        genesis = fixture.checkpoint(0)
        with Journal(self.data_dir, readonly=True) as journal:
            self.assertTrue(journal.verify(genesis))
        self.assertEqual(logical_snapshot(self), before)


if __name__ == "__main__":
    unittest.main()
