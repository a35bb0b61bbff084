#!/usr/bin/env python3
"""Stress runs: concurrent worker processes and random kills.  Not collected by unittest.

    python tests/stress.py [--processes 8] [--calls 200] [--kills 1000] [--dir DIR]
                           [--mode all|processes|kills] [--seed N]

``processes``: N worker processes each make ``--calls`` protected calls on one
profile.  Inside downstream every worker appends ``enter``/``exit`` lines
(pid, operation id, monotonic ns) to an append-only timeline file with
O_APPEND -- an independent record of who ran when.  Prints the counts and
checks: at most one operation in flight at any instant, every admitted call
has ``started`` then ``returned``, no exception (``database is locked`` or any
other) escaped a worker, refusals are only the expected codes, ``PRAGMA
integrity_check`` is ok, and the chain verifies (independent verifier).

``kills``: a driver forks a worker per attempt that installs a boundary hook
SIGKILLing itself at a random boundary of a random step (the ``started``
append, downstream after the side effect, after downstream, the outcome
append, or an operator ``resolve``), then checks the wreck from the parent
(fresh connections): a verifying journal with the operation open, or
``checkpoint_ahead``; the operator's procedure (repair-checkpoint, resolve
from the service database's evidence) settles it and the intent is retried
only when the service shows no booking.  Prints kills tried, re-executions
(an intent booked twice; must be 0), lost operations (a booking without its
``started`` event, or a committed ``started`` that vanished; must be 0) and
max in flight (must be 1).  Exit status 1 when any check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import support  # noqa: E402,F401  (loads this checkout as the package crash_recovery)
from crash_recovery.storage import durable  # noqa: E402
from crash_recovery.admission.binding import ADMISSION  # noqa: E402
from crash_recovery.guard import RecoveryGuard  # noqa: E402
from crash_recovery.storage.errors import JournalError  # noqa: E402
from crash_recovery.journal import Journal  # noqa: E402

EXPECTED_REFUSALS = {"operation_in_flight", "unresolved_operations"}
APPEND_BOUNDARIES = ("begin", "inserted", "checkpoint_written", "checkpoint_fsynced",
                     "checkpoint_replaced", "directory_fsynced", "committed")
KILL_POINTS = ([(b, "started") for b in APPEND_BOUNDARIES]
               + [("side_effect", "downstream"), ("downstream_returned", "started")]
               + [(b, "returned") for b in APPEND_BOUNDARIES]
               + [(b, "resolved") for b in APPEND_BOUNDARIES])


def load_reference():
    from support import reference
    return reference


# ------------------------------------------------------------- processes --

def timeline_write(path: str, event: str, operation: str) -> None:
    line = f"{event} {os.getpid()} {operation} {time.monotonic_ns()}\n".encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


def process_worker(data_dir: str, timeline: str, calls: int, results: str) -> None:
    """One worker process: ``calls`` protected calls; counts into ``results``."""
    guard = RecoveryGuard(data_dir)
    counts = {"admitted": 0, "refused": {}, "escaped": []}

    def downstream():
        operation = ADMISSION.get().operation_id
        timeline_write(timeline, "enter", operation)
        time.sleep(0.0005)
        timeline_write(timeline, "exit", operation)
        return {"ok": True, "operation": operation}

    for index in range(calls):
        try:
            if guard.pre_tool_call(tool_name="book", args={"i": index}, session_id=str(os.getpid()),
                                   tool_call_id=f"{os.getpid()}-{index}") is not None:
                pass  # the hook may refuse too; the middleware decides below
            result = guard.tool_execution("book", {"i": index}, downstream,
                                          session_id=str(os.getpid()),
                                          tool_call_id=f"{os.getpid()}-{index}")
            if isinstance(result, dict):
                counts["admitted"] += 1
            else:
                refusal = json.loads(result)
                code = refusal.get("code") or refusal.get("error")
                counts["refused"][code] = counts["refused"].get(code, 0) + 1
                if code not in EXPECTED_REFUSALS:
                    counts["escaped"].append(f"refused {code}: {refusal.get('explanation')}")
        except BaseException as exc:  # noqa: BLE001 - counted, must be none
            counts["escaped"].append(f"{type(exc).__name__}: {exc}")
        if index % 7 == 0:
            report = guard.status_report()
            if report["integrity"] != "ok":
                counts["escaped"].append(f"status {report['integrity']}")
    with open(results, "w") as stream:
        json.dump(counts, stream)


def run_processes(root: str, processes: int, calls: int) -> dict:
    data_dir = os.path.join(root, "profile")
    timeline = os.path.join(root, "timeline.log")
    children = []
    started = time.monotonic()
    for number in range(processes):
        results = os.path.join(root, f"worker-{number}.json")
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                process_worker(data_dir, timeline, calls, results)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        children.append((pid, results))
    exits = [os.waitpid(pid, 0)[1] for pid, _ in children]
    elapsed = time.monotonic() - started
    totals = {"admitted": 0, "refused": {}, "escaped": []}
    for _, results in children:
        with open(results) as stream:
            counts = json.load(stream)
        totals["admitted"] += counts["admitted"]
        totals["escaped"] += counts["escaped"]
        for code, number in counts["refused"].items():
            totals["refused"][code] = totals["refused"].get(code, 0) + number
    in_flight = max_in_flight = 0
    entered, exited = [], set()
    with open(timeline) as stream:
        for line in stream:
            event, _, operation, _ = line.split()
            if event == "enter":
                in_flight += 1
                entered.append(operation)
            else:
                in_flight -= 1
                exited.add(operation)
            max_in_flight = max(max_in_flight, in_flight)
    connection = sqlite3.connect(os.path.join(data_dir, "journal.sqlite3"))
    integrity = connection.execute("PRAGMA integrity_check").fetchone()[0]
    connection.close()
    report = load_reference().verify(data_dir)
    kinds_by_operation = {}
    for event in report.events:
        kinds_by_operation.setdefault(event["operation_id"], []).append(event["kind"])
    started_then_returned = all(kinds == ["started", "returned"]
                                for kinds in kinds_by_operation.values())
    result = {
        "mode": "processes", "processes": processes, "calls_per_process": calls,
        "calls": processes * calls, "admitted": totals["admitted"], "refused": totals["refused"],
        "escaped_exceptions": len(totals["escaped"]), "escaped_examples": totals["escaped"][:3],
        "worker_exit_codes_nonzero": sum(1 for status in exits if status != 0),
        "max_in_flight": max_in_flight, "timeline_operations": len(entered),
        "journal_operations": len(kinds_by_operation),
        "every_admitted_started_then_returned": started_then_returned,
        "integrity_check": integrity, "chain_verifies": report.ok, "events": report.count,
        "seconds": round(elapsed, 1),
    }
    result["ok"] = (max_in_flight == 1 and not totals["escaped"] and integrity == "ok"
                    and report.ok and started_then_returned
                    and len(entered) == len(exited) == totals["admitted"] == len(kinds_by_operation)
                    and set(totals["refused"]) <= EXPECTED_REFUSALS
                    and result["worker_exit_codes_nonzero"] == 0)
    return result


# ----------------------------------------------------------------- kills --

SERVICE_SCHEMA = ("CREATE TABLE IF NOT EXISTS bookings(id INTEGER PRIMARY KEY, request TEXT NOT NULL, "
                  "operation_id TEXT, pid INTEGER NOT NULL)")


def service_rows(service: str) -> list:
    connection = sqlite3.connect(service)
    try:
        connection.execute(SERVICE_SCHEMA)
        return connection.execute("SELECT request, operation_id FROM bookings").fetchall()
    finally:
        connection.close()


def kill_child(data_dir: str, service: str, timeline: str, point: tuple, request: str,
               operation_to_resolve: str | None, outcome: str | None) -> None:
    """Runs in the forked child: one step, SIGKILLed at ``point`` if reached."""
    def hook(boundary, kind):
        if (boundary, kind) == point:
            os.kill(os.getpid(), signal.SIGKILL)
    durable.set_boundary_hook(hook)
    if operation_to_resolve is not None:
        with Journal(data_dir, create=False) as handle:
            handle.resolve(operation_to_resolve, outcome=outcome,
                           evidence=f"service rows checked for {request}")
        return
    guard = RecoveryGuard(data_dir)

    def downstream():
        operation = ADMISSION.get().operation_id
        timeline_write(timeline, "enter", operation)
        connection = sqlite3.connect(service, isolation_level=None)
        connection.execute(SERVICE_SCHEMA)
        connection.execute("INSERT INTO bookings(request, operation_id, pid) VALUES (?, ?, ?)",
                           (request, operation, os.getpid()))
        connection.close()
        durable.reach_boundary("side_effect", "downstream")
        timeline_write(timeline, "exit", operation)
        return {"status": "confirmed"}

    try:
        guard.tool_execution("book", {"request": request}, downstream, session_id="s",
                             tool_call_id=request)
    finally:
        guard.close()


def probe_call(data_dir: str, calls: list) -> str:
    """One protected call by a fresh guard (closed after); its tool appends to ``calls``."""
    guard = RecoveryGuard(data_dir)
    try:
        return guard.tool_execution("book", {"request": "probe"}, lambda: calls.append(1),
                                    session_id="s", tool_call_id="p")
    finally:
        guard.close()


def run_kills(root: str, kills_wanted: int, seed: int) -> dict:
    rng = random.Random(seed)
    data_dir = os.path.join(root, "kill-profile")
    service = os.path.join(root, "service.sqlite3")
    timeline = os.path.join(root, "kill-timeline.log")
    verifier = load_reference()
    counts = {"kills_tried": 0, "kills_landed": 0, "attempts": 0, "intents_completed": 0,
              "checkpoint_ahead_seen": 0, "pending_seen": 0, "uncertain_seen": 0,
              "silent_repairs": 0, "admitted_while_open": 0, "other_verdicts": 0}
    committed_started = set()  # operation ids a fresh check saw durable
    request_number = 0
    request = f"intent-{request_number}"
    started = time.monotonic()
    max_open = 0
    while counts["kills_tried"] < kills_wanted:
        # Choose a step and a random point of it.
        open_operations = []
        with Journal(data_dir) as handle:
            try:
                open_operations = list(handle.unresolved())
            except JournalError:
                open_operations = []
        if open_operations:
            operation = open_operations[0]
            booked = any(row[1] == operation.operation_id for row in service_rows(service))
            point = rng.choice([p for p in KILL_POINTS if p[1] == "resolved"])
            args = (operation.operation_id, "completed" if booked else "not_applied")
        else:
            point = rng.choice([p for p in KILL_POINTS if p[1] != "resolved"])
            args = (None, None)
        counts["kills_tried"] += 1
        counts["attempts"] += 1
        pid = os.fork()
        if pid == 0:
            try:
                kill_child(data_dir, service, timeline, point, request, *args)
            finally:
                os._exit(0)
        status = os.waitpid(pid, 0)[1]
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        counts["kills_landed"] += int(killed)
        if killed:
            timeline_write(timeline, "killed", "-")
        # ---- the wreck, seen from a fresh connection ----
        verdict = None
        with Journal(data_dir) as handle:
            try:
                status_now = handle.status()
                verdict = "ok"
            except JournalError as exc:
                verdict = exc.code
        if verdict == "checkpoint_ahead":
            counts["checkpoint_ahead_seen"] += 1
            # nothing repairs it silently: a protected call is refused
            calls = []
            result = probe_call(data_dir, calls)
            if calls or json.loads(result)["code"] != "checkpoint_ahead":
                counts["admitted_while_open"] += 1
            with Journal(data_dir) as handle:
                try:
                    handle.status()
                    counts["silent_repairs"] += 1
                except JournalError:
                    pass
                handle.repair_checkpoint()
                status_now = handle.status()
        elif verdict != "ok":
            counts["other_verdicts"] += 1
            break
        report = verifier.verify(data_dir)
        if not report.ok:
            counts["other_verdicts"] += 1
            break
        for event in report.events:
            if event["kind"] == "started":
                committed_started.add(event["operation_id"])
        unresolved = list(status_now.unresolved)
        max_open = max(max_open, len(unresolved))
        for operation in unresolved:
            counts[f"{operation.state}_seen"] += 1
        if unresolved:
            calls = []
            result = probe_call(data_dir, calls)
            if calls:
                counts["admitted_while_open"] += 1
            continue  # the next iteration resolves it (possibly killed again)
        # Nothing open: is the intent done?  The service is the evidence.
        if any(row[0] == request for row in service_rows(service)):
            counts["intents_completed"] += 1
            request_number += 1
            request = f"intent-{request_number}"
    # ---- final accounting ----
    rows = service_rows(service)
    per_request = {}
    for request_name, _ in rows:
        per_request[request_name] = per_request.get(request_name, 0) + 1
    re_executions = sum(number - 1 for number in per_request.values() if number > 1)
    report = verifier.verify(data_dir)
    journal_started = {event["operation_id"] for event in report.events if event["kind"] == "started"}
    lost = (sum(1 for _, operation in rows if operation not in journal_started)
            + len(committed_started - journal_started))
    in_flight = max_in_flight = 0
    with open(timeline) as stream:
        for line in stream:
            event = line.split()[0]
            if event == "enter":
                in_flight += 1
            elif event in ("exit", "killed"):
                in_flight = max(0, in_flight - 1) if event == "killed" else in_flight - 1
            max_in_flight = max(max_in_flight, in_flight)
    result = dict(counts, mode="kills", seed=seed, bookings=len(rows), re_executions=re_executions,
                  lost_operations=lost, max_in_flight=max_in_flight, max_open_operations=max_open,
                  final_chain_verifies=report.ok, events=report.count,
                  seconds=round(time.monotonic() - started, 1))
    result["ok"] = (re_executions == 0 and lost == 0 and max_in_flight <= 1 and report.ok
                    and counts["silent_repairs"] == 0 and counts["admitted_while_open"] == 0
                    and counts["other_verdicts"] == 0 and counts["kills_tried"] >= kills_wanted)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("all", "processes", "kills"), default="all")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dir", default=None, help="work directory (default: a new temp dir)")
    args = parser.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="crash-recovery-stress-")
    os.makedirs(root, exist_ok=True)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    ok = True
    if args.mode in ("all", "processes"):
        result = run_processes(root, args.processes, args.calls)
        print(json.dumps(result, sort_keys=True), flush=True)
        ok &= result["ok"]
    if args.mode in ("all", "kills"):
        result = run_kills(root, args.kills, seed)
        print(json.dumps(result, sort_keys=True), flush=True)
        ok &= result["ok"]
    print(json.dumps({"work_dir": root, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
