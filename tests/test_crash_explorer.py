"""Power loss: the crash-state explorer within the CI budget.

tests/crash_explorer.py records each scenario of tests/explorer_scenarios.py
under strace, enumerates the crash states docs/persistence.md allows, and runs
the product's own recovery on every distinct one.  Here:

* ``RealTraces``: a seeded sample of each real trace (every trace point's
  "durable only" and "everything issued" state, plus a few random ones).  Every
  violation must be a known one (``KNOWN_VIOLATIONS``, with its diagnosis);
  a new kind fails.  A known violation that no longer shows up fails too, so
  that the table is kept true once the product is fixed (remove the line).
* ``Mutants``: the explorer proves it can fail -- without the directory fsync
  after replacing head.json, or without SQLite's WAL fsync at COMMIT, it must
  report a violating state with its trace point and the files' contents.
* ``Model``: the persistence model on a hand-written trace.

Skipped when strace is missing (``CRASH_RECOVERY_REQUIRE_STRACE=1``, as in CI,
turns that into a failure).  The exhaustive run is a command:
``python tests/crash_explorer.py --exhaustive [--scenario NAME]``.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leak_check  # noqa: E402,F401  (no resource left to the garbage collector)
import crash_explorer as explorer  # noqa: E402
import explorer_scenarios as scenarios  # noqa: E402

REQUIRE_STRACE = os.environ.get("CRASH_RECOVERY_REQUIRE_STRACE", "") == "1"
SEED, SAMPLES, BUDGET = 13, 3, 40

# (scenario, invariant) -> diagnosis.  Found in the real, unmutated traces.
KNOWN_VIOLATIONS: dict = {}

_scratch = None
_recordings: dict = {}
_results: dict = {}


def strace_scratch(prefix: str) -> str:
    """A scratch directory for strace recordings, removed when the module's
    tests end; skips the module without strace (a failure with
    CRASH_RECOVERY_REQUIRE_STRACE=1).  Call it from ``setUpModule``."""
    problem = strace_problem()
    if problem:
        if REQUIRE_STRACE:
            raise RuntimeError(f"CRASH_RECOVERY_REQUIRE_STRACE=1 but {problem}")
        raise unittest.SkipTest(problem)
    scratch = tempfile.mkdtemp(prefix=prefix, dir=explorer.FAST_TMP)
    unittest.addModuleCleanup(shutil.rmtree, scratch, ignore_errors=True)
    return scratch


def setUpModule():
    global _scratch
    _scratch = strace_scratch("crash-explorer-test-")


def strace_problem():
    """Why strace cannot record here (None when it can)."""
    if shutil.which("strace") is None:
        return "strace is not installed (CI installs it)"
    completed = subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True,
                               text=True, timeout=60)
    if completed.returncode != 0:
        return f"strace cannot trace here: {completed.stderr.strip()[-300:]}"
    return None


def recording(name):
    """The scenario's recording (once per run)."""
    if name not in _recordings:
        _recordings[name] = explorer.record(scenarios.scenario_named(name), _scratch)
    return _recordings[name]


def explored(name):
    """The sampled exploration of the scenario's real trace (once per run)."""
    if name not in _results:
        _results[name] = explorer.explore(recording(name), seed=SEED, samples=SAMPLES,
                                          budget=BUDGET)
    return _results[name]


class RealTraces(unittest.TestCase):
    """Every scenario's real trace: only known violations, and all of them."""

    maxDiff = None

    def check_scenario(self, name):
        scenario = scenarios.scenario_named(name)
        if scenario.requires and not scenarios.command_exists(scenario.requires):
            self.skipTest(f"operator_cli.py has no {scenario.requires!r} command yet")
        result = explored(name)
        print(f"\n  {result.summary()}", file=sys.stderr)
        found = {violation["invariant"] for violation in result.violations}
        unexpected = [violation for violation in result.violations
                      if (name, violation["invariant"]) not in KNOWN_VIOLATIONS]
        self.assertEqual(unexpected, [], "new violations:\n" + "\n".join(
            explorer.format_violation(violation) for violation in unexpected[:3]))
        gone = sorted(invariant for scenario_name, invariant in KNOWN_VIOLATIONS
                      if scenario_name == name and invariant not in found)
        self.assertEqual(gone, [], f"known violations of {name} no longer found (fixed? then "
                                   "remove them from KNOWN_VIOLATIONS)")
        self.assertGreater(result.checked, 0)

    def test_call(self):
        self.check_scenario("call")

    def test_call_uncertain(self):
        self.check_scenario("call_uncertain")

    def test_first_call(self):
        self.check_scenario("first_call")

    def test_resolve(self):
        self.check_scenario("resolve")

    def test_repair(self):
        self.check_scenario("repair")

    def test_repair_lost_started(self):
        self.check_scenario("repair_lost_started")

    def test_archive(self):
        self.check_scenario("archive")

    def test_restart(self):
        self.check_scenario("restart")

    def test_restart_marker(self):
        self.check_scenario("restart_marker")


# The scenario whose real trace has the step each mutant removes.
MUTANT_SCENARIOS = {"no_dir_fsync_after_checkpoint": "call", "no_wal_fsync": "call",
                    "no_source_dir_fsync": "restart"}


