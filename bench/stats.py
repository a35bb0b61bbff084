"""Summary statistics and timing helpers shared by every measurement.

Nearest-rank percentiles, p50/p99/max distributions in milliseconds, rounded
ratios, timing one call, and the progress log on stderr (stdout carries the
tables, and a worker's stdout its replies).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional


def percentile(samples: List[float], fraction: float) -> float:
    """Nearest-rank percentile of ``samples`` (fraction in [0, 1])."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), int(round(fraction * len(ordered) + 0.5))))
    return ordered[rank - 1]


def milliseconds(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds * 1000.0, 4)


def distribution_ms(samples: List[float]) -> Dict[str, Any]:
    """p50 / p99 / max (ms) and the sample count of ``samples`` (seconds)."""
    if not samples:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"n": len(samples), "p50_ms": milliseconds(percentile(samples, 0.5)),
            "p99_ms": milliseconds(percentile(samples, 0.99)), "max_ms": milliseconds(max(samples))}


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def time_call(function: Callable[[], Any]) -> float:
    began = time.perf_counter()
    function()
    return time.perf_counter() - began


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
