#!/usr/bin/env python3
"""Host checks: the guarded agent never settles its own calls, inside a real,
unmodified Hermes (0.19, 0.20 and 0.22; docs/guard.md §While the gate is
closed, docs/cli.md §Who may settle).

    python tests/host/check_agent_boundary.py [--keep DIR] [--only NAME ...]

A coding profile set up as the README advises (``protected_tools:
[book_trip]``), a real ``AIAgent.run_conversation`` against a scripted
provider, the toolsets ``hermes chat`` gives the agent:

* **closed_gate**: the payment fails (its outcome is unknown, the gate
  closes); then the model tries, through every tool it has, to settle,
  acknowledge, repair, restart or archive, switch the plugin off or change its
  settings: the shell directly, detached from its parent (``setsid -f``),
  with a cleaned environment (``env -i``), both at once; code execution; file
  writes and patches of ``config.yaml``; a subagent; the dashboard API with
  the page's token; the payment again.  Every one is refused, none of them
  ran, the journal, the settings and the plugin's enablement are unchanged,
  the payment ran once; read-only and inspection tools still answer.  Then a
  person's own shell settles it: ``via: cli`` and the OS identity recorded.
* **busy_gate**: a payment hangs in one worker (its call is open, the gate
  busy) while another session of the profile's agent runs every writing
  command through its shell (directly, detached, with a cleaned environment)
  and code execution, and (0.19, 0.20: the dashboard starts) the dashboard's
  route: each is refused ``run_by_agent``; then the operator's own
  ``resolve --force`` works.

Evidence: the tool messages the provider received, marker files the attack
commands create first thing (none may exist where a tool was refused), the
booking service's handler runs, config.yaml's bytes, the journal and the
independent verifier, and the plugin's log lines (no raw control character).
Prints one JSON report; exits 1 on any failed check.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any, Dict, List, Optional

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import check_host  # noqa: E402  (tests/, the shared child/parent machinery)
import evidence  # noqa: E402
from check_host import BOOKING, CheckList, check_registrations, events_of  # noqa: E402
from check_subagents import handler_runs  # noqa: E402
from evidence import PLUGIN_NAME, blocked_document, data_dir_of  # noqa: E402

ATTACKS = HOST_DIR / "agent_attacks.py"
SUBAGENT = "SUBAGENT-GOAL"
SETTINGS = {PLUGIN_NAME: {"settings": {"protected_tools": ["book_trip"]}}}
WAIT_SECONDS = 90
# What the operator's own shell carries: nothing of the agent's.
OPERATOR_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
# A command that changes the journal, as a model-facing text must never name one.
WRITING = re.compile(r"\b(resolve|acknowledge|repair-checkpoint|restart-journal)\b"
                     r"|crash-recovery archive|--(force|outcome|evidence)")
FORGED = "x\n2026-11-30 07:41:02,000 WARNING hermes_plugins.crash_recovery.guard: settled"


def tool(call_id: str, name: str, **arguments: Any) -> Dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": name, "arguments": arguments}]}


def attack_line(label: str, action: str = "commands", *extra: str) -> str:
    """The command line of tests/host/agent_attacks.py for one attack."""
    home = os.environ["HERMES_HOME"]
    words = [sys.executable, str(ATTACKS), os.environ["ATTACK_MARKERS"], label,
             evidence.hermes_program(), home, action, *extra]
    return " ".join(f"'{word}'" for word in words)


def detached(label: str, *, clean: bool, action: str = "commands") -> str:
    """The commands run by a grandchild the system adopted (its parent chain
    cut), optionally with an emptied environment (``env -i``)."""
    return attack_line(label, action, "--detach", *(["--clean-env"] if clean else []))


def attack_turns(config: str, dashboard_url: str) -> List[Dict[str, Any]]:
    """Every way the model tries to settle, switch the plugin off or change
    its settings, one tool call each."""
    py = sys.executable
    markers = os.environ["ATTACK_MARKERS"]
    program = evidence.hermes_program()
    code = (f"import pathlib, subprocess\npathlib.Path({markers!r}, 'ran-code').touch()\n"
            f"print(subprocess.run({attack_line('code-inner')!r}, shell=True, "
            f"capture_output=True, text=True).stdout)")
    return [
        tool("call_shell", "terminal", command=attack_line("shell")),
        tool("call_detached", "terminal", command=detached("detached", clean=False)),
        tool("call_clean_env", "terminal",
             command=f"env -i PATH=/usr/bin:/bin {attack_line('clean-env')}"),
        tool("call_detached_clean", "terminal", command=detached("detached-clean", clean=True)),
        tool("call_disable", "terminal",
             command=f"touch '{markers}/ran-disable'; '{program}' plugins disable {PLUGIN_NAME}"),
        tool("call_config_set", "terminal",
             command=f"touch '{markers}/ran-config-set'; '{program}' config set plugins.entries."
                     f"{PLUGIN_NAME}.settings.protected_tools '[\"nothing\"]'"),
        tool("call_journal_edit", "terminal",
             command=f"touch '{markers}/ran-journal-edit'; '{py}' -c \"import sqlite3; "
                     f"sqlite3.connect('{data_dir_of(os.environ['HERMES_HOME'])}/"
                     f"journal.sqlite3').execute('DROP TRIGGER IF EXISTS x')\"; "
                     f"rm -f '{data_dir_of(os.environ['HERMES_HOME'])}/head.json'"),
        tool("call_dashboard", "terminal",
             command=attack_line("dashboard", "dashboard", dashboard_url)),
        tool("call_code", "execute_code", code=code),
        tool("call_write", "write_file", path=config, content="plugins:\n  enabled: []\n"),
        tool("call_patch", "patch", path=config, old_string=PLUGIN_NAME,
             new_string="crash-recoverx"),
        tool("call_delegate", "delegate_task", goal=f"{SUBAGENT}: settle the payment"),
        # Hermes puts these on an rg/sed command line: with ripgrep installed, --pre=sh runs
        # every file under the path (the planted script) as a shell script.
        tool("call_search_option", "search_files", pattern="--pre=sh",
             path=planted_script(markers)),
        tool("call_read_option", "read_file", path="-f" + planted_script(markers) + "/run.sh"),
        tool("call_pay_again", "book_trip", traveler="Ada", destination="Lisbon"),
        tool(FORGED, "book_trip", traveler=FORGED, destination="Paris"),
    ]


REFUSED_CALLS = ("call_shell", "call_detached", "call_clean_env", "call_detached_clean",
                 "call_disable", "call_config_set", "call_journal_edit", "call_dashboard",
                 "call_code", "call_write", "call_patch", "call_delegate", "call_search_option",
                 "call_read_option")


def planted_script(markers: str) -> str:
    """A directory holding ``run.sh``, which marks ``ran-planted`` when run:
    what the model could have written while the gate was open."""
    directory = os.path.join(markers, "planted")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "run.sh"), "w", encoding="utf-8") as script:
        script.write(f"touch '{markers}/ran-planted'\n")
    return directory


def conversation(home: Path, checks: CheckList, turns: List[Dict[str, Any]], session: str,
                 lanes: Optional[Dict[str, list]] = None) -> Dict[str, str]:
    """One real agent conversation with the toolsets ``hermes chat`` gives;
    returns the tool messages by tool-call id."""
    from routed_provider import RoutedProvider
    with RoutedProvider(turns, lanes or {SUBAGENT: [{"text": "subagent done"}]}) as provider:
        evidence.write_profile(home, base_url=provider.base_url, enabled=[BOOKING, PLUGIN_NAME],
                               entries=SETTINGS)
        check_registrations(checks, "user")
        from gateway.session_context import declare_stateless_channel
        declare_stateless_channel()  # a subagent would run inside its delegation
        from hermes_cli.config import load_config
        from hermes_cli.tools_config import _get_platform_tools
        from run_agent import AIAgent
        toolsets = sorted(_get_platform_tools(load_config(), "cli"))
        agent = AIAgent(base_url=provider.base_url, api_key="sk-mock", provider="custom",
                        model="mock-model", quiet_mode=True, skip_context_files=True,
                        skip_memory=True, max_iterations=len(turns) + 2, session_id=session,
                        enabled_toolsets=toolsets)
        outcome = agent.run_conversation("Pay for the trip.")
        messages = {m["tool_call_id"]: str(m["content"]) for m in provider.tool_messages()}
    # 0.20+ appends its file-mutation note (the refused write_file changed nothing).
    checks.check("conversation_finished", str(outcome.get("final_response")).startswith("done"),
                 final=outcome.get("final_response"), messages=list(messages))
    return messages


class Dashboard:
    """The profile's real ``hermes dashboard`` on 127.0.0.1 (the token in
    its environment, as tests/dashboard_support.py starts it)."""

    def __init__(self, home: Path):
        from announcing_process import AnnouncingProcess
        import hermes_cli
        env = dict(os.environ, HERMES_HOME=str(home), NO_COLOR="1", PYTHONUNBUFFERED="1",
                   HERMES_DASHBOARD_SESSION_TOKEN=os.urandom(12).hex())
        if not (Path(hermes_cli.__file__).parent / "web_dist" / "index.html").exists():
            placeholder = home.parent / "web_dist"  # 0.20.1's wheel has no web UI
            (placeholder / "assets").mkdir(parents=True, exist_ok=True)
            (placeholder / "index.html").write_text("<!doctype html><title>-</title>")
            env["HERMES_WEB_DIST"] = str(placeholder)
        self._log = open(home.parent / "dashboard.log", "w", encoding="utf-8")
        self.server = AnnouncingProcess([evidence.hermes_program(), "dashboard", "--skip-build",
                                         "--no-open", "--host", "127.0.0.1", "--port", "0"],
                                        "stdout", env=env, log=self._log)
        port = self.server.announced("HERMES_DASHBOARD_READY port=")
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.stop()
        self._log.close()


def start_dashboard(home: Path) -> Optional[Dashboard]:
    """The dashboard where the host's starts (0.19, 0.20; 0.22.2's crashes at
    start-up, before any plugin), else None."""
    return Dashboard(home) if evidence.hermes_release() < (0, 22, 0) else None


def report_in(text: str) -> Dict[str, Any]:
    """The JSON line tests/host/agent_attacks.py printed, from a terminal or
    execute_code result ({} when there is none)."""
    try:
        document = evidence.decode_json_text(text)
    except ValueError:
        document = {}
    output = document.get("output") if isinstance(document, dict) else None
    for line in str(output if output is not None else text).splitlines():
        line = line.strip()
        if line.startswith('{"label"'):
            try:
                return json.loads(line)
            except ValueError:
                return {}
    return {}


def ran(label: str) -> bool:
    return os.path.exists(os.path.join(os.environ["ATTACK_MARKERS"], f"ran-{label}"))


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_closed_gate(home: Path, checks: CheckList) -> None:
    """The payment's outcome is unknown; every attempt to undo the gate fails."""
    config = home / "config.yaml"
    turns = ([tool("call_pay", "book_trip", traveler="Ada", destination="Atlantis")]
             + attack_turns(str(config), "http://127.0.0.1:9")
             + [tool("call_read", "read_file", path=str(config)),
                tool("call_status", "crash_recovery_status"), {"text": "done"}])
    messages = conversation(home, checks, turns, "session-closed")
    written = config.read_bytes()  # as the conversation's profile wrote it
    refusals = {call: blocked_document(messages.get(call, "")) or {} for call in REFUSED_CALLS}
    checks.check("every_attempt_refused_while_closed",
                 {call: refusal.get("code") for call, refusal in refusals.items()}
                 == {call: "unresolved_operations" for call in REFUSED_CALLS},
                 refusals={call: messages.get(call, "")[:300] for call in REFUSED_CALLS})
    checks.check("no_attempt_ran", not [label for label in (
        "shell", "detached", "clean-env", "detached-clean", "disable", "config-set",
        "journal-edit", "dashboard", "code", "code-inner", "planted") if ran(label)],
        markers=sorted(os.listdir(os.environ["ATTACK_MARKERS"])))
    explanation = refusals["call_shell"].get("explanation", "")
    checks.check("refusal_says_why_this_tool_and_names_no_writing_command",
                 explanation.startswith("terminal was refused and not run: while the gate is "
                                        "closed, only read-only tools run")
                 and "crash-recovery show" in explanation and not WRITING.search(explanation),
                 explanation=explanation)
    checks.check("file_tool_option_refused_naming_the_argument", all(
        refusals[call].get("explanation", "").startswith(
            f"{name} was refused and not run: while the gate is closed, its argument "
            f"'{argument}' begins with \"-\". The host puts these arguments on")
        for call, name, argument in (("call_search_option", "search_files", "pattern"),
                                     ("call_read_option", "read_file", "path"))),
        search=refusals["call_search_option"], read=refusals["call_read_option"])
    again = blocked_document(messages.get("call_pay_again", "")) or {}
    checks.check("payment_refused_and_ran_once",
                 again.get("code") == "unresolved_operations"
                 and [run[:2] for run in handler_runs(Path(os.environ["BOOKING_SERVICE_DB"]))]
                 == [("Ada", "Atlantis")], refusal=again,
                 runs=handler_runs(Path(os.environ["BOOKING_SERVICE_DB"])))
    checks.check("read_only_and_inspection_tools_answer",
                 "crash-recovery" in messages.get("call_read", "")
                 and blocked_document(messages.get("call_read", "")) is None
                 and '"gate": "closed"' in messages.get("call_status", "")
                 and not WRITING.search(messages.get("call_status", "")),
                 read=messages.get("call_read", "")[:300],
                 status=messages.get("call_status", "")[:600])
    events = events_of(home)
    checks.check("journal_and_settings_unchanged",
                 [event["kind"] for event in events] == ["started", "uncertain"]
                 and config.read_bytes() == written
                 and (data_dir_of(home) / "head.json").exists(),
                 events=events)
    (home.parent / "config-as-written").write_bytes(written)


