#!/usr/bin/env python3
"""What the closed-gate check costs an unprotected call (docs/guard.md §While
the gate is closed).

    python bench/closed_gate_cost.py [--calls N] [--events N]

In ``protected_tools`` mode an unprotected call (``terminal``) that may not run
while the gate is closed costs one verified read of the journal in the
middleware, and another in the ``pre_tool_call`` hook; a read-only tool
(``read_file``) costs none, nor does any call before a journal exists.  For
comparison, the read the gate already makes in a protected call's hook.  Prints
one JSON document: per-call p50 and p99 in microseconds for each case, with a
history of a few events and of ``--events`` (default 100,000, written
directly in the journal's format by bulk_journal.py), interleaved call by call
so a noisy machine's drift hits every series alike.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bulk_journal  # noqa: E402
from product import load_product  # noqa: E402
from stats import percentile  # noqa: E402

SETTINGS = {"protected_tools": ["send_payment"]}


def micro(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def series_for(guard, tool: str, with_hook: bool) -> Callable[[], None]:
    """One unprotected call of ``tool`` through the middleware (and the hook)."""
    def call() -> None:
        if with_hook:
            guard.pre_tool_call(tool_name=tool, args={"command": "ls"}, session_id="s",
                                tool_call_id="c")
        guard.tool_execution(tool_name=tool, args={"command": "ls"}, next_call=lambda: "ok",
                             session_id="s", tool_call_id="c")
    return call


def measure(series: Dict[str, Callable[[], None]], calls: int) -> Dict[str, Dict[str, float]]:
    samples: Dict[str, List[float]] = {name: [] for name in series}
    names = list(series)
    for function in series.values():  # warm: connections open, chains cached
        for _ in range(20):
            function()
    for index in range(calls):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            series[name]()
            samples[name].append(time.perf_counter() - started)
    return {name: {"p50_us": micro(percentile(values, 0.5)),
                   "p99_us": micro(percentile(values, 0.99))} for name, values in samples.items()}


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--events", type=int, default=100_000)
    options = parser.parse_args(argv)
    guard_class = load_product("guard").RecoveryGuard
    root = tempfile.mkdtemp(prefix="crash-recovery-closed-gate-cost-")
    report = {"calls_per_series": options.calls}
    try:
        fresh = guard_class(os.path.join(root, "fresh"), settings=SETTINGS)
        small_dir = os.path.join(root, "small")
        small = guard_class(small_dir, settings=SETTINGS)
        small.tool_execution(tool_name="send_payment", args={}, next_call=lambda: "paid")
        large_dir = os.path.join(root, "large")
        bulk_journal.write_journal(large_dir, options.events)
        large = guard_class(large_dir, settings=SETTINGS)
        series = {
            "no_guard": lambda: (lambda: "ok")(),
            "read_only_tool_hook_and_middleware": series_for(small, "read_file", True),
            "no_journal_yet_hook_and_middleware": series_for(fresh, "terminal", True),
            # The gate's own read today: the hook of a protected call (it appends nothing).
            "protected_call_hook_small_history": lambda: small.pre_tool_call(
                tool_name="send_payment", args={}, session_id="s", tool_call_id="p"),
            "middleware_only_small_history": series_for(small, "terminal", False),
            "hook_and_middleware_small_history": series_for(small, "terminal", True),
            "middleware_only_large_history": series_for(large, "terminal", False),
            "hook_and_middleware_large_history": series_for(large, "terminal", True),
        }
        report["events_large"] = options.events
        report["per_call"] = measure(series, options.calls)
        for guard in (fresh, small, large):
            guard.close()
        report["data_dir_created_for_unprotected_calls_before_a_journal"] = os.path.exists(
            os.path.join(root, "fresh"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
