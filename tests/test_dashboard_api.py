"""The dashboard's API routes (docs/dashboard.md) through HTTP, against the
real ``hermes dashboard`` of the Hermes installed beside this interpreter
(0.19.0: ``hermes``; 0.20.1: ``hermesx``, whose wheel has no web UI but
serves the routes) on 127.0.0.1, with the plugin installed as a copied
directory and operations made by real protected calls in worker processes.

Every answer must be the operator command's own document (docs/cli.md), with
its codes; a refused request appends nothing; settling records the dashboard
in the journal and in ``operator.log``; the host's authentication guards
every route.  Run under each host::

    /work/venvs/h019/bin/python -m unittest tests.test_dashboard_api -v
    /work/venvs/h020/bin/python -m unittest tests.test_dashboard_api -v

Without Hermes the tests skip, saying why, unless CRASH_RECOVERY_REQUIRE_HOST=1.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import uuid

from support import JournalTestCase, reference, run_cli
from crash_recovery.host.dashboard import PAGE_HINTS
from dashboard_support import (PROFILE, REQUIRE_HOST, Dashboard, HeldCall, command_prefix,
                               dashboard_program, data_dir_of, hermes_version, make_home,
                               run_worker)

PROGRAM, MISSING = dashboard_program()
EVIDENCE = "no charge for session-dashboard in the payment ledger, checked 07:55 UTC"
PREFIX = command_prefix(PROGRAM or "hermes") + " "
# A process that POSTs BODY to URL with the page's TOKEN; prints "STATUS BODY".
AGENT_CLIENT = """import sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1], data=sys.argv[3].encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "X-Hermes-Session-Token": sys.argv[2]})
try:
    answer = urllib.request.urlopen(request, timeout=60)
except urllib.error.HTTPError as error:
    answer = error
