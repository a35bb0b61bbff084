"""A host that passes the middleware no callable ``next_call`` (Hermes 0.22's
``plugins.isolation: host``): unprotected calls are left to the host (the
middleware raises, so the host skips it and runs the tool), protected ones are
refused naming the setting, and status says isolation mode cannot be protected
(docs/guard.md §Isolation mode).  The real host is in
tests/test_host_refusals.py."""
from __future__ import annotations

import json
import unittest

from test_guard import GuardTestCase

from crash_recovery.admission.isolation import NoDownstream


class Opaque:
    """What Hermes' plugin host passes instead of a callable."""


class IsolationModeTests(GuardTestCase):

    def no_downstream(self, tool, args=None):
        return self.guard.tool_execution(tool_name=tool, args=args or {}, next_call=Opaque(),
                                         session_id="s-1", tool_call_id="call-1")

    def test_unprotected_calls_raise_so_the_host_runs_them(self):
        for tool in ("read_file", "crash_recovery_status", "tool_search"):
            with self.subTest(tool=tool):
                with self.assertRaises(NoDownstream) as raised:
                    self.no_downstream(tool)
                self.assertNotIn(tool, str(raised.exception))  # one message: logged once

    def test_protected_calls_are_refused_naming_the_setting(self):
        blocked = self.assertBlocked(self.no_downstream("book_trip", {"to": "LIS"}),
                                     "isolation_unsupported")
        self.assertIn("plugins.isolation: in_process", blocked["explanation"])
        self.assertEqual(self.report().events, [])

    def test_status_says_isolation_mode_cannot_be_protected(self):
        self.assertEqual(self.guard.status_report()["gate"], "open")
        self.no_downstream("book_trip")
        status = json.loads(self.guard.status_tool({}))
        self.assertEqual((status["ok"], status["gate"]), (False, "closed"))
        self.assertIn("isolation mode cannot be protected", status["isolation_problem"])


if __name__ == "__main__":
    unittest.main()
