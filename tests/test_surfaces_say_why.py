"""Every surface a person reads tells the same truth, and says why (docs/cli.md
§status, the ``check`` field): the text and JSON of ``status`` and ``status
--check`` (stand-alone and inside Hermes), the Prometheus gauges, the live
worker's ``/crash-recovery`` and the dashboard's status document.

* A typo in ``protected_tools`` (``send_paymnet``): the payment runs
  unprotected; the worker, which knows the host's tools, records them at its
  first call, and every surface then says the typo needs a person -- also the
  stand-alone CLI and the dashboard, which cannot read the registry
  themselves.
* A late outcome that contradicts the resolution is as loud as a closed gate.
* A call an operator resolved with force while its worker still runs is in
  the text and the dashboard's document, not only in the JSON.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import unittest

from support import OPERATOR_CLI, TESTS, JournalTestCase, run_cli
from crash_recovery import operator_cli
from crash_recovery.admission.binding import ADMISSION
from crash_recovery.admission.registered_tools import RECORD_NAME, record_first_call
from crash_recovery.admission.settings import parse_settings
from crash_recovery.guard import RecoveryGuard
from crash_recovery.host.dashboard import DashboardCommands
from crash_recovery.host.hermes import summary_text
from crash_recovery.journal import Journal

PREFIX = ("hermes", "-p", "work", "crash-recovery")
HOST_TOOLS = ["send_payment", "read_file", "terminal", "mcp_ledger_lookup"]
TYPO = {"protected_tools": ["send_paymnet"]}


class ProfileCase(JournalTestCase):
    """A Hermes home (``ROOT/home`` with its config.yaml) and its data directory."""

    def setUp(self):
        super().setUp()
        self.home = os.path.join(self.root, "home")
        os.makedirs(self.home)
        with open(os.path.join(self.home, "config.yaml"), "w", encoding="utf-8") as stream:
            stream.write("plugins:\n  enabled: [crash-recovery]\n")
        self.data_dir = os.path.join(self.home, "plugin-data", "crash-recovery")

    def inside_hermes(self, *words, settings, registered=lambda: None):
        """``hermes -p work crash-recovery WORDS`` as its handler runs it, in
        a process that cannot read the host's registry (``registered``)."""
        args = operator_cli.build_parser().parse_args(list(words))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = operator_cli.execute(args, lambda: self.data_dir, lambda _: PREFIX,
                                        lambda: settings, registered)
        return code, stdout.getvalue()

    def dashboard_status(self, settings):
        commands = DashboardCommands(Journal, data_dir=lambda: self.data_dir,
                                     settings=lambda: settings, registered_tools=lambda: None)
        return commands.status()[0]