print(answer.status, answer.read().decode())
"""


def setUpModule():
    if PROGRAM is None:
        if REQUIRE_HOST:
            raise RuntimeError(f"CRASH_RECOVERY_REQUIRE_HOST=1 but {MISSING}")
        raise unittest.SkipTest(MISSING)
    if hermes_version().startswith("0.22."):
        # Measured: 0.22.2's dashboard fails its start-up (NameError: name 'Path'
        # is not defined, tui_gateway/methods_onboarding.py) and exits.
        raise unittest.SkipTest("Hermes 0.22.2's dashboard fails at start-up (NameError in "
                                "tui_gateway/methods_onboarding.py): no page to test")


class DashboardApiTests(JournalTestCase):
    """One dashboard for the class; each test starts from an empty profile."""

    @classmethod
    def setUpClass(cls):
        cls.home_root = tempfile.mkdtemp(prefix="crash-recovery-dashboard-")
        cls.addClassCleanup(shutil.rmtree, cls.home_root, True)
        cls.home = make_home(cls.home_root)
        cls.dashboard = Dashboard(PROGRAM, cls.home, os.path.join(cls.home_root, "dashboard.log"))
        cls.addClassCleanup(cls.dashboard.stop)

    def setUp(self):
        super().setUp()
        self.data_dir = data_dir_of(self.home)
        shutil.rmtree(self.data_dir, True)
        self.api = self.dashboard.request

    # ------------------------------------------------------------- helpers --

    def pending_operation(self) -> str:
        """A protected call SIGKILLed inside its tool: `pending`, owner gone."""
        held = HeldCall(self.data_dir, "book_trip", f"call-{uuid.uuid4()}")
        held.kill()
        return held.operation_id

    def uncertain_operation(self) -> str:
        """A protected call whose tool returned an error: `uncertain`."""
        before = {op["operation_id"] for op in self.cli("status")["unresolved"]} \
            if os.path.exists(self.data_dir) else set()
        run_worker("error", self.data_dir, "send_payment", f"call-{uuid.uuid4()}")
        (operation_id,) = {op["operation_id"] for op in self.cli("status")["unresolved"]} - before
        return operation_id

    def cli(self, *words) -> dict:
        return run_cli(self.data_dir, *words)[1]

    def journal_content(self) -> dict:
        """The journal's rows and every file but the database's own bytes
        (SQLite may fold its WAL into them on any open: not a change)."""
        files = self.snapshot()["files"]
        files.pop("journal.sqlite3", None)
        return {"files": files, "rows": reference.snapshot_rows(self.data_dir)}

    def assertRefusedWithoutChange(self, method, path, body, status, code, integrity=None,
                                   **options):
        """The request is answered ``status`` with the CLI's ``code`` and the
        journal's rows and files are exactly as before."""
        before = self.journal_content()
        got, document, _ = self.api(method, path, body, **options)
        self.assertEqual((got, document["ok"], document["error"]["code"]),
                         (status, False, code), document)
        self.assertEqual(document.get("integrity"), integrity)
        self.assertEqual(self.journal_content(), before)
        return document

    def assertSameNext(self, page: "str | None", cli: "str | None"):
        """The page's next command is the CLI's, spelled for the profile."""
        if cli is None:
            self.assertIsNone(page)
        else:
            self.assertTrue(page.startswith(PREFIX), page)
            self.assertTrue(cli.endswith(" " + page[len(PREFIX):]), (page, cli))

    def operator_log(self) -> list:
        with open(os.path.join(self.data_dir, "operator.log"), encoding="utf-8") as stream:
            return [json.loads(line) for line in stream]

    # --------------------------------------------------------------- tests --

    def test_requests_without_the_session_token_are_refused_by_the_host(self):
        operation_id = self.pending_operation()
        before = self.journal_content()
        for method, path, body in (("GET", "/status", None), ("GET", "/checkpoint", None),
                                   ("GET", f"/operations/{operation_id}", None),
                                   ("POST", f"/operations/{operation_id}/resolve",
                                    {"outcome": "not_applied", "evidence": EVIDENCE})):
            with self.subTest(path=path):
                status, document, _ = self.api(method, path, body, token=False)
                self.assertEqual((status, document), (401, {"detail": "Unauthorized"}))
        self.dashboard.token, token = "not-the-token", self.dashboard.token
        try:
            status, _, _ = self.api("POST", f"/operations/{operation_id}/resolve",
                                    {"outcome": "not_applied", "evidence": EVIDENCE})
        finally:
            self.dashboard.token = token
        self.assertEqual(status, 401)
        self.assertEqual(self.journal_content(), before)
        self.assertEqual(self.cli("status")["unresolved"][0]["state"], "pending")

    def test_the_page_is_registered_with_its_tab_banner_and_routes(self):
        status, plugins, _ = self.api("GET", "/api/dashboard/plugins")
        self.assertEqual(status, 200)
        (page,) = [plugin for plugin in plugins if plugin["name"] == "crash-recovery"]
        self.assertEqual((page["tab"], page["slots"], page["has_api"], page["source"]),
                         ({"path": "/crash-recovery", "position": "end"}, ["header-banner"],
                          True, "user"))
        status, script, headers = self.api("GET", "/dashboard-plugins/crash-recovery/dist/index.js")
        self.assertEqual((status, headers["Content-Type"]), (200, "application/javascript"))
        self.assertIn('PLUGINS.register(NAME, Page)', script)

    def test_status_is_the_cli_document_with_the_profile_and_settings(self):
        status, document, _ = self.api("GET", "/status")  # no protected call yet: healthy
        self.assertEqual((status, document["ok"], document["journal"], document["gate"],
                          document["check"]), (200, True, "absent", "open",
                                               {"exit_code": 0, "reasons": []}))
        self.assertEqual(self.api("GET", "/archives")[:2],
                         (200, {"ok": True, "integrity": "ok", "data_dir": self.data_dir,
                                "archives": []}))
        operation_id = self.pending_operation()
        status, document, _ = self.api("GET", "/status")
        self.assertEqual(status, 200)
        self.assertEqual(document["profile"], {"name": PROFILE, "home": self.home,
                                               "command": PREFIX.strip()})
        self.assertEqual(document["settings"]["mode"], "read_only_tools")
        expected = self.cli("status")
        for found in (document, expected):
            for operation in found["unresolved"]:
                operation.pop("age_seconds")
        self.assertSameNext(document.pop("next"), expected.pop("next"))
        self.assertEqual({key: document[key] for key in expected}, expected)
        (operation,) = document["unresolved"]
        self.assertEqual((operation["operation_id"], operation["state"], operation["tool"],
                          operation["owner"], operation["owner_pid"], document["gate"]),
                         (operation_id, "pending", "book_trip", "gone", None, "closed"))

    def test_settling_applies_the_cli_rules_and_records_the_dashboard(self):
        operation_id = self.pending_operation()
        resolve = f"/operations/{operation_id}/resolve"
        self.assertRefusedWithoutChange("POST", f"/operations/{uuid.uuid4()}/resolve",
                                        {"outcome": "completed", "evidence": EVIDENCE},
                                        404, "unknown_operation", "ok")
        self.assertRefusedWithoutChange("POST", "/operations/not-an-id/resolve",
                                        {"outcome": "completed", "evidence": EVIDENCE},
                                        400, "invalid_operation_id")
        for evidence in ("", "  \n\t"):
            self.assertRefusedWithoutChange("POST", resolve, {"outcome": "completed",
                                                              "evidence": evidence},
                                            400, "invalid_evidence")
        for body in ({"evidence": EVIDENCE}, {"outcome": "maybe", "evidence": EVIDENCE},
                     {"outcome": "completed"}, {"outcome": "completed", "evidence": 7},
                     {"outcome": "completed", "evidence": EVIDENCE, "force": "yes"},
                     {"outcome": "completed", "evidence": EVIDENCE, "forced": True},
                     ["completed", EVIDENCE]):
            with self.subTest(body=body):
                self.assertRefusedWithoutChange("POST", resolve, body, 400, "usage")
        self.assertRefusedWithoutChange("POST", resolve, None, 400, "usage",
                                        raw=b"outcome=completed&evidence=x",
                                        content_type="application/x-www-form-urlencoded")
        self.assertRefusedWithoutChange("POST", resolve, None, 400, "usage", raw=b"{nope")

        # The dashboard's own page (its Origin) may settle.
        status, document, _ = self.api("POST", resolve, {"outcome": "not_applied",
                                                         "evidence": EVIDENCE},
                                       headers={"Origin": self.dashboard.url,
                                                "Sec-Fetch-Site": "same-origin"})
        self.assertEqual(status, 200, document)
        self.assertEqual({key: document[key] for key in ("ok", "integrity", "resolved", "outcome",
                                                         "previous_state", "tool", "forced")},
                         {"ok": True, "integrity": "ok", "resolved": operation_id,
                          "outcome": "not_applied", "previous_state": "pending",
                          "tool": "book_trip", "forced": False})
        self.assertEqual(document["checkpoint"], self.cli("checkpoint"))
        resolved = self.cli("show", operation_id)["events"][-1]
        self.assertEqual((resolved["kind"], resolved["outcome"], resolved["evidence"]),
                         ("resolved", "not_applied", EVIDENCE))
        self.assertEqual((resolved["operator"]["via"], resolved["operator"]["dashboard_user"],
                          resolved["operator"]["client"]), ("dashboard", None, "127.0.0.1"))
        self.assertEqual(set(resolved["operator"]),
                         {"user", "uid", "host", "via", "dashboard_user", "client", "peer"})
        # The process that sent the request (this one), as the system names it.
        self.assertEqual(resolved["operator"]["peer"], {
            "pid": os.getpid(), "uid": os.getuid(), "user": pwd.getpwuid(os.getuid()).pw_name})
        (line,) = self.operator_log()
        self.assertEqual({key: line[key] for key in ("action", "operation_id", "outcome",
                                                     "evidence", "forced", "owner", "operator",
                                                     "checkpoint_after")},
                         {"action": "resolve", "operation_id": operation_id,
                          "outcome": "not_applied", "evidence": EVIDENCE, "forced": False,
                          "owner": "gone", "operator": resolved["operator"],
                          "checkpoint_after": document["checkpoint"]})
        self.assertEqual(self.api("GET", "/status")[1]["gate"], "open")
        self.assertEqual(self.assertVerifies().kinds(), ["started", "resolved"])

    def test_a_page_of_another_origin_cannot_settle(self):
        operation_id = self.uncertain_operation()
        resolve = f"/operations/{operation_id}/resolve"
        body = {"outcome": "not_applied", "evidence": EVIDENCE}
        # Hermes' CORS admits every loopback port: a page served elsewhere is refused here.
        for headers in ({"Origin": "http://127.0.0.1:1"}, {"Origin": "null"},
                        {"Origin": "http://localhost.evil.example"},
                        {"Origin": self.dashboard.url, "Sec-Fetch-Site": "cross-site"},
                        {"Sec-Fetch-Site": "same-site"}):
            with self.subTest(headers=headers):
                refused = self.assertRefusedWithoutChange("POST", resolve, body, 403,
                                                          "foreign_origin", headers=headers)
                self.assertIn("another", refused["error"]["message"])

    def test_a_request_from_inside_an_agent_cannot_settle(self):
        operation_id = self.uncertain_operation()
        url = f"{self.dashboard.url}/api/plugins/crash-recovery/operations/{operation_id}/resolve"
        body = json.dumps({"outcome": "not_applied", "evidence": EVIDENCE})
        client = [sys.executable, "-c", AGENT_CLIENT, url, self.dashboard.token, body]
        # A tool's process of a worker (its parent has the journal open), and a
        # process carrying Hermes' marker for execute_code's child.
        inside_worker = [sys.executable, "-c", "import sqlite3, subprocess, sys\n"
                         "journal = sqlite3.connect(sys.argv[1])\n"
                         "journal.execute('SELECT count(*) FROM events').fetchone()\n"
                         "sys.exit(subprocess.run(sys.argv[2:]).returncode)",
                         os.path.join(self.data_dir, "journal.sqlite3"), *client]
        for label, argv, extra in (("parent has the journal open", inside_worker, {}),
                                   ("HERMES_RPC_TOKEN", client, {"HERMES_RPC_TOKEN": "t"})):
            with self.subTest(agent=label):
                before = self.journal_content()
                agent = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                       env=dict(os.environ, **extra))
                status, text = agent.stdout.split(" ", 1)
                document = json.loads(text)
                self.assertEqual((status, document["error"]["code"]), ("403", "run_by_agent"),
                                 agent.stdout + agent.stderr)
                self.assertIn(label.split()[-1] if extra else "journal open",
                              document["error"]["message"])
                self.assertIn("open the dashboard in a browser you started yourself",
                              document["error"]["message"])
                self.assertEqual(self.journal_content(), before)

    def test_a_running_owner_is_refused_unless_forced_then_the_late_outcome_is_acknowledged(self):
        held = HeldCall(self.data_dir, "book_trip", "call-held")
        try:
            status = self.api("GET", "/status")[1]
            self.assertEqual((status["gate"], status["unresolved"][0]["owner"],
                              status["unresolved"][0]["owner_pid"]),
                             ("busy", "running", held.process.pid))
            resolve = f"/operations/{held.operation_id}/resolve"
            refused = self.assertRefusedWithoutChange(
                "POST", resolve, {"outcome": "completed", "evidence": EVIDENCE}, 409,
                "owner_running")
            cli = self.cli("resolve", held.operation_id, "--outcome", "completed",
                           "--evidence", EVIDENCE)["error"]
            # The CLI's message; the page's own words beside its checkbox, not --force.
            self.assertEqual(refused["error"]["message"], cli["message"])
            self.assertIn("--force", cli["hint"])
            self.assertEqual(refused["error"]["hint"], PAGE_HINTS["owner_running"])
            status, document, _ = self.api("POST", resolve, {
                "outcome": "completed", "force": True,
                "evidence": "worker hung on a dead connection; PNR ABC123 in the portal"})
            self.assertEqual((status, document["forced"], document["previous_state"]),
                             (200, True, "pending"))
        finally:
            held.finish()
        status = self.api("GET", "/status")[1]
        (late,) = status["attention"]
        self.assertEqual((late["operation_id"], late["late_reason"], status["gate"]),
                         (held.operation_id, "returned", "open"))
        acknowledge = f"/operations/{held.operation_id}/acknowledge"
        self.assertRefusedWithoutChange("POST", acknowledge, {"evidence": " "}, 400,
                                        "invalid_evidence")
        self.assertRefusedWithoutChange("POST", acknowledge, {}, 400, "usage")
        status, document, _ = self.api("POST", acknowledge, {
            "evidence": "late result matches the resolution: one booking ABC123"})
        self.assertEqual((status, document["acknowledged"], document["late_reason"]),
                         (200, held.operation_id, "returned"))
        self.assertRefusedWithoutChange("POST", acknowledge, {"evidence": "again"}, 409,
                                        "nothing_to_acknowledge", "ok")
        self.assertEqual([(line["action"], line.get("forced"), line["operator"]["via"])
                          for line in self.operator_log()],
                         [("resolve", True, "dashboard"), ("acknowledge", None, "dashboard")])
        self.assertEqual(self.api("GET", "/status")[1]["attention"], [])
        self.assertEqual(self.assertVerifies().kinds(),
                         ["started", "resolved", "late_outcome", "acknowledged"])

    def test_a_stale_page_gets_operation_not_open_and_appends_nothing(self):
        operation_id = self.uncertain_operation()
        self.assertEqual(self.api("GET", "/status")[1]["unresolved"][0]["reason"],
                         "error_response")
        exit_code, _, _ = run_cli(self.data_dir, "resolve", operation_id, "--outcome",
                                  "not_applied", "--evidence", EVIDENCE)
        self.assertEqual(exit_code, 0)
        document = self.assertRefusedWithoutChange(
            "POST", f"/operations/{operation_id}/resolve",
            {"outcome": "completed", "evidence": "seen on the page a minute ago"}, 409,
            "operation_not_open", "ok")
        cli = self.cli("resolve", operation_id, "--outcome", "completed", "--evidence",
                       "x")["error"]
        self.assertEqual(document["error"]["message"], cli["message"])
        self.assertEqual(document["error"]["hint"], PAGE_HINTS["operation_not_open"])
        self.assertEqual(len(self.operator_log()), 1)
        self.assertVerifies()

    def test_two_pages_settling_at_once_exactly_one_wins(self):
        operation_id = self.uncertain_operation()
        start = threading.Barrier(2)
        answers = []

        def settle(outcome):
            start.wait()
            answers.append(self.api("POST", f"/operations/{operation_id}/resolve",
                                    {"outcome": outcome, "evidence": f"{outcome}: {EVIDENCE}"}))

        pages = [threading.Thread(target=settle, args=(outcome,))
                 for outcome in ("completed", "not_applied")]
        for page in pages:
            page.start()
        for page in pages:
            page.join()
        self.assertEqual(sorted((status, document.get("error", {}).get("code"))
                                for status, document, _ in answers),
                         [(200, None), (409, "operation_not_open")])
        (winner,) = [document for status, document, _ in answers if status == 200]
        events = self.cli("show", operation_id)["events"]
        self.assertEqual([event["kind"] for event in events],
                         ["started", "uncertain", "resolved"])
        self.assertEqual(events[-1]["outcome"], winner["outcome"])
        self.assertEqual([line["outcome"] for line in self.operator_log()], [winner["outcome"]])
        self.assertVerifies()

    def test_an_integrity_failure_refuses_settling_and_names_the_next_step(self):
        operation_id = self.uncertain_operation()
        reference.execute_sql(self.data_dir, "UPDATE events SET payload = "
                              "replace(payload, 'send_payment', 'send_paymant') WHERE seq = 1")
        status, document, _ = self.api("GET", "/status")
        self.assertEqual((status, document["ok"], document["integrity"], document["gate"]),
                         (409, False, "hash_mismatch", "closed"))
        expected = self.cli("status")["error"]
        self.assertSameNext(document["error"].pop("next"), expected.pop("next"))
        self.assertEqual(document["error"], expected)
        for path, body in ((f"/operations/{operation_id}/resolve",
                            {"outcome": "completed", "evidence": EVIDENCE}),
                           (f"/operations/{operation_id}/acknowledge", {"evidence": EVIDENCE})):
            with self.subTest(path=path):
                self.assertRefusedWithoutChange("POST", path, body, 409, "hash_mismatch",
                                                "hash_mismatch")
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "operator.log")))

    def test_show_verify_checkpoint_and_archives_answer_as_the_cli(self):
        operation_id = self.uncertain_operation()
        status, shown, _ = self.api("GET", f"/operations/{operation_id}")
        expected = self.cli("show", operation_id)
        for found in (shown, expected):
            found["operation"].pop("age_seconds")
        self.assertEqual((status, shown), (200, expected))
        status, verified, _ = self.api("GET", "/verify")
        self.assertEqual((status, verified), (200, self.cli("verify")))
        status, text, headers = self.api("GET", "/checkpoint")
        exit_code, _, printed = run_cli(self.data_dir, "checkpoint")
        self.assertEqual((status, exit_code, json.dumps(text, sort_keys=True)),
                         (200, 0, json.dumps(json.loads(printed), sort_keys=True)))
        self.assertEqual(headers["Content-Disposition"],
                         f'attachment; filename="crash-recovery-checkpoint-{PROFILE}-2.json"')
        self.assertEqual(self.api("GET", "/archives")[1]["archives"], [])
        run_cli(self.data_dir, "resolve", operation_id, "--outcome", "not_applied",
                "--evidence", EVIDENCE)
        exit_code, sealed, _ = run_cli(self.data_dir, "archive")
        self.assertEqual(exit_code, 0, sealed)
        status, listed, _ = self.api("GET", "/archives")
        self.assertEqual((status, listed["archives"]), (200, [sealed["archived"]]))
        self.assertVerifies()


