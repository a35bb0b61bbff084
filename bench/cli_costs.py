"""What the operator CLI costs: wall time and peak RSS per command.

Every read-only command of ``operator_cli.py`` (``log``, ``log --jsonl``,
``show OP``, ``status``, ``verify``, ``checkpoint``) runs in its own process
with its output to /dev/null.  Peak RSS comes from GNU ``/usr/bin/time -f %M``
when present, else from ``getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper
interpreter per command (so it holds that command alone).  Wall times include
the interpreter's start-up.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from machine import time_tool
from product import OPERATOR_CLI, REPOSITORY_ROOT, current_count, middle_operation

CLI_COMMANDS = ("log", "log --jsonl", "show OP", "status", "verify", "checkpoint")

RUSAGE_WRAPPER = (
    "import resource, subprocess, sys, time\n"
    "began = time.perf_counter()\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "wall = time.perf_counter() - began\n"
    "print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)\n")


def run_measured(command: List[str]) -> Dict[str, Any]:
    """Run ``command`` (stdout to /dev/null): wall seconds, peak RSS (MB), exit code.

    ``/usr/bin/time -f %M`` when present; else a fresh wrapper interpreter
    whose ``RUSAGE_CHILDREN`` then holds only this command."""
    tool = time_tool()
    if tool is not None:
        with tempfile.NamedTemporaryFile(prefix="time-", suffix=".txt", delete=False) as report:
            report_path = report.name
        try:
            began = time.perf_counter()
            completed = subprocess.run([tool, "-f", "%M", "-o", report_path, *command],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                       cwd=REPOSITORY_ROOT)
            wall = time.perf_counter() - began
            with open(report_path, encoding="utf-8") as stream:
                peak_kb = int(stream.read().split()[-1])
        finally:
            with contextlib.suppress(OSError):
                os.unlink(report_path)
        return {"seconds": round(wall, 4), "peak_rss_mb": round(peak_kb / 1024, 1),
                "exit": completed.returncode, "stderr": completed.stderr[-500:]}
    completed = subprocess.run([sys.executable, "-c", RUSAGE_WRAPPER, *command],
                               capture_output=True, text=True, cwd=REPOSITORY_ROOT)
    wall, peak_kb, code = completed.stdout.split()
    return {"seconds": round(float(wall), 4), "peak_rss_mb": round(int(peak_kb) / 1024, 1),
            "exit": int(code), "stderr": completed.stderr[-500:]}


def cli_command(data_dir: str, words: str, operation_id: Optional[str]) -> List[str]:
    arguments = [operation_id if word == "OP" else word for word in words.split()]
    return [sys.executable, OPERATOR_CLI, "--data-dir", data_dir, *arguments]


def measure_cli(data_dir: str, repeats: int) -> Dict[str, Any]:
    """Wall time and peak RSS of every read-only operator command; ``status``
    ``repeats`` times (median).  ``show`` needs an operation (none at 0 events)."""
    operation_id = middle_operation(data_dir)
    result: Dict[str, Any] = {"events": current_count(data_dir), "show_operation": operation_id,
                              "commands": {}}
    for words in CLI_COMMANDS:
        if "OP" in words and operation_id is None:
            result["commands"][words] = None
            continue
        runs = [run_measured(cli_command(data_dir, words, operation_id))
                for _ in range(max(1, repeats) if words == "status" else 1)]
        for run in runs:
            if run["exit"] != 0:
                raise RuntimeError(f"operator_cli.py {words} exited {run['exit']}: {run['stderr']}")
        result["commands"][words] = {
            "seconds": round(statistics.median(run["seconds"] for run in runs), 4),
            "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
            "samples": [run["seconds"] for run in runs]}
    result["status_seconds"] = result["commands"]["status"]["seconds"]
    measured = [entry for entry in result["commands"].values() if entry is not None]
    result["max_peak_rss_mb"] = max(entry["peak_rss_mb"] for entry in measured)
    return result
