"""restart-journal and repair-checkpoint killed with SIGKILL before their
calls on the state root, then run again as docs/cli.md says (tests/kill_points.py):
the gate never opens for a call that may have run, every operation open
before keeps its identity, the rerun finishes what the first run began.

A sample within the CI budget: every third call of restart-journal's switch
(from writing ``restart.json`` on) and a spread of the others;
``python tests/kill_points.py`` aims at every call.  Skipped without strace
(``CRASH_RECOVERY_REQUIRE_STRACE=1`` makes that a failure).
"""
from __future__ import annotations

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kill_points  # noqa: E402
from test_crash_explorer import strace_scratch  # noqa: E402

_scratch = None


def setUpModule():
    global _scratch
    _scratch = strace_scratch("restart-killed-test-")


def switch_sample(targets: list) -> list:
    """Every third call from the intent's rename on, every 15th before."""
    start = next(index for index, _, _, shape in targets
                 if shape.startswith("rename(") and "restart.json\"" in shape)
    return sorted(set(range(0, start, 15)) | set(range(start, len(targets), 3)))


class KilledThenRunAgain(unittest.TestCase):
    """No violation at any kill point of the sample."""

    maxDiff = None

    def check(self, name: str, choose=None, every: int = 1):
        result = kill_points.explore_kills(name, tempfile.mkdtemp(dir=_scratch), every=every,
                                           jobs=4, choose=choose)
        print(f"\n  {name}: {result['killed']} of {result['targets']} kill points, "
              f"{result['seconds']:.1f} s", file=sys.stderr)
        self.assertGreater(result["killed"], 10)
        self.assertEqual(result["violations"], [])

    def test_restart_journal_of_a_journal_without_head_json(self):
        self.check("restart", choose=switch_sample)

    def test_restart_journal_of_a_journal_with_a_damaged_marker(self):
        self.check("restart_marker", every=12)

    def test_repair_checkpoint_that_brings_a_lost_call_back(self):
        self.check("repair_lost_started", every=4)

    def test_repair_checkpoint_with_an_operation_open(self):
        self.check("repair", every=4)


if __name__ == "__main__":
    unittest.main()
