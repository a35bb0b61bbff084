"""Test-only Hermes plugin used by tests/check_host.py and
tests/host/check_deployment.py.

It replaces the built-in ``web_extract`` (one of Hermes 0.19.0's parallel-safe
tools, so two calls in one assistant message take the concurrent executor)
with a handler that appends each run to ``$HOST_PROBE_LOG`` and then holds
the call open until a sibling ``web_extract`` call has left the execution
chain (at most ``$HOST_PROBE_WAIT_SECONDS``), so the two calls overlap
deterministically. Its ``tool_execution`` middleware logs every entry (with
the type of each argument it was handed) and exit; installed so that it
loads first (outermost), it shows the nested double invocation on that path
and whether Hermes changed the arguments between the two entries. It also
orders concurrent siblings: a call whose sibling (same tool) is already in
the chain waits until that sibling has reached its inner entry (Hermes 0.19)
or its handler (0.20+, which enters the chain once per call), so the later
call always meets an admission that is complete.
Replacing a built-in needs ``plugins.entries.host-probe.allow_tool_override:
true``.
"""
from __future__ import annotations

import json
import os
import threading
import time

WRITE_LOCK = threading.Lock()
CHAIN_EXITS = threading.Condition()
EXITED_CALL_IDS: set = set()
RUNNING_CALL_ID = threading.local()
# Calls inside the chain now: tool call id -> (tool name, event set once that
# call's nested inner entry has been reached, or once it left the chain).
ACTIVE_LOCK = threading.Lock()
ACTIVE_CALLS: dict = {}

WEB_EXTRACT_SCHEMA = {
    "name": "web_extract",
    "description": "Fetch pages (test probe: slow, records each run).",
    "parameters": {
        "type": "object",
        "properties": {"urls": {"type": "array", "items": {"type": "string"}}},
        "required": ["urls"],
    },
}


def append_record(record: dict) -> None:
    """Append one JSON line to the probe log."""
    path = os.environ.get("HOST_PROBE_LOG", "")
    if not path:
        return
    with WRITE_LOCK, open(path, "a", encoding="utf-8") as log_file:
        log_file.write(json.dumps(record, sort_keys=True) + "\n")


def slow_web_extract(args: dict, **kwargs) -> str:
    """Record the run, then wait until a sibling call has left the chain."""
    own_call_id = getattr(RUNNING_CALL_ID, "value", "")
    append_record({"event": "handler", "tool": "web_extract", "urls": args.get("urls"),
                   "tool_call_id": own_call_id, "thread": threading.get_ident(),
                   "time_ns": time.time_ns()})
    mark_admitted(own_call_id)
    deadline = time.monotonic() + float(os.environ.get("HOST_PROBE_WAIT_SECONDS", "10"))
    with CHAIN_EXITS:
        while not (EXITED_CALL_IDS - {own_call_id}):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                append_record({"event": "handler_wait_timed_out", "tool_call_id": own_call_id})
                break
            CHAIN_EXITS.wait(remaining)
    return json.dumps({"results": [{"url": u, "content": "probe page"} for u in args.get("urls") or []]})


def mark_admitted(call_id: str) -> None:
    """Every middleware has let ``call_id`` through: release waiting siblings."""
    with ACTIVE_LOCK:
        entry = ACTIVE_CALLS.get(call_id)
    if entry is not None:
        entry[1].set()


def stagger(tool_name: str, call_id: str) -> None:
    """Outer entry of a call while a sibling call of the same tool is already in
    the chain (the concurrent path): wait until that sibling has reached its
    nested inner entry or its handler, i.e. has passed every middleware's
    outer entry (its admission is complete), so the later call always
    arrives second.
    ``HOST_PROBE_STAGGER=0`` turns this off."""
    with ACTIVE_LOCK:
        siblings = [(other, entry[1]) for other, entry in ACTIVE_CALLS.items()
                    if entry[0] == tool_name]
        ACTIVE_CALLS[call_id] = (tool_name, threading.Event())
    if os.environ.get("HOST_PROBE_STAGGER", "1") == "0":
        return
    timeout = float(os.environ.get("HOST_PROBE_WAIT_SECONDS", "10"))
    for other, reached in siblings:
        signalled = reached.wait(timeout)
        append_record({"event": "staggered", "tool": tool_name, "tool_call_id": call_id,
                       "after": other, "signalled": signalled, "time_ns": time.time_ns()})


def trace_middleware(tool_name, args, next_call, **kwargs):
    """Record every entry into and exit from the execution chain; change nothing
    (but order concurrent siblings, see :func:`stagger`)."""
    call_id = kwargs.get("tool_call_id", "")
    arg_types = ({key: type(value).__name__ for key, value in args.items()}
                 if isinstance(args, dict) else type(args).__name__)
    append_record({"event": "middleware", "tool": tool_name, "tool_call_id": call_id,
                   "arg_types": arg_types, "thread": threading.get_ident(),
                   "time_ns": time.time_ns()})
    outer_call_id = getattr(RUNNING_CALL_ID, "value", None)
    if outer_call_id is None:
        stagger(tool_name, call_id)
    else:
        mark_admitted(outer_call_id)
    RUNNING_CALL_ID.value = call_id
    try:
        return next_call()
    finally:
        RUNNING_CALL_ID.value = outer_call_id
        if outer_call_id is None:
            with ACTIVE_LOCK:
                entry = ACTIVE_CALLS.pop(call_id, None)
            if entry is not None:
                entry[1].set()
            append_record({"event": "middleware_exit", "tool": tool_name, "tool_call_id": call_id,
                           "thread": threading.get_ident(), "time_ns": time.time_ns()})
            if tool_name == "web_extract":
                with CHAIN_EXITS:
                    EXITED_CALL_IDS.add(call_id)
                    CHAIN_EXITS.notify_all()


def register(ctx) -> None:
    """Register the override tool and the tracing middleware."""
    ctx.register_tool(name="web_extract", toolset="host_probe", schema=WEB_EXTRACT_SCHEMA,
                      handler=slow_web_extract, description=WEB_EXTRACT_SCHEMA["description"],
                      override=True)
    ctx.register_middleware("tool_execution", trace_middleware)
