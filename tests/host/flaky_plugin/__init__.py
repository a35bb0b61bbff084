"""Test-only Hermes plugin used by tests/host/check_deployment.py.

``flaky_quote`` stands for any tool whose own error responses the guard
classifies (docs/guard.md §Error classification). ``shape`` picks the
response: ``success_false`` returns ``{"success": false, ...}``, ``error``
returns ``{"error": ...}``, anything else a normal quote. Every handler run is
appended to ``$FLAKY_RUNS_LOG`` (one JSON line), so the checks count runs
without trusting the result text.
"""
from __future__ import annotations

import json
import os
import time

FLAKY_QUOTE_SCHEMA = {
    "name": "flaky_quote",
    "description": "Ask the (test) quote service for a price. Test probe; may fail on request.",
    "parameters": {
        "type": "object",
        "properties": {
            "item": {"type": "string", "description": "what to quote"},
            "shape": {"type": "string", "description": "ok, success_false or error"},
        },
        "required": ["item"],
    },
}


def flaky_quote(args: dict, **kwargs) -> str:
    """Record the run, then answer in the requested shape."""
    shape = str(args.get("shape") or "ok")
    path = os.environ.get("FLAKY_RUNS_LOG", "")
    if path:
        with open(path, "a", encoding="utf-8") as runs:
            runs.write(json.dumps({"item": args.get("item"), "shape": shape,
                                   "session_id": kwargs.get("session_id"),
                                   "time_ns": time.time_ns()}) + "\n")
    if shape == "success_false":
        return json.dumps({"success": False, "reason": "quote service rejected the request"})
    if shape == "error":
        return json.dumps({"error": "quote service unavailable"})
    return json.dumps({"success": True, "item": args.get("item"), "price_cents": 4200})


def register(ctx) -> None:
    """Register the one tool."""
    ctx.register_tool(name="flaky_quote", toolset="flaky", schema=FLAKY_QUOTE_SCHEMA,
                      handler=flaky_quote, description=FLAKY_QUOTE_SCHEMA["description"])