# Imports plugin_api.py by path as the dashboard does, before or after Hermes'
# own plugin manager loads the plugin for an agent in the same process; prints
# where the storage layer came from and what the plugin manager loaded.
ONE_PROCESS_PROBE = """
import importlib.util, json, sys
from hermes_cli.plugins import discover_plugins, get_plugin_manager

def load_routes():
    spec = importlib.util.spec_from_file_location(
        "hermes_dashboard_plugin_crash-recovery", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)

steps = [load_routes, discover_plugins] if sys.argv[2] == "routes-first" else [
    discover_plugins, load_routes]
for step in steps:
    step()
storage = sorted(name for name, module in sys.modules.items()
                 if name.endswith(".storage.database") and module is not None)
loaded = [(plugin["name"], plugin["middleware"], plugin["error"])
          for plugin in get_plugin_manager().list_plugins() if plugin["name"] == "crash-recovery"]
print(json.dumps({"storage": storage, "loaded": loaded}))
"""


class OneProcessTests(unittest.TestCase):
    """The dashboard may run agents in its own process (0.20+): its routes
    and the agent's plugin must share one copy of the plugin's modules."""

    def test_the_routes_and_an_in_process_agent_share_one_copy_of_the_plugin(self):
        root = tempfile.mkdtemp(prefix="crash-recovery-dashboard-")
        self.addCleanup(shutil.rmtree, root, True)
        home = make_home(root)
        routes = os.path.join(home, "plugins", "crash-recovery", "dashboard", "plugin_api.py")
        for order in ("routes-first", "plugins-first"):
            with self.subTest(order=order):
                completed = subprocess.run(
                    [sys.executable, "-c", ONE_PROCESS_PROBE, routes, order],
                    env=dict(os.environ, HERMES_HOME=home, HOME=root), cwd=root,
                    capture_output=True, text=True, timeout=120)
                self.assertEqual(completed.returncode, 0, completed.stderr[-3000:])
                found = json.loads(completed.stdout.strip().splitlines()[-1])
                self.assertEqual(found, {
                    "storage": ["hermes_plugins.crash_recovery.storage.database"],
                    "loaded": [["crash-recovery", 1, None]]})


if __name__ == "__main__":
    unittest.main()
