#!/usr/bin/env python3
"""crash-recovery benchmark: scale and per-call overhead, in one run.

One command (from the repository root)::

    python bench/run.py [--quick] [--sizes 0,100000,1000000] [--calls 300]
                        [--worker-calls 200] [--json bench/results.json]
                        [--workdir DIR] [--keep] [--no-strace] [--profile]

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
  long SQLite's writer lock is held per append (boundary hook of durable.py:
  ``begin`` -- right after ``BEGIN IMMEDIATE`` -- to ``committed``).
* **overhead in one process** -- the pre-issue-12 measurement: middleware, and
  hook + middleware, interleaved call by call with the floor; fsyncs per
  append (``os.fsync`` wrapped here; SQLite's own fsync/fdatasync counted with
  ``strace -f -c`` in child processes); bytes per event; the
  ``full_verification`` mode (up to 100k events).

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

The floor: ``BEGIN IMMEDIATE``, one INSERT into a WAL ``synchronous=FULL``
database, the checkpoint written to a temp file, fsynced, ``os.replace``d,
directory fsynced, ``COMMIT``, plus SHA-256 over the event's hash input
(docs/format.md §Append steps 2-4, no verification).  A protected call appends
two events, so its floor is two bare appends.  The floor database is a copy of
the benchmark journal of the same size (same B-tree depth, same triggers).

It prints the tables (targets with measured / target / met) and writes all
numbers as JSON (``--json``).  ``--quick`` uses tiny sizes and few calls
(``tests/test_bench.py`` runs it so the benchmark cannot rot; timings are
never asserted).  Standard library only.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import hashlib
import io
import json
import os
import platform
import pstats
import re
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from json.encoder import encode_basestring
from typing import Any, Callable, Dict, List, Optional, Tuple

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPOSITORY_ROOT = os.path.dirname(BENCH_DIR)
OPERATOR_CLI = os.path.join(REPOSITORY_ROOT, "operator_cli.py")
sys.path.insert(0, BENCH_DIR)
import bulk_journal  # noqa: E402  (the independent fixture writer next to this file)

FULL_SIZES = (0, 100_000, 1_000_000)
QUICK_SIZES = (0, 200, 1_000)
FULL_CALLS = 300
QUICK_CALLS = 12
FULL_WORKER_CALLS = 200          # per worker, alternating; the same number alone
QUICK_WORKER_CALLS = 10
WARMUP_CALLS = 3
STRACE_CALLS_FULL = 100
STRACE_CALLS_QUICK = 5
FULL_MODE_CALLS = 5              # protected calls with full_verification=True per size
FULL_MODE_MAX_EVENTS = 100_000   # skip full-mode calls above this history (seconds each)
FULL_MODE_TIME_BUDGET_SECONDS = 10.0
REPEATS_FULL = 3                 # verification pairs, fresh-process first calls, status runs
REPEATS_QUICK = 1
AFTER_ARCHIVE_REPEATS_FULL = 5
AFTER_ARCHIVE_REPEATS_QUICK = 2
LOCK_TEST_BUSY_TIMEOUT_SECONDS = 0.5
RATIO_MIN_EVENTS = 10_000        # below this, verification times are too small for a ratio

# Targets (this round's, and those kept from the first round's benchmark).
TARGET_VERIFY_RATIO = 1.5
TARGET_VERIFY_EVENTS_PER_SECOND = 500_000
TARGET_RSS_MB = 64.0
TARGET_WORKER_RATIO = 2.0
TARGET_LOCK_HOLD_P99_MS = 50.0
TARGET_AFTER_ARCHIVE_EXTRA_MS = 20.0
TARGET_OVERHEAD_RATIO = 1.5
TARGET_FSYNCS_PER_APPEND = 3
TARGET_STATUS_SECONDS = 2.5       # first-round target
TARGET_FIRST_CALL_SECONDS = 2.5   # first-round target
TARGET_EVENTS = 1_000_000

NO_OP_RESULT = "done"
TOOL_NAME = "send_payment"
TOOL_ARGS = {"amount": 125, "currency": "EUR", "to": "acct-4711", "memo": "bench"}
CLI_COMMANDS = ("log", "log --jsonl", "show OP", "status", "verify", "checkpoint")


# ================================================================ machine ==

def machine_description(workdir: str) -> Dict[str, Any]:
    """nproc, CPU model, Python/SQLite versions, kernel and the workdir's filesystem."""
    cpu_model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    memory_mb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo", encoding="utf-8") as stream:
            memory_mb = round(int(stream.readline().split()[1]) / 1024)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_mb": memory_mb,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "kernel": platform.release(),
        "euid": os.geteuid() if hasattr(os, "geteuid") else None,
        "platform": platform.platform(),
        "filesystem": filesystem_of(workdir),
        "time_tool": time_tool(),
        "microbench": microbenchmarks(),
    }


def machine_load() -> Dict[str, str]:
    """Load average and CPU pressure (PSI): how busy the machine is right now."""
    found: Dict[str, str] = {}
    for key, path in (("loadavg", "/proc/loadavg"), ("cpu_pressure", "/proc/pressure/cpu")):
        with contextlib.suppress(OSError):
            with open(path, encoding="utf-8") as stream:
                found[key] = stream.readline().strip()
    return found


