"""What archiving costs, and what it buys the next fresh process.

``operator_cli.py archive`` on the largest journal runs in a child process
(this benchmark in its archive-probe mode, ``probe_archive``) with the
boundary hook recording how long it holds SQLite's writer lock; its wall time
and peak RSS are measured from outside.  Then: the first protected call of
fresh processes on the short live segment, alternating with the same call on
an empty journal (so both see the same fsync latency and machine load),
``status`` and ``verify --all``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from typing import Any, Dict

import bulk_journal
from cli_costs import cli_command, run_measured
from product import BENCH_SCRIPT, LockHoldRecorder, current_count, directory_bytes, journal_bytes, load_product
from stats import milliseconds
from workers import first_call_sample, summarize_first_calls


def probe_archive(data_dir: str, report_path: str) -> int:
    """Child body: ``operator_cli.py archive`` in this process with the
    boundary hook recording the writer-lock hold time; JSON to ``report_path``."""
    recorder = LockHoldRecorder().install()
    operator_cli = load_product("operator_cli")
    with open(os.devnull, "w", encoding="utf-8") as sink, contextlib.redirect_stdout(sink):
        began = time.perf_counter()
        code = operator_cli.main(["--data-dir", data_dir, "archive"])
        seconds = time.perf_counter() - began
    with open(report_path, "w", encoding="utf-8") as stream:
        json.dump({"exit": code, "seconds": seconds, "holds": recorder.holds,
                   "phases": recorder.phases_p50_ms("archived")}, stream)
    return code


def measure_archive(workdir: str, events: int, plan: Dict[str, Any]) -> Dict[str, Any]:
    """``operator_cli.py archive`` on the largest journal, then fresh-process
    first calls on the short live segment, ``status`` and ``verify --all``."""
    journal_dir = os.path.join(workdir, f"journal-{events}")
    before = current_count(journal_dir)
    report_path = os.path.join(workdir, "archive-probe.json")
    run = run_measured([sys.executable, BENCH_SCRIPT, "--probe-archive", journal_dir,
                        "--probe-report", report_path])
    if run["exit"] != 0:
        raise RuntimeError(f"archive failed: {run['stderr']}")
    with open(report_path, encoding="utf-8") as stream:
        probe = json.load(stream)
    holds = probe["holds"].get("archived", [])
    live_events = current_count(journal_dir)
    result: Dict[str, Any] = {
        "archived_events": before,
        "archive_seconds": round(probe["seconds"], 3),
        "archive_process_seconds": run["seconds"],
        "archive_peak_rss_mb": run["peak_rss_mb"],
        "archive_writer_lock_hold_ms": milliseconds(max(holds)) if holds else None,
        "archive_writer_lock_phases_ms": probe.get("phases"),
        "live_events_after_archive": live_events,
        "live_journal_bytes": journal_bytes(journal_dir),
        "data_dir_bytes": directory_bytes(journal_dir),
    }
    # The baseline -- the same first call on an empty journal -- alternates with
    # the archived one, so both see the same fsync latency and machine load.
    empty_dir = os.path.join(workdir, "journal-empty-baseline")
    shutil.rmtree(empty_dir, ignore_errors=True)
    bulk_journal.write_journal(empty_dir, 0)
    archived_samples, empty_samples = [], []
    for _ in range(max(1, plan["after_archive_repeats"])):
        archived_samples.append(first_call_sample(journal_dir))
        empty_samples.append(first_call_sample(empty_dir))
    result["fresh_process"] = summarize_first_calls(archived_samples)
    result["empty_journal_fresh_process"] = summarize_first_calls(empty_samples)
    status = run_measured(cli_command(journal_dir, "status", None))
    verify_all = run_measured(cli_command(journal_dir, "verify --all", None))
    for name, measured in (("status", status), ("verify --all", verify_all)):
        if measured["exit"] != 0:
            raise RuntimeError(f"{name} after archive exited {measured['exit']}: {measured['stderr']}")
    result["status_seconds"] = status["seconds"]
    result["status_peak_rss_mb"] = status["peak_rss_mb"]
    result["verify_all_seconds"] = verify_all["seconds"]
    result["verify_all_peak_rss_mb"] = verify_all["peak_rss_mb"]
    return result
