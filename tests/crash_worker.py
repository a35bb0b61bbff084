#!/usr/bin/env python3
"""A worker process that SIGKILLs itself at a named durable boundary.

    crash_worker.py call    DATA_DIR SERVICE [--kill B:K[:N]] [--request R] [--raise] [--error]
    crash_worker.py resolve DATA_DIR OP      [--kill B:K[:N]] [--outcome O]

``call`` runs one protected call (tool ``book_flight``) through a real
``RecoveryGuard``; its downstream books once in the fictional service database
``SERVICE`` (a separate SQLite file: one row per side effect), announces the
boundary ``side_effect``/``downstream`` and returns a normal response (or raises
with ``--raise``, or returns an error-shaped response with ``--error``).
``resolve`` runs ``operator_cli.main(["resolve", ...])`` in this process.

``--kill BOUNDARY:KIND[:N]`` installs a ``durable.set_boundary_hook`` hook that
sends SIGKILL to this very process the N-th time (default 1) that boundary is
reached for that kind -- no cleanup, no ``finally``, exactly like a power cut
of the process.  Without ``--kill`` the worker prints one JSON line
``{"result": ..., "side_effects": n}`` and exits 0.

Test-only: imported by nobody, installed nowhere.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import support  # noqa: E402,F401  (loads this checkout as the package crash_recovery)
from crash_recovery.storage import durable  # noqa: E402
from crash_recovery.admission.binding import ADMISSION  # noqa: E402
from crash_recovery.guard import RecoveryGuard  # noqa: E402

TOOL = "book_flight"
# Boundaries the worker itself announces (the journal and guard announce the rest).
SIDE_EFFECT_BOUNDARY = ("side_effect", "downstream")
SERVICE_SCHEMA = ("CREATE TABLE IF NOT EXISTS bookings(id INTEGER PRIMARY KEY, request TEXT NOT NULL, "
                  "operation_id TEXT, pid INTEGER NOT NULL, at_ns INTEGER NOT NULL)")


def install_kill(spec: str) -> None:
    """``BOUNDARY:KIND[:N]``: SIGKILL this process at the N-th matching boundary."""
    parts = spec.split(":")
    boundary, kind = parts[0], parts[1]
    wanted = int(parts[2]) if len(parts) > 2 else 1
    seen = [0]

    def hook(reached: str, reached_kind: str) -> None:
        if reached == boundary and reached_kind == kind:
            seen[0] += 1
            if seen[0] == wanted:
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(10)  # never reached: SIGKILL cannot be caught

    durable.set_boundary_hook(hook)


def book(service: str, request: str) -> int:
    """The side effect: one committed row in the service database."""
    binding = ADMISSION.get()
    connection = sqlite3.connect(service, timeout=30, isolation_level=None)
    try:
        connection.execute(SERVICE_SCHEMA)
        cursor = connection.execute(
            "INSERT INTO bookings(request, operation_id, pid, at_ns) VALUES (?, ?, ?, ?)",
            (request, binding.operation_id if binding else None, os.getpid(), time.time_ns()))
        return cursor.lastrowid
    finally:
        connection.close()


def side_effects(service: str, request: str | None = None) -> int:
    """Rows in the service database (for one request, or all)."""
    if not os.path.exists(service):
        return 0
    connection = sqlite3.connect(service, timeout=30)
    try:
        connection.execute(SERVICE_SCHEMA)
        if request is None:
            return connection.execute("SELECT count(*) FROM bookings").fetchone()[0]
        return connection.execute("SELECT count(*) FROM bookings WHERE request = ?",
                                  (request,)).fetchone()[0]
    finally:
        connection.close()


def run_call(args: argparse.Namespace) -> dict:
    guard = RecoveryGuard(args.data_dir, full_verification=args.full)

    def downstream():
        booking = book(args.service, args.request)
        durable.reach_boundary(*SIDE_EFFECT_BOUNDARY)
        if args.raise_:
            raise RuntimeError("service connection reset")
        if args.error:
            return {"status": "failed", "booking": booking}
        return {"status": "confirmed", "booking": booking}

    hook_verdict = guard.pre_tool_call(tool_name=TOOL, args={"request": args.request},
                                       session_id="session-1", tool_call_id=args.request)
    try:
        result = guard.tool_execution(TOOL, {"request": args.request}, downstream,
                                      session_id="session-1", tool_call_id=args.request)
    except RuntimeError as exc:
        result = {"raised": str(exc)}
    return {"result": result, "hook": hook_verdict,
            "side_effects": side_effects(args.service, args.request)}


def run_resolve(args: argparse.Namespace) -> dict:
    import contextlib
    import io
    from crash_recovery import operator_cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = operator_cli.main(["--data-dir", args.data_dir, "resolve", args.service,
                                  "--outcome", args.outcome, "--evidence",
                                  "service has no booking row for this request"])
    return {"exit": code, "output": json.loads(out.getvalue())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("call", "resolve"))
    parser.add_argument("data_dir")
    parser.add_argument("service", help="service database (call) or operation id (resolve)")
    parser.add_argument("--kill", default=None)
    parser.add_argument("--request", default="req-1")
    parser.add_argument("--raise", dest="raise_", action="store_true")
    parser.add_argument("--error", action="store_true")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--outcome", default="not_applied")
    args = parser.parse_args(argv)
    if args.kill:
        install_kill(args.kill)
    result = run_call(args) if args.mode == "call" else run_resolve(args)
    print(json.dumps(result, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
