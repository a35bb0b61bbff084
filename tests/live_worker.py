#!/usr/bin/env python3
"""A long-lived worker: one RecoveryGuard, driven line by line on stdin.

    live_worker.py DATA_DIR SERVICE

Each input line is a command; each answer is one JSON line on stdout:

* ``call REQUEST [error]`` -- one protected call of ``book_flight`` through the
  hook and the middleware; the downstream books one row in the fictional service
  database SERVICE (and answers error-shaped with ``error``).  Answer:
  ``{"hook", "result", "side_effects"}``.
* ``surfaces`` -- what every inspection surface of this worker says now:
  ``{"hook", "status_tool", "verify_tool", "slash"}`` (the slash command's text
  as ``/crash-recovery`` renders it from the status tool).

The worker keeps its journal open between commands, like a gateway.  Test-only.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crash_worker import TOOL, book, side_effects  # noqa: E402  (loads the package)
from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.host.hermes import summary_text  # noqa: E402


def main() -> int:
    data_dir, service = sys.argv[1], sys.argv[2]
    guard = RecoveryGuard(data_dir)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "call":
            request, error = words[1], "error" in words[2:]

            def downstream(request=request, error=error):
                booking = book(service, request)
                return {"status": "failed" if error else "confirmed", "booking": booking}

            hook = guard.pre_tool_call(tool_name=TOOL, args={"request": request},
                                       session_id="s", tool_call_id=request)
            result = guard.tool_execution(TOOL, {"request": request}, downstream,
                                          session_id="s", tool_call_id=request)
            answer = {"hook": hook, "result": result,
                      "side_effects": side_effects(service, request)}
        elif words[0] == "surfaces":
            answer = {"hook": guard.pre_tool_call(tool_name=TOOL, args={"request": "probe"},
                                                  session_id="s", tool_call_id="probe"),
                      "status_tool": json.loads(guard.status_tool({})),
                      "verify_tool": json.loads(guard.verify_tool({})),
                      "slash": summary_text(guard.status_report(),
                                            ("hermes", "-p", "work", "crash-recovery"))}
        else:
            answer = {"unknown_command": words[0]}
        print(json.dumps(answer, sort_keys=True, default=str), flush=True)
    guard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