def cpu_busy_seconds() -> Optional[float]:
    """Seconds of CPU time every process on the machine used since boot (/proc/stat)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/stat", encoding="utf-8") as stream:
            fields = [int(value) for value in stream.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return None


def own_cpu_seconds() -> float:
    """CPU seconds of this process and every child it has waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class LoadMonitor:
    """How much CPU other processes used while the benchmark ran.

    Machine-wide busy CPU seconds (/proc/stat) minus this benchmark's own
    (this process + its waited-for children), over the run; plus the load
    average and CPU pressure sampled at every phase."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.busy_before = cpu_busy_seconds()
        self.own_before = own_cpu_seconds()
        self.samples: List[Dict[str, Any]] = []
        self.sample("start")

    def sample(self, phase: str) -> None:
        self.samples.append({"phase": phase, "at_seconds": round(time.perf_counter() - self.began, 1),
                             **machine_load()})

    def summary(self) -> Dict[str, Any]:
        self.sample("end")
        wall = time.perf_counter() - self.began
        busy_after, own = cpu_busy_seconds(), own_cpu_seconds() - self.own_before
        result: Dict[str, Any] = {"wall_seconds": round(wall, 1), "bench_cpu_seconds": round(own, 1),
                                  "samples": self.samples}
        loads = [float(sample["loadavg"].split()[0]) for sample in self.samples if "loadavg" in sample]
        if loads:
            result["loadavg_1min_min"], result["loadavg_1min_max"] = min(loads), max(loads)
        pressures = [float(match.group(1)) for sample in self.samples
                     for match in [re.search(r"avg10=([\d.]+)", sample.get("cpu_pressure", ""))] if match]
        if pressures:
            result["cpu_pressure_avg10_min"], result["cpu_pressure_avg10_max"] = min(pressures), max(pressures)
        if self.busy_before is not None and busy_after is not None:
            busy = busy_after - self.busy_before
            other = max(0.0, busy - own)
            capacity = wall * (os.cpu_count() or 1)
            result.update({"machine_busy_cpu_seconds": round(busy, 1),
                           "other_processes_cpu_seconds": round(other, 1),
                           "other_processes_cpu_share": round(other / capacity, 3) if capacity else None})
        return result


def filesystem_of(path: str) -> str:
    """Type and device of the mount holding ``path`` (from /proc/self/mounts)."""
    path = os.path.realpath(path)
    best = ("", "unknown", "unknown")
    with contextlib.suppress(OSError):
        with open("/proc/self/mounts", encoding="utf-8") as stream:
            for line in stream:
                fields = line.split()
                if len(fields) < 3:
                    continue
                device, mount_point, fs_type = fields[0], fields[1], fields[2]
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best[0]):
                    best = (mount_point, fs_type, device)
    return f"{best[1]} ({best[2]} on {best[0] or '?'})"


def microbenchmarks() -> Dict[str, float]:
    """Per-operation costs (µs) that bound a pure-Python verifier on this machine."""
    payload = bulk_journal.STARTED_TEMPLATE.format(
        args_hash="a" * 64, fingerprint="b" * 64, operation_id=str(uuid.uuid4()),
        session_id="session-1", timestamp_ns=time.time_ns(), tool=TOOL_NAME,
        tool_call_id="call-00000001")
    envelope = ('{"payload":' + encode_basestring(payload) + ',"previous":"' + "c" * 64 + '"}').encode()
    repeats = 20_000

    def per_call_us(function: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            for _ in range(repeats):
                function()
            best = min(best, (time.perf_counter() - began) / repeats)
        return round(best * 1e6, 3)

    return {
        "payload_bytes": len(payload),
        "json_loads_payload_us": per_call_us(lambda: json.loads(payload)),
        "sha256_hexdigest_envelope_us": per_call_us(lambda: hashlib.sha256(envelope).hexdigest()),
        "envelope_bytes": len(envelope),
        "json_string_escape_payload_us": per_call_us(lambda: encode_basestring(payload)),
        "uuid_parse_us": per_call_us(lambda: uuid.UUID("6513270e-269e-4d37-b2a7-4de452e6b438")),
    }


# ============================================================= statistics ==

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


# ================================================================= counts ==

class OsCallCounter:
    """Counts ``os.fsync`` and ``os.replace`` calls made in this process.

    Wraps the functions on the ``os`` module, so code that calls
    ``os.fsync(...)`` is counted (code that bound ``from os import fsync``
    earlier is not).  Use as a context manager.
    """

    def __init__(self) -> None:
        self.fsync_calls = 0
        self.replace_calls = 0
        self._original_fsync = os.fsync
        self._original_replace = os.replace

    def _counting_fsync(self, descriptor: Any) -> None:
        self.fsync_calls += 1
        self._original_fsync(descriptor)

    def _counting_replace(self, source: Any, destination: Any, **options: Any) -> None:
        self.replace_calls += 1
        self._original_replace(source, destination, **options)

    def __enter__(self) -> "OsCallCounter":
        os.fsync = self._counting_fsync
        os.replace = self._counting_replace
        return self

    def __exit__(self, *exc_info: Any) -> None:
        os.fsync = self._original_fsync
        os.replace = self._original_replace


STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)\s*$")


def strace_path() -> Optional[str]:
    return shutil.which("strace")


def count_sync_syscalls(data_dir: str, target: str, calls: int) -> Optional[int]:
    """fsync+fdatasync syscalls of a child doing ``calls`` protected calls
    (``target`` = product) or bare call pairs (``target`` = floor) on ``data_dir``
    after one warm-up call.  None when strace is missing or fails."""
    tracer = strace_path()
    if tracer is None:
        return None
    with tempfile.NamedTemporaryFile(prefix="strace-", suffix=".txt", delete=False) as report:
        report_path = report.name
    try:
        command = [tracer, "-f", "-c", "-o", report_path, "-e", "trace=fsync,fdatasync",
                   sys.executable, os.path.abspath(__file__), "--probe-dir", data_dir,
                   "--probe-target", target, "--probe-calls", str(calls)]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if completed.returncode != 0:
            sys.stderr.write(f"strace probe failed ({completed.returncode}): {completed.stderr[-2000:]}\n")
            return None
        with open(report_path, encoding="utf-8") as stream:
            text = stream.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(report_path)
    return sum(int(match.group(1)) for match in
               (STRACE_ROW.match(line) for line in text.splitlines()) if match)


# ================================================================= floor ==

class DurableAppendFloor:
    """The bare durable writes of one append (docs/format.md §Append steps 2-4, no verification).

    ``BEGIN IMMEDIATE``; INSERT the row; write the checkpoint to a temp file,
    fsync it, ``os.replace`` it over ``head.json``, fsync the directory;
    ``COMMIT``.  The row's hash is a real SHA-256 over the same bytes the
    product hashes.  Works on its own copy of a journal (reads its head once:
    never let anything else append to that copy while an instance is open).
    """

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.checkpoint_path = os.path.join(data_dir, bulk_journal.HEAD_NAME)
        self.temp_path = self.checkpoint_path + ".tmp"
        self.connection = sqlite3.connect(os.path.join(data_dir, bulk_journal.DB_NAME),
                                          isolation_level=None)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute("PRAGMA synchronous=FULL")
        self.journal_id = self.connection.execute(
            "SELECT value FROM metadata WHERE key = 'journal_id'").fetchone()[0]
        row = self.connection.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        self.count, self.head = row if row else (0, bulk_journal.genesis_hash(self.journal_id))
        self.operation_prefix = str(uuid.uuid4())[:24]
        self.count_operations = 0

    def append(self, payload_text: str) -> None:
        """One bare durable append of ``payload_text``."""
        new_hash = bulk_journal.event_hash(self.head, payload_text)
        seq = self.count + 1
        self.connection.execute("BEGIN IMMEDIATE")
        self.connection.execute("INSERT INTO events(seq, payload, previous, hash) VALUES (?, ?, ?, ?)",
                                (seq, payload_text, self.head, new_hash))
        checkpoint = bulk_journal.checkpoint_text(self.journal_id, seq, new_hash).encode()
        descriptor = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(descriptor, checkpoint)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(self.temp_path, self.checkpoint_path)
        directory = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.connection.execute("COMMIT")
        self.count, self.head = seq, new_hash

    def protected_call(self) -> None:
        """The floor of one protected call: two bare appends (started, returned)."""
        self.count_operations += 1
        operation_id = f"{self.operation_prefix}{self.count_operations:012x}"
        self.append(bulk_journal.STARTED_TEMPLATE.format(
            args_hash="a" * 64, fingerprint="b" * 64, operation_id=operation_id,
            session_id="bench-session", timestamp_ns=time.time_ns(), tool=TOOL_NAME,
            tool_call_id=f"floor-{self.count_operations}"))
        self.append(bulk_journal.CLOSING_TEMPLATE.format(
            kind="returned", operation_id=operation_id, reason="returned",
            result_hash="c" * 64, timestamp_ns=time.time_ns()))

    def close(self) -> None:
        self.connection.close()


# ================================================================ product ==

def load_product(name: str) -> Any:
    """``crash_recovery.<name>`` from this checkout (the repository as a package)."""
    if REPOSITORY_ROOT not in sys.path:
        sys.path.insert(0, REPOSITORY_ROOT)
    from standalone import load_module
    return load_module(name)


def product_attribute(name: str, modules: Tuple[str, ...] = ("schema", "database")) -> Any:
    """``name`` from the first product module (in ``modules``) that defines it
    (the schema constants moved from database.py to schema.py)."""
    for module in modules:
        try:
            found = load_product(module)
        except ImportError:
            continue
        if hasattr(found, name):
            return getattr(found, name)
    raise AttributeError(f"no product module of {modules} defines {name}")


class ProductCaller:
    """Protected no-op calls through ``guard.RecoveryGuard.tool_execution``
    (the middleware Hermes calls); ``protected_call(with_hook=True)`` first
    runs the ``pre_tool_call`` hook, as Hermes does before every tool call."""

    entry_point = "guard.RecoveryGuard.tool_execution"

    def __init__(self, data_dir: str, **settings: Any) -> None:
        self.data_dir = data_dir
        self.call_number = 0
        self.downstream_calls = 0
        self.recovery_guard = load_product("guard").RecoveryGuard(data_dir, **settings)

    def _no_op_tool(self, *positional: Any, **keywords: Any) -> str:
        self.downstream_calls += 1
        return NO_OP_RESULT

    def hook(self) -> Optional[dict]:
        """The ``pre_tool_call`` hook for the next call: None (allow) or the block."""
        return self.recovery_guard.pre_tool_call(
            TOOL_NAME, TOOL_ARGS, session_id="bench-session",
            tool_call_id=f"bench-call-{self.call_number + 1}")

    def middleware(self) -> None:
        """One protected call around a no-op tool; raises if it was refused."""
        self.call_number += 1
        before = self.downstream_calls
        result = self.recovery_guard.tool_execution(
            TOOL_NAME, TOOL_ARGS, self._no_op_tool,
            session_id="bench-session", tool_call_id=f"bench-call-{self.call_number}")
        if self.downstream_calls != before + 1 or result != NO_OP_RESULT:
            raise RuntimeError(f"protected call was refused or altered: {str(result)[:500]}")

    def protected_call(self, with_hook: bool = False) -> None:
        if with_hook:
            verdict = self.hook()
            if verdict is not None:
                raise RuntimeError(f"pre_tool_call refused: {str(verdict)[:500]}")
        self.middleware()

    def protected_call_with_hook(self) -> None:
        """``pre_tool_call`` hook, then the middleware: what Hermes runs per tool call."""
        self.protected_call(with_hook=True)

    def close(self) -> None:
        self.recovery_guard.close()


class LockHoldRecorder:
    """Boundary hook (durable.set_boundary_hook): how long each append held
    SQLite's writer lock, from ``begin`` (reached right after ``BEGIN
    IMMEDIATE`` succeeded) to ``committed`` (right after ``COMMIT``), per event
    kind; and, for ``started``, when each boundary was reached (ms after begin)."""

    def __init__(self) -> None:
        self.holds: Dict[str, List[float]] = {}
        self.phases: Dict[str, List[Dict[str, float]]] = {}
        self._open: Dict[str, Tuple[float, Dict[str, float]]] = {}

    def __call__(self, boundary: str, kind: str) -> None:
        now = time.perf_counter()
        if boundary == "begin":
            self._open[kind] = (now, {})  # a retry after a stale snapshot starts again
            return
        entry = self._open.get(kind)
        if entry is None:
            return
        entry[1][boundary] = now - entry[0]
        if boundary == "committed":
            self.holds.setdefault(kind, []).append(now - entry[0])
            self.phases.setdefault(kind, []).append(entry[1])
            del self._open[kind]

    def install(self) -> "LockHoldRecorder":
        load_product("durable").set_boundary_hook(self)
        return self

    def reset(self) -> None:
        self.holds, self.phases = {}, {}

    def phases_p50_ms(self, kind: str) -> Optional[Dict[str, float]]:
        """Median ms after ``begin`` at which each boundary of ``kind`` was reached."""
        phases = self.phases.get(kind)
        if not phases:
            return None
        names = sorted({name for phase in phases for name in phase},
                       key=lambda name: statistics.median(phase.get(name, 0.0) for phase in phases))
        return {name: milliseconds(statistics.median(phase[name] for phase in phases if name in phase))
                for name in names}

    def report(self) -> Dict[str, Any]:
        result: Dict[str, Any] = {kind: distribution_ms(samples) for kind, samples in self.holds.items()}
        result["started_phases_p50_ms"] = self.phases_p50_ms("started")
        return result


# ================================================================ journals ==

def current_count(data_dir: str) -> int:
    """Event count from head.json (the product keeps it equal to the journal)."""
    with open(os.path.join(data_dir, bulk_journal.HEAD_NAME), encoding="utf-8") as stream:
        return int(json.load(stream)["count"])


def journal_bytes(data_dir: str) -> int:
    """Bytes of journal.sqlite3 plus its -wal file (what the live journal costs on disk)."""
    total = 0
    for name in (bulk_journal.DB_NAME, bulk_journal.DB_NAME + "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(os.path.join(data_dir, name))
    return total


def directory_bytes(path: str) -> int:
    """Bytes of every regular file under ``path``."""
    total = 0
    for root, _directories, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def middle_operation(data_dir: str) -> Optional[str]:
    """The id of an operation started in the middle of the journal (for ``show``)."""
    uri = "file:" + os.path.join(data_dir, bulk_journal.DB_NAME) + "?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        (count,) = connection.execute("SELECT count(*) FROM events").fetchone()
        for (payload,) in connection.execute("SELECT payload FROM events WHERE seq >= ? ORDER BY seq",
                                             (count // 2,)):
            event = json.loads(payload)
            if event.get("kind") == "started":
                return event["operation_id"]
    return None


# =========================================================== verification ==

REFERENCE_QUERY = "SELECT seq, payload, previous, hash FROM events ORDER BY seq"
BYTES_QUERY = ("SELECT seq, CAST(payload AS BLOB), CAST(previous AS BLOB), CAST(hash AS BLOB) "
               "FROM events ORDER BY seq")


def read_only_connection(data_dir: str) -> sqlite3.Connection:
    uri = "file:" + os.path.join(data_dir, bulk_journal.DB_NAME) + "?mode=ro"
    return sqlite3.connect(uri, uri=True)


def reference_chain_only(data_dir: str) -> Tuple[float, int]:
    """The chain-only reference loop, written here from docs/format.md §Hashes:
    fetch every row, recompute ``Hi = SHA256(C({"previous": H(i-1), "payload":
    p_i}))`` and check the link to the row before -- nothing else.  Returns
    (seconds, rows)."""
    sha256 = hashlib.sha256
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        journal_id = connection.execute(
            "SELECT value FROM metadata WHERE key = 'journal_id'").fetchone()[0]
        began = time.perf_counter()
        head, rows = bulk_journal.genesis_hash(journal_id), 0
        for seq, payload, previous, stored_hash in connection.execute(REFERENCE_QUERY):
            if previous != head:
                raise RuntimeError(f"reference: broken link at {seq}")
            # C() of the envelope: sorted keys put payload first; encode_basestring
            # is json.dumps(ensure_ascii=False) of a str.
            head = sha256(('{"payload":' + encode_basestring(payload) + ',"previous":"'
                           + previous + '"}').encode()).hexdigest()
            if head != stored_hash:
                raise RuntimeError(f"reference: hash mismatch at {seq}")
            rows += 1
        return time.perf_counter() - began, rows


def reference_iterate_rows(data_dir: str) -> float:
    """Only fetch every row (what SQLite and the sqlite3 module cost)."""
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        began = time.perf_counter()
        for _row in connection.execute(REFERENCE_QUERY):
            pass
        return time.perf_counter() - began


def reference_bytes_hash(data_dir: str) -> float:
    """Diagnostic: fetch the stored bytes and hash with quote escaping only (the
    product's fast-path hashing; exact for payloads without backslashes or
    control characters, which every bulk payload is), nothing else."""
    sha256 = hashlib.sha256
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        began = time.perf_counter()
        head = None
        for seq, payload, previous, stored_hash in connection.execute(BYTES_QUERY):
            if head is not None and previous != head:
                raise RuntimeError(f"bytes reference: broken link at {seq}")
            head = sha256(b'{"payload":"' + payload.replace(b'"', b'\\"') + b'","previous":"'
                          + previous + b'"}').hexdigest().encode()
            if head != stored_hash:
                raise RuntimeError(f"bytes reference: hash mismatch at {seq}")
        return time.perf_counter() - began


def product_query_fetch(data_dir: str) -> float:
    """Diagnostic: only fetch every row with the product's own verification
    query (``SQL_SELECT_ROWS_AFTER``: stored bytes, type checks)."""
    query = product_attribute("SQL_SELECT_ROWS_AFTER")
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        began = time.perf_counter()
        for _row in connection.execute(query, (0,)):
            pass
        return time.perf_counter() - began


def product_full_verification(data_dir: str) -> Tuple[float, int]:
    """The product's full verification as a fresh process pays it: open
    ``Journal(data_dir, create=False)``, ``verify()`` (the whole history, the
    marker and head.json), close.  Returns (seconds, verified count)."""
    journal_module = load_product("journal")
    began = time.perf_counter()
    journal = journal_module.Journal(data_dir, create=False)
    try:
        status = journal.verify()
    finally:
        journal.close()
    return time.perf_counter() - began, status.checkpoint["count"]


def measure_verification(data_dir: str, repeats: int, profile: bool) -> Dict[str, Any]:
    """Product full verification vs the chain-only reference, alternately
    (``repeats`` each, product first), plus the diagnostic loops once."""
    product_samples: List[float] = []
    reference_samples: List[float] = []
    events = None
    for _ in range(max(1, repeats)):
        seconds, events = product_full_verification(data_dir)
        product_samples.append(seconds)
        seconds, rows = reference_chain_only(data_dir)
        reference_samples.append(seconds)
        if rows != events:
            raise RuntimeError(f"reference read {rows} rows, the product verified {events}")
    product, reference = statistics.median(product_samples), statistics.median(reference_samples)
    result: Dict[str, Any] = {
        "events": events, "repeats": len(product_samples),
        "product_seconds": round(product, 6),
        "product_samples": [round(sample, 6) for sample in product_samples],
        "product_events_per_second": round(events / product) if events else None,
        "reference_chain_only_seconds": round(reference, 6),
        "reference_samples": [round(sample, 6) for sample in reference_samples],
        "reference_chain_only_events_per_second": round(events / reference) if events else None,
        "ratio_to_reference": ratio(product, reference) if events else None,
    }
    iterate = reference_iterate_rows(data_dir)
    bytes_hash = reference_bytes_hash(data_dir)
    result.update({
        "reference_iterate_rows_seconds": round(iterate, 4),
        "product_query_fetch_seconds": round(product_query_fetch(data_dir), 4),
        "reference_bytes_hash_seconds": round(bytes_hash, 4),
        "ratio_to_bytes_hash": ratio(product, bytes_hash) if events else None,
    })
    if profile and events:
        result["profile_top"] = profile_verification(data_dir)
    return result


def profile_verification(data_dir: str) -> List[str]:
    """cProfile of one product verification: the 15 most expensive functions."""
    journal = load_product("journal").Journal(data_dir, create=False)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        journal.verify()
        profiler.disable()
    finally:
        journal.close()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(15)
    return [line for line in stream.getvalue().splitlines() if line.strip()][-17:]


# =================================================================== CLI ==

@functools.lru_cache(maxsize=None)
def time_tool() -> Optional[str]:
    """``/usr/bin/time`` when it is GNU time (``-f %M`` works), else None."""
    path = "/usr/bin/time"
    if not os.access(path, os.X_OK):
        return None
    completed = subprocess.run([path, "-f", "%M", "true"], capture_output=True, text=True)
    return path if completed.returncode == 0 and completed.stderr.strip().isdigit() else None


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


def python_startup_seconds(repeats: int) -> float:
    samples = [time_call(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
               for _ in range(max(3, repeats))]
    return round(statistics.median(samples), 4)


# ==================================================== fresh-process probes ==

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


def first_call_sample(data_dir: str) -> Dict[str, Any]:
    """One fresh process making its first protected call on ``data_dir``."""
    began = time.perf_counter()
    completed = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe-first-call", data_dir],
                               capture_output=True, text=True, cwd=REPOSITORY_ROOT, timeout=600)
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


# ================================================================ workers ==

class WorkerProcess:
    """A long-lived worker (this file with ``--worker DIR``) driven over pipes:
    one JSON request per line on its stdin, one JSON reply per line on its stdout."""

    def __init__(self, data_dir: str, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", data_dir, "--worker-name", name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=REPOSITORY_ROOT)

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

    ``call``: hook + middleware around a no-op tool (timed apart);
    ``holds``: the writer-lock hold times recorded since the last ``holds``;
    ``lock_test``: run while the coordinator holds the writer lock;
    ``exit``."""
    recorder = LockHoldRecorder().install()
    caller = ProductCaller(data_dir)
    caller.call_number = 0
    reply: Dict[str, Any]
    for line in sys.stdin:
        request = json.loads(line)
        operation = request["op"]
        try:
            if operation == "call":
                began = time.perf_counter()
                verdict = caller.hook()
                hooked = time.perf_counter()
                if verdict is not None:
                    raise RuntimeError(f"pre_tool_call refused: {str(verdict)[:300]}")
                caller.middleware()
                ended = time.perf_counter()
                reply = {"ok": True, "hook_seconds": hooked - began, "middleware_seconds": ended - hooked}
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


