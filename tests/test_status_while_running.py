"""While a protected call runs, the gate is *busy*, not closed, on every
monitoring surface (docs/cli.md §status): ``status --check`` exits 0 with gate
``busy``, the Prometheus gauge ``crash_recovery_gate_closed`` is 0 and the text
says the call is running now; after it returns the gate is open.
"""
from __future__ import annotations

import threading
import unittest

from reliability_support import ReliabilityCase, call
from support import run_cli

from crash_recovery.guard import RecoveryGuard

# Only a broken guard would keep the tool from starting; the test then fails.
TOOL_START_TIMEOUT_SECONDS = 120


class BusyGate(ReliabilityCase):
    """A call running in this process, inspected from another."""

    def test_a_running_call_is_busy_not_closed(self):
        seen = {}
        started, finish = threading.Event(), threading.Event()

        def tool():  # runs until the checks below are done, however long they take
            started.set()
            finish.wait()
            return "ok"

        guard = RecoveryGuard(self.data_dir)
        self.addCleanup(guard.close)
        worker = threading.Thread(target=lambda: seen.setdefault("result", call(guard, tool,
                                                                                  "a")))
        worker.start()
        try:
            self.assertTrue(started.wait(TOOL_START_TIMEOUT_SECONDS), seen)
            code, status, text = run_cli(self.data_dir, "status", "--check")
            seen["status"] = (code, status["gate"], len(status["unresolved"]))
            seen["gauges"] = run_cli(self.data_dir, "status", "--format", "prometheus")[2]
            seen["text"] = run_cli(self.data_dir, "--format", "text", "status")[2]
        finally:
            finish.set()
            worker.join()
        self.assertEqual(seen["status"], (0, "busy", 1))
        self.assertIn("crash_recovery_gate_closed{", seen["gauges"])
        self.assertRegex(seen["gauges"], r"crash_recovery_gate_closed\{[^}]*\} 0")
        self.assertIn("running now", seen["text"])
        self.assertEqual(seen["result"], "ok")
        self.assertEqual(run_cli(self.data_dir, "status", "--check")[1]["gate"], "open")


if __name__ == "__main__":
    unittest.main()
