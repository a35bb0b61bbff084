"""Overhead of a protected call in one process, against the floor.

The middleware alone, and the ``pre_tool_call`` hook + middleware, interleaved
call by call with the floor (two bare durable appends, see floor.py) so drift
on a noisy machine hits every series alike; ``os.fsync`` / ``os.replace`` per
append; and protected calls in the ``full_verification`` mode (the whole
history verified on every admission and outcome), for histories up to
FULL_MODE_MAX_EVENTS.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional

from floor import DurableAppendFloor
from os_calls import OsCallCounter
from product import WARMUP_CALLS, ProductCaller, current_count
from stats import milliseconds, percentile, time_call

FULL_MODE_CALLS = 5              # protected calls with full_verification=True per size
FULL_MODE_MAX_EVENTS = 100_000   # skip full-mode calls above this history (seconds each)
FULL_MODE_TIME_BUDGET_SECONDS = 10.0


def measure_overhead(journal_dir: str, floor_dir: str, calls: int) -> Dict[str, Any]:
    """In one process: middleware and hook + middleware interleaved call by call
    with the floor; os.fsync/os.replace counts per append."""
    result: Dict[str, Any] = {}
    product = ProductCaller(journal_dir)
    floor = DurableAppendFloor(floor_dir)
    try:
        result["entry_point"] = product.entry_point
        result["first_call_in_process_seconds"] = round(time_call(product.protected_call), 4)
        for _ in range(WARMUP_CALLS):
            product.protected_call()
            floor.protected_call()
        series: Dict[str, Callable[[], None]] = {
            "floor": floor.protected_call,
            "middleware": product.protected_call,
            "hook_and_middleware": product.protected_call_with_hook,
        }
        samples: Dict[str, List[float]] = {name: [] for name in series}
        names = list(series)
        for index in range(calls):
            # Rotate the order so drift on a noisy machine hits every series alike.
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                samples[name].append(time_call(series[name]))
        floor_p50, floor_p99 = percentile(samples["floor"], 0.5), percentile(samples["floor"], 0.99)
        result.update({
            "floor_call_p50_ms": milliseconds(floor_p50),
            "floor_call_p99_ms": milliseconds(floor_p99),
            "floor_append_p50_ms": milliseconds(floor_p50 / 2),
        })
        for name, prefix in (("middleware", "protected_call"),
                             ("hook_and_middleware", "hook_and_protected_call")):
            p50, p99 = percentile(samples[name], 0.5), percentile(samples[name], 0.99)
            result.update({
                f"{prefix}_p50_ms": milliseconds(p50),
                f"{prefix}_p99_ms": milliseconds(p99),
                f"{prefix}_mean_ms": milliseconds(statistics.fmean(samples[name])),
                f"{prefix}_overhead_ratio_p50": round(p50 / floor_p50, 3),
                f"{prefix}_overhead_ratio_p99": round(p99 / floor_p99, 3),
            })

        counted_calls = max(3, calls // 10)
        events_before = current_count(journal_dir)
        with OsCallCounter() as product_counter:
            for _ in range(counted_calls):
                product.protected_call()
        appended = current_count(journal_dir) - events_before
        with OsCallCounter() as floor_counter:
            for _ in range(counted_calls):
                floor.protected_call()
        result.update({
            "appends_per_protected_call": round(appended / counted_calls, 3),
            "python_fsync_per_append": round(product_counter.count("fsync") / max(1, appended), 3),
            "python_replace_per_append": round(product_counter.count("replace") / max(1, appended), 3),
            "floor_python_fsync_per_append": round(floor_counter.count("fsync") / (2 * counted_calls), 3),
        })
    finally:
        product.close()
        floor.close()
    return result


def measure_full_mode(journal_dir: str, events: int) -> Optional[float]:
    """p50 (ms) of protected calls with ``full_verification=True`` (the whole
    history on every admission and outcome); None for a journal built with
    more than FULL_MODE_MAX_EVENTS events."""
    if events > FULL_MODE_MAX_EVENTS:
        return None
    product = ProductCaller(journal_dir, full_verification=True)
    try:
        product.protected_call()
        samples: List[float] = []
        while len(samples) < FULL_MODE_CALLS and sum(samples) < FULL_MODE_TIME_BUDGET_SECONDS:
            samples.append(time_call(product.protected_call))
        return milliseconds(percentile(samples, 0.5))
    finally:
        product.close()
