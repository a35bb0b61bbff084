#!/usr/bin/env python3
"""The stand-alone crash scenario (README §Try it); no Hermes needed.

    python demo.py [--directory NEW_DIR]

A worker is SIGKILLed after the service commits its booking; a restarted
worker's same booking is refused; the operator resolves it; a new worker runs
again.  Progress on stderr, a JSON verdict on stdout, exit 1 if a check fails.
``--directory`` (new or empty) keeps the files, else a temporary one is removed.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OPERATOR_CLI = os.path.join(HERE, "operator_cli.py")
TRIP = {"traveller": "Ada Lovelace", "from": "LHR", "to": "LIS", "date": "2026-12-24"}
WORKER_TIMEOUT_SECONDS = 20.0  # the wait for a worker to reach a point
# What run_demo's checks must be for the demo to pass.
EXPECTED_CHECKS = {"worker_killed_by_sigkill": True, "pending_after_crash": 1,
                   "repeat_blocked": True, "bookings": 1, "resolution_accepted": True,
                   "gate_open_after_resolution": True, "integrity_ok": True,
                   "unresolved_after_resolution": 0, "journal_events": 4}


class BookingService:
    """A fictional booking service with its own SQLite database."""

    def __init__(self, path: str):
        self.path = path
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE IF NOT EXISTS bookings(id INTEGER PRIMARY KEY, "
                               "traveller TEXT, route TEXT, date TEXT)")
            connection.execute("CREATE TABLE IF NOT EXISTS outbox(id INTEGER PRIMARY KEY, "
                               "recipient TEXT, subject TEXT)")

    def book(self, trip: dict) -> int:
        """Commit one booking; returns its id."""
        with sqlite3.connect(self.path) as connection:
            cursor = connection.execute(
                "INSERT INTO bookings(traveller, route, date) VALUES (?, ?, ?)",
                (trip["traveller"], f"{trip['from']}-{trip['to']}", trip["date"]))
            return cursor.lastrowid

    def send_mail(self, recipient: str, subject: str) -> int:
        """Commit one outgoing message; returns its id."""
        with sqlite3.connect(self.path) as connection:
            return connection.execute("INSERT INTO outbox(recipient, subject) VALUES (?, ?)",
                                      (recipient, subject)).lastrowid

    def count(self, table: str) -> int:
        """Rows in ``bookings`` or ``outbox``."""
        assert table in ("bookings", "outbox")
        with sqlite3.connect(self.path) as connection:
            return connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def run_worker(role: str, directory: str) -> int:
    """One agent process: a protected call through the guard; prints its result."""
    checkout = runpy.run_path(os.path.join(HERE, "host", "standalone.py"))
    RecoveryGuard = checkout["load_module"]("guard").RecoveryGuard

    service = BookingService(os.path.join(directory, "service.sqlite3"))
    guard = RecoveryGuard(os.path.join(directory, "profile", "plugin-data", "crash-recovery"))
    signal_path = os.path.join(directory, "booked.signal")

    def book_trip() -> str:
        booking = service.book(TRIP)
        if role == "crash":
            # Committed: tell the demo, then be killed before the guard records it.
            with open(signal_path, "w") as stream:
                stream.write(str(booking))
            time.sleep(WORKER_TIMEOUT_SECONDS * 3)
        return json.dumps({"status": "confirmed", "booking_id": booking})

    def email_itinerary() -> str:
        return json.dumps({"status": "sent", "message_id": service.send_mail(
            "ada@example.invalid", "Your itinerary LHR-LIS")})

    tool_name, args, call = (("book_trip", TRIP, book_trip) if role in ("crash", "retry") else
                             ("email_itinerary", {"to": "ada@example.invalid"}, email_itinerary))
    print(guard.tool_execution(tool_name=tool_name, args=args, next_call=call,
                               session_id=f"demo-{role}", tool_call_id=f"call-{role}"))
    return 0


def _say(text: str) -> None:
    print(f"demo: {text}", file=sys.stderr, flush=True)


def _worker(role: str, directory: str) -> subprocess.Popen:
    environment = dict(os.environ, HERMES_HOME=os.path.join(directory, "profile"))
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", role,
                             "--directory", directory], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment)


def _finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=WORKER_TIMEOUT_SECONDS)
    if process.returncode != 0:
        raise RuntimeError(f"worker failed ({process.returncode}): {err.strip()[-500:]}")
    return json.loads(out)


def _operator(data_dir: str, *words: str) -> tuple:
    completed = subprocess.run([sys.executable, OPERATOR_CLI, "--data-dir", data_dir, *words],
                               capture_output=True, text=True, timeout=WORKER_TIMEOUT_SECONDS)
    return completed.returncode, json.loads(completed.stdout)


def run_demo(directory: str) -> dict:
    """Run the scenario in ``directory``; return the verdict dict."""
    started = time.monotonic()
    data_dir = os.path.join(directory, "profile", "plugin-data", "crash-recovery")
    service = BookingService(os.path.join(directory, "service.sqlite3"))
    checks: dict = {}

    _say("1. worker books a trip; the service commits it; the worker is killed (SIGKILL)")
    crashing = _worker("crash", directory)
    signal_path = os.path.join(directory, "booked.signal")
    deadline = time.monotonic() + WORKER_TIMEOUT_SECONDS
    while not os.path.exists(signal_path):
        if crashing.poll() is not None or time.monotonic() > deadline:
            crashing.kill()
            raise RuntimeError("the crashing worker never reached the booking: "
                               + crashing.communicate()[1][-500:])
        time.sleep(0.01)
    os.kill(crashing.pid, signal.SIGKILL)
    crashing.communicate()
    checks["worker_killed_by_sigkill"] = crashing.returncode == -signal.SIGKILL
    code, status = _operator(data_dir, "status")
    pending = [operation for operation in status.get("unresolved", [])
               if operation["state"] == "pending"]
    checks["pending_after_crash"] = len(pending)
    operation_id = pending[0]["operation_id"] if pending else None
    _say(f"   journal: operation {operation_id} is pending (outcome unknown)")

    _say("2. a restarted worker tries the same booking")
    retry = _finish(_worker("retry", directory))
    checks["repeat_blocked"] = (retry.get("error") == "crash_recovery_blocked"
                                and retry.get("operation_ids") == [operation_id])
    checks["blocked_code"] = retry.get("code")
    checks["bookings"] = service.count("bookings")
    _say(f"   refused ({retry.get('code')}); the service holds {checks['bookings']} booking(s)")

    _say("3. the operator checks the service and resolves the operation")
    evidence = (f"service.sqlite3 bookings row 1: {TRIP['traveller']} "
                f"{TRIP['from']}-{TRIP['to']} {TRIP['date']} exists; booking completed")
    resolve_code, resolved = _operator(data_dir, "resolve", str(operation_id),
                                       "--outcome", "completed", "--evidence", evidence)
    checks["resolution_accepted"] = resolve_code == 0 and resolved.get("resolved") == operation_id

    _say("4. a new worker may run protected calls again")
    after = _finish(_worker("after", directory))
    checks["gate_open_after_resolution"] = after.get("status") == "sent"
    verify_code, verified = _operator(data_dir, "verify")
    checks["integrity_ok"] = verify_code == 0 and verified.get("integrity") == "ok"
    _, final_status = _operator(data_dir, "status")
    checks["unresolved_after_resolution"] = len(final_status.get("unresolved", [None]))
    checks["bookings"] = service.count("bookings")
    checks["journal_events"] = verified.get("count")

    ok = all(checks[name] == value for name, value in EXPECTED_CHECKS.items())
    return {"ok": ok, **checks, "operation_id": operation_id, "data_dir": data_dir,
            "seconds": round(time.monotonic() - started, 2)}


def main(argv: list | None = None) -> int:
    """Run the demo (or, with the hidden ``--worker``, one worker); returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--directory", help="keep the demo's files here (new or empty directory)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.directory)
    keep = bool(args.directory)
    if keep:
        directory = os.path.abspath(args.directory)
        if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
            print(json.dumps({"ok": False, "error": f"{directory} exists and is not an empty "
                                                    "directory"}))
            return 1
        os.makedirs(directory, exist_ok=True)
    else:
        directory = tempfile.mkdtemp(prefix="crash-recovery-demo-")
    try:
        verdict = run_demo(directory)
    except Exception as exc:  # the verdict must still be one JSON document
        verdict = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
    if not keep:
        verdict.pop("data_dir", None)
    print(json.dumps(verdict, indent=1, sort_keys=True))
    _say("PASS" if verdict["ok"] else "FAIL")
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
