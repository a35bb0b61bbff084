"""Busy workers: what a refusal costs while another call is in flight, and
what eight workers get done against one.

Eight warm worker processes (workers.py's worker mode, each with its own
``RecoveryGuard`` on the same journal) make protected calls back to back --
the ``pre_tool_call`` hook and, when it allows, the middleware around the
no-op tool -- for a fixed time, pausing 5 ms after a refusal (see
PAUSE_AFTER_REFUSAL_SECONDS); first one worker alone, then all eight at once.
Only one protected call runs at a time in a profile (docs/guard.md
§Concurrency), so most attempts of the eight are refused, normally
``operation_in_flight``.  Each attempt is timed in its worker.  Reported:
the latency of refused attempts (p50 / p99 / max) by code and by the stage
that refused, the admitted calls' latency, and the throughput (admitted calls
per second) of eight workers against one.  Targets (issue 27): a refusal
because another call is in flight at most 20 ms at p99 with 8 busy workers
("a refusal costs what a read costs"); the throughput ratio is printed.
"""
from __future__ import annotations

from typing import Any, Dict, List

from stats import distribution_ms, log, ratio
from workers import WorkerProcess

BUSY_WORKERS = 8
IN_FLIGHT_CODE = "operation_in_flight"
# After a refusal a worker waits this long before it tries again: a model told
# to wait takes far longer (a turn), so this is harsher than life, but a worker
# retrying at once would only measure how seven spinning processes starve the
# one whose call is in flight on a 2-core machine.
PAUSE_AFTER_REFUSAL_SECONDS = 0.005


def _phase(workers: List[WorkerProcess], seconds: float) -> Dict[str, Any]:
    """All of ``workers`` busy at once for ``seconds``; the pooled results."""
    for worker in workers:
        worker.send({"op": "busy", "seconds": seconds, "pause_after_refusal": PAUSE_AFTER_REFUSAL_SECONDS})
    replies = [worker.receive() for worker in workers]
    admitted = [value for reply in replies for value in reply["admitted_seconds"]]
    refused = [entry for reply in replies for entry in reply["refused"]]
    elapsed = max(reply["elapsed_seconds"] for reply in replies)
    by_code: Dict[str, List[float]] = {}
    by_stage: Dict[str, List[float]] = {}
    for seconds_taken, code, stage in refused:
        by_code.setdefault(code, []).append(seconds_taken)
        by_stage.setdefault(stage, []).append(seconds_taken)
    attempts = len(admitted) + len(refused)
    return {
        "workers": len(workers), "seconds": round(elapsed, 3), "attempts": attempts,
        "admitted": len(admitted), "refused": len(refused),
        "admitted_per_second": round(len(admitted) / elapsed, 1) if elapsed else None,
        "attempts_per_second": round(attempts / elapsed, 1) if elapsed else None,
        "admitted_latency": distribution_ms(admitted),
        "refused_latency": distribution_ms([entry[0] for entry in refused]),
        "refused_by_code": {code: distribution_ms(values) for code, values in sorted(by_code.items())},
        "refused_by_stage": {stage: distribution_ms(values) for stage, values in sorted(by_stage.items())},
        "cpu_seconds_per_admitted_call": (round(sum(reply["cpu_seconds"] for reply in replies)
                                                / len(admitted), 5) if admitted else None),
        "admitted_per_worker": [len(reply["admitted_seconds"]) for reply in replies],
        "log_records": {level: sum(reply["log_records"].get(level, 0) for reply in replies)
                        for level in sorted({level for reply in replies for level in reply["log_records"]})},
    }


def measure_busy_workers(journal_dir: str, seconds: float, workers: int = BUSY_WORKERS) -> Dict[str, Any]:
    """Worker A busy alone for ``seconds``, then ``workers`` busy at once."""
    started = [WorkerProcess(journal_dir, f"busy-{index}") for index in range(workers)]
    try:
        log(f"busy workers: warming {workers} workers (each verifies the history once) ...")
        for worker in started:  # first reads all at once: read-only
            worker.send({"op": "hook"})
        for worker in started:
            worker.receive()
        for worker in started:  # one admitted call each, one after the other
            worker.request({"op": "call"})
        alone = _phase(started[:1], seconds)
        together = _phase(started, seconds)
    finally:
        for worker in started:
            worker.close()
    in_flight = together["refused_by_code"].get(IN_FLIGHT_CODE)
    return {"seconds_per_phase": seconds, "pause_after_refusal_seconds": PAUSE_AFTER_REFUSAL_SECONDS,
            "alone": alone, "together": together,
            "in_flight_refusal": in_flight,
            "throughput_ratio": ratio(together["admitted_per_second"], alone["admitted_per_second"])}


def format_busy_workers(sizes: List[Dict[str, Any]]) -> str:
    """The busy-workers table over the sizes that measured it, as Markdown."""
    measured = [entry for entry in sizes if entry.get("busy_workers")]
    if not measured:
        return ""
    lines = ["| | " + " | ".join(f"{entry['events']:,} events" for entry in measured) + " |",
             "|---|" + "---|" * len(measured)]

    def row(label: str, cells: List[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def shown(distribution: Any) -> str:
        if not distribution or not distribution.get("n"):
            return "-"
        return f"{distribution['p50_ms']:.2f} / {distribution['p99_ms']:.2f} / {distribution['max_ms']:.2f} (n {distribution['n']})"
    busy = [entry["busy_workers"] for entry in measured]
    count = busy[0]["together"]["workers"]
    row("one worker alone: admitted calls/s", [f"{b['alone']['admitted_per_second']}" for b in busy])
    row(f"{count} workers: admitted calls/s (ratio to one)",
        [f"{b['together']['admitted_per_second']} ({b['throughput_ratio']})" for b in busy])
    row(f"{count} workers: attempts / admitted / refused",
        [f"{b['together']['attempts']} / {b['together']['admitted']} / {b['together']['refused']}" for b in busy])
    row(f"{count} workers: refused `{IN_FLIGHT_CODE}` p50 / p99 / max (ms)",
        [shown(b["in_flight_refusal"]) for b in busy])
    codes = sorted({code for b in busy for code in b["together"]["refused_by_code"]} - {IN_FLIGHT_CODE})
    for code in codes:
        row(f"{count} workers: refused `{code}` p50 / p99 / max (ms)",
            [shown(b["together"]["refused_by_code"].get(code)) for b in busy])
    for stage in ("hook", "middleware"):
        row(f"{count} workers: refused by the {stage}, p50 / p99 / max (ms)",
            [shown(b["together"]["refused_by_stage"].get(stage)) for b in busy])
    row(f"{count} workers: admitted call p50 / p99 / max (ms)", [shown(b["together"]["admitted_latency"]) for b in busy])
    row("one worker alone: admitted call p50 / p99 / max (ms)", [shown(b["alone"]["admitted_latency"]) for b in busy])
    row(f"{count} workers: the product's log records (by level)",
        [", ".join(f"{level} {number}" for level, number in b["together"]["log_records"].items()) or "none"
         for b in busy])
    return "\n".join(lines)
