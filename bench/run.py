#!/usr/bin/env python3
"""crash-recovery benchmark: scale and per-call overhead, in one run.

One command (from the repository root)::

    python bench/run.py [--quick] [--sizes 0,100000,1000000] [--calls 300]
                        [--worker-calls 200] [--json bench/results.json]
                        [--workdir DIR] [--keep] [--no-strace] [--profile]
                        [--peers | --no-peers] [--peers-python PATH]
                        [--cpu-baseline-us DISK[,TMPFS]] [--baseline-root DIR]
                        [--busy-seconds S]

First, once per run:

* **runtime size** (runtime_lines.py) and **cross-process lock mechanisms**
  (lock_mechanisms.py: the runtime's lock calls from its source, and a traced
  run naming the file each lock is on);
* **side by side** (side_by_side.py): the floor, the product's protected call
  and the peers -- a one-step DBOS workflow and a one-node LangGraph invoke
  with its SQLite checkpointer (peers.py), run from their own virtual
  environment (bench/requirements-peers.txt) -- on fresh journals, on disk
  and on tmpfs, interleaved in one loop; wall and CPU time per call.  Without
  the peers' environment (or with ``--no-peers``; in ``--quick`` unless
  ``--peers``) the peers are reported as not measured, with the reason.
  With ``--baseline-root DIR``, the code of another checkout (the code before
  issue 27) runs beside them as one more series.

At each history size (journals built by ``bench/bulk_journal.py``, which is
written from docs/format.md alone), side by side in the same run:

* **verification** -- the product's full verification (a fresh
  ``Journal(data_dir, create=False)``, then ``verify()``) against the
  *chain-only reference loop* (fetch every row, recompute every SHA-256 link of
  docs/format.md §Hashes, nothing else), run alternately; the ratio of their
  medians and events/s.  Diagnostic loops next to it: only iterate the rows
  (plain query, and the product's own query); fetch the stored bytes and hash
  them the way the product's fast path does (quote escaping), nothing else.
* **operator CLI** -- wall time and peak RSS (``/usr/bin/time -f %M``, else
  ``getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process per command) of
  ``log``, ``log --jsonl``, ``show OP``, ``status``, ``verify`` and
  ``checkpoint``, output to /dev/null.
* **first protected call of a fresh process** -- a new interpreter imports the
  plugin, builds a ``RecoveryGuard`` and makes one protected call; the time
  from the guard's construction to the call's return (start-up and imports
  are reported apart).
* **warm workers** -- two long-lived worker processes, each with its own
  ``RecoveryGuard``, make protected calls strictly alternating (coordinated
  over pipes); then one of them alone.  Each call is the ``pre_tool_call`` hook
  and the ``tool_execution`` middleware around a no-op tool, timed inside the
  worker.  The floor (two bare durable appends on a copy of the journal, see
  below) is interleaved with them from this process.  The workers record how
  long SQLite's writer lock is held per append (boundary hook of
  storage/durable.py: ``begin`` -- right after ``BEGIN IMMEDIATE`` -- to
  ``committed``).
* **overhead in one process** -- the first round's measurement: middleware, and
  hook + middleware, interleaved call by call with the floor; fsyncs per
  append (``os.fsync`` wrapped here; SQLite's own fsync/fdatasync counted with
  ``strace -f -c`` in child processes); bytes per event; the
  ``full_verification`` mode (up to 100k events).

* **first call against verify** (first_call_vs_verify.py) -- fresh
  processes, alternating: a first protected call, then ``verify``.
* **file-system calls** (os_calls.py) -- ``stat``/``lstat``/``fstat``/
  ``open`` per protected call and per read, by file.
* **busy workers** (busy_workers.py; at every size, ``--quick``: the
  largest) -- one worker, then eight, making protected calls back to back:
  the latency of refused calls, throughput of eight against one.

At the largest size, also:

* **gate check under a held writer lock** -- another connection holds
  ``BEGIN IMMEDIATE`` while a warm worker runs the ``pre_tool_call`` hook, a
  fresh guard runs it, and the fresh guard attempts a protected call (which
  must wait for the lock and is refused ``database_locked``).  (At every size,
  after the worker phases: a warm worker's next call right after an operator
  ``status`` ran.)
* **archive** -- ``operator_cli.py archive`` (time, peak RSS, writer-lock hold
  time), then the first protected call of fresh processes on the short live
  segment, ``status`` and ``verify --all``.

Then, on its own profile, **many archives** (archive_scale.py): at 1, 100 and
1,000 archives (``--archive-counts``), a fresh process's first call, warm
calls, a warm worker's first call after a switch, ``status`` and ``verify
--all`` (per event).

The floor: ``BEGIN IMMEDIATE``, one INSERT into a WAL ``synchronous=FULL``
database, the checkpoint written to a temp file, fsynced, ``os.replace``d,
directory fsynced, ``COMMIT``, plus SHA-256 over the event's hash input
(docs/format.md §Append steps 2-4, no verification).  A protected call appends
two events, so its floor is two bare appends.  The floor database is a copy of
the benchmark journal of the same size (same B-tree depth, same triggers).

It prints the tables (targets with measured / target / met) and writes all
numbers as JSON (``--json``).  ``--quick`` uses tiny sizes and few calls
(``tests/test_bench.py`` runs it so the benchmark cannot rot; timings are
never asserted).  Standard library only (the peers run in their own
interpreter).

Layout: this file is the one entry point (options, the plan, the loop over
sizes, the JSON, and the hidden modes its child processes run in); each
measurement is a module next to it: machine.py (the machine, its load),
stats.py, product.py (loading the product, protected calls, lock holds),
floor.py (the floor, fsync counting), os_calls.py (counting os calls by
file), overhead.py, verification.py, cli_costs.py, workers.py (fresh
processes, warm workers, the gate under a held lock), busy_workers.py,
first_call_vs_verify.py (with first_call_probe.py), side_by_side.py and peers.py, lock_mechanisms.py,
runtime_lines.py, archive_costs.py, archive_scale.py and targets.py
(targets, tables).  bulk_journal.py builds the journals.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:  # the measurement modules sit next to this file
    sys.path.insert(0, BENCH_DIR)

# The modules next to this file; bulk_journal.py is the independent fixture writer.
import bulk_journal  # noqa: E402
from archive_costs import measure_archive, probe_archive  # noqa: E402
from archive_scale import format_scale_table, measure_archive_scale  # noqa: E402
from busy_workers import measure_busy_workers  # noqa: E402
from cli_costs import measure_cli  # noqa: E402
from first_call_vs_verify import measure_first_call_vs_verify  # noqa: E402
from floor import measure_sync_syscalls, run_probe, strace_path  # noqa: E402
from lock_mechanisms import measure_lock_mechanisms  # noqa: E402
from machine import LoadMonitor, machine_description, python_startup_seconds  # noqa: E402
from os_calls import measure_os_calls  # noqa: E402
from overhead import measure_full_mode, measure_overhead  # noqa: E402
from peers import PEERS_REQUIREMENTS, peer_worker_main, peers_python  # noqa: E402
from product import REPOSITORY_ROOT, WARMUP_CALLS, journal_bytes  # noqa: E402
from runtime_lines import measure_runtime_lines  # noqa: E402
from side_by_side import measure_side_by_side  # noqa: E402
from stats import log  # noqa: E402
from targets import evaluate_targets, format_tables  # noqa: E402
from verification import measure_verification  # noqa: E402
from workers import measure_first_calls, measure_workers, probe_first_call, worker_main  # noqa: E402

FULL_SIZES = (0, 100_000, 1_000_000)
QUICK_SIZES = (0, 200, 1_000)
FULL_CALLS = 300
QUICK_CALLS = 12
FULL_WORKER_CALLS = 200          # per worker, alternating; the same number alone
QUICK_WORKER_CALLS = 10
STRACE_CALLS_FULL = 100
STRACE_CALLS_QUICK = 5
REPEATS_FULL = 3                 # verification pairs, fresh-process first calls, status runs
REPEATS_QUICK = 1
AFTER_ARCHIVE_REPEATS_FULL = 5
AFTER_ARCHIVE_REPEATS_QUICK = 2
FULL_ARCHIVE_COUNTS = (1, 100, 1000)   # archive_scale.py: a profile archived this many times
QUICK_ARCHIVE_COUNTS = (1, 3, 8)
FULL_BUSY_SECONDS = 3.0          # busy_workers.py: each phase (one worker, eight workers)
QUICK_BUSY_SECONDS = 0.3
FULL_OS_CALLS = 20               # os_calls.py: protected calls (and reads) counted per size
QUICK_OS_CALLS = 3


def measure_size(workdir: str, events: int, options: argparse.Namespace, plan: Dict[str, Any],
                 monitor: LoadMonitor) -> Dict[str, Any]:
    """Everything measured at one history size."""
    journal_dir = os.path.join(workdir, f"journal-{events}")
    floor_dir = os.path.join(workdir, f"floor-{events}")
    for stale in (journal_dir, floor_dir):  # left by an earlier run with --workdir
        shutil.rmtree(stale, ignore_errors=True)
    log(f"history {events:,} events: building the journal ...")
    bulk = bulk_journal.write_journal(journal_dir, events, seed=events + 1)
    shutil.copytree(journal_dir, floor_dir)
    result: Dict[str, Any] = {"events": events, "bulk_write_seconds": round(bulk["seconds"], 3),
                              "journal_bytes_as_built": journal_bytes(journal_dir),
                              "journal_bytes_per_event": round(journal_bytes(journal_dir) / events, 1)
                              if events else None}
    log(f"history {events:,}: operator CLI (time, peak RSS) ...")
    result["cli"] = measure_cli(journal_dir, plan["repeats"])
    monitor.sample(f"{events}: cli")
    log(f"history {events:,}: first protected call of fresh processes ...")
    result["fresh_process"] = measure_first_calls(journal_dir, plan["repeats"])
    log(f"history {events:,}: full verification vs the chain-only reference ...")
    result["verification"] = measure_verification(journal_dir, plan["repeats"],
                                                  options.profile and events == plan["largest"])
    monitor.sample(f"{events}: verification")
    log(f"history {events:,}: a fresh process's first call against `verify`, alternating ...")
    result["first_call_vs_verify"] = measure_first_call_vs_verify(journal_dir, plan["repeats"])
    monitor.sample(f"{events}: first call vs verify")
    log(f"history {events:,}: file-system calls per protected call and per read ...")
    result["os_calls"] = measure_os_calls(journal_dir, plan["os_calls"])
    log(f"history {events:,}: overhead in one process ...")
    result["overhead"] = measure_overhead(journal_dir, floor_dir, plan["calls"])
    result["overhead"]["full_verification_mode_call_p50_ms"] = measure_full_mode(journal_dir, events)
    if plan["strace_calls"] and events in (plan["smallest"], plan["largest"]) and strace_path():
        log(f"history {events:,}: fsync syscalls (strace) ...")
        result["overhead"].update(measure_sync_syscalls(journal_dir, floor_dir, plan["strace_calls"]))
    monitor.sample(f"{events}: overhead")
    log(f"history {events:,}: two warm workers alternating, then one alone ...")
    result["workers"] = measure_workers(journal_dir, floor_dir, plan["worker_calls"],
                                        lock_test=events == plan["largest"])
    monitor.sample(f"{events}: workers")
    if events in plan["busy_sizes"]:
        log(f"history {events:,}: busy workers, one alone, then eight at once ...")
        result["busy_workers"] = measure_busy_workers(journal_dir, plan["busy_seconds"])
        monitor.sample(f"{events}: busy workers")
    shutil.rmtree(floor_dir, ignore_errors=True)
    return result


def cpu_baseline(text: Optional[str]) -> Optional[Dict[str, float]]:
    """``--cpu-baseline-us DISK[,TMPFS]`` as ``{"disk": µs, "tmpfs": µs}``, or None."""
    if not text:
        return None
    figures = [float(value) for value in text.split(",") if value.strip()]
    if len(figures) not in (1, 2) or min(figures) <= 0:
        raise SystemExit("--cpu-baseline-us takes one or two positive figures (DISK[,TMPFS])")
    return {"disk": figures[0], "tmpfs": figures[-1]}


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes {QUICK_SIZES} and {QUICK_CALLS} calls (smoke test)")
    parser.add_argument("--sizes", help="comma-separated history sizes in events "
                        f"(default {','.join(map(str, FULL_SIZES))})")
    parser.add_argument("--calls", type=int, help=f"timed in-process calls per size (default {FULL_CALLS})")
    parser.add_argument("--worker-calls", type=int,
                        help=f"timed calls per worker and phase (default {FULL_WORKER_CALLS})")
    parser.add_argument("--json", dest="json_path", default=os.path.join(BENCH_DIR, "results.json"),
                        help="where to write the JSON results (default bench/results.json)")
    parser.add_argument("--workdir", help="directory for the benchmark journals (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark journals")
    parser.add_argument("--no-strace", action="store_true", help="do not count syscalls with strace")
    parser.add_argument("--no-archive", action="store_true", help="skip the archive measurement")
    parser.add_argument("--archive-counts", help="comma-separated archive counts for the many-"
                        f"archives measurement (default {','.join(map(str, FULL_ARCHIVE_COUNTS))}"
                        "; 0 skips it)")
    parser.add_argument("--profile", action="store_true",
                        help="add a cProfile of the product's verification at the largest size")
    parser.add_argument("--peers", action="store_true",
                        help="measure the peers (DBOS, LangGraph) in --quick too (a full run always does)")
    parser.add_argument("--no-peers", action="store_true", help="do not measure the peers")
    parser.add_argument("--peers-python", help="the interpreter that has the peers installed "
                        "(default: $CRASH_RECOVERY_BENCH_PEERS_PYTHON, else .venv-bench-peers/bin/python "
                        "at the repository root, else this one; see "
                        f"{os.path.relpath(PEERS_REQUIREMENTS, REPOSITORY_ROOT)})")
    parser.add_argument("--cpu-baseline-us", help="CPU time per protected call (hook + middleware, µs) "
                        "of the code before issue 27, as DISK[,TMPFS] (one figure: both): the "
                        "'CPU halved' target is measured against it")
    parser.add_argument("--baseline-root", help="a checkout of the code before issue 27 (e.g. "
                        "`git worktree add DIR COMMIT`): its hook + middleware runs side by side "
                        "as one more series, and the 'CPU halved' target is measured against it")
    parser.add_argument("--busy-seconds", type=float, help="length of each busy-workers phase "
                        f"(default {FULL_BUSY_SECONDS}; --quick {QUICK_BUSY_SECONDS})")
    parser.add_argument("--probe-dir", help=argparse.SUPPRESS)
    parser.add_argument("--probe-target", choices=("product", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-calls", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--probe-first-call", help=argparse.SUPPRESS)
    parser.add_argument("--probe-archive", help=argparse.SUPPRESS)
    parser.add_argument("--probe-report", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--peer-worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-name", default="A", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    options = parse_arguments(argv)
    if options.probe_dir:
        return run_probe(options.probe_dir, options.probe_target, options.probe_calls)
    if options.probe_first_call:
        print(json.dumps(probe_first_call(options.probe_first_call)))
        return 0
    if options.probe_archive:
        return probe_archive(options.probe_archive, options.probe_report)
    if options.worker:
        return worker_main(options.worker, options.worker_name)
    if options.peer_worker:
        return peer_worker_main(options.peer_worker, options.worker_name)

    began = time.perf_counter()
    if options.sizes:
        sizes = sorted({int(size) for size in options.sizes.split(",") if size.strip()})
    else:
        sizes = list(QUICK_SIZES if options.quick else FULL_SIZES)
    plan = {
        "sizes": sizes, "smallest": sizes[0], "largest": sizes[-1], "quick": options.quick,
        "calls": options.calls or (QUICK_CALLS if options.quick else FULL_CALLS),
        "worker_calls": options.worker_calls or (QUICK_WORKER_CALLS if options.quick else FULL_WORKER_CALLS),
        "repeats": REPEATS_QUICK if options.quick else REPEATS_FULL,
        "after_archive_repeats": AFTER_ARCHIVE_REPEATS_QUICK if options.quick else AFTER_ARCHIVE_REPEATS_FULL,
        "strace_calls": 0 if options.no_strace else (STRACE_CALLS_QUICK if options.quick else STRACE_CALLS_FULL),
        "warmup_calls": WARMUP_CALLS,
        "archive_counts": sorted({int(count) for count in options.archive_counts.split(",")
                                  if count.strip() and int(count) > 0})
        if options.archive_counts else list(QUICK_ARCHIVE_COUNTS if options.quick
                                            else FULL_ARCHIVE_COUNTS),
        "busy_seconds": options.busy_seconds or (QUICK_BUSY_SECONDS if options.quick else FULL_BUSY_SECONDS),
        # --quick: eight busy workers at the largest size only (the suite's time)
        "busy_sizes": sizes[-1:] if options.quick else sizes,
        "os_calls": QUICK_OS_CALLS if options.quick else FULL_OS_CALLS,
        "cpu_baseline_us": cpu_baseline(options.cpu_baseline_us),
        "baseline_root": os.path.abspath(options.baseline_root) if options.baseline_root else None,
    }
    workdir = options.workdir or tempfile.mkdtemp(prefix="crash-recovery-bench-")
    os.makedirs(workdir, exist_ok=True)
    monitor = LoadMonitor()
    report: Dict[str, Any] = {
        "command": " ".join(["python", os.path.relpath(os.path.abspath(__file__), REPOSITORY_ROOT)]
                            + sys.argv[1:]),
        "machine": machine_description(workdir),
        "settings": {**plan, "strace": None if options.no_strace else strace_path()},
        "python_startup_seconds": python_startup_seconds(plan["repeats"]),
        "sizes": [],
    }
    try:
        report["runtime_lines"] = measure_runtime_lines()
        log("lock mechanisms: the source, then a traced run ...")
        report["lock_mechanisms"] = measure_lock_mechanisms(workdir)
        python, found = peers_python(options.peers_python)
        if options.no_peers:
            python, found = None, "--no-peers"
        elif options.quick and not options.peers:
            python, found = None, "--quick (add --peers to measure them)"
        report["side_by_side"] = measure_side_by_side(workdir, plan["calls"], python, found,
                                                      options.baseline_root)
        monitor.sample("side by side")
        for events in sizes:
            report["sizes"].append(measure_size(workdir, events, options, plan, monitor))
        if not options.no_archive and sizes[-1] > 0:
            log(f"archive of the {sizes[-1]:,}-event journal, then fresh processes ...")
            report["archive"] = measure_archive(workdir, sizes[-1], plan)
        if plan["archive_counts"]:
            report["archive_scale"] = measure_archive_scale(workdir, plan["archive_counts"],
                                                            plan["repeats"])
    finally:
        if not options.keep and not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    report["load"] = monitor.summary()
    report["strace_note"] = (None if strace_path() and not options.no_strace else
                             "strace not available (or --no-strace): SQLite's own fsyncs "
                             "are not counted; only Python-level os.fsync calls are")
    report["targets"] = evaluate_targets(report)
    report["run_seconds"] = round(time.perf_counter() - began, 1)
    text = format_tables(report)
    if report.get("archive_scale"):
        text += "\n\nMany archives (archive_scale.py):\n\n" + format_scale_table(
            report["archive_scale"])
    print(text)
    print(f"\nrun time {report['run_seconds']} s; JSON: {options.json_path}")
    if options.json_path:
        directory = os.path.dirname(os.path.abspath(options.json_path))
        os.makedirs(directory, exist_ok=True)
        with open(options.json_path, "w", encoding="utf-8") as stream:
            json.dump(report, stream, indent=1, sort_keys=True)
            stream.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
