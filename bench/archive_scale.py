"""What many archives cost: start-up, per call, after a switch, ``verify --all``.

One profile is archived again and again by the product itself (a protected
call, then ``Journal.archive``), and measured when it holds each archive
count of the plan (1, 100 and 1,000 by default):

* the first protected call of fresh processes (median; the import apart);
* a warm guard's protected calls with no archive between (median);
* a warm guard's first call right after another ``Journal`` archived (the
  full verification every worker makes after a switch; median over several
  switches);
* ``operator_cli.py status`` and ``verify --all`` (wall time, peak RSS), and
  ``verify --all`` per event of every segment.

None of the first four should grow with the number of archives, and
``verify --all`` should stay linear in events (constant per event).
"""
from __future__ import annotations

import os
import shutil
import statistics
import time
from typing import Any, Dict, List

from cli_costs import cli_command, run_measured
from product import ProductCaller, load_product
from stats import log
from workers import first_call_sample, summarize_first_calls

WARM_CALLS = 30
SWITCH_SAMPLES = 5


def _archive_once(journal: Any, caller: ProductCaller) -> None:
    """One protected call (so there is something to seal), then an archive."""
    caller.middleware()
    journal.archive()


def _median_ms(samples: List[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def measure_archive_scale(workdir: str, counts: List[int], repeats: int) -> Dict[str, Any]:
    """The measurements above at each archive count in ``counts`` (ascending)."""
    journal_class = load_product("journal").Journal
    data_dir = os.path.join(workdir, "archive-scale")
    shutil.rmtree(data_dir, ignore_errors=True)
    caller = ProductCaller(data_dir)
    journal = None
    rows: List[Dict[str, Any]] = []
    made = 0
    try:
        caller.middleware()  # creates the journal
        journal = journal_class(data_dir, create=False)
        for count in counts:
            log(f"archive scale: making archives up to {count:,} ...")
            began, batch = time.perf_counter(), made
            while made < count - SWITCH_SAMPLES:
                _archive_once(journal, caller)
                made += 1
            building = (time.perf_counter() - began) / max(1, made - batch)
            after_switch = []
            while made < count:  # the last few switches are timed from the warm guard
                _archive_once(journal, caller)
                made += 1
                began = time.perf_counter()
                caller.middleware()
                after_switch.append(time.perf_counter() - began)
            warm = []
            for _ in range(WARM_CALLS):
                began = time.perf_counter()
                caller.middleware()
                warm.append(time.perf_counter() - began)
            fresh = summarize_first_calls([first_call_sample(data_dir)
                                           for _ in range(max(1, repeats))])
            status = run_measured(cli_command(data_dir, "status", None))
            verify_all = run_measured(cli_command(data_dir, "verify --all", None))
            verified = journal.verify_all()
            events = (sum(anchor["count"] for anchor in verified["archives"])
                      + verified["status"].checkpoint["count"])
            rows.append({
                "archives": made, "events_all_segments": events,
                "call_and_archive_seconds_each": round(building, 5),
                "fresh_first_call_ms": round(fresh["first_call_seconds"] * 1000, 3),
                "fresh_import_ms": round(fresh["import_seconds"] * 1000, 3),
                "warm_call_p50_ms": _median_ms(warm),
                "first_call_after_a_switch_p50_ms": _median_ms(after_switch),
                "status_seconds": status["seconds"], "status_exit": status["exit"],
                "verify_all_seconds": verify_all["seconds"], "verify_all_exit": verify_all["exit"],
                "verify_all_peak_rss_mb": verify_all["peak_rss_mb"],
                "verify_all_us_per_event": round(verify_all["seconds"] * 1e6 / events, 2),
            })
    finally:
        caller.close()
        if journal is not None:
            journal.close()
    return {"rows": rows}


def format_scale_table(result: Dict[str, Any]) -> str:
    """The Markdown table pasted into bench/RESULTS.md."""
    lines = ["| archives | events (all segments) | fresh process, first call (ms) | warm call "
             "p50 (ms) | first call after a switch p50 (ms) | `status` (s) | `verify --all` (s) "
             "| `verify --all` per event (µs) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['archives']:,} | {row['events_all_segments']:,} | "
                     f"{row['fresh_first_call_ms']} | {row['warm_call_p50_ms']} | "
                     f"{row['first_call_after_a_switch_p50_ms']} | {row['status_seconds']} | "
                     f"{row['verify_all_seconds']} | {row['verify_all_us_per_event']} |")
    return "\n".join(lines)
