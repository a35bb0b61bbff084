"""The benchmark keeps running, and keeps measuring what it says it measures.

``python bench/run.py --quick`` -- the one entry point, with the measurement
modules next to it and the worker and probe processes it starts by running
itself -- exits 0 and writes complete JSON: every number the tables are built
from exists and is finite, counts add up, the workers really alternated, the
gate check really ran under a held writer lock, the archive really left a short
live segment, every target has its row and the tables are printed.  Timings are
never compared with targets (shared machines are noisy).  The bulk fixture
writer (bench/bulk_journal.py) produces journals the reference reading (and
the project's independent checker, where present) accepts, with the
append-only triggers the product expects.  No file under bench/ names the
process-introspection paths that Hermes' plugin install scan reports as HIGH.
"""
from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import unittest

from support import reference, workspace_verifier

from crash_recovery.storage.schema import TRIGGERS, schema_problem
from crash_recovery.journal import Journal

REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_RUN = os.path.join(REPOSITORY_ROOT, "bench", "run.py")
BULK_JOURNAL = os.path.join(REPOSITORY_ROOT, "bench", "bulk_journal.py")
# What Hermes' plugin install scan flags as proc_access (HIGH), written so this file does not match it.
PROC_ACCESS = re.compile(r"/proc/(self|\d+/)")

CLI_COMMANDS = ("log", "log --jsonl", "show OP", "status", "verify", "checkpoint")
VERIFICATION_KEYS = ("product_seconds", "reference_chain_only_seconds",
                     "reference_iterate_rows_seconds", "reference_bytes_hash_seconds",
                     "product_query_fetch_seconds")
