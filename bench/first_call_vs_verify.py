"""A fresh process's first protected call against ``verify``, alternating.

Issue 27: a fresh process verifies its live history once, so its first
protected call costs at most what ``operator_cli.py verify`` costs (one full
verification) -- at most 1.0 x at 1M events.  Both are fresh processes, run
one after the other, ``repeats`` pairs, and timed the same way here (wall
time of the whole process, from ``subprocess.run`` to its exit: interpreter
start-up and the product's imports in both).  The first-call process is
first_call_probe.py (the product and one call, none of the benchmark's
modules; it also reports the time from building the guard to the call's
return); ``verify`` runs with its output to /dev/null.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

from cli_costs import cli_command
from product import BENCH_DIR, REPOSITORY_ROOT, TOOL_ARGS, TOOL_NAME, current_count
from stats import ratio
from workers import first_call_sample

PROBE = os.path.join(BENCH_DIR, "first_call_probe.py")


def first_call_process(data_dir: str) -> Dict[str, Any]:
    """One first_call_probe.py process: its timings and ``process_seconds``."""
    return first_call_sample(data_dir, [sys.executable, PROBE, data_dir, TOOL_NAME,
                                        json.dumps(TOOL_ARGS)])


def verify_sample(data_dir: str) -> float:
    """Wall seconds of one ``operator_cli.py verify`` process (it must pass)."""
    began = time.perf_counter()
    completed = subprocess.run(cli_command(data_dir, "verify", None), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, cwd=REPOSITORY_ROOT, timeout=600)
    seconds = time.perf_counter() - began
    if completed.returncode != 0:
        raise RuntimeError(f"operator_cli.py verify exited {completed.returncode}: {completed.stderr[-1000:]}")
    return seconds


def measure_first_call_vs_verify(data_dir: str, repeats: int) -> Dict[str, Any]:
    """``repeats`` pairs (first call, then ``verify``); medians and ratios."""
    first: List[Dict[str, Any]] = []
    verify: List[float] = []
    events = current_count(data_dir)
    for _ in range(max(1, repeats)):
        first.append(first_call_process(data_dir))
        verify.append(verify_sample(data_dir))
    process = statistics.median(sample["process_seconds"] for sample in first)
    call = statistics.median(sample["first_call_seconds"] for sample in first)
    verified = statistics.median(verify)
    return {"events": events, "pairs": len(verify),
            "first_call_process_seconds": round(process, 4),
            "first_call_seconds": round(call, 4),
            "verify_process_seconds": round(verified, 4),
            "ratio_process_to_verify": ratio(process, verified),
            "ratio_first_call_to_verify": ratio(call, verified),
            "first_call_process_samples": [sample["process_seconds"] for sample in first],
            "verify_samples": [round(sample, 4) for sample in verify]}
