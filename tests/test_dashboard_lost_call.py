"""The page shows a lost call as a window, never as a call that started at
the restart (docs/dashboard.md, docs/cli.md §restart-journal): headless
Chromium against the real ``hermes dashboard`` of 0.19.0, as in
tests/test_dashboard_browser.py (same skips)."""
from __future__ import annotations

import os
import tempfile
import unittest

from support import JournalTestCase, run_cli
from cdp_browser import Browser
from dashboard_support import Dashboard, HeldCall, data_dir_of, make_home, run_worker
from test_dashboard_browser import CHROMIUM, PROGRAM, setUpModule, shown  # noqa: F401


class LostCallOnThePage(JournalTestCase):

    def test_the_lost_call_reads_as_its_window(self):
        home = make_home(self.root)
        self.data_dir = data_dir_of(home)
        run_worker("ok", self.data_dir, "send_payment", "call-1")
        held = HeldCall(self.data_dir, "send_payment", "call-2")
        held.kill()  # pending: its side effect may have happened
        os.unlink(os.path.join(self.data_dir, "head.json"))
        code, restarted, _ = run_cli(self.data_dir, "restart-journal", "--evidence",
                                     "head.json deleted by a cleanup script")
        self.assertEqual(code, 0, restarted)
        lost = restarted["lost_operation"]
        view = {operation["operation_id"]: operation for operation in restarted["unresolved"]}[lost]
        dashboard = Dashboard(PROGRAM, home, os.path.join(self.root, "dashboard.log"))
        self.addCleanup(dashboard.stop)
        page = Browser(CHROMIUM, width=1280, height=1200)
        self.addCleanup(page.close)
        page.navigate(dashboard.url + "/crash-recovery")
        page.wait_for(shown(f"cr-op-{lost}"), "the lost operation")
        window = page.text_of(f"cr-op-window-{lost}")
        self.assertIn(f"after {view['lost_after']} UTC (the last verified event) and before "
                      f"{view['lost_before']} UTC", window)
        row = page.text_of(f"cr-op-{lost}")
        self.assertIn("session and tool call unknown", row)
        self.assertNotIn("started " + view["recorded_at"], row)
        self.assertNotIn("session null", row)
        # The carried-over call keeps its own start, session and call id.
        carried = page.text_of(f"cr-op-{held.operation_id}")
        self.assertIn("tool call call-2", carried)
        page.click(f"cr-settle-open-{lost}")
        self.assertIn("its tool, session and tool call are unknown",
                      page.text_of(f"cr-lost-window-{lost}"))
        artifacts = os.environ.get("CRASH_RECOVERY_ARTIFACTS") or tempfile.mkdtemp(
            prefix="crash-recovery-screenshots-")
        os.makedirs(artifacts, exist_ok=True)
        page.screenshot(os.path.join(artifacts, "dashboard-lost-call-window.png"))


if __name__ == "__main__":
    unittest.main()
