"""The deployment checks' operator side (tests/host/check_deployment.py):
``hermes [-p PROFILE] crash-recovery ...`` as real subprocesses against
``operator_cli.py --data-dir DIR`` (same JSON, same exit codes), the command
printed in a blocked result (``show``) run as printed, the resolution from the
operator's own shell, and a sticky profile.

:class:`OperatorCommands` is a mixin of check_deployment's ``DeploymentRun``
(it uses its ``run``, ``operator``, ``add``, ``base_environment`` and
``hermes``). Standard library only; Hermes runs in the subprocesses.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import evidence
from evidence import data_dir_of, kinds

PROFILE = "work"  # the named profile of the `profiles` step
# The host's program as an operator types it: `hermes`, or `hermesx` where
# only that is installed (Hermes 0.20.1); every printed command must name it.
PROGRAM = evidence.hermes_program_name()
# How the default profile's commands may be spelled: plain, or pinned with
# `-p default` (which also holds when another profile is made sticky).
DEFAULT_PREFIXES = (f"{PROGRAM} crash-recovery", f"{PROGRAM} -p default crash-recovery")
RESOLVE_EVIDENCE = "checked the booking service: no booking row and no charge for this call"


def without_volatile(value: Any, top: bool = True) -> Any:
    """A result with the fields that change between two runs (ages) removed,
    and the documented differences of ``hermes crash-recovery status``: it
    shows the profile's settings as config.yaml holds them (the stand-alone CLI
    cannot read config.yaml: it shows those the last worker recorded), and
    ``next`` is written as it is run there."""
    if isinstance(value, dict):
        return {key: without_volatile(item, False) for key, item in value.items()
                if key not in ("age_seconds", "next") and not (top and key == "settings")}
    if isinstance(value, list):
        return [without_volatile(item, False) for item in value]
    return value


def prometheus_samples(text: str) -> List[str]:
    """Sample lines without the one that holds an age, and without the gauges
    of the settings (only ``hermes crash-recovery`` knows them)."""
    return [line for line in text.splitlines()
            if line and not line.startswith("crash_recovery_oldest_unresolved_age_seconds")
            and not any(name in line for name in ("crash_recovery_settings_problem",
                                                  "crash_recovery_unmatched_tools",
                                                  "crash_recovery_settings_attention",
                                                  "crash_recovery_agent_reaches_journal"))]


class Ran:
    """A finished command: exit code, stdout, parsed JSON (or None)."""

    def __init__(self, completed: subprocess.CompletedProcess) -> None:
        self.code = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        try:
            self.json = json.loads(completed.stdout)
        except ValueError:
            self.json = None

    def detail(self) -> Dict[str, Any]:
        return {"code": self.code, "stdout": self.stdout[-2500:], "stderr": self.stderr[-1500:]}


class OperatorCommands:
    """``hermes crash-recovery ...`` against the stand-alone operator CLI."""

    def cli_commands(self, label: str, fake_home: Path, default: Path, named: Path,
                     facts: Dict[str, Any]) -> None:
        """``hermes [-p work] crash-recovery ...`` against ``operator_cli.py``."""
        named_dir, default_dir = data_dir_of(named), data_dir_of(default)
        user = self.base_environment(HOME=str(fake_home))
        via_home = self.base_environment(HOME=str(fake_home), HERMES_HOME=str(named))
        cwd = fake_home.parent
        work_op, default_op = facts.get("relay_operation"), facts.get("default_operation")

        def hermes(*words: str, environment: Dict[str, str] = user) -> Ran:
            return self.run([self.hermes, *words], environment, cwd)

        def same(name: str, ours: Ran, reference: Ran, code: int) -> None:
            self.add(label, name, ours.code == reference.code == code
                     and ours.json is not None
                     and without_volatile(ours.json) == without_volatile(reference.json),
                     hermes=ours.detail(), operator_cli=reference.detail(), expected_code=code)

        reference = self.operator(named_dir, "status")
        same("status_named_profile", hermes("-p", PROFILE, "crash-recovery", "status"),
             reference, 0)
        self.add(label, "status_names_named_operation",
                 [o.get("operation_id") for o in (reference.json or {}).get("unresolved", [])]
                 == [work_op], reference=reference.detail())
        same("status_hermes_home", hermes("crash-recovery", "status", environment=via_home),
             reference, 0)
        same("show_hermes_home", hermes("crash-recovery", "show", str(work_op),
                                        environment=via_home),
             self.operator(named_dir, "show", str(work_op)), 0)
        same("status_default_profile", hermes("crash-recovery", "status"),
             self.operator(default_dir, "status"), 0)
        ours = hermes("-p", PROFILE, "crash-recovery", "status", "--check")
        same("status_check_exit_3", ours, self.operator(named_dir, "status", "--check"), 3)
        ours = hermes("-p", PROFILE, "crash-recovery", "--format", "prometheus", "status")
        theirs = self.operator(named_dir, "--format", "prometheus", "status")
        self.add(label, "prometheus_same",
                 ours.code == theirs.code == 0
                 and prometheus_samples(ours.stdout) == prometheus_samples(theirs.stdout)
                 and re.search(r"^crash_recovery_unresolved_operations\{[^}]*\} 1$", ours.stdout,
                               re.MULTILINE) is not None,
                 hermes=ours.detail(), operator_cli=theirs.detail())
        same("show_named_profile", hermes("-p", PROFILE, "crash-recovery", "show", str(work_op)),
             self.operator(named_dir, "show", str(work_op)), 0)
        text = hermes("-p", PROFILE, "crash-recovery", "status", "--format", "text")
        self.add(label, "status_text_names_profile_command",
                 text.code == 0 and f"{PROGRAM} -p {PROFILE} crash-recovery resolve {work_op}"
                 in text.stdout and "operator_cli" not in text.stdout, **text.detail())
        ours = hermes("-p", PROFILE, "crash-recovery", "resolve", str(work_op), "--outcome",
                      "completed")
        theirs = self.operator(named_dir, "resolve", str(work_op), "--outcome", "completed")
        self.add(label, "usage_error_json_exit_1",
                 ours.code == theirs.code == 1 and (ours.json or {}).get("error", {}).get("code")
                 == (theirs.json or {}).get("error", {}).get("code") == "usage",
                 hermes=ours.detail(), operator_cli=theirs.detail())
        self.add(label, "usage_error_changed_nothing",
                 kinds(evidence.read_events(named_dir)) == ["started", "uncertain"])
        # Words argparse leaves to Hermes' own parser answer as JSON too, not Hermes' usage.
        for name, words in (("unknown_option", ("status", "--no-such-option")),
                            ("unknown_command", ("no-such-command",))):
            ours = hermes("-p", PROFILE, "crash-recovery", *words)
            self.add(label, f"usage_error_{name}_json_exit_1",
                     ours.code == 1 and (ours.json or {}).get("error", {}).get("code") == "usage",
                     **ours.detail())
        shown = hermes("-p", PROFILE, "crash-recovery", "--help")
        self.add(label, "help_needs_no_file",
                 shown.code == 0 and "restart-journal" in shown.stdout
                 and "docs/" not in shown.stdout, **shown.detail())

        # The command the model was told to pass on (how a person looks at the
        # operation), run as printed; then the person settles it from their own shell.
        for name, line, prefix, home_dir, operation in (
                ("named", facts.get("relay_show"), [PROGRAM, "-p", PROFILE, "crash-recovery"],
                 named_dir, work_op),
                ("default", facts.get("default_show"),
                 shlex.split(facts.get("default_prefix") or DEFAULT_PREFIXES[0]),
                 default_dir, default_op)):
            words = shlex.split(line) if line else []
            expected = [*prefix, "show", operation]
            self.add(label, f"printed_show_command_{name}", words == expected, line=line,
                     expected=expected)
            if words != expected:
                continue
            shown_op = self.run([self.hermes if word == PROGRAM else word for word in words],
                                user, cwd)
            self.add(label, f"printed_show_command_shows_{name}",
                     shown_op.code == 0 and (shown_op.json or {}).get("operation", {}).get(
                         "operation_id") == operation, **shown_op.detail())
            ran = self.run([self.hermes, *prefix[1:], "resolve", operation, "--outcome",
                            "not_applied", "--evidence", RESOLVE_EVIDENCE], user, cwd)
            document = ran.json or {}
            self.add(label, f"operator_resolve_settles_{name}",
                     ran.code == 0 and document.get("resolved") == operation
                     and document.get("outcome") == "not_applied"
                     and document.get("previous_state") == "uncertain"
                     and document.get("tool") == "book_trip"
                     and document.get("data_dir") == str(home_dir), **ran.detail())
            events = evidence.read_events(home_dir)
            self.add(label, f"resolution_journaled_{name}",
                     kinds(events) == ["started", "uncertain", "resolved"]
                     and events[-1].get("evidence") == RESOLVE_EVIDENCE
                     and events[-1].get("operator", {}).get("via") == "cli", events=events)
        same("status_check_exit_0_when_clear",
             hermes("-p", PROFILE, "crash-recovery", "status", "--check"),
             self.operator(named_dir, "status", "--check"), 0)
        same("status_check_default_exit_0_when_clear", hermes("crash-recovery", "status", "--check"),
             self.operator(default_dir, "status", "--check"), 0)
        ours = hermes("-p", PROFILE, "crash-recovery", "--format", "prometheus", "status")
        self.add(label, "prometheus_clear",
                 ours.code == 0 and re.search(r"^crash_recovery_unresolved_operations\{[^}]*\} 0$",
                                              ours.stdout, re.MULTILINE) is not None,
                 **ours.detail())
        same("resolve_again_refused",
             hermes("-p", PROFILE, "crash-recovery", "resolve", str(work_op), "--outcome",
                    "completed", "--evidence", "again"),
             self.operator(named_dir, "resolve", str(work_op), "--outcome", "completed",
                           "--evidence", "again"), 1)
        same("show_resolved", hermes("-p", PROFILE, "crash-recovery", "show", str(work_op)),
             self.operator(named_dir, "show", str(work_op)), 0)

        # `hermes profile use work` makes `work` sticky: a command without -p then
        # runs in `work`. The default profile's printed command must still reach
        # the default profile.
        printed = shlex.split(str(facts.get("default_status") or ""))
        sticky = fake_home / ".hermes" / "active_profile"
        used = self.run([self.hermes, "profile", "use", PROFILE], user, cwd)
        ran = self.run([self.hermes if word == PROGRAM else word for word in printed], user, cwd) \
            if printed[:1] == [PROGRAM] else None
        self.add(label, "default_command_reaches_default_profile_when_another_is_sticky",
                 used.code == 0 and sticky.exists() and ran is not None and ran.code == 0
                 and (ran.json or {}).get("data_dir") == str(default_dir),
                 printed=printed, profile_use=used.detail(),
                 ran=ran.detail() if ran is not None else None)