class TypoInProtectedTools(ProfileCase):

    def setUp(self):
        super().setUp()
        self.guard = RecoveryGuard(self.data_dir, settings=TYPO,
                                   registered_tools=lambda: HOST_TOOLS,
                                   command_prefix=lambda: PREFIX)
        self.addCleanup(self.guard.close)
        with self.assertLogs("crash_recovery", "WARNING") as logs:
            # The real payment: not protected, because of the typo.
            self.assertEqual(self.guard.tool_execution("send_payment", {"cents": 500},
                                                       lambda: {"status": "paid"}),
                             {"status": "paid"})
        self.assertIn("send_paymnet", "".join(logs.output))

    def assert_says_the_typo(self, reasons):
        self.assertEqual([reason["code"] for reason in reasons], ["unmatched_tools"])
        self.assertIn("protected_tools names send_paymnet", reasons[0]["message"])
        self.assertIn("protects nothing", reasons[0]["message"])

    def test_the_worker_records_the_host_tools_at_its_first_call(self):
        with open(os.path.join(self.data_dir, RECORD_NAME), encoding="utf-8") as stream:
            record = json.load(stream)
        self.assertEqual(record["tool_names"], sorted(HOST_TOOLS))
        self.assertEqual((record["pid"], record["settings"]["unmatched_tools"],
                          record["settings"]["needs_attention"]),
                         (os.getpid(), ["send_paymnet"], True))
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "journal.sqlite3")))

    def test_a_dead_writers_leftover_goes_a_live_ones_stays(self):
        dead = os.path.join(self.data_dir, f"{RECORD_NAME}.999999999-deadbeef.tmp")
        live = os.path.join(self.data_dir, f"{RECORD_NAME}.{os.getpid()}-cafe0000.tmp")
        for path in (dead, live):
            with open(path, "w", encoding="utf-8") as stream:
                stream.write("{")
        record_first_call(self.data_dir, lambda: HOST_TOOLS, parse_settings(TYPO))
        self.assertEqual((os.path.exists(dead), os.path.exists(live)), (False, True))
        with open(os.path.join(self.data_dir, RECORD_NAME), encoding="utf-8") as stream:
            self.assertEqual(json.load(stream)["tool_names"], sorted(HOST_TOOLS))

    def test_the_live_worker_slash_command_says_the_typo(self):
        text = summary_text(self.guard.status_report(), PREFIX)
        first, second = text.splitlines()[:2]
        self.assertEqual(first, "crash-recovery: gate open, but something NEEDS A PERSON:")
        self.assertTrue(second.startswith("! unmatched_tools: protected_tools names "
                                          "send_paymnet"), second)
        self.assertNotIn("nothing unresolved", text)

    def test_stand_alone_status_check_exits_3_and_says_why_first(self):
        code, document, _ = run_cli(self.data_dir, "status", "--check")
        self.assertEqual((code, document["ok"], document["journal"]), (3, True, "absent"))
        self.assertEqual(document["check"]["exit_code"], 3)
        self.assert_says_the_typo(document["check"]["reasons"])
        self.assertEqual((document["settings"]["unmatched_tools"],
                          document["settings"]["recorded_by_pid"]), (["send_paymnet"], os.getpid()))
        code, _, text = run_cli(self.data_dir, "status", "--check", "--format", "text")
        lines = text.splitlines()
        self.assertEqual(code, 3)
        self.assertEqual(lines[0], "NEEDS A PERSON (status --check exits 3):")
        self.assertTrue(lines[1].startswith("- unmatched_tools: protected_tools names "
                                            "send_paymnet"), lines[1])
        self.assertIn("UNMATCHED TOOL NAMES", text)
        _, _, gauges = run_cli(self.data_dir, "status", "--format", "prometheus")
        label = '{data_dir="%s"}' % self.data_dir
        self.assertIn(f"crash_recovery_settings_attention{label} 1\n", gauges)
        self.assertIn(f"crash_recovery_unmatched_tools{label} 1\n", gauges)

    def test_inside_hermes_the_record_covers_what_the_command_cannot_load(self):
        code, stdout = self.inside_hermes("status", "--check", settings=TYPO)
        document = json.loads(stdout)
        self.assertEqual(code, 3)
        self.assertEqual((document["settings"]["tool_list"],
                          document["settings"]["unmatched_tools"]), ("recorded", ["send_paymnet"]))
        self.assert_says_the_typo(document["check"]["reasons"])
        # The record names the MCP tools a running agent had: they are judged too.
        code, stdout = self.inside_hermes("status", "--check",
                                          settings={"protected_tools": ["mcp_ledger_lookup"]})
        self.assertEqual((code, json.loads(stdout)["settings"]["unmatched_tools"]), (0, []))

    def test_the_dashboard_says_the_typo(self):
        document = self.dashboard_status(TYPO)
        self.assertEqual((document["ok"], document["gate"], document["settings"]["needs_attention"],
                          document["settings"]["unmatched_tools"],
                          document["settings"]["tool_list"]),
                         (True, "open", True, ["send_paymnet"], "recorded"))
        self.assertEqual(document["check"]["exit_code"], 3)
        self.assert_says_the_typo(document["check"]["reasons"])

    def test_a_fixed_spelling_reads_healthy_everywhere(self):
        fixed = {"protected_tools": ["send_payment"]}
        self.assertEqual(self.inside_hermes("status", "--check", settings=fixed)[0], 0)
        self.assertEqual(self.dashboard_status(fixed)["check"], {"exit_code": 0, "reasons": []})


def call_with(guard, tool_call_id, during):
    """One protected call of send_payment whose tool runs ``during(operation_id)``."""
    def pays():
        during(ADMISSION.get().operation_id)
        return {"status": "paid"}
    return guard.tool_execution("send_payment", {"cents": 500}, pays, session_id="s",
                                tool_call_id=tool_call_id)


def resolve_by_force(data_dir, operation_id):
    with contextlib.redirect_stdout(io.StringIO()):
        return operator_cli.main(["--data-dir", data_dir, "resolve", operation_id, "--outcome",
                                  "not_applied", "--force", "--evidence",
                                  "worker hung on a dead socket"])


