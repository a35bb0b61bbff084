"""Protected calls from other processes: fresh ones and warm workers.

* First calls: a new interpreter imports the plugin, builds a
  ``RecoveryGuard`` and makes one protected call, then a second one; the time
  from the guard's construction to the first call's return, with the import
  reported apart (``probe_first_call`` is the child's body).
* Warm workers: two long-lived processes running this benchmark in its worker
  mode (``worker_main``), each with its own guard, make protected calls
  strictly alternating, coordinated over pipes; then one of them alone.  Each
  call is the ``pre_tool_call`` hook and the middleware around a no-op tool,
  timed inside the worker; the floor is interleaved from the coordinator.  The
  workers record how long SQLite's writer lock is held per append.
* After the worker phases: a warm worker's next call right after an operator
  ``status`` ran; and, at the largest size, the gate check while another
  connection holds the writer lock (``gate_under_writer_lock``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import bulk_journal
from cli_costs import cli_command, run_measured
from floor import DurableAppendFloor
from product import (BENCH_SCRIPT, NO_OP_RESULT, PRODUCT_ROOT_VARIABLE, REPOSITORY_ROOT, TOOL_ARGS, TOOL_NAME,
                     WARMUP_CALLS, LockHoldRecorder, ProductCaller, current_count, load_product)
from stats import distribution_ms, milliseconds, percentile, ratio, time_call

LOCK_TEST_BUSY_TIMEOUT_SECONDS = 0.5
PRODUCT_PACKAGE = "crash_recovery"  # the name product.py loads the plugin under


# ----------------------------------------------------------- first calls --

def probe_first_call(data_dir: str) -> Dict[str, Any]:
    """Child body: import the plugin, build a guard, make one protected call,
    then a second (warm) one; print the timings as JSON."""
    began = time.perf_counter()
    guard_module = load_product("guard")
    imported = time.perf_counter()
    assert guard_module is not None
    events_before = current_count(data_dir)
    caller_began = time.perf_counter()
    caller = ProductCaller(data_dir)  # the guard opens nothing until its first call
    caller.middleware()
    first = time.perf_counter() - caller_began
    second = time_call(caller.middleware)
    caller.close()
    return {"import_seconds": round(imported - began, 4), "first_call_seconds": round(first, 4),
            "second_call_seconds": round(second, 4), "events_before": events_before}


def first_call_sample(data_dir: str, command: Optional[List[str]] = None) -> Dict[str, Any]:
    """One fresh process making its first protected call on ``data_dir``
    (``command``: another probe's, e.g. first_call_probe.py); its JSON line
    plus ``process_seconds``."""
    began = time.perf_counter()
    command = command or [sys.executable, BENCH_SCRIPT, "--probe-first-call", data_dir]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPOSITORY_ROOT,
                               timeout=600)
    wall = time.perf_counter() - began
    if completed.returncode != 0:
        raise RuntimeError(f"first-call probe failed: {completed.stderr[-2000:]}")
    sample = json.loads(completed.stdout.strip().splitlines()[-1])
    sample["process_seconds"] = round(wall, 4)
    return sample


def summarize_first_calls(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {
        "events_before": samples[0]["events_before"],
        "repeats": len(samples),
        "first_call_seconds": round(statistics.median(s["first_call_seconds"] for s in samples), 4),
        "second_call_seconds": round(statistics.median(s["second_call_seconds"] for s in samples), 4),
        "import_seconds": round(statistics.median(s["import_seconds"] for s in samples), 4),
        "process_seconds": round(statistics.median(s["process_seconds"] for s in samples), 4),
        "samples": [s["first_call_seconds"] for s in samples],
    }


def measure_first_calls(data_dir: str, repeats: int) -> Dict[str, Any]:
    """``repeats`` fresh processes, each making its first protected call."""
    return summarize_first_calls([first_call_sample(data_dir) for _ in range(max(1, repeats))])


# ---------------------------------------------------------- warm workers --

class WorkerProcess:
    """A long-lived worker (bench/run.py with ``--worker DIR``, or the hidden
    mode ``mode`` names) driven over pipes: one JSON request per line on its
    stdin, one JSON reply per line on its stdout.  ``python``: the interpreter
    to run it with (the peers' virtual environment, see peers.py)."""

    def __init__(self, data_dir: str, name: str, mode: str = "--worker",
                 python: str = sys.executable, environment: Optional[Dict[str, str]] = None) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [python, BENCH_SCRIPT, mode, data_dir, "--worker-name", name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=REPOSITORY_ROOT,
            env=None if environment is None else {**os.environ, **environment})

    def send(self, request: Dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def receive(self) -> Dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} exited ({self.process.wait()})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"worker {self.name} failed: {reply}")
        return reply

    def request(self, request: Dict[str, Any]) -> Dict[str, Any]:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send({"op": "exit"})
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def worker_main(data_dir: str, name: str) -> int:
    """Worker body: a warm ``RecoveryGuard`` answering requests from stdin.

    ``call``: hook + middleware around a no-op tool (timed apart; and the
    process's CPU time for both);
    ``holds``: the writer-lock hold times recorded since the last ``holds``;
    ``lock_test``: run while the coordinator holds the writer lock;
    ``busy``: protected calls back to back for ``seconds`` (busy_workers.py);
    ``exit``."""
    recorder = LockHoldRecorder()
    if not os.environ.get(PRODUCT_ROOT_VARIABLE):
        # A worker running another checkout (side_by_side.py's baseline) records
        # no hold times: the hook's own CPU would be added to the calls compared.
        recorder.install()
    caller = ProductCaller(data_dir)
    caller.call_number = 0
    reply: Dict[str, Any]
    for line in sys.stdin:
        request = json.loads(line)
        operation = request["op"]
        try:
            if operation == "call":
                cpu_began = time.process_time()
                began = time.perf_counter()
                verdict = caller.hook()
                hooked = time.perf_counter()
                if verdict is not None:
                    raise RuntimeError(f"pre_tool_call refused: {str(verdict)[:300]}")
                caller.middleware()
                ended = time.perf_counter()
                reply = {"ok": True, "hook_seconds": hooked - began, "middleware_seconds": ended - hooked,
                         "cpu_seconds": time.process_time() - cpu_began}
            elif operation == "hook":
                began = time.perf_counter()
                verdict = caller.hook()
                reply = {"ok": verdict is None, "hook_seconds": time.perf_counter() - began,
                         "verdict": verdict}
            elif operation == "holds":
                reply = {"ok": True, "holds": recorder.report()}
                recorder.reset()
            elif operation == "lock_test":
                reply = {"ok": True, **lock_test_in_worker(caller, data_dir)}
            elif operation == "busy":
                reply = {"ok": True, **busy_attempts(caller, request["seconds"],
                                                     request["pause_after_refusal"])}
            elif operation == "exit":
                break
            else:
                reply = {"ok": False, "error": f"unknown op {operation}"}
        except Exception as exc:  # report to the coordinator, which fails the run
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    caller.close()
    return 0


def lock_test_in_worker(caller: ProductCaller, data_dir: str) -> Dict[str, Any]:
    """Run while another connection holds SQLite's writer lock: the warm
    guard's hook, a fresh guard's hook, and the fresh guard's protected call
    (which needs the lock and must be refused after its busy timeout)."""
    began = time.perf_counter()
    warm_verdict = caller.hook()
    warm_seconds = time.perf_counter() - began
    fresh = ProductCaller(data_dir, busy_timeout=LOCK_TEST_BUSY_TIMEOUT_SECONDS)
    try:
        began = time.perf_counter()
        fresh_verdict = fresh.hook()
        fresh_seconds = time.perf_counter() - began
        began = time.perf_counter()
        result = fresh.recovery_guard.tool_execution(
            TOOL_NAME, TOOL_ARGS, fresh._no_op_tool, session_id="bench-session",
            tool_call_id="bench-lock-test")
        call_seconds = time.perf_counter() - began
        downstream_ran = fresh.downstream_calls
    finally:
        fresh.close()
    try:
        refusal_code = json.loads(result).get("code") if result != NO_OP_RESULT else None
    except (TypeError, ValueError):
        refusal_code = None
    return {"warm_hook_verdict": "allow" if warm_verdict is None else "block",
            "warm_hook_ms": milliseconds(warm_seconds),
            "fresh_hook_verdict": "allow" if fresh_verdict is None else "block",
            "fresh_hook_ms": milliseconds(fresh_seconds),
            "fresh_hook_message": None if fresh_verdict is None else str(fresh_verdict)[:300],
            "call_result": "ran" if result == NO_OP_RESULT else "refused",
            "call_refusal_code": refusal_code, "call_ms": milliseconds(call_seconds),
            "call_downstream_ran": downstream_ran,
            "busy_timeout_seconds": LOCK_TEST_BUSY_TIMEOUT_SECONDS}


def refusal_code(message: Any) -> str:
    """The ``code`` of a blocked JSON message (the hook's ``message``, or the
    middleware's result), or ``unparsed``."""
    try:
        code = json.loads(message).get("code")
    except (TypeError, ValueError, AttributeError):
        return "unparsed"
    return code if isinstance(code, str) else "unparsed"


class LogRecordCounter(logging.Handler):
    """Counts the product's log records by level instead of printing them."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] = self.counts.get(record.levelname, 0) + 1


def busy_attempts(caller: ProductCaller, seconds: float, pause_after_refusal: float) -> Dict[str, Any]:
    """Protected calls (hook, then -- if it allows -- the middleware) back to
    back for ``seconds``, as a busy worker makes them, pausing
    ``pause_after_refusal`` seconds after a refusal (the model is told to
    wait and ask again).  Each attempt is timed (wall); refused ones are
    recorded with their code and the stage that refused (``hook`` or
    ``middleware``).  The product's log records are counted, not printed."""
    admitted: List[float] = []
    refused: List[list] = []  # [seconds, code, stage]
    logged = LogRecordCounter()
    product_logger = logging.getLogger(PRODUCT_PACKAGE)
    product_logger.addHandler(logged)
    cpu_began = time.process_time()
    began = time.perf_counter()
    deadline = began + seconds
    now = began
    try:
        while now < deadline:
            verdict = caller.hook()  # for call number call_number + 1, as ProductCaller.middleware
            caller.call_number += 1
            if verdict is not None:
                stage, code = "hook", refusal_code(verdict.get("message"))
            else:
                result = caller.recovery_guard.tool_execution(
                    TOOL_NAME, TOOL_ARGS, caller._no_op_tool, session_id="bench-session",
                    tool_call_id=f"bench-call-{caller.call_number}")
                stage, code = ("middleware", refusal_code(result)) if result != NO_OP_RESULT else (None, None)
            ended = time.perf_counter()
            if stage is None:
                admitted.append(ended - now)
            else:
                refused.append([ended - now, code, stage])
                time.sleep(pause_after_refusal)
            now = time.perf_counter()
    finally:
        product_logger.removeHandler(logged)
    return {"elapsed_seconds": now - began, "cpu_seconds": time.process_time() - cpu_began,
            "admitted_seconds": admitted, "refused": refused, "log_records": logged.counts}


def measure_workers(journal_dir: str, floor_dir: str, calls: int, lock_test: bool) -> Dict[str, Any]:
    """Two warm workers alternating protected calls, then worker A alone; the
    floor interleaved from this process; writer-lock hold times per phase."""
    workers = [WorkerProcess(journal_dir, "A"), WorkerProcess(journal_dir, "B")]
    floor = DurableAppendFloor(floor_dir)
    result: Dict[str, Any] = {"events": current_count(journal_dir), "calls_per_worker": calls}
    try:
        began = time.perf_counter()
        # Each worker's first pre_tool_call verifies the whole history (read-only,
        # so both run at once); protected calls must not overlap (the second
        # would be refused operation_in_flight / unresolved_operations).
        for worker in workers:
            worker.send({"op": "hook"})
        first = [worker.receive() for worker in workers]
        result["warmup_first_hook_ms"] = [milliseconds(reply["hook_seconds"]) for reply in first]
        result["warmup_seconds"] = round(time.perf_counter() - began, 3)
        for _ in range(WARMUP_CALLS):
            for worker in workers:
                worker.request({"op": "call"})
            floor.protected_call()
        for worker in workers:
            worker.request({"op": "holds"})  # drop the warm-up's hold times

        def phase(active: List[WorkerProcess]) -> Dict[str, Any]:
            hook: List[float] = []
            middleware: List[float] = []
            total: List[float] = []
            floor_samples: List[float] = []
            steps = [*active, None]  # None: one floor call
            for index in range(calls):
                # The workers keep their strict A, B order; the floor's slot rotates.
                slot = index % len(steps)
                order = [step for step in steps if step is not None]
                order.insert(slot, None)
                for step in order:
                    if step is None:
                        floor_samples.append(time_call(floor.protected_call))
                        continue
                    reply = step.request({"op": "call"})
                    hook.append(reply["hook_seconds"])
                    middleware.append(reply["middleware_seconds"])
                    total.append(reply["hook_seconds"] + reply["middleware_seconds"])
            holds = [worker.request({"op": "holds"})["holds"] for worker in active]
            floor_p50 = percentile(floor_samples, 0.5)
            merged: Dict[str, Any] = {}
            for kind in ("started", "returned"):
                samples_ms = []
                for hold in holds:
                    if kind in hold:
                        samples_ms.append(hold[kind])
                merged[kind] = combine_hold_reports(samples_ms)
            merged["started_phases_p50_ms"] = holds[0].get("started_phases_p50_ms")
            return {
                "workers": len(active),
                "middleware": distribution_ms(middleware),
                "hook": distribution_ms(hook),
                "hook_and_middleware": distribution_ms(total),
                "floor": distribution_ms(floor_samples),
                "middleware_ratio_p50": ratio(percentile(middleware, 0.5), floor_p50),
                "hook_and_middleware_ratio_p50": ratio(percentile(total, 0.5), floor_p50),
                "lock_hold": merged,
            }

        result["alternating"] = phase(workers)
        result["single"] = phase(workers[:1])
        # An operator's read-only `status` while the workers are warm: what does
        # the next protected call of a warm worker cost?
        status = run_measured(cli_command(journal_dir, "status", None))
        after = workers[0].request({"op": "call"})
        again = workers[0].request({"op": "call"})
        result["call_after_operator_status_ms"] = milliseconds(after["hook_seconds"] + after["middleware_seconds"])
        result["call_after_that_ms"] = milliseconds(again["hook_seconds"] + again["middleware_seconds"])
        result["operator_status_seconds"] = status["seconds"]
        if lock_test:
            result["gate_under_writer_lock"] = gate_under_writer_lock(journal_dir, workers[0])
    finally:
        for worker in workers:
            worker.close()
        floor.close()
    return result


def combine_hold_reports(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Hold-time distributions of several workers: the workers' own samples
    are gone, so report the worst p50/p99/max and the total count."""
    if not reports:
        return distribution_ms([])
    return {"n": sum(report["n"] for report in reports),
            "p50_ms": max(report["p50_ms"] for report in reports),
            "p99_ms": max(report["p99_ms"] for report in reports),
            "max_ms": max(report["max_ms"] for report in reports)}


def gate_under_writer_lock(journal_dir: str, worker: WorkerProcess) -> Dict[str, Any]:
    """Hold ``BEGIN IMMEDIATE`` in another connection; the worker's hook must
    still answer (it takes no writer lock), a protected call must not.

    The holder connection first reads once and the worker's hook runs: opening
    the WAL from a new connection can itself make a warm worker re-verify the
    whole history (SQLite running as root ``fchown``s the WAL it opens, which
    changes its ctime; see bench/RESULTS.md), and that cost is reported apart
    (``hook_after_foreign_open_ms``) instead of being mistaken for lock waiting."""
    holder = sqlite3.connect(os.path.join(journal_dir, bulk_journal.DB_NAME), timeout=10,
                             isolation_level=None)
    try:
        holder.execute("SELECT count(*) FROM metadata").fetchone()
        opened = worker.request({"op": "hook"})
        holder.execute("BEGIN IMMEDIATE")
        began = time.perf_counter()
        reply = worker.request({"op": "lock_test"})
        held = time.perf_counter() - began
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    after = worker.request({"op": "call"})  # and a call works again once it is released
    reply.pop("ok", None)
    reply["hook_after_foreign_open_ms"] = milliseconds(opened["hook_seconds"])
    reply["writer_lock_held_seconds"] = round(held, 3)
    reply["call_after_release_ms"] = milliseconds(after["hook_seconds"] + after["middleware_seconds"])
    return reply
