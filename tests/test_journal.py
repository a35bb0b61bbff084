"""Journal: docs/format.md on real files.

Transitions (docs/format.md §Events) legal and illegal, blocking states that are never
repaired silently, the creation race, SQLite settings, external checkpoints,
read-only use, and format compatibility with the independent JournalBuilder.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import unittest
import uuid

from support import REPO, TESTS, JournalTestCase, reference

from crash_recovery.storage import record
from crash_recovery.guard import RecoveryGuard
from crash_recovery.storage.errors import AdmissionRefused, IntegrityError, JournalError, JournalUnavailable
from crash_recovery.journal import Journal

HASH_A = "a" * 64
HASH_B = "b" * 64
HASH_NULL = record.value_hash(None)
RACE_PROCESSES = 8
RACE_TIMEOUT_SECONDS = 60


def admit(journal: Journal, tool: str = "book_trip", call: str = "call-1") -> str:
    operation_id = str(uuid.uuid4())
    journal.admit(operation_id=operation_id, tool=tool, args_hash=HASH_A, fingerprint=HASH_B,
                  session_id="session-1", tool_call_id=call)
    return operation_id


def returned(journal: Journal, operation_id: str) -> None:
    journal.record_outcome(operation_id, uncertain=False, result_hash=HASH_A, reason="returned")


def uncertain(journal: Journal, operation_id: str, reason: str = "exception") -> None:
    journal.record_outcome(operation_id, uncertain=True, result_hash=HASH_NULL, reason=reason)


class LegalTransitionTests(JournalTestCase):

    def test_started_returned(self):
        with Journal(self.data_dir) as journal:
            operation = admit(journal)
            self.assertEqual([op.state for op in journal.unresolved()], ["pending"])
            returned(journal, operation)
            self.assertEqual(journal.unresolved(), ())
            self.assertEqual(journal.checkpoint()["count"], 2)
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"])
        self.assertEqual(report.state_of(operation), "returned")

    def test_started_uncertain_each_reason_then_resolved(self):
        with Journal(self.data_dir) as journal:
            operations = []
            for reason, outcome in (("exception", "completed"), ("cancelled", "not_applied"),
                                    ("error_response", "completed")):
                operation = admit(journal)
                uncertain(journal, operation, reason)
                state = journal.unresolved()
                self.assertEqual([(op.operation_id, op.state, op.reason) for op in state],
                                 [(operation, "uncertain", reason)])
                before = journal.resolve(operation, outcome=outcome, evidence="receipt 42 checked").operation
                self.assertEqual(before.state, "uncertain")
                self.assertEqual(journal.unresolved(), ())
                operations.append(operation)
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "uncertain", "resolved"] * 3)
        self.assertEqual([e["reason"] for e in report.events if e["kind"] == "uncertain"],
                         ["exception", "cancelled", "error_response"])
        self.assertEqual([report.operations[op]["outcome"] for op in operations],
                         ["completed", "not_applied", "completed"])

    def test_pending_resolved(self):
        with Journal(self.data_dir) as journal:
            operation = admit(journal)
            before = journal.resolve(operation, outcome="not_applied", evidence="no row in orders").operation
            self.assertEqual(before.state, "pending")
            self.assertEqual(journal.unresolved(), ())
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "resolved"])
        self.assertEqual(report.state_of(operation), "resolved")


class IllegalTransitionTests(JournalTestCase):
    """Each journal is written by the independent JournalBuilder; ours must
    report exactly ``invalid_transition``."""

    def build(self, script):
        builder = reference.JournalBuilder(self.data_dir)
        script(builder)
        return builder

    def assertInvalidTransition(self, builder):
        before = self.snapshot()
        self.assertFalse(reference.verify(self.data_dir).ok)  # the reference reading agrees
        self.cross_check(self.data_dir, False)
        for readonly in (True, False):
            with Journal(self.data_dir, readonly=readonly) as journal:
                with self.assertRaises(IntegrityError) as caught:
                    journal.status()
                self.assertEqual(caught.exception.code, "invalid_transition")
        with Journal(self.data_dir) as journal:
            with self.assertRaises(IntegrityError) as caught:
                admit(journal)
            self.assertEqual(caught.exception.code, "invalid_transition")
        self.assertEqual(self.snapshot(), before)

    def test_illegal_sequences(self):
        unknown = "9d7d2b1e-1111-4222-8333-444455556666"

        def returned_unknown(b):
            b.returned(unknown)

        def uncertain_unknown(b):
            b.uncertain(unknown)

        def resolved_unknown(b):
            b.resolved(unknown)

        def started_twice(b):
            op = b.started()
            b.started(operation_id=op)

        def started_reused_after_returned(b):
            op = b.started()
            b.returned(op)
            b.started(operation_id=op)

        def started_reused_after_resolved(b):
            op = b.started()
            b.resolved(op)
            b.started(operation_id=op)

        def returned_twice(b):
            op = b.started()
            b.returned(op)
            b.returned(op)

        def uncertain_after_returned(b):
            op = b.started()
            b.returned(op)
            b.uncertain(op)

        def returned_after_uncertain(b):
            op = b.started()
            b.uncertain(op)
            b.returned(op)

        def uncertain_twice(b):
            op = b.started()
            b.uncertain(op)
            b.uncertain(op, reason="cancelled")

        def resolved_after_returned(b):
            op = b.started()
            b.returned(op)
            b.resolved(op)

        def resolved_twice(b):
            op = b.started()
            b.uncertain(op)
            b.resolved(op)
            b.resolved(op, "not_applied")

        def returned_after_resolved(b):
            op = b.started()
            b.resolved(op)
            b.returned(op)

        def uncertain_after_resolved(b):
            op = b.started()
            b.resolved(op, "not_applied")
            b.uncertain(op)

        for script in (returned_unknown, uncertain_unknown, resolved_unknown, started_twice,
                       started_reused_after_returned, started_reused_after_resolved,
                       returned_twice, uncertain_after_returned, returned_after_uncertain,
                       uncertain_twice, resolved_after_returned, resolved_twice,
                       returned_after_resolved, uncertain_after_resolved):
            with self.subTest(script.__name__):
                self.setUp()
                self.assertInvalidTransition(self.build(script))


class ApiRefusesIllegalAppendsTests(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.journal = Journal(self.data_dir)
        self.addCleanup(self.journal.close)
        self.done = admit(self.journal, call="c-done")
        returned(self.journal, self.done)
        self.settled = admit(self.journal, call="c-settled")
        uncertain(self.journal, self.settled)
        self.journal.resolve(self.settled, outcome="completed", evidence="row 9 exists")

    def assertRefused(self, code, action):
        before = self.snapshot()
        with self.assertRaises(AdmissionRefused) as caught:
            action()
        self.assertEqual(caught.exception.code, code)
        self.assertEqual(self.snapshot(), before)
        self.assertVerifies()
        return caught.exception

    def test_resolve_refusals(self):
        self.assertRefused("operation_not_open", lambda: self.journal.resolve(
            self.done, outcome="completed", evidence="x"))
        self.assertRefused("operation_not_open", lambda: self.journal.resolve(
            self.settled, outcome="not_applied", evidence="x"))
        self.assertRefused("unknown_operation", lambda: self.journal.resolve(
            str(uuid.uuid4()), outcome="completed", evidence="x"))
        self.assertRefused("invalid_request", lambda: self.journal.resolve(
            self.done, outcome="done", evidence="x"))
        for blank in ("", "   ", "\n\t"):
            self.assertRefused("invalid_request", lambda: self.journal.resolve(
                self.done, outcome="completed", evidence=blank))

    def test_record_outcome_refusals(self):
        for operation in (self.done, self.settled, str(uuid.uuid4())):
            for is_uncertain in (False, True):
                self.assertRefused("operation_not_pending", lambda: self.journal.record_outcome(
                    operation, uncertain=is_uncertain, result_hash=HASH_A,
                    reason="exception" if is_uncertain else "returned"))
        open_operation = admit(self.journal, call="c-open")
        uncertain(self.journal, open_operation)
        self.assertRefused("operation_not_pending", lambda: returned(self.journal, open_operation))
        self.assertRefused("operation_not_pending", lambda: uncertain(self.journal, open_operation))

    def test_admission_refused_while_open(self):
        pending = admit(self.journal, call="c-pending")
        refusal = self.assertRefused("unresolved_operations", lambda: admit(self.journal))
        self.assertEqual([op["operation_id"] for op in refusal.details["operations"]], [pending])
        self.assertEqual(refusal.details["operations"][0]["state"], "pending")
        uncertain(self.journal, pending)
        refusal = self.assertRefused("unresolved_operations", lambda: admit(self.journal))
        self.assertEqual(refusal.details["operations"][0]["state"], "uncertain")

    def test_invalid_reason_is_refused_before_writing(self):
        pending = admit(self.journal, call="c-pending")
        self.assertRefused("invalid_request", lambda: self.journal.record_outcome(
            pending, uncertain=True, result_hash=HASH_A, reason="timeout"))
        self.assertRefused("invalid_request", lambda: self.journal.record_outcome(
            pending, uncertain=False, result_hash="not-a-hash", reason="returned"))


class BlockingStatesTests(JournalTestCase):
    """checkpoint_ahead and missing_database block and are never repaired."""

    def make_journal(self, events=2):
        with Journal(self.data_dir) as journal:
            operation = admit(journal)
            if events > 1:
                returned(journal, operation)

    def assertBlocks(self, code):
        before = self.snapshot()
        listing = sorted(os.listdir(self.data_dir))
        for readonly in (True, False):
            with Journal(self.data_dir, readonly=readonly) as journal:
                with self.assertRaises(IntegrityError) as caught:
                    journal.status()
                self.assertEqual(caught.exception.code, code)
        with Journal(self.data_dir) as journal:
            with self.assertRaises(IntegrityError) as caught:
                admit(journal)
            self.assertEqual(caught.exception.code, code)
            with self.assertRaises(IntegrityError) as caught:
                journal.verify()
            self.assertEqual(caught.exception.code, code)
        calls = []
        guard = RecoveryGuard(self.data_dir)
        result = json.loads(guard.tool_execution(tool_name="book_trip", args={},
                                                 next_call=lambda: calls.append(1)))
        self.assertEqual((result["code"], result["blocked"], calls), (code, True, []))
        self.assertEqual(self.snapshot(), before)
        self.assertEqual(sorted(name for name in os.listdir(self.data_dir)
                                if name not in ("journal.sqlite3-wal", "journal.sqlite3-shm",
                                                "calls")),
                         sorted(name for name in listing
                                if name not in ("journal.sqlite3-wal", "journal.sqlite3-shm",
                                                "calls")))

    def test_crash_between_replace_and_commit_leaves_checkpoint_ahead(self):
        self.make_journal()
        # A real crash: the process SIGKILLs itself right after os.replace of
        # head.json, before COMMIT (an in-process exception would be rolled back).
        script = ("import os, signal, sys, uuid\n"
                  f"sys.path.insert(0, {TESTS!r})\n"
                  "from checkout import load_package; load_package()\n"
                  "from crash_recovery import journal\nfrom crash_recovery.storage import durable\n"
                  "def hook(boundary, kind):\n"
                  "    if boundary == 'checkpoint_replaced' and kind == 'started':\n"
                  "        os.kill(os.getpid(), signal.SIGKILL)\n"
                  "durable.set_boundary_hook(hook)\n"
                  "journal.Journal(sys.argv[1]).admit(operation_id=str(uuid.uuid4()), "
                  "tool='book_trip', args_hash='a' * 64, fingerprint='b' * 64, "
                  "session_id=None, tool_call_id=None)\n")
        completed = subprocess.run([sys.executable, "-c", script, self.data_dir],
                                   capture_output=True, timeout=RACE_TIMEOUT_SECONDS)
        self.assertEqual(completed.returncode, -signal.SIGKILL, completed.stderr)
        with open(os.path.join(self.data_dir, "head.json"), "rb") as stream:
            self.assertEqual(json.loads(stream.read())["count"], 3)
        self.assertEqual(len(reference.snapshot_rows(self.data_dir)), 2)
        self.assertBlocks("checkpoint_ahead")

    def test_hand_written_checkpoint_ahead(self):
        builder = reference.JournalBuilder(self.data_dir)
        op = builder.started()
        builder.returned(op)
        builder.auto_head = False
        builder.started()
        builder.write_head()  # anchors 3 events
        builder.sql("DELETE FROM events WHERE seq = 3")
        self.assertBlocks("checkpoint_ahead")

    def test_missing_database_with_each_survivor(self):
        survivors = ("head.json", "initialized", "journal.sqlite3-wal", "journal.sqlite3-shm")
        for survivor in survivors:
            with self.subTest(survivor):
                self.setUp()
                self.make_journal()
                for name in os.listdir(self.data_dir):
                    if name != survivor and name != "calls":
                        os.unlink(os.path.join(self.data_dir, name))
                if not os.path.exists(os.path.join(self.data_dir, survivor)):
                    with open(os.path.join(self.data_dir, survivor), "wb"):
                        pass  # SQLite removed its side file on close: recreate it empty
                self.assertMissingDatabase()

    def assertMissingDatabase(self):
        listing = sorted(os.listdir(self.data_dir))
        before = self.snapshot()
        for options in ({}, {"readonly": True}, {"create": False}):
            with Journal(self.data_dir, **options) as journal:
                with self.assertRaises(IntegrityError) as caught:
                    journal.status()
                self.assertEqual(caught.exception.code, "missing_database")
        calls = []
        result = json.loads(RecoveryGuard(self.data_dir).tool_execution(
            tool_name="book_trip", args={}, next_call=lambda: calls.append(1)))
        self.assertEqual((result["code"], calls), ("missing_database", []))
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "journal.sqlite3")))
        self.assertEqual(sorted(os.listdir(self.data_dir)), listing)
        self.assertEqual(self.snapshot(), before)

    def test_empty_database_file_with_checkpoint_is_missing_database(self):
        self.make_journal()
        for name in ("journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm"):
            path = os.path.join(self.data_dir, name)
            if os.path.exists(path):
                os.unlink(path)
        open(os.path.join(self.data_dir, "journal.sqlite3"), "wb").close()
        before = self.snapshot()
        with Journal(self.data_dir) as journal:
            with self.assertRaises(IntegrityError) as caught:
                journal.status()
            self.assertEqual(caught.exception.code, "missing_database")
        self.assertEqual(self.snapshot()["files"], before["files"])


def _race_worker(data_dir, barrier, results, mode):
    """One process of the creation race: wait for all, then use the fresh dir."""
    try:
        barrier.wait(RACE_TIMEOUT_SECONDS)
        if mode == "journal":
            with Journal(data_dir) as journal:
                results.put(("ok", journal.checkpoint()["journal_id"]))
        else:
            guard = RecoveryGuard(data_dir)
            result = guard.tool_execution(tool_name="book_trip", args={"n": os.getpid()},
                                          next_call=lambda: "done", session_id=str(os.getpid()),
                                          tool_call_id="race")
            results.put(("ran", None) if result == "done" else ("blocked", json.loads(result)["code"]))
    except Exception as exc:  # reported to the parent, which fails the test
        code = getattr(exc, "code", None)
        results.put(("error", f"{type(exc).__name__}:{code}:{exc}"))


class CreationRaceTests(JournalTestCase):

    def race(self, mode):
        context = multiprocessing.get_context("fork")
        barrier = context.Barrier(RACE_PROCESSES)
        results = context.Queue()
        processes = [context.Process(target=_race_worker, args=(self.data_dir, barrier, results, mode))
                     for _ in range(RACE_PROCESSES)]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=RACE_TIMEOUT_SECONDS) for _ in processes]
        for process in processes:
            process.join(RACE_TIMEOUT_SECONDS)
            self.assertEqual(process.exitcode, 0)
        return outcomes

    def test_eight_processes_create_one_journal(self):
        outcomes = self.race("journal")
        self.assertEqual([kind for kind, _ in outcomes], ["ok"] * RACE_PROCESSES, outcomes)
        self.assertEqual(len({journal_id for _, journal_id in outcomes}), 1)
        report = self.assertVerifies()
        self.assertEqual(report.journal_id, outcomes[0][1])
        self.assertEqual(report.count, 0)
        with open(os.path.join(self.data_dir, "initialized"), "rb") as stream:
            self.assertEqual(json.loads(stream.read())["journal_id"], report.journal_id)

    def test_eight_guards_on_a_fresh_profile(self):
        outcomes = self.race("guard")
        kinds = [kind for kind, _ in outcomes]
        self.assertNotIn("error", kinds, outcomes)
        self.assertGreaterEqual(kinds.count("ran"), 1)
        refused = {code for kind, code in outcomes if kind == "blocked"}
        self.assertLessEqual(refused, {"operation_in_flight", "unresolved_operations",
                                       "database_locked"})
        report = self.assertVerifies()
        self.assertEqual(report.kinds(), ["started", "returned"] * kinds.count("ran"))
        self.assertEqual(report.unresolved(), [])


class SqliteSettingsTests(JournalTestCase):

    def test_wal_and_synchronous_full(self):
        with Journal(self.data_dir) as journal:
            admit(journal)
            self.assertEqual(journal._store.database.connection.execute("PRAGMA journal_mode").fetchone()[0], "wal")
            # synchronous is per connection: 2 == FULL.
            self.assertEqual(journal._store.database.connection.execute("PRAGMA synchronous").fetchone()[0], 2)
            self.assertGreater(journal._store.database.connection.execute("PRAGMA busy_timeout").fetchone()[0], 0)
        connection = sqlite3.connect(os.path.join(self.data_dir, "journal.sqlite3"))
        try:
            self.assertEqual(connection.execute("PRAGMA journal_mode").fetchone()[0], "wal")
            self.assertEqual(
                connection.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0],
                "CREATE TABLE events(seq INTEGER PRIMARY KEY, payload TEXT NOT NULL, "
                "previous TEXT NOT NULL, hash TEXT NOT NULL)")
            self.assertEqual(dict(connection.execute("SELECT key, value FROM metadata"))["schema"],
                             "hermes.crash-recovery.v1")
        finally:
            connection.close()
        self.assertVerifies()


class ExternalCheckpointTests(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.journal = Journal(self.data_dir)
        self.addCleanup(self.journal.close)
        self.genesis = self.journal.checkpoint()
        operation = admit(self.journal)
        self.older = self.journal.checkpoint()
        returned(self.journal, operation)
        self.current = self.journal.checkpoint()

    def assertNotAncestor(self, checkpoint, code="checkpoint_not_ancestor"):
        with self.assertRaises(JournalError) as caught:
            self.journal.verify(checkpoint)
        self.assertEqual(caught.exception.code, code)
        report = reference.verify(self.data_dir)
        self.assertNotEqual(reference.check_ancestor(report, checkpoint), [])

    def test_ancestors_accepted(self):
        self.assertEqual(self.genesis["count"], 0)
        self.assertEqual(self.genesis["head"],
                         record.genesis_hash(self.genesis["journal_id"]))
        for checkpoint in (self.genesis, self.older, self.current):
            with self.subTest(count=checkpoint["count"]):
                status = self.journal.verify(checkpoint)
                self.assertEqual(status.checkpoint, self.current)
                self.assertEqual(reference.check_ancestor(self.assertVerifies(), checkpoint), [])

    def test_non_ancestors_refused(self):
        foreign_id = str(uuid.uuid4())
        cases = {
            "foreign": dict(self.current, journal_id=foreign_id,
                            head=record.genesis_hash(foreign_id)),
            "foreign at 0": dict(self.genesis, journal_id=foreign_id,
                                 head=record.genesis_hash(foreign_id)),
            "ahead": dict(self.current, count=3),
            "wrong head": dict(self.older, head=self.current["head"]),
            "wrong genesis": dict(self.genesis, head=self.older["head"]),
            "other schema": dict(self.current, schema="hermes.crash-recovery.v2"),
            "missing key": {key: value for key, value in self.current.items() if key != "head"},
            "extra key": dict(self.current, note="x"),
            "negative count": dict(self.current, count=-1),
            "boolean count": dict(self.genesis, count=False),
            "not a dict": [self.current],
        }
        malformed = ("missing key", "extra key", "negative count", "boolean count", "not a dict")
        for label, checkpoint in cases.items():
            with self.subTest(label):
                # A malformed export is a bad request, not a verdict on the journal.
                self.assertNotAncestor(checkpoint, "invalid_checkpoint" if label in malformed
                                       else "checkpoint_not_ancestor")


class ReadOnlyTests(JournalTestCase):

    def test_readonly_never_creates_anything(self):
        for options in ({"readonly": True}, {"create": False}):
            with self.subTest(options):
                with Journal(self.data_dir, **options) as journal:
                    for method in (journal.status, journal.verify, journal.checkpoint,
                                   journal.events):
                        with self.assertRaises(JournalUnavailable) as caught:
                            method()
                        self.assertEqual(caught.exception.code, "journal_absent")
                self.assertFalse(os.path.exists(self.data_dir))
        os.makedirs(self.data_dir)
        with Journal(self.data_dir, readonly=True) as journal:
            with self.assertRaises(JournalUnavailable):
                journal.status()
        self.assertEqual(os.listdir(self.data_dir), [])

    def test_readonly_refuses_writes_and_changes_nothing(self):
        with Journal(self.data_dir) as journal:
            operation = admit(journal)
        before = self.snapshot()
        with Journal(self.data_dir, readonly=True) as journal:
            self.assertEqual([op.operation_id for op in journal.unresolved()], [operation])
            with self.assertRaises(JournalUnavailable) as caught:
                journal.resolve(operation, outcome="completed", evidence="x")
            self.assertEqual(caught.exception.code, "storage_unavailable")
            with self.assertRaises(JournalUnavailable):
                admit(journal)
        self.assertEqual(self.snapshot(), before)


class FormatCompatibilityTests(JournalTestCase):

    def test_reads_builder_journal_and_extends_it(self):
        standard = reference.standard_journal(self.data_dir)
        builder = standard["builder"]
        with Journal(self.data_dir) as journal:
            status = journal.status()
            self.assertEqual(status.checkpoint, builder.checkpoint())
            self.assertEqual([(op.operation_id, op.state, op.reason, op.tool) for op in status.unresolved],
                             [(standard["uncertain"], "uncertain", "error_response", "post_message")])
            self.assertEqual(journal.verify(builder.checkpoint(2)).checkpoint, builder.checkpoint())
            with self.assertRaises(AdmissionRefused):
                admit(journal)
            journal.resolve(standard["uncertain"], outcome="not_applied", evidence="no post in #ops")
            operation = admit(journal, call="after")
            returned(journal, operation)
        report = self.assertVerifies()
        self.assertEqual(report.count, 10)
        self.assertEqual(report.kinds()[-3:], ["resolved", "started", "returned"])
        self.assertEqual(report.unresolved(), [])

    def test_builder_null_session_ids_accepted(self):
        builder = reference.JournalBuilder(self.data_dir)
        op = builder.started(session_id=None)
        builder.returned(op, {"ok": True})
        with Journal(self.data_dir) as journal:
            self.assertEqual(journal.status().checkpoint, builder.checkpoint())
            admit(journal)
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()


class FastPathParityTests(JournalTestCase):
    """Verification checks rows in the plugin's own canonical layouts by pattern
    (the fast path, docs/format.md §Verification cost) and every other row field
    by field.  For payloads just off those layouts, the verdict -- ok, or the
    code and the seq -- must be the same with the fast path disabled, and the
    reference reading must agree on ok / not ok."""

    OP = "6513270e-269e-4d37-b2a7-0123456789ab"

    def started_text(self, **changes):
        payload = {"schema": record.SCHEMA, "timestamp_ns": 1700000000000000000,
                   "kind": "started", "operation_id": self.OP, "tool": "book_trip",
                   "fingerprint": "a" * 64, "args_hash": "b" * 64, "session_id": "s-1",
                   "tool_call_id": "call-1"}
        payload.update(changes)
        return reference.canonical(payload)

    def outcome_text(self, kind="returned", **changes):
        payload = {"schema": record.SCHEMA, "timestamp_ns": 1700000000000000001, "kind": kind,
                   "operation_id": self.OP, "reason": "returned" if kind == "returned"
                   else "exception", "result_hash": "c" * 64}
        payload.update(changes)
        return reference.canonical(payload)

    def cases(self):
        started, returned = self.started_text(), self.outcome_text()
        uncertain = self.outcome_text("uncertain")
        swap = str.replace
        yield "started as written", started, None
        yield "args_hash upper case", swap(started, "b" * 64, "B" + "b" * 63), None
        yield "fingerprint not hex", swap(started, "a" * 64, "g" + "a" * 63), None
        yield "args_hash 63 digits", swap(started, "b" * 64, "b" * 63), None
        yield "operation id upper case", swap(started, self.OP, self.OP.upper()), None
        yield "operation id not a uuid", swap(started, self.OP, "x" * 36), None
        yield "timestamp leading zero", swap(started, "1700000000000000000", "01700"), None
        yield "timestamp negative", swap(started, "1700000000000000000", "-1"), None
        yield "timestamp 20 digits", swap(started, "1700000000000000000", "1" * 20), None
        yield "timestamp fraction", swap(started, "1700000000000000000", "1.5"), None
        yield "empty tool", self.started_text(tool=""), None
        yield "tool with a quote", self.started_text(tool='say "hi"'), None
        yield "tool with a backslash", self.started_text(tool="a\\b"), None
        yield "tool not ascii", self.started_text(tool="réserver"), None
        yield "tool with a control character", self.started_text(tool="a\u0001b"), None
        yield "session id a number", self.started_text(session_id=5), None
        yield "call id null", self.started_text(tool_call_id=None), None
        yield "extra field", self.started_text(note="x"), None
        yield "session id missing", swap(started, '"session_id":"s-1",', ""), None
        yield "space after a colon", swap(started, '"tool":"book_trip"', '"tool": "book_trip"'), None
        yield "duplicate key", swap(started, '"tool":"book_trip"',
                                    '"tool":"","tool":"book_trip"'), None
        yield "other schema", swap(started, record.SCHEMA, record.SCHEMA + "x"), None
        yield "kind with a space", swap(started, '"started"', '"started "'), None
        for name, outcome in (("returned", returned), ("uncertain", uncertain)):
            yield f"{name} as written", outcome, started
            yield f"{name} result upper case", swap(outcome, "c" * 64, "C" + "c" * 63), started
            yield f"{name} result 65 digits", swap(outcome, "c" * 64, "c" * 65), started
            yield f"{name} reason unknown", self.outcome_text(name, reason="bored"), started
            yield f"{name} of an unknown operation", swap(outcome, self.OP, str(uuid.uuid4())), started
            yield f"{name} trailing space", outcome + " ", started
            yield f"{name} with an extra field", self.outcome_text(name, note="x"), started
        yield "returned with reason not_run", self.outcome_text(reason="not_run"), started
        yield "returned with an uncertain reason", self.outcome_text(reason="exception"), started
        yield "uncertain with a returned reason", self.outcome_text("uncertain",
                                                                   reason="returned"), started

    def verdict(self, disable_fast_path):
        from crash_recovery.storage import chain
        never = __import__("re").compile(b"(?!)")
        patches = ({"_STARTED": never, "_RETURNED": never, "_UNCERTAIN": never}
                   if disable_fast_path else {})
        saved = {name: getattr(chain, name) for name in patches}
        try:
            for name, pattern in patches.items():
                setattr(chain, name, pattern)
            with Journal(self.data_dir, readonly=True) as journal:
                try:
                    journal.verify()
                except IntegrityError as exc:
                    return exc.code, exc.details.get("seq")
                return "ok", None
        finally:
            for name, pattern in saved.items():
                setattr(chain, name, pattern)

    def test_fast_and_slow_path_agree(self):
        import shutil
        for name, text, before in self.cases():
            with self.subTest(name):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                builder = reference.JournalBuilder(self.data_dir)
                if before is not None:
                    builder.append_payload_text(before)
                builder.append_payload_text(text)
                fast, slow = self.verdict(False), self.verdict(True)
                self.assertEqual(fast, slow)
                self.assertEqual(fast[0] == "ok", reference.verify(self.data_dir).ok,
                                 (fast, reference.verify(self.data_dir).errors))
        # The layouts are really taken: every "as written" payload matches one.
        from crash_recovery.storage import chain
        self.assertIsNotNone(chain._STARTED.fullmatch(self.started_text().encode()))
        self.assertIsNotNone(chain._RETURNED.fullmatch(self.outcome_text().encode()))
        self.assertIsNotNone(chain._UNCERTAIN.fullmatch(self.outcome_text("uncertain").encode()))
