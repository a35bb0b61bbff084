#!/usr/bin/env python3
"""Host checks: delayed plugin discovery never lets a protected tool run
unjournaled, inside a real, unmodified Hermes (0.19, 0.20 and 0.22;
docs/guard.md §Inside Hermes, "The gate on every path").

    python tests/host/check_discovery_race.py [--keep DIR] [--only NAME ...]

A test plugin (tests/host/slow_discovery_plugin) whose registration waits on
a file the check releases sorts between the booking service and
crash-recovery, so while it waits, discovery is still running and
crash-recovery is not registered.

* **startup**: the session starts while discovery is still running -- on
  0.20 and 0.22 started in the background by the entry point
  ``hermes_cli/main.py`` uses for agent commands
  (``hermes_cli.plugins.start_background_plugin_discovery``), on 0.19 run by
  the session's own import of ``model_tools`` (0.19 has no background
  discovery).  The host makes the session wait for discovery before it asks
  the model anything (0.20+: ``discover_plugins`` joins the background thread,
  then takes the manager's lock): the model's first call is journaled and
  runs once.  (The join gives up after 30 s; on a loaded machine the session
  may then start without the plugins' tools, and the call must be refused
  with nothing run or journaled: the check says which happened.)
* **forced_rediscovery** (0.20, 0.22): a plugin reload
  (``discover_plugins(force=True)``, what a live gateway's plugin rewire
  runs) is in flight when the model's protected call arrives; the host reads
  its middleware list (crash-recovery not registered: only the probe), and
  the probe (tests/host/race_probe_plugin) lets the reload finish inside the
  call, so that crash-recovery's ``pre_tool_call`` hook runs inside the
  host's execution middleware with no admission bound: it refuses the call
  (``middleware_not_run``), the tool never runs, nothing is journaled; the
  next call, after the reload, is journaled and runs once.  On 0.19 the hooks
  run before the middleware list is read, so a reload in flight leaves a call
  with no crash-recovery at all (docs/guard.md says so); not run there.

Prints one JSON report; exits 1 on any failed check.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HOST_DIR = Path(__file__).resolve().parent
TESTS_DIR = HOST_DIR.parent
sys.path.insert(0, str(HOST_DIR))
sys.path.insert(0, str(TESTS_DIR))

import check_host  # noqa: E402  (tests/, the shared child/parent machinery)
import evidence  # noqa: E402
from check_host import BOOKING, CheckList, check_registrations, events_of  # noqa: E402
from check_host_refusals import outcome_reasons  # noqa: E402
from check_subagents import handler_runs  # noqa: E402
from evidence import PLUGIN_NAME, blocked_document  # noqa: E402

SLOW = "c-slow-discovery"
PROBE = "0-race-probe"
WAIT_SECONDS = 120


def tool(call_id: str, name: str, **arguments: Any) -> Dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": name, "arguments": arguments}]}


def write_config(home: Path, base_url: str, enabled: List[str]) -> None:
    """The profile, with plugin loads inline (0.22's per-plugin deadline off,
    so the slow plugin holds discovery as long as it waits)."""
    evidence.write_profile(home, base_url=base_url, enabled=enabled)
    config = json.loads((home / "config.yaml").read_text(encoding="utf-8"))
    config["plugins"]["load_timeout_seconds"] = 0
    (home / "config.yaml").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def wait_for(path: str) -> bool:
    deadline = time.monotonic() + WAIT_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def run_agent(provider: Any, checks: CheckList, session: str, turns: int) -> Dict[str, str]:
    from run_agent import AIAgent
    agent = AIAgent(base_url=provider.base_url, api_key="sk-mock", provider="custom",
                    model="mock-model", quiet_mode=True, skip_context_files=True,
                    skip_memory=True, max_iterations=turns + 2, session_id=session)
    outcome = agent.run_conversation("Book the trips.")
    messages = {m["tool_call_id"]: str(m["content"]) for m in provider.tool_messages()}
    checks.check("conversation_finished", str(outcome.get("final_response")).startswith("done"),
                 final=outcome.get("final_response"), messages=messages)
    return messages


# --------------------------------------------------------------------------
# Scenarios (each runs in a child process; HERMES_HOME is already set)
# --------------------------------------------------------------------------

def scenario_startup(home: Path, checks: CheckList) -> None:
    """The session starts while discovery waits on the slow plugin."""
    from mock_provider import ScriptedProvider
    turns = [tool("call_first", "book_trip", traveler="Ada", destination="Lisbon"),
             {"text": "done"}]
    with ScriptedProvider(turns) as provider:
        write_config(home, provider.base_url, [BOOKING, SLOW, PLUGIN_NAME])
        import hermes_cli.plugins as plugins
        background = hasattr(plugins, "start_background_plugin_discovery")
        checks.check("background_discovery_where_the_host_has_it",
                     background == (evidence.hermes_release() >= (0, 20, 0)),
                     hermes=evidence.hermes_version())
        seen = {}

        def release_once_waiting() -> None:
            seen["entered"] = wait_for(os.environ["DISCOVERY_ENTERED"])
            seen["model_asked_before_release"] = len(provider.chat_requests())
            Path(os.environ["DISCOVERY_RELEASE"]).write_text("go", encoding="utf-8")

        releaser = threading.Thread(target=release_once_waiting, daemon=True)
        releaser.start()
        gave_up = []  # the host's join of the discovery timed out (30 s on 0.20+)
        if background:
            join = plugins._join_background_discovery

            def recording_join(*args: Any, **kwargs: Any) -> None:
                join(*args, **kwargs)
                thread = plugins._background_discovery_thread
                if thread is not None and thread.is_alive() \
                        and thread is not threading.current_thread():
                    gave_up.append(True)
            plugins._join_background_discovery = recording_join
            plugins.start_background_plugin_discovery()  # hermes_cli/main.py's entry point
        messages = run_agent(provider, checks, "session-startup", len(turns))
        releaser.join(WAIT_SECONDS)
    check_registrations(checks, "user")
    checks.check("discovery_was_running_when_the_session_started",
                 seen.get("entered") is True and seen.get("model_asked_before_release") == 0,
                 seen=seen)
    runs = handler_runs(Path(os.environ["BOOKING_SERVICE_DB"]))
    try:
        code = json.loads(messages.get("call_first") or "{}").get("code")
    except ValueError:
        code = None  # the host's own answer: still nothing may have run
    # The host built the session without the plugins' tools: seen by the timed-out
    # join, or -- when discovery finished between the join's timeout and the look
    # at its thread -- by the call the host could not resolve.
    if gave_up or code == "bridge_call_unresolved":
        # A loaded machine: the host stopped waiting for discovery and built the
        # session without the plugins' tools.  Then the promise is that the call
        # never ran unjournaled: refused by name, nothing run, nothing journaled.
        print(f"  the host stopped waiting for plugin discovery ({len(gave_up)} join(s) seen "
              f"timing out, first call {code}): checking the refusal instead", file=sys.stderr)
        Path(os.environ["DISCOVERY_GAVE_UP"]).write_text("yes", encoding="utf-8")
        checks.check("first_call_journaled_and_ran_once",
                     code in ("bridge_call_unresolved", None) and runs == []
                     and events_of(home) == [], code=code, events=events_of(home), runs=runs,
                     message=messages.get("call_first"))
        return
    checks.check("first_call_journaled_and_ran_once",
                 outcome_reasons(events_of(home)) == {
                     "call_first": ("book_trip", "returned", "returned")}
                 and [run[:2] for run in runs] == [("Ada", "Lisbon")],
                 events=events_of(home), runs=runs, message=messages.get("call_first"))


def scenario_forced_rediscovery(home: Path, checks: CheckList) -> None:
    """A plugin reload is in flight when the protected call arrives."""
    from mock_provider import ScriptedProvider
    notes = home.parent / "notes.txt"
    notes.write_text("trip notes\n", encoding="utf-8")
    turns = [tool("call_read", "read_file", path=str(notes)),
             tool("call_raced", "book_trip", traveler="Ada", destination="Lisbon"),
             tool("call_after", "book_trip", traveler="Ada", destination="Porto"),
             {"text": "done"}]
    Path(os.environ["DISCOVERY_RELEASE"]).write_text("go", encoding="utf-8")  # start-up's
    with ScriptedProvider(turns) as provider:
        write_config(home, provider.base_url, [PROBE, BOOKING, SLOW, PLUGIN_NAME])
        check_registrations(checks, "user")
        messages = run_agent(provider, checks, "session-reload", len(turns))
    steps = [json.loads(line) for line in
             Path(os.environ["RACE_PROBE_LOG"]).read_text(encoding="utf-8").splitlines()]
    checks.check("reload_in_flight_when_the_call_arrived", steps == [
        {"step": "reload_started", "entered": True},
        {"step": "released_inside_the_call", "call": "call_raced", "reload_done": True}],
        steps=steps)
    refusal = blocked_document(messages.get("call_raced", "")) or {}
    checks.check("unwrapped_call_refused_by_the_hook", refusal.get("code") == "middleware_not_run",
                 message=messages.get("call_raced"))
    runs = handler_runs(Path(os.environ["BOOKING_SERVICE_DB"]))
    checks.check("refused_call_never_ran_the_next_ran_once_journaled",
                 [run[:2] for run in runs] == [("Ada", "Porto")]
                 and outcome_reasons(events_of(home)) == {
                     "call_after": ("book_trip", "returned", "returned")},
                 runs=runs, events=events_of(home))
    log = (home / "logs" / "agent.log").read_text(encoding="utf-8", errors="replace")
    checks.check("refusal_logged", "without crash-recovery's middleware" in log)


SCENARIOS = {"startup": scenario_startup, "forced_rediscovery": scenario_forced_rediscovery}


# --------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------

class RaceRun(check_host.HostRun):
    """One profile per scenario: the booking service, the slow plugin, the
    probe (forced_rediscovery) and crash-recovery."""

    CHILD_SCRIPT = str(Path(__file__).resolve())
    # A session that waits for the host's discovery (0.22 joins it for up to
    # 30 s) took over 120 s on a loaded 3.14 lane: as long as the agent checks.
    scenario_timeout = 300.0

    def run_step(self, label: str, *plugins: str) -> None:
        home = self.user_profile(label)
        for name, folder in plugins:
            shutil.copytree(HOST_DIR / folder, home / "plugins" / name)
        self.run_scenario(label, label, home,
                          DISCOVERY_ENTERED=str(home.parent / "entered"),
                          DISCOVERY_RELEASE=str(home.parent / "release"),
                          RACE_PROBE_LOG=str(home.parent / "probe.jsonl"),
                          DISCOVERY_GAVE_UP=str(home.parent / "gave_up"))
        if (home.parent / "gave_up").exists():  # nothing was journaled (checked in the child)
            return
        self.verify_journal(label, home)

    def startup(self) -> None:
        self.run_step("startup", (SLOW, "slow_discovery_plugin"))

    def forced_rediscovery(self) -> None:
        if evidence.hermes_release() < (0, 20, 0):
            return  # 0.19 runs the hooks before the middleware list is read (see above)
        self.run_step("forced_rediscovery", (SLOW, "slow_discovery_plugin"),
                      (PROBE, "race_probe_plugin"))


def main(argv: Optional[List[str]] = None) -> int:
    return check_host.checker_main(argv, description="crash-recovery: delayed plugin discovery",
                                   steps=("startup", "forced_rediscovery"), make_run=RaceRun,
                                   scenarios=SCENARIOS, temp_prefix="crash-recovery-race-")


if __name__ == "__main__":
    raise SystemExit(main())
