"""What the dashboard page's routes answer (host/dashboard.py), without a
dashboard: the operator commands' own documents and codes, the request body
checks, the HTTP status of each refusal and who is recorded as acting.  The
same answers through a real ``hermes dashboard`` are tested in
tests/test_dashboard_api.py.
"""
from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import types
import unittest

from support import JournalTestCase, run_cli
from crash_recovery.guard import RecoveryGuard
from crash_recovery.host.dashboard import (DashboardCommands, checkpoint_file_name,
                                           dashboard_operator)
from crash_recovery.journal import Journal

EVIDENCE = "no row for call-1 in the service's request log"


class DashboardCommandTests(JournalTestCase):

    def setUp(self):
        super().setUp()
        self.commands = DashboardCommands(Journal, data_dir=lambda: self.data_dir,
                                          settings=lambda: {"protected_tools": ["book_trip"]},
                                          registered_tools=lambda: ["book_trip", "read_file"])
        self.connection = self.loopback_connection()

    def loopback_connection(self) -> tuple:
        """The two ends of a real loopback connection whose client is this
        test process (a person's browser, as the routes see one): the
        writing routes examine the process that sent a request."""
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        for endpoint in (server, client, accepted):
            self.addCleanup(endpoint.close)
        return client.getsockname(), accepted.getsockname()

    def uncertain_operation(self) -> str:
        guard = RecoveryGuard(self.data_dir)
        guard.tool_execution(tool_name="book_trip", args={"to": "Lisbon"},
                             next_call=lambda: '{"error": "upstream timeout"}',
                             session_id="session-1", tool_call_id="call-1")
        guard.close()
        return run_cli(self.data_dir, "status")[1]["unresolved"][0]["operation_id"]

    def test_a_profile_without_a_journal_reads_healthy_as_the_cli_says(self):
        document, status = self.commands.status()
        self.assertEqual((status, document["ok"], document["integrity"], document["journal"],
                          document["gate"], document["check"]),
                         (200, True, "ok", "absent", "open", {"exit_code": 0, "reasons": []}))
        self.assertEqual(document["settings"]["mode"], "protected_tools")
        self.assertFalse(os.path.exists(self.data_dir))

    def test_bad_requests_get_the_cli_codes_and_change_nothing(self):
        operation_id = self.uncertain_operation()
        before = self.snapshot()
        via = dashboard_operator()
        cases = (
            (operation_id, {"outcome": "completed", "evidence": ""}, 400, "invalid_evidence"),
            (operation_id, {"outcome": "completed", "evidence": "x" * 65537}, 400,
             "invalid_evidence"),
            (operation_id, {"outcome": "completed", "evidence": "\ud800"}, 400,
             "invalid_evidence"),
            ("../../etc", {"outcome": "completed", "evidence": EVIDENCE}, 400,
             "invalid_operation_id"),
            ("00000000-0000-4000-8000-000000000000", {"outcome": "completed",
                                                      "evidence": EVIDENCE}, 404,
             "unknown_operation"),
            (operation_id, {"outcome": "completed", "evidence": EVIDENCE, "force": 1}, 400,
             "usage"),
            (operation_id, {"outcome": None, "evidence": EVIDENCE}, 400, "usage"),
            (operation_id, {"outcome": "completed", "evidence": ["a"]}, 400, "usage"),
            (operation_id, "completed", 400, "usage"),
            (operation_id, None, 400, "usage"),
        )
        for target, body, status, code in cases:
            with self.subTest(body=str(body)[:60], target=target):
                document, got = self.commands.resolve(target, body, via, self.connection)
                self.assertEqual((got, document["ok"], document["error"]["code"]),
                                 (status, False, code))
        document, got = self.commands.acknowledge(operation_id, {"evidence": EVIDENCE}, via,
                                                  self.connection)
        self.assertEqual((got, document["error"]["code"], document["integrity"]),
                         (409, "nothing_to_acknowledge", "ok"))
        self.assertEqual(self.snapshot(), before)

    def test_the_resolution_records_the_dashboard_and_its_user(self):
        operation_id = self.uncertain_operation()
        login = types.SimpleNamespace(user_id="u-17", email="ops@example.com",
                                      display_name="Ops " + "x" * 300, provider="password")
        via = dashboard_operator(login, "127.0.0.1")
        document, status = self.commands.resolve(operation_id, {"outcome": "not_applied",
                                                                "evidence": EVIDENCE}, via,
                                                 self.connection)
        self.assertEqual((status, document["resolved"], document["previous_state"],
                          document["forced"]), (200, operation_id, "uncertain", False))
        operator = run_cli(self.data_dir, "show", operation_id)[1]["events"][-1]["operator"]
        self.assertEqual({key: operator[key] for key in ("via", "client")},
                         {"via": "dashboard", "client": "127.0.0.1"})
        self.assertEqual(operator["dashboard_user"],
                         {"user_id": "u-17", "email": "ops@example.com",
                          "display_name": ("Ops " + "x" * 300)[:256], "provider": "password"})
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            (line,) = [json.loads(text) for text in stream]
        self.assertEqual((line["action"], line["operator"]), ("resolve", operator))
        document, status = self.commands.status()
        self.assertEqual((status, document["gate"], document["unresolved"]), (200, "open", []))
        self.assertVerifies()

    def test_the_checkpoint_download_is_named_safely(self):
        self.uncertain_operation()
        document, status = self.commands.checkpoint()
        self.assertEqual((status, document), (200, run_cli(self.data_dir, "checkpoint")[1]))
        name = checkpoint_file_name({"count": 2})
        self.assertRegex(name, r"^crash-recovery-checkpoint-[A-Za-z0-9_-]+-2\.json$")


class RuntimeStaysStandardLibrary(unittest.TestCase):

    def test_only_the_dashboard_imports_its_routes(self):
        # register(ctx) and every runtime module import neither the routes
        # file nor FastAPI; the dashboard imports plugin_api.py by path.
        from test_layout import runtime_modules
        from support import REPO
        imported = set()
        for path in runtime_modules():
            with open(os.path.join(REPO, path), encoding="utf-8") as stream:
                tree = ast.parse(stream.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    imported.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    imported.add(node.module or "")
        self.assertEqual(sorted(name for name in imported
                                if name.split(".")[0] in ("fastapi", "starlette", "dashboard")
                                or "plugin_api" in name), [])
        with open(os.path.join(REPO, "dashboard", "manifest.json"), encoding="utf-8") as stream:
            manifest = json.load(stream)
        self.assertEqual((manifest["name"], manifest["api"], manifest["entry"],
                          manifest["slots"]),
                         ("crash-recovery", "plugin_api.py", "dist/index.js", ["header-banner"]))

    @unittest.skipUnless(os.path.exists(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), ".git")), "not a git checkout")  # .git: a file in a worktree
    def test_the_page_is_part_of_every_clone(self):
        # A clone, `git archive` and `hermes plugins install` carry only what
        # git tracks: an ignore rule for build output must not hide the page.
        from support import REPO
        files = [os.path.join("dashboard", name)
                 for name in ("manifest.json", "plugin_api.py", os.path.join("dist", "index.js"))]
        ignored = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=REPO,
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual((ignored.returncode, ignored.stdout), (1, ""))


if __name__ == "__main__":
    unittest.main()
