#!/usr/bin/env python3
"""Host checks: the crash-recovery plugin inside a real, unmodified Hermes Agent.

    python tests/check_host.py [--keep DIR] [--only NAME ...]

Every scenario runs in its own child process with an isolated ``HERMES_HOME``
(inside a fresh network namespace when ``unshare -rn`` is allowed). Hermes'
own PluginManager loads the plugin; tool calls go through Hermes' own
``model_tools.handle_function_call`` or, for two calls in one assistant
message, through ``AIAgent.run_conversation`` against a scripted provider on
127.0.0.1 (the concurrent executor: tests/host/concurrent_path.py). Install
paths are in tests/host/install_steps.py. Evidence is read from the journal
file, the booking service database and the tool messages the provider
received. Prints one JSON report; exits 1 on any failed check. Needs Hermes
importable in the running interpreter (any packaging: 0.19.0, 0.20.1, 0.22.2
are checked in CI); where the hosts really differ, a check branches on the
imported Hermes' version and says which host behaviour it proves.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

HOST_DIR = Path(__file__).resolve().parent / "host"
sys.path.insert(0, str(HOST_DIR))

import evidence  # noqa: E402  (tests/host)
from evidence import (BOOKING_PLUGIN_DIR, PLUGIN_NAME, PROBE_PLUGIN_DIR,  # noqa: E402
                      blocked_document, data_dir_of, kinds, service_counts)
from install_steps import BOOKING, InstallSteps  # noqa: E402
# Re-exported: the checkers built on this one import these from here.
from scenario_support import (PROBE, CheckList, booked, check_registrations,  # noqa: E402,F401
                              events_of, hermes_call, scripted_conversation)
from concurrent_path import scenario_concurrent  # noqa: E402

SCENARIO_TIMEOUT_SECONDS = 300


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_dispatch(home: Path, checks: CheckList) -> None:
    """Journaling, uncertainty, refusal on both paths, inspection, resolution."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    check_registrations(checks, "user")

    # 1. one protected call: started -> returned
    result = hermes_call("book_trip", {"traveler": "Ada", "destination": "Lisbon"},
                         session_id="session-A", call_id="call-A1")
    checks.check("first_call_booked", booked(result) is not None, result=result)
    events = events_of(home)
    checks.check("first_call_journaled", kinds(events) == ["started", "returned"], events=events)
    if len(events) >= 2:
        started, returned = events[0], events[1]
        checks.check("started_fields",
                     started["tool"] == "book_trip" and started["session_id"] == "session-A"
                     and started["tool_call_id"] == "call-A1", started=started)
        checks.check("returned_matches_started",
                     returned["operation_id"] == started["operation_id"]
                     and returned["reason"] == "returned", returned=returned)
        checks.check("no_raw_arguments_stored",
                     all("Ada" not in json.dumps(event) and "Lisbon" not in json.dumps(event)
                         for event in events), events=events)
    checks.check("service_after_first", service_counts(service) == {"bookings": 1, "attempts": 1},
                 counts=service_counts(service))

    # 2. read_file is exempt: untouched result, nothing journaled
    sample = home / "notes.txt"
    sample.write_text("exempt-marker-7c1\n", encoding="utf-8")
    result = hermes_call("read_file", {"path": str(sample)}, session_id="session-A",
                         call_id="call-A2")
    checks.check("read_file_untouched", "exempt-marker-7c1" in result
                 and blocked_document(result) is None, result=result[:500])
    checks.check("read_file_not_journaled", len(events_of(home)) == 2)

    # 3. a tool that errors leaves uncertain
    result = hermes_call("book_trip", {"traveler": "Bob", "destination": "Atlantis"},
                         session_id="session-A", call_id="call-A3")
    checks.check("failing_call_returns_host_error", "ServiceUnavailable" in result, result=result)
    events = events_of(home)
    checks.check("failing_call_uncertain", kinds(events) == ["started", "returned", "started",
                                                             "uncertain"], events=events)
    uncertain_id = events[3]["operation_id"] if len(events) == 4 else None
    if uncertain_id:
        checks.check("uncertain_reason", events[3]["reason"] == "error_response"
                     and events[2]["operation_id"] == uncertain_id
                     and events[2]["tool_call_id"] == "call-A3", events=events[2:])
    checks.check("service_after_failure", service_counts(service) == {"bookings": 1, "attempts": 2},
                 counts=service_counts(service))

    # 4. another session, middleware only (hook skipped): refused, handler not run
    result = hermes_call("book_trip", {"traveler": "Cy", "destination": "Paris"},
                         session_id="session-B", call_id="call-B1", hook=False)
    refusal = blocked_document(result)
    checks.check("middleware_refuses_other_session",
                 refusal is not None and refusal.get("blocked") is True
                 and refusal.get("operation_ids") == [uncertain_id] and bool(refusal.get("code")),
                 result=result)
    checks.check("middleware_refusal_is_direct_json",
                 json.loads(result).get("error") == "crash_recovery_blocked", result=result)
    checks.check("refused_handler_not_run", service_counts(service)["attempts"] == 2,
                 counts=service_counts(service))
    checks.check("refusal_appends_nothing", len(events_of(home)) == 4)

    # 5. the same refusal through the pre_tool_call hook path
    result = hermes_call("book_trip", {"traveler": "Cy", "destination": "Paris"},
                         session_id="session-C", call_id="call-C1", hook=True)
    outer = json.loads(result)
    inner = blocked_document(outer.get("error")) if isinstance(outer.get("error"), str) else None
    checks.check("hook_path_wraps_blocked_json",
                 set(outer) == {"error"} and inner is not None
                 and inner.get("operation_ids") == [uncertain_id]
                 and inner.get("code") == (refusal or {}).get("code"), result=result)
    checks.check("hook_refusal_handler_not_run", service_counts(service)["attempts"] == 2)

    # 6. unknown tool names are protected too
    result = hermes_call("transfer_funds", {"amount": 5}, session_id="session-B",
                         call_id="call-B2", hook=False)
    checks.check("unknown_tool_refused", blocked_document(result) is not None, result=result)

    # 7. inspection and read-only tools work while blocked
    status = json.loads(hermes_call("crash_recovery_status", {}, session_id="session-B",
                                    call_id="call-B3"))
    unresolved = [(o.get("operation_id"), o.get("tool"), o.get("state"))
                  for o in status.get("unresolved", [])]
    checks.check("status_tool_while_blocked",
                 unresolved == [(uncertain_id, "book_trip", "uncertain")], status=status)
    verify = json.loads(hermes_call("crash_recovery_verify", {}, session_id="session-B",
                                    call_id="call-B4"))
    checks.check("verify_tool_while_blocked",
                 verify.get("ok") is True and (verify.get("checkpoint") or {}).get("count") == 4,
                 verify=verify)
    lookup = json.loads(hermes_call("lookup_receipt", {"traveler": "Ada"},
                                    session_id="session-B", call_id="call-B5"))
    checks.check("configured_read_only_tool_while_blocked", lookup.get("count") == 1,
                 lookup=lookup)
    result = hermes_call("read_file", {"path": str(sample)}, session_id="session-B",
                         call_id="call-B6")
    checks.check("read_file_while_blocked", "exempt-marker-7c1" in result, result=result[:300])
    checks.check("inspection_appends_nothing", len(events_of(home)) == 4)

    # 8. operator resolves from evidence (another process); protected calls resume
    data_dir = data_dir_of(home)
    code, document = evidence.operator_cli(data_dir, "status")
    cli_unresolved = [(o.get("operation_id"), o.get("state")) for o in document.get("unresolved", [])]
    checks.check("operator_status", code == 0 and cli_unresolved == [(uncertain_id, "uncertain")],
                 code=code, document=document)
    code, document = evidence.operator_cli(
        data_dir, "resolve", str(uncertain_id), "--outcome", "not_applied", "--evidence",
        "service attempts table shows ServiceUnavailable and no booking row for Bob")
    checks.check("operator_resolve", code == 0, code=code, document=document)
    result = hermes_call("book_trip", {"traveler": "Dee", "destination": "Rome"},
                         session_id="session-B", call_id="call-B7")
    checks.check("call_after_resolution_booked", booked(result) is not None, result=result)
    events = events_of(home)
    checks.check("final_journal", kinds(events) == ["started", "returned", "started", "uncertain",
                                                    "resolved", "started", "returned"],
                 events=events)
    if len(events) == 7:
        checks.check("resolved_event", events[4]["operation_id"] == uncertain_id
                     and events[4]["outcome"] == "not_applied" and events[4]["evidence"],
                     event=events[4])
    checks.check("service_final", service_counts(service) == {"bookings": 2, "attempts": 3},
                 counts=service_counts(service))


