"""What every host scenario child uses (tests/check_host.py and the checkers
built on it): named checks, one call through Hermes' own dispatcher, the
plugin's registrations as Hermes' plugin manager recorded them, a real agent
loop against the scripted provider, and the journal.

Hermes is imported only inside the functions: a scenario child sets
``HERMES_HOME`` first (Hermes discovers plugins once per process).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import evidence
from evidence import PLUGIN_NAME, data_dir_of, read_events

# The probe's name sorts first: Hermes 0.19 loads plugins in directory order,
# 0.20+ by name (after declared dependencies), and the first loaded
# middleware is the outermost, so the probe sees every call enter the chain.
PROBE = "0-host-probe"
INSPECTION_TOOLS = {"crash_recovery_status", "crash_recovery_verify"}


class CheckList:
    """Named pass/fail results of one scenario."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.results: List[Dict[str, Any]] = []

    def check(self, name: str, condition: Any, **detail: Any) -> bool:
        passed = bool(condition)
        entry: Dict[str, Any] = {"name": f"{self.scenario}.{name}", "ok": passed}
        if detail and not passed:
            entry["detail"] = detail
        self.results.append(entry)
        return passed

    def fail(self, name: str, **detail: Any) -> None:
        self.results.append({"name": f"{self.scenario}.{name}", "ok": False, "detail": detail})


# --------------------------------------------------------------------------
# In-child helpers (Hermes is imported only inside scenario children)
# --------------------------------------------------------------------------

def hermes_call(tool: str, args: Dict[str, Any], *, session_id: str, call_id: str,
                hook: bool = True) -> str:
    """One tool call through Hermes' own dispatcher.

    ``hook=False`` skips the pre_tool_call hook (as Hermes' agent executors do
    after firing it themselves), so only the execution middleware can refuse."""
    import model_tools
    return model_tools.handle_function_call(tool, args, task_id=f"task-{session_id}",
                                            tool_call_id=call_id, session_id=session_id,
                                            skip_pre_tool_call_hook=not hook)


def check_registrations(checks: CheckList, expected_source: str) -> None:
    """The plugin is loaded by Hermes with its middleware, hook and tools."""
    import model_tools  # noqa: F401  (importing it runs plugin discovery)
    from hermes_cli.plugins import get_plugin_manager
    from tools.registry import registry
    manager = get_plugin_manager()
    loaded = manager._plugins.get(PLUGIN_NAME)
    checks.check("plugin_loaded", loaded is not None and loaded.enabled and loaded.error is None,
                 found=None if loaded is None else {"enabled": loaded.enabled,
                                                    "error": loaded.error})
    if loaded is None:
        return
    checks.check("plugin_source", loaded.manifest.source == expected_source,
                 source=loaded.manifest.source, expected=expected_source)
    checks.check("tools_registered", INSPECTION_TOOLS <= set(loaded.tools_registered),
                 tools=loaded.tools_registered)
    declared = evidence.plugin_manifest().get("provides_hooks") or []
    checks.check("hook_registered", "pre_tool_call" in loaded.hooks_registered
                 and sorted(loaded.hooks_registered) == sorted(declared),
                 hooks=loaded.hooks_registered, declared=declared)
    checks.check("middleware_registered", loaded.middleware_registered == ["tool_execution"],
                 middleware=loaded.middleware_registered)
    checks.check("tools_in_registry",
                 all(registry.get_entry(name) is not None for name in INSPECTION_TOOLS))


def booked(result: str) -> Optional[str]:
    """The receipt of a successful book_trip result, else None."""
    try:
        document = json.loads(result)
    except ValueError:
        return None
    if isinstance(document, dict) and document.get("status") == "booked":
        return document.get("receipt")
    return None


def events_of(home: Path) -> List[Dict[str, Any]]:
    return read_events(data_dir_of(home))


def scripted_conversation(home: Path, checks: "CheckList", turns: List[Dict[str, Any]],
                          prompt: str, *, session_id: str, enabled: List[str],
                          entries: Optional[Dict[str, Any]] = None,
                          max_iterations: int = 6) -> Dict[str, str]:
    """One real ``AIAgent.run_conversation`` against a scripted provider on
    127.0.0.1 (the profile written with ``enabled`` plugins and ``entries``):
    checks the registrations and that the conversation finished; returns the
    tool messages the provider received, by tool-call id."""
    from mock_provider import ScriptedProvider
    with ScriptedProvider(turns) as provider:
        evidence.write_profile(home, base_url=provider.base_url, enabled=enabled,
                               **({"entries": entries} if entries else {}))
        check_registrations(checks, "user")
        from run_agent import AIAgent
        agent = AIAgent(base_url=provider.base_url, api_key="sk-mock", provider="custom",
                        model="mock-model", quiet_mode=True, skip_context_files=True,
                        skip_memory=True, max_iterations=max_iterations, session_id=session_id)
        outcome = agent.run_conversation(prompt)
        messages = {m["tool_call_id"]: str(m["content"]) for m in provider.tool_messages()}
    checks.check("conversation_finished", outcome.get("final_response") == "done",
                 final=outcome.get("final_response"), messages=messages)
    return messages


def status_tool(session_id: str, call_id: str) -> Dict[str, Any]:
    """``crash_recovery_status`` through Hermes' dispatcher, decoded."""
    return json.loads(hermes_call("crash_recovery_status", {}, session_id=session_id,
                                  call_id=call_id))