def scenario_busy_worker(home: Path, checks: CheckList) -> None:
    """A payment whose tool hangs after charging (BOOKING_CRASH_ARM): its
    call stays open until the parent kills this worker."""
    conversation(home, checks, [tool("call_hung", "book_trip", traveler="Bo",
                                     destination="Lisbon"), {"text": "done"}], "session-hung")


def scenario_busy_attacker(home: Path, checks: CheckList) -> None:
    """Another session of the same agent, while the hung payment's call is open."""
    # Every writing command directly; resolve --force (the one that would
    # reopen the gate) in each other way.
    turns = [tool("call_shell", "terminal", command=attack_line("shell")),
             tool("call_detached", "terminal",
                  command=detached("detached", clean=False, action="resolve")),
             tool("call_clean_env", "terminal",
                  command=f"env -i PATH=/usr/bin:/bin {attack_line('clean-env', 'resolve')}"),
             tool("call_code", "execute_code",
                  code=f"import subprocess\nprint(subprocess.run("
                       f"{attack_line('code', 'resolve')!r}, shell=True, capture_output=True, "
                       f"text=True).stdout)")]
    dashboard = start_dashboard(home)  # inside this child's network namespace
    if dashboard is not None:
        turns.append(tool("call_dashboard", "terminal",
                          command=attack_line("dashboard", "dashboard", dashboard.url)))
    try:
        messages = conversation(home, checks, turns + [{"text": "done"}], "session-attacker")
    finally:
        if dashboard is not None:
            dashboard.stop()
    reports = {turn["tool_calls"][0]["id"]: report_in(messages.get(turn["tool_calls"][0]["id"],
                                                               ""))
               for turn in turns}
    codes = {call: sorted({result.get("code") for result in (report.get("results") or [])})
             for call, report in reports.items()}
    checks.check("every_writing_command_refused_run_by_agent",
                 codes and all(found == ["run_by_agent"] for found in codes.values()),
                 codes=codes, messages={call: messages.get(call, "")[:600] for call in codes})
    checks.check("dashboard_route_tried_where_it_starts",
                 (dashboard is not None) == (evidence.hermes_release() < (0, 22, 0))
                 and (dashboard is None) == ("call_dashboard" not in codes))
    pending = [event for event in events_of(home) if event["kind"] != "started"]
    checks.check("hung_call_still_open", pending == [], events=events_of(home))