FRESH_KEYS = ("first_call_seconds", "second_call_seconds", "import_seconds", "process_seconds")
OVERHEAD_KEYS = (
    "first_call_in_process_seconds", "protected_call_p50_ms", "protected_call_p99_ms",
    "protected_call_overhead_ratio_p50", "hook_and_protected_call_p50_ms",
    "hook_and_protected_call_p99_ms", "hook_and_protected_call_overhead_ratio_p50",
    "floor_call_p50_ms", "floor_call_p99_ms", "floor_append_p50_ms",
    "appends_per_protected_call", "python_fsync_per_append", "python_replace_per_append",
    "floor_python_fsync_per_append",
)
STRACE_KEYS = ("product_sync_syscalls_per_append", "floor_sync_syscalls_per_append")
DISTRIBUTION_KEYS = ("p50_ms", "p99_ms", "max_ms")
TARGET_FRAGMENTS = (
    "full verification / chain-only reference", "full verification at", "peak RSS of `log`",
    "peak RSS of `log --jsonl`", "peak RSS of `show OP`", "peak RSS of `status`",
    "peak RSS of `verify`", "peak RSS of `checkpoint`", "two warm workers alternating",
    "one warm worker alone", "writer-lock hold of an admission", "gate check (pre_tool_call)",
    "after archiving", "first protected call of a fresh process at", "operator_cli.py status",
    "overhead in one process at 0 events", "fsyncs per append",
)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class BenchmarkQuickRunTest(unittest.TestCase):
    """``python bench/run.py --quick`` exits 0 and writes complete JSON."""

    @classmethod
    def setUpClass(cls):
        cls.temporary = tempfile.TemporaryDirectory(prefix="bench-test-")
        json_path = os.path.join(cls.temporary.name, "results.json")
        cls.completed = subprocess.run(
            [sys.executable, BENCH_RUN, "--quick", "--json", json_path,
             "--workdir", os.path.join(cls.temporary.name, "work")],
            capture_output=True, text=True, cwd=REPOSITORY_ROOT, timeout=900)
        cls.report = None
        if cls.completed.returncode == 0:
            with open(json_path, encoding="utf-8") as stream:
                cls.report = json.load(stream)

    @classmethod
    def tearDownClass(cls):
        cls.temporary.cleanup()

    def setUp(self):
        self.assertEqual(self.completed.returncode, 0,
                         f"bench/run.py --quick failed:\n{self.completed.stdout[-3000:]}\n"
                         f"{self.completed.stderr[-3000:]}")

    def assert_numbers(self, mapping, keys, where, positive=False):
        for key in keys:
            with self.subTest(where=where, key=key):
                self.assertIn(key, mapping)
                self.assertTrue(is_number(mapping[key]), f"{where}.{key} = {mapping[key]!r}")
                if positive:
                    self.assertGreater(mapping[key], 0, f"{where}.{key}")

    def assert_distribution(self, distribution, where, count=None):
        self.assert_numbers(distribution, DISTRIBUTION_KEYS, where, positive=True)
        self.assertLessEqual(distribution["p50_ms"], distribution["p99_ms"], where)
        self.assertLessEqual(distribution["p99_ms"], distribution["max_ms"], where)
        if count is not None:
            self.assertEqual(distribution["n"], count, where)

    def test_sizes(self):
        self.assertEqual([entry["events"] for entry in self.report["sizes"]],
                         self.report["settings"]["sizes"])
        self.assertGreaterEqual(len(self.report["sizes"]), 3)
        self.assertEqual(self.report["sizes"][0]["events"], 0)

    def test_verification_side_by_side(self):
        for entry in self.report["sizes"]:
            verification = entry["verification"]
            where = f"sizes[{entry['events']}].verification"
            # The fresh-process probes ran first, two protected calls each.
            self.assertEqual(verification["events"],
                             entry["events"] + 4 * entry["fresh_process"]["repeats"], where)
            self.assert_numbers(verification, VERIFICATION_KEYS, where, positive=True)
            self.assertEqual(len(verification["product_samples"]), verification["repeats"])
            self.assertEqual(len(verification["reference_samples"]), verification["repeats"])
            if entry["events"]:
                self.assert_numbers(verification, ("ratio_to_reference", "product_events_per_second",
                                                   "reference_chain_only_events_per_second"),
                                    where, positive=True)
                self.assertAlmostEqual(verification["ratio_to_reference"],
                                       verification["product_seconds"]
                                       / verification["reference_chain_only_seconds"],
                                       delta=0.01 * verification["ratio_to_reference"] + 0.002)

    def test_cli_time_and_peak_rss(self):
        for entry in self.report["sizes"]:
            cli = entry["cli"]
            self.assertEqual(set(cli["commands"]), set(CLI_COMMANDS))
            for words, measured in cli["commands"].items():
                where = f"sizes[{entry['events']}].cli[{words}]"
                if measured is None:  # show needs an operation: none at 0 events
                    self.assertEqual((words, entry["events"]), ("show OP", 0), where)
                    continue
                self.assert_numbers(measured, ("seconds", "peak_rss_mb"), where, positive=True)
                # A Python process with the plugin loaded is megabytes, not bytes or terabytes.
                self.assertGreater(measured["peak_rss_mb"], 5, where)
                self.assertLess(measured["peak_rss_mb"], 4096, where)
            if entry["events"]:
                self.assertIsNotNone(cli["commands"]["show OP"])
                self.assertTrue(cli["show_operation"])

    def test_fresh_processes(self):
        for entry in self.report["sizes"]:
            fresh = entry["fresh_process"]
            where = f"sizes[{entry['events']}].fresh_process"
            self.assert_numbers(fresh, FRESH_KEYS, where, positive=True)
            self.assertEqual(fresh["repeats"], len(fresh["samples"]))
            self.assertGreater(fresh["process_seconds"], fresh["first_call_seconds"], where)
            self.assertEqual(fresh["events_before"], entry["events"], where)

    def test_warm_workers(self):
        calls = self.report["settings"]["worker_calls"]
        for entry in self.report["sizes"]:
            workers = entry["workers"]
            for mode, count in (("alternating", 2), ("single", 1)):
                phase = workers[mode]
                where = f"sizes[{entry['events']}].workers.{mode}"
                self.assertEqual(phase["workers"], count, where)
                for key in ("middleware", "hook", "hook_and_middleware"):
                    self.assert_distribution(phase[key], f"{where}.{key}", count * calls)
                self.assert_distribution(phase["floor"], f"{where}.floor", calls)
                self.assert_numbers(phase, ("middleware_ratio_p50", "hook_and_middleware_ratio_p50"),
                                    where, positive=True)
                # Every timed call appended started and returned under the writer lock.
                for kind in ("started", "returned"):
                    self.assert_distribution(phase["lock_hold"][kind], f"{where}.lock_hold.{kind}",
                                             count * calls)
                phases = phase["lock_hold"]["started_phases_p50_ms"]
                for boundary in ("inserted", "checkpoint_replaced", "committed"):
                    self.assertIn(boundary, phases, where)
            self.assertEqual(len(workers["warmup_first_hook_ms"]), 2)
            self.assert_numbers(workers, ("call_after_operator_status_ms", "call_after_that_ms",
                                          "operator_status_seconds"), "workers", positive=True)

    def test_gate_under_writer_lock(self):
        gate = self.report["sizes"][-1]["workers"]["gate_under_writer_lock"]
        self.assertEqual(gate["warm_hook_verdict"], "allow")
        self.assertEqual(gate["fresh_hook_verdict"], "allow")
        # The protected call needs the lock: it waited and was refused, nothing ran.
        self.assertEqual(gate["call_result"], "refused")
        self.assertEqual(gate["call_refusal_code"], "database_locked")
        self.assertEqual(gate["call_downstream_ran"], 0)
        self.assertGreaterEqual(gate["call_ms"], 1000 * gate["busy_timeout_seconds"] * 0.9)
        self.assert_numbers(gate, ("warm_hook_ms", "fresh_hook_ms", "hook_after_foreign_open_ms",
                                   "call_after_release_ms", "writer_lock_held_seconds"), "gate")

    def test_archive(self):
        archived = self.report["archive"]
        largest = self.report["sizes"][-1]
        self.assertGreater(archived["archived_events"], largest["events"])  # + the calls made
        self.assertEqual(archived["live_events_after_archive"], 1)  # the anchor
        self.assert_numbers(archived, ("archive_seconds", "archive_peak_rss_mb",
                                       "archive_writer_lock_hold_ms", "status_seconds",
                                       "verify_all_seconds", "live_journal_bytes",
                                       "data_dir_bytes"), "archive", positive=True)
        phases = archived["archive_writer_lock_phases_ms"]
        self.assertIn("committed", phases)  # the hold ends at COMMIT
        self.assertAlmostEqual(phases["committed"], archived["archive_writer_lock_hold_ms"], delta=0.01)
        fresh = archived["fresh_process"]
        self.assert_numbers(fresh, FRESH_KEYS, "archive.fresh_process", positive=True)
        baseline = archived["empty_journal_fresh_process"]
        self.assert_numbers(baseline, FRESH_KEYS, "archive.empty_journal_fresh_process", positive=True)
        self.assertEqual(baseline["events_before"], 0)
        self.assertEqual(baseline["repeats"], fresh["repeats"])
        self.assertEqual(fresh["events_before"], 1)  # the first fresh process found only the anchor

    def test_many_archives(self):
        rows = self.report["archive_scale"]["rows"]
        self.assertEqual([row["archives"] for row in rows], self.report["settings"]["archive_counts"])
        for row in rows:
            self.assert_numbers(row, ("fresh_first_call_ms", "warm_call_p50_ms",
                                      "first_call_after_a_switch_p50_ms", "status_seconds",
                                      "verify_all_seconds", "verify_all_us_per_event"),
                                f"archive_scale[{row['archives']}]", positive=True)
            self.assertEqual((row["status_exit"], row["verify_all_exit"]), (0, 0))
            # Each archive holds at least one call (started, returned) and, but the
            # first, its anchor.
            self.assertGreaterEqual(row["events_all_segments"], 3 * row["archives"])
        self.assertIn("Many archives", self.completed.stdout)

    def test_overhead_and_counts(self):
        for entry in self.report["sizes"]:
            overhead = entry["overhead"]
            where = f"sizes[{entry['events']}].overhead"
            self.assert_numbers(overhead, OVERHEAD_KEYS, where, positive=True)
            self.assertEqual(overhead["appends_per_protected_call"], 2.0, where)
            if entry["events"] <= 100_000:
                self.assert_numbers(overhead, ("full_verification_mode_call_p50_ms",), where, positive=True)
        if not self.report["settings"]["strace"]:
            return
        for entry in (self.report["sizes"][0], self.report["sizes"][-1]):
            self.assert_numbers(entry["overhead"], STRACE_KEYS, f"sizes[{entry['events']}]", positive=True)

    def test_bytes_per_event(self):
        for entry in self.report["sizes"][1:]:
            self.assertTrue(is_number(entry["journal_bytes_per_event"]))
            self.assertGreater(entry["journal_bytes_per_event"], 100)  # a payload is ~300 bytes

    def test_machine_and_load(self):
        machine = self.report["machine"]
        for key in ("nproc", "cpu_model", "python", "sqlite", "filesystem", "kernel", "euid"):
            self.assertIn(key, machine)
        self.assertNotIn("workdir", machine)  # no machine-specific paths in the results
        self.assert_numbers(machine["microbench"],
                            ("json_loads_payload_us", "sha256_hexdigest_envelope_us"), "microbench")
        load = self.report["load"]
        self.assert_numbers(load, ("wall_seconds", "bench_cpu_seconds"), "load", positive=True)
        self.assertGreaterEqual(len(load["samples"]), 2)
        self.assertTrue(is_number(self.report["python_startup_seconds"]))
        self.assertTrue(is_number(self.report["run_seconds"]))

    def test_every_target_has_a_row(self):
        names = [row["name"] for row in self.report["targets"]]
        for fragment in TARGET_FRAGMENTS:
            self.assertTrue(any(fragment in name for name in names), fragment)
        for row in self.report["targets"]:
            self.assertIn(row["met"], (True, False, None), row)
            if row["met"] is not None:
                self.assertTrue(is_number(row["measured"]), row)

    def test_tables_printed(self):
        for heading in ("| target | measured | target | met |", "### Verification",
                        "### Warm workers", "Gate check while another connection held",
                        "Archive of "):
            self.assertIn(heading, self.completed.stdout)