# ============================================================ measurement ==

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
            "python_fsync_per_append": round(product_counter.fsync_calls / max(1, appended), 3),
            "python_replace_per_append": round(product_counter.replace_calls / max(1, appended), 3),
            "floor_python_fsync_per_append": round(floor_counter.fsync_calls / (2 * counted_calls), 3),
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


def measure_sync_syscalls(journal_dir: str, floor_dir: str, calls: int) -> Dict[str, Any]:
    """fsync+fdatasync syscalls per append, counted by strace in child processes
    (a child doing ``calls`` calls minus one doing 0, so start-up and the
    warm-up call cancel out).  Nothing else may have the floor copy open."""
    counts: Dict[str, Any] = {}
    for target, data_dir in (("product", journal_dir), ("floor", floor_dir)):
        totals = [count_sync_syscalls(data_dir, target, probe_calls) for probe_calls in (0, calls)]
        if None in totals:
            counts[f"{target}_sync_syscalls_per_append"] = None
            continue
        per_call = (totals[1] - totals[0]) / calls
        counts[f"{target}_sync_syscalls_per_append"] = round(per_call / 2, 3)
    return counts


def run_probe(data_dir: str, target: str, calls: int) -> int:
    """Child process body for strace: one warm-up call, then ``calls`` calls."""
    caller: Any = ProductCaller(data_dir) if target == "product" else DurableAppendFloor(data_dir)
    caller.protected_call()
    for _ in range(calls):
        caller.protected_call()
    caller.close()
    return 0


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
    shutil.rmtree(floor_dir, ignore_errors=True)
    return result