class LateOutcomeContradictsTheResolution(ProfileCase):
    """Settled not_applied while the payment was still running; then it paid."""

    def setUp(self):
        super().setUp()
        guard = RecoveryGuard(self.data_dir, settings={"protected_tools": ["send_payment"]},
                              registered_tools=lambda: HOST_TOOLS)
        self.addCleanup(guard.close)
        seen = []
        with self.assertLogs("crash_recovery", "WARNING"):
            call_with(guard, "late", lambda operation_id: seen.append(
                (operation_id, resolve_by_force(self.data_dir, operation_id))))
        [(self.operation_id, code)] = seen
        self.assertEqual(code, 0)
        self.slash = summary_text(guard.status_report(), PREFIX)

    def test_text_status_starts_with_the_late_outcome(self):
        code, _, text = run_cli(self.data_dir, "status", "--format", "text")
        lines = text.splitlines()
        self.assertEqual((code, lines[0]), (0, "NEEDS A PERSON (status --check exits 3):"))
        self.assertTrue(lines[1].startswith(f"- late_outcome: operation {self.operation_id} "
                                            "(send_payment) ended (returned) after it was "
                                            "resolved as not_applied"), lines[1])
        self.assertEqual(run_cli(self.data_dir, "status", "--check")[0], 3)

    def test_the_slash_command_is_not_calm(self):
        first = self.slash.splitlines()[0]
        self.assertEqual(first, "crash-recovery: gate open, but something NEEDS A PERSON:")
        self.assertIn(f"! late_outcome: operation {self.operation_id}", self.slash)
        self.assertIn(f"hermes -p work crash-recovery acknowledge {self.operation_id}",
                      self.slash)

    def test_the_dashboard_document_names_it(self):
        document = self.dashboard_status({"protected_tools": ["send_payment"]})
        self.assertEqual((document["gate"], document["check"]["exit_code"],
                          [reason["code"] for reason in document["check"]["reasons"]]),
                         ("open", 3, ["late_outcome"]))


class ForcedResolutionOfARunningCall(ProfileCase):
    """A worker hangs inside the payment; an operator resolves it with force."""

    def setUp(self):
        super().setUp()
        self.guard = RecoveryGuard(self.data_dir)
        self.addCleanup(self.guard.close)
        self.inside, self.release = threading.Event(), threading.Event()
        self.seen = []

        def hangs(operation_id):
            self.seen.append(operation_id)
            self.inside.set()
            self.release.wait(60)
        self.worker = threading.Thread(target=lambda: call_with(self.guard, "hung", hangs))
        self.worker.start()
        self.addCleanup(self.finish)
        self.assertTrue(self.inside.wait(60))
        self.assertEqual(resolve_by_force(self.data_dir, self.seen[0]), 0)
        self.text = run_cli(self.data_dir, "status", "--format", "text")[2]
        self.document = run_cli(self.data_dir, "status")[1]
        self.archive = run_cli(self.data_dir, "archive")
        self.dashboard = self.dashboard_status(None)

    def finish(self):
        self.release.set()
        self.worker.join(60)

    def test_text_status_names_the_call_that_still_runs(self):
        [entry] = self.document["resolved_running"]
        self.assertEqual(entry["operation_id"], self.seen[0])
        self.assertIn("1 call(s) an operator resolved with --force still run", self.text)
        self.assertIn(f"operation {self.seen[0]}, pid {os.getpid()}", self.text)

    def test_the_dashboard_document_names_it(self):
        self.assertEqual([entry["operation_id"] for entry in self.dashboard["resolved_running"]],
                         [self.seen[0]])

    def test_archive_waits_and_its_hint_names_no_force(self):
        code, document, _ = self.archive
        self.assertEqual((code, document["error"]["code"]), (1, "owner_running"))
        self.assertNotIn("--force", document["error"]["hint"] + document["error"]["message"])
        self.assertIn("resolved_running", document["error"]["hint"])


class WorkersKnownToRun(ProfileCase):
    """``workers_running``: the pids a status document knows alive, so that
    "stop every worker" names them -- also beside an integrity verdict."""

    def setUp(self):
        super().setUp()
        self.guard = RecoveryGuard(self.data_dir, registered_tools=lambda: HOST_TOOLS)
        self.addCleanup(self.guard.close)
        self.assertEqual(self.guard.tool_execution("send_payment", {"cents": 1}, lambda: "paid"),
                         "paid")

    def test_the_recorded_worker_is_told_from_a_reused_pid_by_its_start_in_ticks(self):
        """The boot time in seconds since the epoch follows the wall clock (a VM's
        moves it by seconds): a worker whose recorded start time no longer matches
        is still named; one whose start in ticks after boot differs is not."""
        path = os.path.join(self.data_dir, "registered_tools.json")
        with open(path) as stream:
            record = json.load(stream)
        listed = {}
        for name, change in (("wall clock moved", {"process_start": record["process_start"] + 1}),
                             ("pid reused", {"process_start_ticks": record["process_start_ticks"] + 1})):
            with open(path, "w") as stream:
                json.dump({**record, **change}, stream)
            listed[name] = run_cli(self.data_dir, "status")[1]["workers_running"]
        self.assertEqual(listed, {"wall clock moved": [{"pid": os.getpid(),
                                                        "known_as": "recorded_first_call"}],
                                  "pid reused": []})

    def test_the_worker_that_recorded_its_first_call_is_named(self):
        document = run_cli(self.data_dir, "status")[1]
        self.assertEqual(document["workers_running"],
                         [{"pid": os.getpid(), "known_as": "recorded_first_call"}])
        self.guard.close()
        os.unlink(os.path.join(self.data_dir, "head.json"))
        code, document, _ = run_cli(self.data_dir, "status")
        self.assertEqual((code, document["integrity"], document["workers_running"]),
                         (1, "checkpoint_missing",
                          [{"pid": os.getpid(), "known_as": "recorded_first_call"}]))
        text = run_cli(self.data_dir, "status", "--format", "text")[2]
        self.assertIn(f"workers of this profile known to run (stop them before any repair): "
                      f"pid {os.getpid()} (the last worker to start here)", text)

    def test_a_dead_or_reused_pid_is_not_named(self):
        path = os.path.join(self.data_dir, RECORD_NAME)
        with open(path, encoding="utf-8") as stream:
            record = json.load(stream)
        for changed in ({"pid": 999999999}, {"process_start": 1.0}):
            with self.subTest(changed=changed):
                with open(path, "w", encoding="utf-8") as stream:
                    json.dump({**record, **changed}, stream)
                self.assertEqual(run_cli(self.data_dir, "status")[1]["workers_running"], [])