class BulkJournalTest(unittest.TestCase):
    """bench/bulk_journal.py writes journals the reference reading (and the
    project's independent checker, where present) accepts, and the product
    verifies and appends to without touching the schema."""

    def test_small_journals_verify_independently(self):
        with tempfile.TemporaryDirectory(prefix="bulk-test-") as temporary:
            for events in (0, 2, 3, 5, 501):
                data_dir = os.path.join(temporary, str(events))
                subprocess.run([sys.executable, BULK_JOURNAL, data_dir, "--events", str(events)],
                               check=True, capture_output=True, text=True)
                with self.subTest(events=events):
                    report = reference.verify(data_dir)
                    self.assertTrue(report.ok, report.errors)
                    self.assertEqual(report.count, events)
                    self.assertEqual(report.unresolved(), [])
                    with Journal(data_dir, readonly=True) as journal:
                        status = journal.verify()
                    self.assertEqual(status.checkpoint, report.summary())
                    checker = workspace_verifier()
                    if checker is not None:
                        self.assertTrue(checker.verify(data_dir).ok)

    def test_schema_has_the_append_only_triggers(self):
        """The product finds nothing missing, so its first append re-creates
        no trigger (and logs no WARNING); the triggers refuse an edit."""
        with tempfile.TemporaryDirectory(prefix="bulk-test-") as temporary:
            data_dir = os.path.join(temporary, "journal")
            subprocess.run([sys.executable, BULK_JOURNAL, data_dir, "--events", "20"],
                           check=True, capture_output=True, text=True)
            database = os.path.join(data_dir, "journal.sqlite3")
            connection = sqlite3.connect(database)
            try:
                self.assertIsNone(schema_problem(connection))
                names = {row[0] for row in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
                self.assertEqual(names, set(TRIGGERS))
                with self.assertRaises(sqlite3.DatabaseError):
                    connection.execute("UPDATE events SET payload = payload WHERE seq = 3")
            finally:
                connection.close()
            with self.assertNoLogs("crash_recovery", level="WARNING"):
                with Journal(data_dir) as journal:
                    journal.admit(operation_id="2f1c4f0e-8f53-4d7a-9c55-0c1e6b9a1d20", tool="t",
                                  args_hash="0" * 64, fingerprint="1" * 64, session_id=None,
                                  tool_call_id=None)
            report = reference.verify(data_dir)
            self.assertTrue(report.ok, report.errors)
            self.assertEqual(report.count, 21)

    def test_without_triggers_on_request(self):
        with tempfile.TemporaryDirectory(prefix="bulk-test-") as temporary:
            data_dir = os.path.join(temporary, "old")
            subprocess.run([sys.executable, BULK_JOURNAL, data_dir, "--events", "4", "--no-triggers"],
                           check=True, capture_output=True, text=True)
            connection = sqlite3.connect(os.path.join(data_dir, "journal.sqlite3"))
            try:
                self.assertEqual(schema_problem(connection), ("missing", sorted(TRIGGERS)))
            finally:
                connection.close()
            self.assertTrue(reference.verify(data_dir).ok)

    def test_one_event_is_refused(self):
        with tempfile.TemporaryDirectory(prefix="bulk-test-") as temporary:
            completed = subprocess.run([sys.executable, BULK_JOURNAL, os.path.join(temporary, "one"),
                                        "--events", "1"], capture_output=True, text=True)
            self.assertNotEqual(completed.returncode, 0)


class BenchSourceTest(unittest.TestCase):
    """The files under bench/ pass Hermes' plugin install scan: the file
    system is named without reading the mount table under /proc."""

    def test_no_process_introspection_paths(self):
        bench_dir = os.path.dirname(BENCH_RUN)
        for name in sorted(os.listdir(bench_dir)):
            if not name.endswith((".py", ".md")):
                continue
            with open(os.path.join(bench_dir, name), encoding="utf-8") as stream:
                text = stream.read()
            with self.subTest(file=name):
                self.assertIsNone(PROC_ACCESS.search(text))


if __name__ == "__main__":
    unittest.main()
