"""Durable creation (docs/persistence.md, docs/format.md §Creation): what a
power cut or a crash during creation and first use may leave, tested
directly, without strace (tests/crash_explorer.py explores the same under a
crash model).

* A fresh profile's data directory: every directory entry on the way to the
  journal is fsynced before the first ``started`` commits, else a power cut
  can drop the whole directory after the tool ran.
* ``operator.log``: its directory is fsynced after each append, so a command
  that reported success keeps its audit line.
* Journal creation is atomic: ``journal.sqlite3`` is built under a temporary
  name and linked into place, so no crash leaves a half-made database.
* An operator command on a journal whose creator stopped half-way writes
  nothing.
"""
from __future__ import annotations

import contextlib
import io
import os
import sqlite3
import unittest
import uuid
from unittest import mock

from support import JournalTestCase, run_cli

from crash_recovery import operator_cli
from crash_recovery.guard import RecoveryGuard
from crash_recovery.journal import Journal
from crash_recovery.reconciliation import audit  # operator.log lines
from crash_recovery.storage import database, durable


class FreshProfileDirectories(JournalTestCase):
    """The directories on the way to a fresh journal are durable before any
    tool runs."""

    def test_every_ancestor_is_fsynced_before_the_first_started_commits(self):
        data_dir = os.path.join(self.root, "home", "plugin-data", "crash-recovery")
        order = []
        real_fsync_directory = durable.fsync_directory

        def record_fsync(path):
            order.append(("fsync_dir", os.path.abspath(path)))
            real_fsync_directory(path)

        def tool():
            order.append(("tool", None))
            return "booked"

        with mock.patch.object(durable, "fsync_directory", record_fsync), \
                mock.patch.object(database, "fsync_directory", record_fsync):
            guard = RecoveryGuard(data_dir)
            self.assertEqual(guard.tool_execution("book_trip", {"to": "LIS"}, tool,
                                                  session_id="s", tool_call_id="c"), "booked")
            guard.close()
        before_tool = [path for kind, path in order[:order.index(("tool", None))]
                       if kind == "fsync_dir"]
        ancestors = []
        current = os.path.abspath(data_dir)
        while os.path.dirname(current) != current:
            ancestors.append(os.path.dirname(current))
            current = os.path.dirname(current)
        for ancestor in ancestors + [os.path.abspath(data_dir)]:
            self.assertIn(ancestor, before_tool)
        self.assertTrue(self.assertVerifies(data_dir).ok)

    def test_a_path_component_that_is_a_file_is_a_clear_refusal(self):
        blocker = os.path.join(self.root, "plugin-data")
        with open(blocker, "w") as stream:
            stream.write("not a directory")
        guard = RecoveryGuard(os.path.join(blocker, "crash-recovery"))
        calls = []
        result = guard.tool_execution("book_trip", {}, lambda: calls.append(1),
                                      session_id="s", tool_call_id="c")
        self.assertIn('"storage_unavailable"', result)
        self.assertEqual(calls, [])


class OperatorLogDirectory(JournalTestCase):
    """A command that reported success keeps its audit line."""

    def test_the_directory_is_fsynced_after_the_audit_line(self):
        guard = RecoveryGuard(self.data_dir)

        def explode():
            raise TimeoutError("gateway timeout")

        with self.assertRaises(TimeoutError):
            guard.tool_execution("book_trip", {"to": "LIS"}, explode, session_id="s",
                                 tool_call_id="c")
        guard.close()
        [operation_id] = self.assertVerifies().unresolved()
        synced = []
        real = durable.fsync_directory
        with mock.patch.object(audit, "fsync_directory",
                               lambda path: (synced.append(os.path.abspath(path)), real(path))):
            with contextlib.redirect_stdout(io.StringIO()) as stdout:
                code = operator_cli.main(["--data-dir", self.data_dir, "resolve", operation_id,
                                          "--outcome", "not_applied", "--evidence",
                                          "no booking found"])
        self.assertEqual(code, 0, stdout.getvalue())
        self.assertIn(os.path.abspath(self.data_dir), synced)
        self.assertTrue(os.path.exists(os.path.join(self.data_dir, "operator.log")))


class AtomicCreation(JournalTestCase):
    """journal.sqlite3 appears complete or not at all."""

    def test_a_creator_killed_while_building_leaves_no_journal(self):
        # The build fails half-way (as a crash would stop it): journal.sqlite3
        # does not exist, read-only commands say journal_absent, and the next
        # writer creates the journal and removes nothing it should keep.
        def broken_build(self, temp_path):
            connection = sqlite3.connect(temp_path)
            connection.execute("CREATE TABLE half(x)")
            connection.close()
            raise OSError(5, "Input/output error")

        with mock.patch.object(database.Database, "_build_database", broken_build):
            with self.assertRaises(Exception) as caught:
                with Journal(self.data_dir) as journal:
                    journal.checkpoint()
        self.assertEqual(getattr(caught.exception, "code", None), "storage_unavailable")
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "journal.sqlite3")))
        self.assertEqual([name for name in os.listdir(self.data_dir)], [])
        for command in ("verify", "status"):
            code, output, text = run_cli(self.data_dir, command)
            self.assertEqual(output["error"]["code"], "journal_absent", text)
        with Journal(self.data_dir) as journal:
            self.assertEqual(journal.checkpoint()["count"], 0)
        self.assertTrue(self.assertVerifies().ok)

    def test_a_dead_creators_leftovers_are_removed_by_the_next_writer(self):
        os.makedirs(self.data_dir)
        dead = os.path.join(self.data_dir, "journal.sqlite3.999999999-0a1b2c3d.tmp")
        for suffix in ("", "-journal"):
            with open(dead + suffix, "wb") as stream:
                stream.write(b"half-built")
        guard = RecoveryGuard(self.data_dir)
        self.assertEqual(guard.tool_execution("book_trip", {}, lambda: "ok", session_id="s",
                                              tool_call_id="c"), "ok")
        guard.close()
        self.assertEqual(sorted(name for name in os.listdir(self.data_dir) if ".tmp" in name), [])
        self.assertTrue(self.assertVerifies().ok)

    def test_the_database_is_complete_when_its_name_appears(self):
        seen = []
        real_link = os.link

        def link_and_look(source, target, *args, **kwargs):
            real_link(source, target, *args, **kwargs)
            probe = sqlite3.connect("file:" + target + "?mode=ro&immutable=1", uri=True)
            seen.append(sorted(row[0] for row in probe.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")))
            probe.close()
            with open(target, "rb") as stream:  # header bytes 18-19: 2 = WAL
                seen.append(stream.read(20)[18:20])

        with mock.patch.object(os, "link", link_and_look):
            with Journal(self.data_dir) as journal:
                journal.checkpoint()
        self.assertEqual(seen, [["events", "metadata"], b"\x02\x02"])


class HalfCreatedJournal(JournalTestCase):
    """Operator commands that fail on a journal whose creator stopped before
    head.json and the marker write nothing."""

    def test_half_created_journal_stays_as_it_is(self):
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


if __name__ == "__main__":
    unittest.main()
