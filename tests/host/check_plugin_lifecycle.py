#!/usr/bin/env python3
"""Host checks of what a person meets around the plugin's life in a real,
unmodified Hermes (offline, isolated profiles): facts the README's install and
runbook sections state per host (0.19.0, 0.20.1, 0.22.2).

    python tests/host/check_plugin_lifecycle.py [--keep DIR] [--only STEP ...]

* ``typo_in_protected_tools``: ``protected_tools: [book_trp]`` (a typo of
  ``book_trip``): the real booking runs unrecorded; the worker's
  ``/crash-recovery``, ``hermes crash-recovery status --check`` (text and
  JSON) and the stand-alone ``operator_cli.py --data-dir`` all say the typo
  needs a person (exit 3, the reason first), from what the worker recorded.
* ``disable_and_remove_with_an_operation_open``: an uncertain booking closes
  the gate; then ``hermes plugins disable`` and ``hermes plugins remove`` as
  the host does them -- what happens to the settings, the plugin list, the
  journal and ``hermes crash-recovery``; that the booking then runs again
  unrecorded; and that the documented recovery closes the gate again with the
  operation still open: on 0.19/0.20 the plugin directory put back (the
  settings stayed), on 0.22 also ``plugins.enabled`` and the settings written
  with ``hermes config set`` (offline ``plugins enable`` fails there).

Prints one JSON report; exits 1 on any failed check.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import check_host  # noqa: E402  (tests/, the shared child/parent machinery)
import evidence  # noqa: E402
from check_host import BOOKING, CheckList, booked, events_of, hermes_call  # noqa: E402
from evidence import (HOST_COMMAND_SECONDS, OPERATOR_CLI, PLUGIN_NAME,  # noqa: E402
                      blocked_document, data_dir_of)

TYPO = "book_trp"
RECORD_NAME = "registered_tools.json"
# 0.22's plugin-set changes go through its package manager, whose runtime is
# downloaded at first use: offline that fails with the host's raw traceback.
PACKAGE_MANAGER_REFUSAL = "AdmissionRefused"


def settings_wiped_by_remove() -> bool:
    """0.22 forgets a removed plugin's config (``plugins_cmd._forget_plugin_config``:
    its ``plugins.enabled`` entry and ``plugins.entries.<name>``); 0.19 and
    0.20 only delete the directory (``plugins_cmd.cmd_remove``)."""
    return evidence.hermes_release() >= (0, 22, 0)


def plugin_set_changes_need_the_network() -> bool:
    """0.22's ``plugins enable``/``disable`` admit the change through its
    package manager (``plugins_admission.admit_plugin_set_change``)."""
    return evidence.hermes_release() >= (0, 22, 0)


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def slash_text() -> str:
    from hermes_cli.plugins import get_plugin_command_handler
    handler = get_plugin_command_handler(PLUGIN_NAME)
    return str(handler("")) if handler else ""


def scenario_typo_call(home: Path, checks: CheckList) -> None:
    """The booking runs unrecorded (the typo protects nothing); the worker
    records the host's tools; its /crash-recovery leads with the typo."""
    check_host.check_registrations(checks, "user")
    result = hermes_call("book_trip", {"traveler": "Ada", "destination": "Lisbon"},
                         session_id="session-typo", call_id="call-typo")
    checks.check("booking_ran_unrecorded", booked(result) and events_of(home) == [],
                 result=result, events=events_of(home))
    try:
        record = json.loads((data_dir_of(home) / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        record = {"unreadable": str(exc)}
    checks.check("worker_recorded_the_host_tools",
                 "book_trip" in record.get("tool_names", [])
                 and (record.get("settings") or {}).get("unmatched_tools") == [TYPO],
                 record=str(record)[:2000])
    lines = slash_text().splitlines()
    checks.check("slash_leads_with_the_typo",
                 lines[:1] == ["crash-recovery: gate open, but something NEEDS A PERSON:"]
                 and len(lines) > 1 and lines[1].startswith(
                     f"! unmatched_tools: protected_tools names {TYPO}"), lines=lines)


def scenario_uncertain_booking(home: Path, checks: CheckList) -> None:
    """A booking whose service raised: uncertain, the gate closed."""
    check_host.check_registrations(checks, "user")
    hermes_call("book_trip", {"traveler": "Bob", "destination": "Atlantis"},
                session_id="session-open", call_id="call-open")
    checks.check("operation_left_open", [e["kind"] for e in events_of(home)]
                 == ["started", "uncertain"], events=events_of(home))


def scenario_booking_after_removal(home: Path, checks: CheckList) -> None:
    """With the plugin gone, nothing guards the tool: the booking runs, the
    journal is not touched."""
    from hermes_cli.plugins import get_plugin_manager
    import model_tools  # noqa: F401  (importing it runs plugin discovery)
    checks.check("plugin_not_loaded", PLUGIN_NAME not in get_plugin_manager()._plugins
                 or not get_plugin_manager()._plugins[PLUGIN_NAME].enabled)
    before = events_of(home)
    result = hermes_call("book_trip", {"traveler": "Bob", "destination": "Lisbon"},
                         session_id="session-removed", call_id="call-removed")
    checks.check("booking_ran_again_unrecorded", booked(result) and events_of(home) == before,
                 result=result)


def scenario_gate_closed_again(home: Path, checks: CheckList) -> None:
    """After the recovery the operation is still open: the booking is refused."""
    check_host.check_registrations(checks, "user")
    result = hermes_call("book_trip", {"traveler": "Bob", "destination": "Lisbon"},
                         session_id="session-restored", call_id="call-restored")
    refusal = blocked_document(result) or {}
    checks.check("booking_refused_unresolved", refusal.get("code") == "unresolved_operations",
                 result=result)


SCENARIOS = {"typo_call": scenario_typo_call, "uncertain_booking": scenario_uncertain_booking,
             "booking_after_removal": scenario_booking_after_removal,
             "gate_closed_again": scenario_gate_closed_again}


# --------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------

class LifecycleRun(check_host.HostRun):
    CHILD_SCRIPT = str(Path(__file__).resolve())

    def hermes_words(self, home: Path, *words: str) -> subprocess.CompletedProcess:
        return self.hermes_cli(home, *words)

    def standalone(self, home: Path, *words: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.isolation_prefix + [sys.executable, str(OPERATOR_CLI),
                                                       "--data-dir", str(data_dir_of(home)),
                                                       *words],
                              env=self.child_environment(home), capture_output=True, text=True,
                              timeout=HOST_COMMAND_SECONDS, stdin=subprocess.DEVNULL, cwd=str(home.parent))

    def typo_in_protected_tools(self) -> None:
        label = "typo_in_protected_tools"
        home = self.user_profile(label)
        evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME], entries={
            PLUGIN_NAME: {"settings": {"protected_tools": [TYPO]}}})
        self.run_scenario(label, "typo_call", home)
        for where, ran in (("hermes", self.hermes_words(home, "crash-recovery", "status",
                                                        "--check", "--format", "text")),
                           ("standalone", self.standalone(home, "status", "--check", "--format",
                                                          "text"))):
            lines = ran.stdout.splitlines()
            self.add(label, f"{where}_check_text_says_why_first",
                     ran.returncode == 3 and lines[:1] == ["NEEDS A PERSON (status --check "
                                                           "exits 3):"]
                     and len(lines) > 1 and lines[1].startswith(
                         f"- unmatched_tools: protected_tools names {TYPO}"),
                     code=ran.returncode, output=(ran.stdout + ran.stderr)[-2000:])
        ran = self.hermes_words(home, "crash-recovery", "status", "--check")
        try:
            document = json.loads(ran.stdout)
        except ValueError:
            document = {}
        self.add(label, "hermes_check_json_reasons",
                 ran.returncode == 3 and [reason.get("code") for reason in (
                     document.get("check") or {}).get("reasons", [])] == ["unmatched_tools"]
                 and (document.get("settings") or {}).get("unmatched_tools") == [TYPO],
                 code=ran.returncode, output=ran.stdout[-2000:])

    def config_of(self, home: Path) -> Dict[str, Any]:
        loaded = evidence.load_yaml((home / "config.yaml").read_text(encoding="utf-8"))
        return loaded if isinstance(loaded, dict) else {}

    def plugin_config(self, home: Path) -> Dict[str, Any]:
        plugins = self.config_of(home).get("plugins") or {}
        return {"enabled": PLUGIN_NAME in (plugins.get("enabled") or []),
                "disabled": PLUGIN_NAME in (plugins.get("disabled") or []),
                "settings": ((plugins.get("entries") or {}).get(PLUGIN_NAME) or {}).get(
                    "settings")}

    def journal_bytes(self, home: Path) -> Dict[str, bytes]:
        directory = data_dir_of(home)
        return {name: (directory / name).read_bytes() for name in ("head.json", "initialized")}

    def disable_and_remove_with_an_operation_open(self) -> None:
        label = "disable_and_remove"
        home = self.user_profile(label)
        settings = {"protected_tools": ["book_trip"]}
        evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME],
                               entries={PLUGIN_NAME: {"settings": settings}})
        self.run_scenario(label, "uncertain_booking", home)
        journal = self.journal_bytes(home)
        before = self.plugin_config(home)

        disabled = self.hermes_words(home, "plugins", "disable", PLUGIN_NAME)
        after = self.plugin_config(home)
        output = disabled.stdout + disabled.stderr
        if plugin_set_changes_need_the_network() and self.isolation_prefix:
            self.add(label, "disable_offline_prints_the_hosts_traceback_and_changes_nothing",
                     disabled.returncode != 0 and "Traceback" in output
                     and PACKAGE_MANAGER_REFUSAL in output and after == before,
                     code=disabled.returncode, output=output[-2000:], config=after)
        elif not plugin_set_changes_need_the_network():
            self.add(label, "disable_moves_it_to_disabled_and_keeps_the_settings",
                     disabled.returncode == 0 and after == {"enabled": False, "disabled": True,
                                                            "settings": settings},
                     code=disabled.returncode, output=output[-2000:], config=after)
            command = self.hermes_words(home, "crash-recovery", "status")
            self.add(label, "disabled_plugin_has_no_hermes_command",
                     command.returncode == 2 and "invalid choice: 'crash-recovery'"
                     in command.stderr, code=command.returncode, output=command.stderr[-1000:])
            standalone = self.standalone(home, "status", "--check")
            self.add(label, "standalone_cli_still_reads_the_open_operation",
                     standalone.returncode == 3, code=standalone.returncode,
                     output=standalone.stdout[-1500:])
            evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME],
                                   entries={PLUGIN_NAME: {"settings": settings}})
        self.add(label, "disable_left_the_journal_as_it_was", self.journal_bytes(home) == journal)

        removed = self.hermes_words(home, "plugins", "remove", PLUGIN_NAME)
        after = self.plugin_config(home)
        self.add(label, "remove_deletes_the_plugin_directory",
                 removed.returncode == 0 and not (home / "plugins" / PLUGIN_NAME).exists(),
                 code=removed.returncode, output=(removed.stdout + removed.stderr)[-2000:])
        if settings_wiped_by_remove():
            backups = sorted((home / "backups" / "config").glob("config.yaml.good.*"))
            kept = [path.name for path in backups
                    if "book_trip" in path.read_text(encoding="utf-8", errors="replace")]
            self.add(label, "remove_wipes_the_settings_and_the_enabled_entry",
                     after == {"enabled": False, "disabled": False, "settings": None},
                     config=after)
            self.add(label, "the_hosts_config_backups_keep_the_settings", kept != [],
                     backups=[path.name for path in backups])
        else:
            self.add(label, "remove_keeps_the_settings_and_the_enabled_entry",
                     after == {"enabled": True, "disabled": False, "settings": settings},
                     config=after)
        self.add(label, "remove_left_the_journal_as_it_was", self.journal_bytes(home) == journal)
        self.run_scenario(label, "booking_after_removal", home)

        # The recovery the README gives, per host: the plugin directory back
        # (and on 0.22, offline, plugins.enabled and the settings through
        # `hermes config set`); the operation is still open.
        evidence.copy_plugin_checkout(home / "plugins" / PLUGIN_NAME)
        if settings_wiped_by_remove():
            self.restore_with_config_set(label, home, settings)
        self.add(label, "recovered_config",
                 self.plugin_config(home) == {"enabled": True, "disabled": False,
                                              "settings": settings},
                 config=self.plugin_config(home))
        self.run_scenario(label, "gate_closed_again", home)
        status = self.hermes_words(home, "crash-recovery", "status", "--check")
        self.add(label, "status_check_says_the_operation_is_still_open",
                 status.returncode == 3 and '"unresolved_operations"' in status.stdout,
                 code=status.returncode, output=status.stdout[-1500:])
        self.verify_journal(label, home)


    def restore_with_config_set(self, label: str, home: Path, settings: Dict[str, Any]) -> None:
        """0.22 offline: ``plugins enable`` refuses with the host's traceback;
        ``hermes config set`` writes what it would have (0.22 stores a list
        typed as JSON as a real list)."""
        if self.isolation_prefix:
            enabled = self.hermes_words(home, "plugins", "enable", PLUGIN_NAME)
            output = enabled.stdout + enabled.stderr
            self.add(label, "enable_offline_prints_the_hosts_traceback",
                     enabled.returncode != 0 and "Traceback" in output
                     and PACKAGE_MANAGER_REFUSAL in output, code=enabled.returncode,
                     output=output[-2000:])
        for key, value in (("plugins.enabled", [BOOKING, PLUGIN_NAME]),
                           (f"plugins.entries.{PLUGIN_NAME}.settings.protected_tools",
                            settings["protected_tools"])):
            ran = self.hermes_words(home, "config", "set", key, json.dumps(value))
            self.add(label, f"config_set_{key.rsplit('.', 1)[-1]}", ran.returncode == 0,
                     output=(ran.stdout + ran.stderr)[-1500:])


STEPS = ("disable_and_remove_with_an_operation_open", "typo_in_protected_tools")


def main(argv: Optional[List[str]] = None) -> int:
    return check_host.checker_main(argv, description="crash-recovery: the plugin's life in a "
                                   "real Hermes", steps=STEPS, make_run=LifecycleRun,
                                   scenarios=SCENARIOS, temp_prefix="crash-recovery-lifecycle-")


if __name__ == "__main__":
    raise SystemExit(main())