def scenario_journal_failure(home: Path, checks: CheckList) -> None:
    """The data directory path is a regular file: every protected call is
    refused and the handler never runs, although Hermes fails open on raises."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    check_registrations(checks, "user")
    result = hermes_call("book_trip", {"traveler": "Eve", "destination": "Oslo"},
                         session_id="session-F", call_id="call-F1", hook=False)
    checks.check("middleware_fails_closed", blocked_document(result) is not None, result=result)
    checks.check("middleware_handler_count_zero", service_counts(service)["attempts"] == 0,
                 counts=service_counts(service))
    result = hermes_call("book_trip", {"traveler": "Eve", "destination": "Oslo"},
                         session_id="session-F", call_id="call-F2", hook=True)
    checks.check("hook_fails_closed", blocked_document(result) is not None, result=result)
    checks.check("hook_handler_count_zero", service_counts(service)["attempts"] == 0)
    status = json.loads(hermes_call("crash_recovery_status", {}, session_id="session-F",
                                    call_id="call-F3"))
    checks.check("status_reports_failure", status.get("ok") is False, status=status)
    checks.check("data_path_still_a_file", data_dir_of(home).is_file())


def scenario_tampered(home: Path, checks: CheckList) -> None:
    """An edited journal record blocks protected calls (and the verifier agrees)."""
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    check_registrations(checks, "user")
    result = hermes_call("book_trip", {"traveler": "Fay", "destination": "Riga"},
                         session_id="session-T", call_id="call-T1")
    checks.check("first_call_booked", booked(result) is not None, result=result)
    database = data_dir_of(home) / "journal.sqlite3"
    # Another connection, as a determined editor would: the journal's
    # append-only triggers are dropped first, then a stored record is edited.
    connection = sqlite3.connect(str(database), timeout=10, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            connection.execute(f'DROP TRIGGER "{name}"')
        payload = connection.execute("SELECT payload FROM events WHERE seq = 1").fetchone()[0]
        connection.execute("UPDATE events SET payload = ? WHERE seq = 1",
                           (payload.replace('"book_trip"', '"book_tram"'),))
        connection.execute("COMMIT")
    finally:
        connection.close()
    result = hermes_call("book_trip", {"traveler": "Fay", "destination": "Riga"},
                         session_id="session-T", call_id="call-T2", hook=False)
    checks.check("tampered_journal_refused", blocked_document(result) is not None, result=result)
    result = hermes_call("book_trip", {"traveler": "Fay", "destination": "Riga"},
                         session_id="session-T", call_id="call-T3", hook=True)
    checks.check("tampered_journal_refused_by_hook", blocked_document(result) is not None,
                 result=result)
    checks.check("tampered_handler_not_run", service_counts(service) == {"bookings": 1,
                                                                         "attempts": 1})
    verify = json.loads(hermes_call("crash_recovery_verify", {}, session_id="session-T",
                                    call_id="call-T4"))
    checks.check("verify_tool_reports_tamper", verify.get("ok") is False, verify=verify)


def scenario_cancelled(home: Path, checks: CheckList) -> None:
    """A cancellation (KeyboardInterrupt) inside the tool propagates unchanged
    through Hermes and the guard, and leaves ``uncertain``/``cancelled``."""
    import hashlib
    service = Path(os.environ["BOOKING_SERVICE_DB"])
    check_registrations(checks, "user")
    raised = None
    try:
        hermes_call("book_trip", {"traveler": "Hal", "destination": "Interrupted"},
                    session_id="session-K", call_id="call-K1")
    except KeyboardInterrupt as exc:
        raised = exc
    checks.check("interrupt_propagates", raised is not None
                 and "booking service" in str(raised), raised=repr(raised))
    events = events_of(home)
    null_hash = hashlib.sha256(b"null").hexdigest()
    checks.check("cancelled_uncertain", kinds(events) == ["started", "uncertain"]
                 and events[1]["reason"] == "cancelled" and events[1]["result_hash"] == null_hash,
                 events=events)
    result = hermes_call("book_trip", {"traveler": "Hal", "destination": "Oslo"},
                         session_id="session-K", call_id="call-K2", hook=False)
    refusal = blocked_document(result)
    checks.check("binding_reset_after_cancel",
                 refusal is not None and refusal.get("code") == "unresolved_operations"
                 and refusal.get("operation_ids") == [events[0]["operation_id"]] if events else False,
                 result=result)
    checks.check("cancelled_handler_ran_once", service_counts(service) == {"bookings": 0,
                                                                          "attempts": 1},
                 counts=service_counts(service))


def scenario_loaded(home: Path, checks: CheckList) -> None:
    """After an install path: Hermes loads the plugin and it journals a call."""
    expected_source = os.environ.get("CHECK_EXPECTED_SOURCE", "user")
    check_registrations(checks, expected_source)
    status = json.loads(hermes_call("crash_recovery_status", {}, session_id="session-I",
                                    call_id="call-I1"))
    # The journal is the profile's (guarded_call_journaled reads it there); the
    # model's status tool names no path.
    checks.check("status_tool_no_path",
                 status.get("ok") is True and "data_dir" not in status
                 and str(home) not in json.dumps(status), status=status)
    result = hermes_call("book_trip", {"traveler": "Gus", "destination": "Kyiv"},
                         session_id="session-I", call_id="call-I2")
    checks.check("guarded_call_booked", booked(result) is not None, result=result)
    checks.check("guarded_call_journaled", kinds(events_of(home)) == ["started", "returned"],
                 events=events_of(home))


SCENARIOS: Dict[str, Callable[[Path, CheckList], None]] = {
    "dispatch": scenario_dispatch,
    "journal_failure": scenario_journal_failure,
    "tampered": scenario_tampered,
    "cancelled": scenario_cancelled,
    "concurrent": scenario_concurrent,
    "loaded": scenario_loaded,
}


def run_child(scenario: str, home: Path, result_file: Path,
              scenarios: Optional[Dict[str, Any]] = None) -> int:
    """Child process entry: run one scenario (of ``scenarios``, default this
    file's), write its checks as JSON."""
    checks = CheckList(os.environ.get("CHECK_LABEL", scenario))
    try:
        (scenarios or SCENARIOS)[scenario](home, checks)
    except Exception as exc:
        checks.fail("crashed", error=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc()[-3000:])
    result_file.write_text(json.dumps(checks.results), encoding="utf-8")
    return 0


# --------------------------------------------------------------------------
# Parent: prepare profiles, run children, install paths, verify journals
# --------------------------------------------------------------------------

class CheckerRun:
    """What every host checker's parent shares: the results, the network
    isolation prefix, the host's program (``hermes``/``hermesx``), and running one scenario in a
    child process of ``script`` (``--child``)."""

    # Seconds one scenario child may take (a checker with long scenarios sets more).
    scenario_timeout: float = SCENARIO_TIMEOUT_SECONDS

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results: List[Dict[str, Any]] = []
        self.isolation_prefix, self.isolation = evidence.network_isolation()
        self.hermes = evidence.hermes_program()  # hermes, or hermesx on 0.20.1
        self.step_seconds: Dict[str, float] = {}
        self.child_seconds: Dict[str, float] = {}

    def add(self, label: str, name: str, ok: Any, **detail: Any) -> None:
        entry: Dict[str, Any] = {"name": f"{label}.{name}", "ok": bool(ok)}
        if detail and not ok:
            entry["detail"] = detail
        self.results.append(entry)

    def launch_child(self, script: str, label: str, scenario: str, home: Path, result_file: Path,
                     environment: Dict[str, str], cwd: Path) -> None:
        """Run ``script --child scenario`` and collect the checks it wrote."""
        command = self.isolation_prefix + [sys.executable, script, "--child", scenario,
                                           "--home", str(home), "--result", str(result_file)]
        started = time.monotonic()
        try:
            completed = subprocess.run(command, env=environment, capture_output=True, text=True,
                                       timeout=self.scenario_timeout, cwd=str(cwd),
                                       stdin=subprocess.DEVNULL)
            output = (completed.stdout + completed.stderr)[-3000:]
        except subprocess.TimeoutExpired as exc:
            output = f"timed out after {exc.timeout} s"
        self.child_seconds[label] = round(time.monotonic() - started, 2)
        if result_file.exists():
            self.results.extend(json.loads(result_file.read_text(encoding="utf-8")))
        else:
            self.add(label, "child_ran", False, output=output)


class HostRun(CheckerRun, InstallSteps):
    """Prepares isolated profiles and runs scenario children: the module at
    ``CHILD_SCRIPT`` (a checker module built on this one sets its own)."""

    CHILD_SCRIPT = str(Path(__file__).resolve())

    def new_home(self, label: str) -> Path:
        home = self.root / label / "home"
        home.mkdir(parents=True)
        return home

    def child_environment(self, home: Path, **extra: str) -> Dict[str, str]:
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("HERMES_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_"))}
        environment.update(HERMES_HOME=str(home), BOOKING_SERVICE_DB=str(home.parent / "service.db"),
                           PYTHONDONTWRITEBYTECODE="1", **extra)
        return environment

    def run_scenario(self, label: str, scenario: str, home: Path, **extra: str) -> None:
        self.launch_child(self.CHILD_SCRIPT, label, scenario, home,
                          home.parent / "checks.json",
                          self.child_environment(home, CHECK_LABEL=label, **extra), home.parent)

    def verify_journal(self, label: str, home: Path, expect_valid: bool = True) -> None:
        valid, report = evidence.run_verifier(data_dir_of(home))
        self.add(label, "independent_verifier", valid is expect_valid,
                 expected=expect_valid, report=report)

    def user_profile(self, label: str, *, read_only: Optional[List[str]] = None) -> Path:
        home = self.new_home(label)
        evidence.copy_plugin_checkout(home / "plugins" / PLUGIN_NAME)
        shutil.copytree(BOOKING_PLUGIN_DIR, home / "plugins" / BOOKING)
        entries = None
        if read_only is not None:
            entries = {PLUGIN_NAME: {"settings": {"read_only_tools": read_only}}}
        evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME], entries=entries)
        return home

    # -- scenarios run from the parent ------------------------------------

    def dispatch(self) -> None:
        home = self.user_profile("dispatch", read_only=["read_file", "search_files",
                                                         "lookup_receipt"])
        self.run_scenario("dispatch", "dispatch", home)
        self.verify_journal("dispatch", home)

    def journal_failure(self) -> None:
        home = self.user_profile("journal_failure")
        (home / "plugin-data").mkdir()
        data_dir_of(home).write_text("not a directory\n", encoding="utf-8")
        self.run_scenario("journal_failure", "journal_failure", home)

    def tampered(self) -> None:
        home = self.user_profile("tampered")
        self.run_scenario("tampered", "tampered", home)
        self.verify_journal("tampered", home, expect_valid=False)

    def cancelled(self) -> None:
        home = self.user_profile("cancelled")
        self.run_scenario("cancelled", "cancelled", home)
        self.verify_journal("cancelled", home)

    def concurrent(self) -> None:
        home = self.user_profile("concurrent")
        # The probe loads first (see PROBE): its tracing middleware is the
        # outermost link of the execution chain.
        shutil.copytree(PROBE_PLUGIN_DIR, home / "plugins" / PROBE)
        self.run_scenario("concurrent", "concurrent", home,
                          HOST_PROBE_LOG=str(home.parent / "probe.jsonl"))
        self.verify_journal("concurrent", home)


