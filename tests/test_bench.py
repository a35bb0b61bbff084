"""The benchmark (bench/run.py, issue 5) still runs: a tiny ``--quick`` run.

Only the shape of its JSON is checked -- every number the table is built from
exists and is a number.  Timings are never asserted (shared machines are noisy).
Also checks that the bulk fixture writer produces a journal the independent
verifier accepts.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

from support import reference, workspace_verifier

from crash_recovery.journal import Journal

REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_RUN = os.path.join(REPOSITORY_ROOT, "bench", "run.py")
BULK_JOURNAL = os.path.join(REPOSITORY_ROOT, "bench", "bulk_journal.py")

PER_SIZE_KEYS = (
    "events", "bulk_write_seconds", "first_call_seconds",
    "protected_call_p50_ms", "protected_call_p99_ms", "protected_call_overhead_ratio_p50",
    "hook_and_protected_call_p50_ms", "hook_and_protected_call_p99_ms",
    "hook_and_protected_call_overhead_ratio_p50",
    "floor_call_p50_ms", "floor_call_p99_ms", "floor_append_p50_ms",
    "overhead_ratio_p50", "overhead_ratio_p99",
    "appends_per_protected_call", "python_fsync_per_protected_call",
    "python_replace_per_protected_call", "python_fsync_per_append", "python_replace_per_append",
    "floor_python_fsync_per_append", "journal_bytes", "journal_bytes_per_event",
    "full_verification_mode_call_p50_ms",
)
STRACE_KEYS = ("product_sync_syscalls_per_append", "floor_sync_syscalls_per_append")
VERIFICATION_KEYS = ("events", "seconds", "events_per_second", "reference_iterate_rows_seconds",
                     "reference_chain_only_seconds", "reference_chain_and_json_seconds",
                     "reference_chain_only_events_per_second")
CLI_KEYS = ("events", "status_seconds", "verify_seconds", "python_startup_seconds")


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

    def assert_numbers(self, mapping, keys, where):
        for key in keys:
            with self.subTest(where=where, key=key):
                self.assertIn(key, mapping)
                self.assertTrue(is_number(mapping[key]), f"{where}.{key} = {mapping[key]!r}")

    def test_per_size_numbers(self):
        self.assertGreaterEqual(len(self.report["sizes"]), 2)
        for entry in self.report["sizes"]:
            keys = PER_SIZE_KEYS
            if entry["events"] > 100_000:  # full-verification mode is measured up to 100k only
                keys = tuple(key for key in keys if key != "full_verification_mode_call_p50_ms")
            self.assert_numbers(entry, keys, f"sizes[{entry['events']}]")

    def test_strace_counts_when_strace_ran(self):
        if not self.report["settings"]["strace"]:
            self.skipTest("strace not installed: SQLite fsyncs are not counted")
        first, last = self.report["sizes"][0], self.report["sizes"][-1]
        for entry in (first, last):
            self.assert_numbers(entry, STRACE_KEYS, f"sizes[{entry['events']}]")

    def test_verification_cli_storage_numbers(self):
        self.assert_numbers(self.report["verification"], VERIFICATION_KEYS, "verification")
        self.assert_numbers(self.report["cli"], CLI_KEYS, "cli")
        self.assert_numbers(self.report["storage"], ("journal_bytes", "journal_bytes_per_event"),
                            "storage")
        self.assertTrue(is_number(self.report["run_seconds"]))

    def test_machine_description(self):
        machine = self.report["machine"]
        for key in ("nproc", "cpu_model", "python", "sqlite", "filesystem"):
            self.assertIn(key, machine)
        self.assert_numbers(machine["microbench"],
                            ("json_loads_payload_us", "sha256_hexdigest_envelope_us"), "microbench")

    def test_every_target_has_a_row(self):
        names = " ".join(row["name"] for row in self.report["targets"])
        for fragment in ("overhead at 0 events", "full verification", "fsyncs per append",
                         "status"):
            self.assertIn(fragment, names)
        for row in self.report["targets"]:
            self.assertTrue(is_number(row["measured"]), row)
            self.assertIn(row["met"], (True, False, None))

    def test_table_printed(self):
        self.assertIn("| target | measured | target | met |", self.completed.stdout)


class BulkJournalTest(unittest.TestCase):
    """bench/bulk_journal.py writes journals the reference reading (and the
    workspace checker, where present) accepts, and the product verifies."""

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

    def test_one_event_is_refused(self):
        with tempfile.TemporaryDirectory(prefix="bulk-test-") as temporary:
            completed = subprocess.run([sys.executable, BULK_JOURNAL, os.path.join(temporary, "one"),
                                        "--events", "1"], capture_output=True, text=True)
            self.assertNotEqual(completed.returncode, 0)


if __name__ == "__main__":
    unittest.main()
