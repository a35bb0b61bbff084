"""Test-only Hermes plugin used by tests/check_host.py.

It replaces the built-in ``web_extract`` (one of Hermes 0.19.0's parallel-safe
tools, so two calls in one assistant message take the concurrent executor)
with a slow handler that appends each run to ``$HOST_PROBE_LOG``, and it adds
a ``tool_execution`` middleware that appends every entry, which shows the
nested double invocation on that path. Replacing a built-in needs
``plugins.entries.host-probe.allow_tool_override: true``.
"""
from __future__ import annotations

import json
import os
import threading
import time

WRITE_LOCK = threading.Lock()

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
    """Record the run, then hold the call open so a sibling call overlaps it."""
    append_record({"event": "handler", "tool": "web_extract", "urls": args.get("urls"),
                   "thread": threading.get_ident(), "time_ns": time.time_ns()})
    time.sleep(float(os.environ.get("HOST_PROBE_SLEEP_SECONDS", "1.5")))
    return json.dumps({"results": [{"url": u, "content": "probe page"} for u in args.get("urls") or []]})


def trace_middleware(tool_name, args, next_call, **kwargs):
    """Record every entry into the execution chain, then continue unchanged."""
    append_record({"event": "middleware", "tool": tool_name,
                   "tool_call_id": kwargs.get("tool_call_id", ""),
                   "thread": threading.get_ident(), "time_ns": time.time_ns()})
    return next_call()


def register(ctx) -> None:
    """Register the override tool and the tracing middleware."""
    ctx.register_tool(name="web_extract", toolset="host_probe", schema=WEB_EXTRACT_SCHEMA,
                      handler=slow_web_extract, description=WEB_EXTRACT_SCHEMA["description"],
                      override=True)
    ctx.register_middleware("tool_execution", trace_middleware)
