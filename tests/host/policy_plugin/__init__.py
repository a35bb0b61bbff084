"""Test-only Hermes plugin used by tests/host/check_host_refusals.py: another
plugin's policy.  Its ``pre_tool_call`` hook blocks ``book_trip`` to the
destination ``Embargoed`` and ``web_extract`` of a URL containing
``embargoed`` (the host then never invokes the handler), and
appends each decision to ``$POLICY_GATE_LOG`` when that is set."""
from __future__ import annotations

import json
import os

EMBARGOED = "Embargoed"
BLOCK_MESSAGE = "policy-gate: travel to Embargoed is not allowed"


def pre_tool_call(tool_name=None, args=None, tool_call_id=None, **kwargs):
    """Block the embargoed booking or page; allow everything else."""
    blocked = isinstance(args, dict) and (
        (tool_name == "book_trip" and args.get("destination") == EMBARGOED)
        or (tool_name == "web_extract" and any(EMBARGOED.lower() in str(url)
                                               for url in args.get("urls") or [])))
    path = os.environ.get("POLICY_GATE_LOG", "")
    if path:
        with open(path, "a", encoding="utf-8") as log_file:
            log_file.write(json.dumps({"tool": tool_name, "tool_call_id": tool_call_id,
                                       "blocked": blocked}) + "\n")
    return {"action": "block", "message": BLOCK_MESSAGE} if blocked else None


def register(ctx) -> None:
    """Register the policy hook."""
    ctx.register_hook("pre_tool_call", pre_tool_call)