class FreshProfiles(ProfileCase):
    """A profile whose first protected call has not come yet reads healthy
    through ``--data-dir`` too; a directory that cannot be a profile's stays
    an error with a next step."""

    def test_a_profile_data_dir_and_its_home_read_healthy(self):
        for typed in (self.data_dir, self.home):
            with self.subTest(typed=typed):
                code, document, _ = run_cli(typed, "status", "--check")
                self.assertEqual((code, document["ok"], document["journal"], document["gate"],
                                  document["data_dir"], document["check"]),
                                 (0, True, "absent", "open", self.data_dir,
                                  {"exit_code": 0, "reasons": []}))
                code, _, text = run_cli(typed, "status", "--format", "text")
                self.assertIn("none yet", text)
                self.assertNotIn("NEEDS A PERSON", text)
        self.assertFalse(os.path.exists(self.data_dir))  # status created nothing

    def test_a_typo_or_a_file_stays_an_error_with_a_next_step(self):
        typo = os.path.join(self.home, "plugin-data", "crash-recovry")
        a_file = os.path.join(self.home, "config.yaml")
        for typed, code_expected in ((typo, "journal_absent"),
                                     (os.path.join(a_file), None)):
            with self.subTest(typed=typed):
                code, document, _ = run_cli(typed, "status", "--check")
                if code_expected is None:  # config.yaml: the home's file, not a directory
                    code_expected = document["error"]["code"]
                    self.assertEqual(code_expected, "storage_unavailable")
                self.assertEqual((code, document["ok"], document["error"]["code"],
                                  document["check"]["exit_code"]), (1, False, code_expected, 1))
                self.assertTrue(document["error"]["next"].endswith(
                    f"--data-dir {self.data_dir} status"), document["error"]["next"])


class ConsoleScriptNamesItself(JournalTestCase):
    """``crash-recovery-operator`` (pip's console script) prints its own name
    in the commands it gives, not a venv's interpreter and a path."""

    def test_next_lines_name_the_console_script(self):
        bin_dir = os.path.join(self.root, "bin")
        os.makedirs(bin_dir)
        script = os.path.join(bin_dir, "crash-recovery-operator")
        with open(script, "w", encoding="utf-8") as stream:  # what pip writes, in essence
            stream.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {TESTS!r})\n"
                         "import checkout\ncheckout.load_package()\n"
                         "from crash_recovery.operator_cli import run\nsys.exit(run())\n")
        os.chmod(script, 0o755)
        guard = RecoveryGuard(self.data_dir)
        with self.assertLogs("crash_recovery", "WARNING"), self.assertRaises(RuntimeError):
            guard.tool_execution("send_payment", {}, lambda: (_ for _ in ()).throw(
                RuntimeError("connection reset")))
        guard.close()
        environment = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        ran = subprocess.run(["crash-recovery-operator", "--data-dir", self.data_dir, "status"],
                             env=environment, capture_output=True, text=True, timeout=60)
        document = json.loads(ran.stdout)
        self.assertTrue(document["next"].startswith(
            f"crash-recovery-operator --data-dir {self.data_dir} resolve "), document["next"])
        text = subprocess.run(["crash-recovery-operator", "--data-dir", self.data_dir, "status",
                               "--format", "text"], env=environment, capture_output=True,
                              text=True, timeout=60).stdout
        self.assertIn(f"  crash-recovery-operator --data-dir {self.data_dir} show ", text)
        self.assertNotIn(OPERATOR_CLI, text)


if __name__ == "__main__":
    unittest.main()