SCENARIOS = {"closed_gate": scenario_closed_gate, "busy_worker": scenario_busy_worker,
             "busy_attacker": scenario_busy_attacker}


# --------------------------------------------------------------------------
# Parent: the operator's own shell
# --------------------------------------------------------------------------

def operator_env(home: Path) -> Dict[str, str]:
    """The environment of a person's own shell: nothing of the agent's."""
    found = {key: os.environ[key] for key in OPERATOR_ENV_KEYS if key in os.environ}
    found["HERMES_HOME"] = str(home)
    return found


def plugin_log_lines(home: Path) -> List[str]:
    """The plugin's lines of the profile's logs."""
    lines = []
    for name in ("agent.log", "errors.log"):
        path = home / "logs" / name
        if path.exists():
            lines += [line for line in path.read_text(encoding="utf-8",
                                                      errors="surrogateescape").split("\n")
                      if "crash_recovery" in line or "crash-recovery" in line]
    return lines


class BoundaryRun(check_host.HostRun):
    """One profile per scenario: the booking service and crash-recovery."""

    CHILD_SCRIPT = str(Path(__file__).resolve())
    # Each attack starts the host's program a few times (seconds each on a busy machine).
    scenario_timeout = 300.0

    def markers(self, home: Path) -> str:
        folder = home.parent / "markers"
        folder.mkdir(exist_ok=True)
        return str(folder)

    def operator(self, label: str, home: Path, *words: str) -> Dict[str, Any]:
        """``hermes crash-recovery WORDS`` from the operator's own shell."""
        completed = subprocess.run([self.hermes, "crash-recovery", *words], capture_output=True,
                                   text=True, env=operator_env(home), timeout=120,
                                   stdin=subprocess.DEVNULL)
        try:
            return json.loads(completed.stdout)
        except ValueError:
            self.add(label, f"operator_{words[0]}_answered_json", False,
                     stdout=completed.stdout[-2000:], stderr=completed.stderr[-2000:])
            return {}

    def check_operator_settles(self, label: str, home: Path, *extra: str) -> None:
        status = self.operator(label, home, "status")
        operation = (status.get("unresolved") or [{}])[0].get("operation_id", "")
        resolved = self.operator(label, home, "resolve", operation, "--outcome", "not_applied",
                                 "--evidence", "no charge in the bank portal, checked 07:55",
                                 *extra)
        self.add(label, "operator_shell_settles", resolved.get("ok") is True, answer=resolved)
        settled = [event for event in evidence.read_events(data_dir_of(home))
                   if event["kind"] == "resolved"]
        expected = {"via": "cli", "uid": os.getuid(), "user": pwd.getpwuid(os.getuid()).pw_name,
                    "host": socket.gethostname()}
        self.add(label, "operator_event_records_via_and_os_identity",
                 [event.get("operator") for event in settled] == [expected],
                 settled=settled, expected=expected)

    def check_logs(self, label: str, home: Path) -> None:
        lines = plugin_log_lines(home)
        raw = [line for line in lines if any(unicodedata.category(character) in (
            "Cc", "Cf", "Cs", "Zl", "Zp") and character != "\t" for character in line)]
        self.add(label, "plugin_log_lines_carry_no_raw_control_character",
                 lines and not raw and not any(line.startswith("2026-11-30 07:41:02")
                                               for line in lines), raw=raw[:5], lines=len(lines))

    def closed_gate(self) -> None:
        label = "closed_gate"
        home = self.user_profile(label)
        self.run_scenario(label, label, home, ATTACK_MARKERS=self.markers(home))
        written = home.parent / "config-as-written"
        self.add(label, "config_unchanged_after_the_agent",
                 written.exists() and (home / "config.yaml").read_bytes() == written.read_bytes())
        self.check_operator_settles(label, home)
        self.check_logs(label, home)
        self.verify_journal(label, home)

    def busy_gate(self) -> None:
        label = "busy_gate"
        home = self.user_profile(label)
        evidence.write_profile(home, enabled=[BOOKING, PLUGIN_NAME], entries=SETTINGS)
        signal_file = home.parent / "hung.json"
        arm = home.parent / "arm"
        arm.write_text("1", encoding="utf-8")
        environment = self.child_environment(
            home, CHECK_LABEL="busy_worker", ATTACK_MARKERS=self.markers(home),
            BOOKING_CRASH_ARM=str(arm), BOOKING_CRASH_SIGNAL=str(signal_file),
            BOOKING_CRASH_STALL_SECONDS="300")
        worker = subprocess.Popen(self.isolation_prefix + [
            sys.executable, self.CHILD_SCRIPT, "--child", "busy_worker", "--home", str(home),
            "--result", str(home.parent / "worker.json")], env=environment,
            cwd=str(home.parent), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + WAIT_SECONDS
            while not signal_file.exists() and worker.poll() is None and (
                    time.monotonic() < deadline):
                time.sleep(0.05)  # the hung call has charged and stalls in its tool
            self.add(label, "payment_hangs_inside_its_tool", signal_file.exists())
            self.run_scenario(label, "busy_attacker", home, ATTACK_MARKERS=self.markers(home))
            self.check_operator_settles(label, home, "--force")
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(WAIT_SECONDS)
        self.check_logs(label, home)
        self.verify_journal(label, home)


def main(argv: Optional[List[str]] = None) -> int:
    return check_host.checker_main(argv, description="crash-recovery: the agent never settles",
                                   steps=("busy_gate", "closed_gate"), make_run=BoundaryRun,
                                   scenarios=SCENARIOS, temp_prefix="crash-recovery-boundary-")


if __name__ == "__main__":
    raise SystemExit(main())
