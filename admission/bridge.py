"""Tool Search bridge calls (docs/guard.md §Tool Search).

``tool_search``/``tool_describe`` read the catalog; ``tool_call`` invokes tools
(``{"name", "arguments"}`` on 0.20, ``{"calls": [...]}`` on 0.22).  The host
peels a ``tool_call`` it can run, so one reaching us is a 0.22 connector batch
or one it will not run.  Protection is decided on the underlying tool names.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Optional

from .settings import CATALOG_TOOLS
BRIDGE_CALL = "tool_call"
CONNECTOR_PREFIX = "connectors__"

PASS = "pass"      # run it untouched: nothing protected can run under this name
REFUSE = "refuse"  # refuse it ourselves: a protected tool named, the host will not run it


def bridge_calls(args: Any) -> Optional[list]:
    """``(tool name, arguments)`` of each call a ``tool_call``'s ``args``
    invoke, in order, read as the hosts do (``calls``: list, JSON text or
    object; else ``name`` and ``arguments``); None if a name is unreadable.
    ``arguments`` is the entry's value as given (None when absent)."""
    if not isinstance(args, dict):
        return None
    calls = args.get("calls")
    if calls is None:
        calls = [{"name": args.get("name"), "arguments": args.get("arguments")}]
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except (ValueError, RecursionError):
            return None
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not calls:
        return None
    found = []
    for call in calls:
        name = call.get("name") if isinstance(call, dict) else None
        if not isinstance(name, str) or not name.strip():
            return None
        found.append((name.strip(), call.get("arguments")))
    return found


def bridge_entries(args: Any) -> Optional[list]:
    """The tool names a ``tool_call``'s ``args`` invoke, in order
    (:func:`bridge_calls`); None if unreadable."""
    calls = bridge_calls(args)
    return None if calls is None else [name for name, _ in calls]


def bridge_verdict(tool_name: Any, args: Any,
                   is_protected: Callable[[Any], bool]) -> Optional[str]:
    """None for a tool that is not a bridge tool; :data:`PASS` for a catalog
    read, a connector batch or a ``tool_call`` naming only unprotected tools;
    :data:`REFUSE` for one naming a protected tool, or no readable name."""
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
    """Whether a call may run while the gate is closed (docs/guard.md §While the
    gate is closed): a connector batch, or every name it invokes ``allowed``."""
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
