#!/usr/bin/env python3
"""A worker process making one real protected call through ``RecoveryGuard``,
for the dashboard tests.

    dashboard_worker.py hold  DATA_DIR TOOL CALL_ID    inside the tool: print
        {"in_tool": OPERATION_ID}, then wait for one line on stdin and return a
        normal response (kill it meanwhile for `pending`; settle it with
        --force meanwhile for a late outcome)
    dashboard_worker.py error DATA_DIR TOOL CALL_ID    the tool returns an
        error-shaped response (`uncertain`, reason error_response)

At the end it prints one JSON line ``{"result": ...}``.  Test-only: imported
by nobody, installed nowhere.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import support  # noqa: E402,F401  (loads this checkout as the package crash_recovery)
from crash_recovery.admission.binding import ADMISSION  # noqa: E402
from crash_recovery.guard import RecoveryGuard  # noqa: E402


def main(argv: list) -> int:
    mode, data_dir, tool, call_id = argv
    guard = RecoveryGuard(data_dir)

    def downstream():
        if mode == "error":
            return json.dumps({"error": "card declined by the payment service"})
        print(json.dumps({"in_tool": ADMISSION.get().operation_id}), flush=True)
        sys.stdin.readline()  # the test says when the tool ends (or kills us)
        return json.dumps({"status": "confirmed", "call": call_id})

    result = guard.tool_execution(tool, {"call": call_id}, downstream,
                                  session_id="session-dashboard", tool_call_id=call_id)
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
