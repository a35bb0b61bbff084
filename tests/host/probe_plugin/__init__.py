"""Test-only Hermes plugin used by tests/check_host.py.

It replaces the built-in ``web_extract`` (one of Hermes 0.19.0's parallel-safe
tools, so two calls in one assistant message take the concurrent executor)
with a handler that appends each run to ``$HOST_PROBE_LOG`` and then holds
the call open until a sibling ``web_extract`` call has left the execution
chain (at most ``$HOST_PROBE_WAIT_SECONDS``), so the two calls overlap
deterministically. Its ``tool_execution`` middleware logs every entry and
exit; installed so that it loads first (outermost), it shows the nested
double invocation on that path. Replacing a built-in needs
``plugins.entries.host-probe.allow_tool_override: true``.
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
    deadline = time.monotonic() + float(os.environ.get("HOST_PROBE_WAIT_SECONDS", "10"))
    with CHAIN_EXITS:
        while not (EXITED_CALL_IDS - {own_call_id}):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                append_record({"event": "handler_wait_timed_out", "tool_call_id": own_call_id})
                break
            CHAIN_EXITS.wait(remaining)
    return json.dumps({"results": [{"url": u, "content": "probe page"} for u in args.get("urls") or []]})


def trace_middleware(tool_name, args, next_call, **kwargs):
    """Record every entry into and exit from the execution chain; change nothing."""
    call_id = kwargs.get("tool_call_id", "")
    append_record({"event": "middleware", "tool": tool_name, "tool_call_id": call_id,
                   "thread": threading.get_ident(), "time_ns": time.time_ns()})
    outer_call_id = getattr(RUNNING_CALL_ID, "value", None)
    RUNNING_CALL_ID.value = call_id
    try:
        return next_call()
    finally:
        RUNNING_CALL_ID.value = outer_call_id
        if outer_call_id is None:
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
