"""Tool Search bridge calls (docs/guard.md §Tool Search).

Hermes (Tool Search, on by default from 0.20) hides plugin and MCP tools
behind three bridge tools: ``tool_search`` and ``tool_describe`` read the
catalog; ``tool_call({"name": TOOL, "arguments": {...}})`` (0.20) or
``tool_call({"calls": [{"name", "arguments"}, ...]})`` (0.22) invokes a tool.
The host's agent executors peel a ``tool_call`` they can run, so the
middleware and hooks see the underlying tool (``_unwrap_tool_search_call`` in
``agent/tool_executor.py``); ``model_tools.handle_function_call`` resolves the
bridge before the middleware.  A ``tool_call`` that still reaches us under the
bridge name is one the host will not run as a single tool:

* a connector batch (every entry ``connectors__…``, 0.22): the host keeps the
  wrapper and sends each entry through the execution middleware and hooks as
  its own call (``tools/connectors/dispatch.py``), where each is guarded;
* a name the host cannot resolve (unknown, not deferrable, out of the session's
  scope, arguments that fail the tool's schema, several local tools in one call):
  the host refuses it.  (0.22's agent splits a batch naming a local tool into
  one ``tool_call`` per entry first, ``agent/tool_call_batches.py``; one that
  still reaches us has more than ten entries or came from outside the agent
  loop.  0.19 and 0.20 have no batches.)

Protection is decided on the underlying tool names, never on a bridge name.
Pure functions; no I/O.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Optional

from .settings import CATALOG_TOOLS
BRIDGE_CALL = "tool_call"
CONNECTOR_PREFIX = "connectors__"

PASS = "pass"      # run it untouched: nothing protected can run under this name
REFUSE = "refuse"  # refuse it ourselves: a protected tool named, the host will not run it


def bridge_entries(args: Any) -> Optional[list]:
    """The tool names a ``tool_call``'s arguments invoke, in order, read the way
    the hosts read them (a ``calls`` array, also as JSON text or one object;
    else the single ``name``); None when no name can be read."""
    if not isinstance(args, dict):
        return None
    calls = args.get("calls")
    if calls is None:
        calls = [{"name": args.get("name")}]
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except (ValueError, RecursionError):
            return None
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not calls:
        return None
    names = []
    for call in calls:
        name = call.get("name") if isinstance(call, dict) else None
        if not isinstance(name, str) or not name.strip():
            return None
        names.append(name.strip())
    return names


def bridge_verdict(tool_name: Any, args: Any,
                   is_protected: Callable[[Any], bool]) -> Optional[str]:
    """None when ``tool_name`` is not a bridge tool (decide on the name as
    usual); :data:`PASS` for a catalog read, a connector batch (each entry is
    guarded as its own call) or a ``tool_call`` naming only unprotected tools;
    :data:`REFUSE` for a ``tool_call`` that names a protected tool (or no
    readable name) under the bridge name."""
    if tool_name in CATALOG_TOOLS:
        return PASS
    if tool_name != BRIDGE_CALL:
        return None
    names = bridge_entries(args)
    if names is None:
        return REFUSE
    if all(name.startswith(CONNECTOR_PREFIX) for name in names):
        return PASS
    if any(name in CATALOG_TOOLS or name == BRIDGE_CALL or is_protected(name) for name in names):
        return REFUSE
    return PASS


def runs_while_closed(tool_name: Any, args: Any, allowed: Callable[[Any], bool]) -> bool:
    """Whether a call may run while the gate is closed (docs/guard.md §While
    the gate is closed), decided on the underlying tools: a ``tool_call``
    runs when every tool it names is ``allowed`` (a connector batch passes:
    the host sends each entry through the hooks and the middleware as a call
    of its own); any other call when its own name is."""
    if tool_name != BRIDGE_CALL:
        return allowed(tool_name)
    names = bridge_entries(args)
    if names is None:
        return False
    return (all(name.startswith(CONNECTOR_PREFIX) for name in names)
            or all(allowed(name) for name in names))


def refusal_explanation(args: Any) -> str:
    """What a model is told when :func:`bridge_verdict` refuses."""
    names = bridge_entries(args)
    shown = ", ".join(names) if names else "no readable tool name"
    return (f"This tool_call ({shown}) was not resolved by the host to a tool it can run here "
            "(an unknown or misspelled name, a tool not available in this session, arguments "
            "that do not match its schema, or several local tools in one call), and it names a "
            "tool crash-recovery protects, so it was refused. Nothing was run. Use tool_search "
            "to find the exact name and call one tool per tool_call.")