def measure_archive(workdir: str, events: int, plan: Dict[str, Any]) -> Dict[str, Any]:
    """``operator_cli.py archive`` on the largest journal, then fresh-process
    first calls on the short live segment, ``status`` and ``verify --all``."""
    journal_dir = os.path.join(workdir, f"journal-{events}")
    before = current_count(journal_dir)
    report_path = os.path.join(workdir, "archive-probe.json")
    run = run_measured([sys.executable, os.path.abspath(__file__), "--probe-archive", journal_dir,
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


# ================================================================ targets ==

def evaluate_targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per target: name, measured, target, met (None = not measurable)."""
    sizes = report["sizes"]
    smallest, largest = sizes[0], sizes[-1]
    at = f"{largest['events']:,} events"
    short_history = largest["events"] < TARGET_EVENTS
    rows: List[Dict[str, Any]] = []

    def add(name: str, measured: Any, target: str, met: Optional[bool], note: str = "") -> None:
        if short_history:
            note = (note + "; " if note else "") + "history smaller than the targets' 1M"
        rows.append({"name": name, "measured": measured, "target": target, "met": met, "note": note})

    verification = largest["verification"]
    rate, verify_ratio = verification["product_events_per_second"], verification["ratio_to_reference"]
    measurable = largest["events"] >= RATIO_MIN_EVENTS
    add(f"full verification / chain-only reference at {at}", verify_ratio,
        f"<= {TARGET_VERIFY_RATIO}", (verify_ratio <= TARGET_VERIFY_RATIO) if measurable and verify_ratio else None,
        f"{verification['product_seconds']:.3f} s vs {verification['reference_chain_only_seconds']:.3f} s"
        + ("" if measurable else f"; too few events to compare (< {RATIO_MIN_EVENTS:,})"))
    add(f"full verification at {at} (events/s)", rate, f">= {TARGET_VERIFY_EVENTS_PER_SECOND:,}",
        (rate >= TARGET_VERIFY_EVENTS_PER_SECOND) if measurable and rate else None,
        f"reference loop here: {verification['reference_chain_only_events_per_second']:,} events/s"
        if verification["reference_chain_only_events_per_second"] else "")
    for words in CLI_COMMANDS:
        entry = largest["cli"]["commands"].get(words)
        if entry is None:
            add(f"peak RSS of `{words}` at {at} (MB)", None, f"<= {TARGET_RSS_MB:.0f}", None, "no operation to show")
            continue
        add(f"peak RSS of `{words}` at {at} (MB)", entry["peak_rss_mb"], f"<= {TARGET_RSS_MB:.0f}",
            entry["peak_rss_mb"] <= TARGET_RSS_MB, f"{entry['seconds']:.2f} s")
    workers = largest["workers"]
    for mode, label in (("alternating", "two warm workers alternating"), ("single", "one warm worker alone")):
        phase = workers[mode]
        for key, what in (("middleware", "middleware"), ("hook_and_middleware", "hook + middleware")):
            value = phase[f"{key}_ratio_p50"]
            add(f"{label} at {at}, {what} p50 / floor p50", value, f"<= {TARGET_WORKER_RATIO}",
                value is not None and value <= TARGET_WORKER_RATIO,
                f"{phase[key]['p50_ms']:.2f} ms (p99 {phase[key]['p99_ms']:.2f}) vs floor "
                f"{phase['floor']['p50_ms']:.2f} ms (p99 {phase['floor']['p99_ms']:.2f})")
    hold = workers["alternating"]["lock_hold"]["started"]
    add(f"writer-lock hold of an admission at {at}, p99 (ms), two workers", hold["p99_ms"],
        f"<= {TARGET_LOCK_HOLD_P99_MS:.0f}", hold["p99_ms"] is not None and hold["p99_ms"] <= TARGET_LOCK_HOLD_P99_MS,
        f"p50 {hold['p50_ms']} ms, max {hold['max_ms']} ms over {hold['n']} admissions; one bare "
        f"durable append (floor / 2) p50 {workers['alternating']['floor']['p50_ms'] / 2:.2f} ms")
    gate = workers.get("gate_under_writer_lock")
    if gate:
        answered = (gate["warm_hook_verdict"] == "allow" and gate["fresh_hook_verdict"] == "allow"
                    and gate["warm_hook_ms"] < 1000 * LOCK_TEST_BUSY_TIMEOUT_SECONDS)
        add(f"gate check (pre_tool_call) while another connection holds the writer lock, at {at} (ms)",
            gate["warm_hook_ms"], "answers without the lock", answered,
            f"warm hook {gate['warm_hook_verdict']} in {gate['warm_hook_ms']:.2f} ms; fresh guard's hook "
            f"{gate['fresh_hook_verdict']} in {gate['fresh_hook_ms']:.0f} ms; its protected call "
            f"{gate['call_result']} ({gate['call_refusal_code']}) after {gate['call_ms']:.0f} ms")
    archived = report.get("archive")
    if archived:
        after = archived["fresh_process"]["first_call_seconds"]
        baseline = archived["empty_journal_fresh_process"]["first_call_seconds"]
        extra = milliseconds(after - baseline)
        add(f"first protected call of a fresh process after archiving {archived['archived_events']:,} events, "
            "minus the same on an empty journal (ms)", extra, f"<= {TARGET_AFTER_ARCHIVE_EXTRA_MS:.0f}",
            extra <= TARGET_AFTER_ARCHIVE_EXTRA_MS,
            f"{milliseconds(after):.1f} ms with {archived['live_events_after_archive']} live event(s) vs "
            f"{milliseconds(baseline):.1f} ms on an empty journal, alternating, median of "
            f"{archived['fresh_process']['repeats']} each")
    first = largest["fresh_process"]["first_call_seconds"]
    add(f"first protected call of a fresh process at {at}, no archive (s, first-round target)", first,
        f"<= {TARGET_FIRST_CALL_SECONDS}", first <= TARGET_FIRST_CALL_SECONDS,
        f"import of the plugin {largest['fresh_process']['import_seconds']:.3f} s apart")
    status = largest["cli"]["status_seconds"]
    add(f"operator_cli.py status at {at} (s, first-round target)", status, f"<= {TARGET_STATUS_SECONDS}",
        status <= TARGET_STATUS_SECONDS, f"python start-up alone {report['python_startup_seconds']} s")
    for entry in (smallest, largest) if smallest is not largest else (smallest,):
        overhead = entry["overhead"]
        for prefix, label in (("protected_call", "middleware"),
                              ("hook_and_protected_call", "pre_tool_call hook + middleware")):
            value = overhead[f"{prefix}_overhead_ratio_p50"]
            rows.append({"name": f"overhead in one process at {entry['events']:,} events, {label} "
                                 "(p50 / floor p50, first-round target)",
                         "measured": value, "target": f"<= {TARGET_OVERHEAD_RATIO}",
                         "met": value <= TARGET_OVERHEAD_RATIO,
                         "note": f"{overhead[f'{prefix}_p50_ms']:.2f} ms vs floor "
                                 f"{overhead['floor_call_p50_ms']:.2f} ms"})
    traced = [entry["overhead"].get("product_sync_syscalls_per_append") for entry in sizes]
    traced = [value for value in traced if value is not None]
    python_fsyncs = max(entry["overhead"]["python_fsync_per_append"] for entry in sizes)
    if traced:
        worst = max(traced)
        rows.append({"name": "fsyncs per append (Python os.fsync + SQLite fsync/fdatasync, strace, first-round target)",
                     "measured": worst, "target": f"<= {TARGET_FSYNCS_PER_APPEND}",
                     "met": worst <= TARGET_FSYNCS_PER_APPEND,
                     "note": f"Python os.fsync alone: {python_fsyncs}; worst over traced sizes"})
    else:
        rows.append({"name": "fsyncs per append (Python os.fsync only; strace unavailable, first-round target)",
                     "measured": python_fsyncs, "target": f"<= {TARGET_FSYNCS_PER_APPEND}",
                     "met": None, "note": "SQLite's own fsyncs not counted"})
    return rows


# ================================================================ tables ==

def show(value: Any, digits: int = 2) -> str:
    """A number for the table, or '-' when it was not measured."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_tables(report: Dict[str, Any]) -> str:
    """Human-readable tables (also pasted into bench/RESULTS.md)."""
    sizes = report["sizes"]
    header = "| | " + " | ".join(f"{entry['events']:,} events" for entry in sizes) + " |"
    rule = "|---|" + "---|" * len(sizes)

    def row(label: str, values: List[Any], digits: int = 2) -> str:
        return f"| {label} | " + " | ".join(show(value, digits) for value in values) + " |"

    lines = ["### Targets", "", "| target | measured | target | met | note |", "|---|---|---|---|---|"]
    for target in report["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[target["met"]]
        lines.append(f"| {target['name']} | {show(target['measured'], 3)} | {target['target']} | {met} "
                     f"| {target['note']} |")

    lines += ["", "### Verification (full, one fresh `Journal` each) vs the chain-only reference", "",
              header, rule]
    verification = [entry["verification"] for entry in sizes]
    lines += [
        row("product full verification (s, median)", [v["product_seconds"] for v in verification], 3),
        row("chain-only reference loop (s, median)", [v["reference_chain_only_seconds"] for v in verification], 3),
        row("ratio product / reference", [v["ratio_to_reference"] for v in verification], 3),
        row("product events/s", [v["product_events_per_second"] for v in verification]),
        row("reference events/s", [v["reference_chain_only_events_per_second"] for v in verification]),
        row("diagnostic: only fetch the rows (s)", [v["reference_iterate_rows_seconds"] for v in verification], 3),
        row("diagnostic: only fetch the rows with the product's query (s)",
            [v["product_query_fetch_seconds"] for v in verification], 3),
        row("diagnostic: fetch bytes + hash with quote escaping (s)",
            [v["reference_bytes_hash_seconds"] for v in verification], 3),
    ]

    lines += ["", "### Fresh processes and the operator CLI (wall time incl. interpreter start-up)", "",
              header, rule]
    fresh = [entry["fresh_process"] for entry in sizes]
    lines += [
        row("first protected call of a fresh process (ms, median)",
            [milliseconds(f["first_call_seconds"]) for f in fresh], 1),
        row("its second call (ms)", [milliseconds(f["second_call_seconds"]) for f in fresh], 1),
        row("import of the plugin (ms)", [milliseconds(f["import_seconds"]) for f in fresh], 1),
    ]
    for words in CLI_COMMANDS:
        entries = [entry["cli"]["commands"].get(words) for entry in sizes]
        lines.append(row(f"`{words}`: s / peak RSS MB",
                         [f"{e['seconds']:.2f} / {e['peak_rss_mb']:.1f}" if e else None for e in entries]))

    lines += ["", "### Warm workers (hook + middleware per call, timed in the worker; floor from "
              "the coordinator, interleaved)", "", header, rule]
    for mode, label in (("alternating", "two alternating"), ("single", "one alone")):
        phases = [entry["workers"][mode] for entry in sizes]
        lines += [
            row(f"{label}: middleware p50 / p99 (ms)",
                [f"{p['middleware']['p50_ms']:.2f} / {p['middleware']['p99_ms']:.2f}" for p in phases]),
            row(f"{label}: hook + middleware p50 / p99 (ms)",
                [f"{p['hook_and_middleware']['p50_ms']:.2f} / {p['hook_and_middleware']['p99_ms']:.2f}"
                 for p in phases]),
            row(f"{label}: floor p50 / p99 (ms)",
                [f"{p['floor']['p50_ms']:.2f} / {p['floor']['p99_ms']:.2f}" for p in phases]),
            row(f"{label}: ratio p50 middleware / hook+mw",
                [f"{show(p['middleware_ratio_p50'])} / {show(p['hook_and_middleware_ratio_p50'])}"
                 for p in phases]),
            row(f"{label}: writer lock held by `started` p50 / p99 / max (ms)",
                [f"{show(p['lock_hold']['started']['p50_ms'])} / {show(p['lock_hold']['started']['p99_ms'])}"
                 f" / {show(p['lock_hold']['started']['max_ms'])}" for p in phases]),
            row(f"{label}: writer lock held by `returned` p50 / p99 / max (ms)",
                [f"{show(p['lock_hold']['returned']['p50_ms'])} / {show(p['lock_hold']['returned']['p99_ms'])}"
                 f" / {show(p['lock_hold']['returned']['max_ms'])}" for p in phases]),
        ]
    lines.append(row("warm worker's next call right after an operator `status` ran / the call after (ms)",
                     [f"{entry['workers']['call_after_operator_status_ms']:.2f} / "
                      f"{entry['workers']['call_after_that_ms']:.2f}" for entry in sizes]))
    lines.append(row("first pre_tool_call of each worker, A / B at once (ms)",
                     [" / ".join(f"{value:.0f}" for value in entry["workers"]["warmup_first_hook_ms"])
                      for entry in sizes]))

    lines += ["", "### One process: overhead against the floor, fsyncs, size", "", header, rule]
    overhead = [entry["overhead"] for entry in sizes]
    lines += [
        row("middleware p50 / p99 (ms)",
            [f"{o['protected_call_p50_ms']:.2f} / {o['protected_call_p99_ms']:.2f}" for o in overhead]),
        row("hook + middleware p50 / p99 (ms)",
            [f"{o['hook_and_protected_call_p50_ms']:.2f} / {o['hook_and_protected_call_p99_ms']:.2f}"
             for o in overhead]),
        row("floor p50 / p99 (ms)", [f"{o['floor_call_p50_ms']:.2f} / {o['floor_call_p99_ms']:.2f}"
                                     for o in overhead]),
        row("ratio p50: middleware / hook+mw",
            [f"{o['protected_call_overhead_ratio_p50']:.2f} / {o['hook_and_protected_call_overhead_ratio_p50']:.2f}"
             for o in overhead]),
        row("full_verification mode, call p50 (ms)", [o.get("full_verification_mode_call_p50_ms") for o in overhead], 1),
        row("os.fsync + os.replace per append",
            [f"{o['python_fsync_per_append']:.2f} + {o['python_replace_per_append']:.2f}" for o in overhead]),
        row("fsync syscalls per append, product / floor (strace)",
            [f"{show(o.get('product_sync_syscalls_per_append'))} / {show(o.get('floor_sync_syscalls_per_append'))}"
             for o in overhead]),
        row("bytes per event (as built)", [entry["journal_bytes_per_event"] for entry in sizes], 1),
        row("bulk build of the journal (s)", [entry["bulk_write_seconds"] for entry in sizes], 1),
    ]
    gate = sizes[-1]["workers"].get("gate_under_writer_lock")
    if gate:
        lines += ["", f"Gate check while another connection held `BEGIN IMMEDIATE` ({sizes[-1]['events']:,} "
                  f"events): warm worker's `pre_tool_call` {gate['warm_hook_verdict']} in "
                  f"{gate['warm_hook_ms']:.2f} ms; a fresh guard's `pre_tool_call` {gate['fresh_hook_verdict']} "
                  f"in {gate['fresh_hook_ms']:.1f} ms; that guard's protected call {gate['call_result']} "
                  f"(`{gate['call_refusal_code']}`) after {gate['call_ms']:.1f} ms (busy timeout "
                  f"{gate['busy_timeout_seconds']} s), downstream run {gate['call_downstream_ran']} times; "
                  f"after the lock was released the next call took {gate['call_after_release_ms']:.2f} ms. "
                  f"(Before the lock was taken, the holder connection's first read made the warm worker's "
                  f"next `pre_tool_call` take {gate['hook_after_foreign_open_ms']:.2f} ms; running as uid "
                  f"{report['machine']['euid']}.)"]
    archived = report.get("archive")
    if archived:
        lines += ["", f"Archive of {archived['archived_events']:,} events: `operator_cli.py archive` "
                  f"{archived['archive_seconds']:.2f} s (process {archived['archive_process_seconds']:.2f} s, "
                  f"peak RSS {archived['archive_peak_rss_mb']:.1f} MB), writer lock held "
                  f"{show(archived['archive_writer_lock_hold_ms'], 1)} ms (boundaries reached after "
                  f"`begin`, ms: {', '.join(f'{name} {value:.1f}' for name, value in (archived['archive_writer_lock_phases_ms'] or {}).items())}); "
                  f"live segment afterwards "
                  f"{archived['live_events_after_archive']} events in a {archived['live_journal_bytes']:,}-byte "
                  f"database file (data directory {archived['data_dir_bytes']:,} bytes). First protected call "
                  f"of a fresh process: {milliseconds(archived['fresh_process']['first_call_seconds']):.1f} ms "
                  f"(median of {archived['fresh_process']['repeats']}; samples "
                  f"{', '.join(f'{milliseconds(s):.1f}' for s in archived['fresh_process']['samples'])} ms), "
                  f"on an empty journal in alternation "
                  f"{milliseconds(archived['empty_journal_fresh_process']['first_call_seconds']):.1f} ms (samples "
                  f"{', '.join(f'{milliseconds(s):.1f}' for s in archived['empty_journal_fresh_process']['samples'])}"
                  f" ms); "
                  f"`status` {archived['status_seconds']:.3f} s; `verify --all` {archived['verify_all_seconds']:.2f} s "
                  f"(peak RSS {archived['verify_all_peak_rss_mb']:.1f} MB)."]
    load = report["load"]
    lines += ["", f"Python start-up alone: {report['python_startup_seconds']} s. Load: loadavg "
              f"{load.get('loadavg_1min_min')}-{load.get('loadavg_1min_max')} (1 min), CPU pressure avg10 "
              f"{load.get('cpu_pressure_avg10_min')}-{load.get('cpu_pressure_avg10_max')} %; other processes used "
              f"{load.get('other_processes_cpu_seconds')} CPU s ({show(load.get('other_processes_cpu_share'), 3)} "
              f"of the machine) while the benchmark used {load.get('bench_cpu_seconds')} CPU s over "
              f"{load.get('wall_seconds')} s."]
    return "\n".join(lines)


# =================================================================== main ==

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
    parser.add_argument("--profile", action="store_true",
                        help="add a cProfile of the product's verification at the largest size")
    parser.add_argument("--probe-dir", help=argparse.SUPPRESS)
    parser.add_argument("--probe-target", choices=("product", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-calls", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--probe-first-call", help=argparse.SUPPRESS)
    parser.add_argument("--probe-archive", help=argparse.SUPPRESS)
    parser.add_argument("--probe-report", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
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
        for events in sizes:
            report["sizes"].append(measure_size(workdir, events, options, plan, monitor))
        if not options.no_archive and sizes[-1] > 0:
            log(f"archive of the {sizes[-1]:,}-event journal, then fresh processes ...")
            report["archive"] = measure_archive(workdir, sizes[-1], plan)
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