class Mutants(unittest.TestCase):
    """Remove one durability step from a recorded trace: the explorer must
    find a violating state, and say where and what the files held."""

    def check_mutant(self, mutant, invariants):
        result = explorer.explore(recording(MUTANT_SCENARIOS[mutant]), seed=SEED,
                                  samples=SAMPLES, budget=BUDGET, mutant=mutant,
                                  stop_at_first=True)
        self.assertTrue(result.violations, f"mutant {mutant}: no violation found")
        violation = result.violations[0]
        self.assertIn(violation["invariant"], invariants, explorer.format_violation(violation))
        self.assertGreater(violation["k"], 0)
        text = explorer.format_violation(violation)
        for expected in ("trace point", "crash after", "head.json", "database rows"):
            self.assertIn(expected, text)
        return violation

    def test_without_directory_fsync_after_head_json(self):
        self.check_mutant("no_dir_fsync_after_checkpoint",
                          {"crash_verdict", "not_settled", "event_lost"})

    def test_without_wal_fsync_at_commit(self):
        self.check_mutant("no_wal_fsync", {"event_lost", "crash_verdict", "not_settled"})

    def test_without_the_source_directory_fsync_of_a_rename(self):
        # restart-journal renames its new journal out of its staging folder:
        # without that folder's fsync a power cut after "ok" loses it.
        self.check_mutant("no_source_dir_fsync",
                          {"not_settled", "event_lost", "identity_lost", "crash_verdict",
                           "restart_failed"})

    def test_the_real_trace_has_the_steps_the_mutants_remove(self):
        self.assertEqual(set(MUTANT_SCENARIOS), set(explorer.MUTANTS))
        for mutant, name in MUTANT_SCENARIOS.items():
            ops = explorer.mutate(recording(name).ops, mutant)
            self.assertLess(len(ops), len(recording(name).ops), mutant)


def _hex(data):
    return '"' + "".join(f"\\x{byte:02x}" for byte in data) + '"'


class Model(unittest.TestCase):
    """The persistence model on a hand-written strace excerpt: a file replaced
    by rename (temp fsynced, directory not) and an unsynced 1000-byte write."""

    def setUp(self):
        self.home, self.witness = "/r/home", "/r/witness"
        self.base = explorer.FsState({"d/f": 1, "d/log": 2}, {1: b"old", 2: b""}, {"d"})
        path = lambda name: _hex(f"/r/home/d/{name}".encode())  # noqa: E731
        fd = lambda number, name: f"{number}<{_hex(f'/r/home/d/{name}'.encode())[1:-1]}>"  # noqa: E731
        cwd = f"AT_FDCWD<{_hex(b'/r')[1:-1]}>"
        lines = [
            f"7 openat({cwd}, {path('f.tmp')}, O_WRONLY|O_CREAT|O_EXCL, 0644) = {fd(3, 'f.tmp')}",
            f"7 write({fd(3, 'f.tmp')}, {_hex(b'new')}, 3) = 3",
            f"7 fsync({fd(3, 'f.tmp')}) = 0",
            f"7 close({fd(3, 'f.tmp')}) = 0",
            f"7 rename({path('f.tmp')}, {path('f')}) = 0",
            f"7 openat({cwd}, {path('log')}, O_WRONLY|O_APPEND) = {fd(4, 'log')}",
            f"7 write({fd(4, 'log')}, {_hex(bytes(1000))}, 1000 <unfinished ...>",
            "7 <... write resumed>) = 1000",
        ]
        self.ops = explorer.TraceParser(self.home, self.witness, "/r", self.base).parse(lines)
        self.model = explorer.CrashModel(self.base, self.ops)

    def files(self, keep=(), torn=None, k=None):
        k = len(self.ops) if k is None else k
        return self.model.materialize(k, frozenset(keep), torn or {}).files()

    def test_parse(self):
        self.assertEqual([op.kind for op in self.ops],
                         ["creat", "write", "sync", "rename", "write"])
        self.assertEqual((self.ops[4].offset, len(self.ops[4].data)), (0, 1000))

    def test_fsynced_content_but_unsynced_name(self):
        self.assertEqual(self.model.pending(len(self.ops)), [0, 3, 4])
        self.assertEqual(self.files()["d/f"], b"old")  # the rename may be lost
        self.assertEqual(self.files(keep=[3])["d/f"], b"new")  # or kept: new content is durable

    def test_torn_write_at_sector_boundaries(self):
        self.assertEqual(self.ops[4].cuts(), [512])
        self.assertEqual(len(self.files(keep=[4], torn={4: 1})["d/log"]), 512)
        self.assertEqual(len(self.files(keep=[4])["d/log"]), 1000)

    def test_plans(self):
        plans, capped = explorer.crash_plans(self.model, len(self.ops), exhaustive=True,
                                             rng=random.Random(0), samples=0)
        self.assertFalse(capped)
        states = {self.model.materialize(plan.k, plan.keep, dict(plan.torn)).key()
                  for plan in plans}
        # name of f: old / new; log: empty / 512 / 1000 bytes (tmp name: present or not)
        self.assertEqual(len({(files["d/f"], len(files["d/log"])) for files in
                              (self.model.materialize(p.k, p.keep, dict(p.torn)).files()
                               for p in plans)}), 6)
        self.assertGreaterEqual(len(states), 6)

    def test_documented_codes(self):
        codes = scenarios.documented_codes()
        self.assertTrue({"checkpoint_ahead", "unresolved_operations", "journal_absent"} <= codes)


if __name__ == "__main__":
    unittest.main()