# Slowest first, so two workers finish together.
PARENT_STEPS = ("install_pip", "concurrent", "dispatch", "install_git", "journal_failure",
                "tampered", "cancelled", "install_copy")


def checker_main(argv: Optional[List[str]], *, description: str, steps: Sequence[str],
                 make_run: Any, scenarios: Dict[str, Any], temp_prefix: str) -> int:
    """The command line of a host checker: run ``steps`` (methods of the object
    ``make_run(root)``, which has ``results``, ``step_seconds``, ``isolation``
    and ``add``) two at a time, print a JSON summary, exit 0 only if every
    check passed.  ``--child`` runs one of ``scenarios`` in this process."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--keep", help="keep all profiles under this new directory")
    parser.add_argument("--only", nargs="*", choices=steps, help="run only these steps")
    parser.add_argument("--jobs", type=int, default=2, help="steps run at once (default 2)")
    parser.add_argument("--child", choices=sorted(scenarios), help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        return run_child(options.child, Path(options.home), Path(options.result), scenarios)

    version = evidence.hermes_version()
    if not version:
        print(json.dumps({"ok": False, "error": "Hermes (hermes_cli) is not importable in "
                          f"{sys.executable}"}))
        return 2
    if options.keep:
        root = Path(options.keep).resolve()
        root.mkdir(parents=True, exist_ok=False)
    else:
        root = Path(tempfile.mkdtemp(prefix=temp_prefix))
    started = time.monotonic()
    run = make_run(root)

    def run_step(step: str) -> None:
        step_started = time.monotonic()
        try:
            getattr(run, step)()
        except Exception as exc:
            run.add(step, "step_crashed", False, error=f"{type(exc).__name__}: {exc}",
                    traceback=traceback.format_exc()[-3000:])
        run.step_seconds[step] = round(time.monotonic() - step_started, 2)

    try:
        with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
            list(pool.map(run_step, options.only or steps))
    finally:
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)
    failed = [r for r in run.results if not r["ok"]]
    summary = {"ok": not failed and bool(run.results), "hermes_version": version,
               "network": run.isolation, "checks": len(run.results), "failed": failed,
               "passed": [r["name"] for r in run.results if r["ok"]],
               "seconds": round(time.monotonic() - started, 1), "step_seconds": run.step_seconds,
               "profiles": str(root) if options.keep else None}
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


def main(argv: Optional[List[str]] = None) -> int:
    return checker_main(argv, description="crash-recovery checks inside real Hermes",
                        steps=PARENT_STEPS, make_run=HostRun, scenarios=SCENARIOS,
                        temp_prefix="crash-recovery-host-")


if __name__ == "__main__":
    raise SystemExit(main())
