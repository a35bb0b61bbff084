#!/usr/bin/env python3
"""crash-recovery benchmark: protected-call overhead against the durable-write floor.

One command (from the repository root)::

    python bench/run.py [--quick] [--sizes 0,10000,100000,1000000]
                        [--calls 300] [--json bench/results.json] [--workdir DIR] [--keep]

What one run measures, side by side (absolute times on shared machines are
noisy, so every comparison is made within the same run):

* **floor** -- the durable writes of one append done bare: ``BEGIN IMMEDIATE``,
  one INSERT into a WAL ``synchronous=FULL`` database, the checkpoint written
  to a temp file, fsynced, ``os.replace``d, directory fsynced, ``COMMIT``; plus
  SHA-256 over the event's hash input.  A protected call appends two events
  (``started`` and ``returned``), so the floor of a protected call is two bare
  appends.  The floor database is a copy of the benchmark journal of the same
  size, so B-tree depth is the same.
* **protected call** -- admission + completion around a no-op tool, through
  ``guard.RecoveryGuard``'s middleware when ``guard.py`` exists, else through
  ``journal.Journal.admit`` / ``record_outcome``; at each history size
  (journals built by ``bench/bulk_journal.py``).  Product and floor calls are
  interleaved, p50/p99 are reported; the first call of a fresh process (which
  verifies the whole history) is reported apart.
* **verification** -- full verification throughput at the largest size
  (``Journal(readonly=True).verify()``), next to reference loops that show what
  pure Python can reach here (iterate rows; + SHA-256 chain; + ``json.loads``).
* **CLI** -- ``operator_cli.py status`` / ``verify`` latency (subprocess) at the
  largest size, next to the bare interpreter start-up time.
* **fsync / os.replace counts** per append and per protected call: ``os.fsync``
  and ``os.replace`` are wrapped in this process; SQLite's own ``fsync`` /
  ``fdatasync`` syscalls are counted with ``strace -f -c`` in a child process
  when strace is installed (else reported as null with a note).
* **storage** -- journal bytes per event at the largest size.

It prints a table with "measured / target" for each target of issue 5 and
writes everything as JSON (``--json``).  ``--quick`` uses tiny sizes and few
calls (used by ``tests/test_bench.py`` so the benchmark cannot rot; timings
are never asserted).  Standard library only.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import os
import platform
import pstats
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from json.encoder import encode_basestring
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPOSITORY_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
import bulk_journal  # noqa: E402  (the independent fixture writer next to this file)

FULL_SIZES = (0, 10_000, 100_000, 1_000_000)
QUICK_SIZES = (0, 200, 1_000)
FULL_CALLS = 300
QUICK_CALLS = 12
WARMUP_CALLS = 3
STRACE_CALLS_FULL = 100
STRACE_CALLS_QUICK = 5
FULL_MODE_CALLS = 5          # protected calls with full_verification=True per size
FULL_MODE_MAX_EVENTS = 100_000   # skip full-mode calls above this history (seconds each)
CLI_REPEATS_FULL = 3
CLI_REPEATS_QUICK = 1
CLI_TIME_BUDGET_SECONDS = 20.0   # stop repeating a CLI command after this much time
FULL_MODE_TIME_BUDGET_SECONDS = 10.0

TARGET_OVERHEAD_RATIO = 1.5
TARGET_VERIFY_EVENTS_PER_SECOND = 500_000
TARGET_FSYNCS_PER_APPEND = 3
TARGET_STATUS_SECONDS = 2.5
TARGET_STATUS_EVENTS = 1_000_000

NO_OP_RESULT = "done"
TOOL_NAME = "send_payment"
TOOL_ARGS = {"amount": 125, "currency": "EUR", "to": "acct-4711", "memo": "bench"}


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
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "filesystem": filesystem_of(workdir),
        "workdir": workdir,
        "load": machine_load(),
        "microbench": microbenchmarks(),
    }


def machine_load() -> Dict[str, str]:
    """Load average and CPU pressure (PSI): how busy other processes kept the machine."""
    found: Dict[str, str] = {}
    for key, path in (("loadavg", "/proc/loadavg"), ("cpu_pressure", "/proc/pressure/cpu")):
        with contextlib.suppress(OSError):
            with open(path, encoding="utf-8") as stream:
                found[key] = stream.readline().strip()
    return found


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


def milliseconds(seconds: float) -> float:
    return round(seconds * 1000.0, 4)


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
    product hashes.  Works on its own copy of a journal.
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
        self.count_operations = getattr(self, "count_operations", 0) + 1
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

def import_product() -> Tuple[Any, Any]:
    """(journal module, guard module or None), imported from the repository root."""
    if REPOSITORY_ROOT not in sys.path:
        sys.path.insert(0, REPOSITORY_ROOT)
    from standalone import load_module  # the checkout as the package crash_recovery
    return load_module("journal"), load_module("guard")


class ProductCaller:
    """Runs protected no-op calls through the product.

    Entry point: ``guard.RecoveryGuard(...).tool_execution`` (the middleware
    Hermes calls) when ``guard.py`` exists, else ``journal.Journal.admit`` +
    ``record_outcome`` with the argument hashes computed per call.
    ``protected_call(with_hook=True)`` first runs the ``pre_tool_call`` hook, as
    Hermes does before every tool call.
    """

    def __init__(self, data_dir: str, *, full_verification: bool = False) -> None:
        self.journal_module, self.guard_module = import_product()
        self.data_dir = data_dir
        self.call_number = 0
        self.downstream_calls = 0
        if self.guard_module is not None:
            self.entry_point = "guard.RecoveryGuard.tool_execution"
            self.recovery_guard = self.guard_module.RecoveryGuard(
                data_dir, full_verification=full_verification)
            self.product_journal = None
        else:
            self.entry_point = "journal.Journal.admit+record_outcome"
            self.recovery_guard = None
            self.product_journal = self.journal_module.Journal(
                data_dir, full_verification=full_verification)

    def _no_op_tool(self, *positional: Any, **keywords: Any) -> str:
        self.downstream_calls += 1
        return NO_OP_RESULT

    def protected_call(self, with_hook: bool = False) -> None:
        """One protected call around a no-op tool; raises if it was refused."""
        self.call_number += 1
        tool_call_id = f"bench-call-{self.call_number}"
        if self.recovery_guard is not None:
            if with_hook:
                verdict = self.recovery_guard.pre_tool_call(
                    TOOL_NAME, TOOL_ARGS, session_id="bench-session", tool_call_id=tool_call_id)
                if verdict is not None:
                    raise RuntimeError(f"pre_tool_call refused: {str(verdict)[:500]}")
            before = self.downstream_calls
            result = self.recovery_guard.tool_execution(
                TOOL_NAME, TOOL_ARGS, self._no_op_tool,
                session_id="bench-session", tool_call_id=tool_call_id)
            if self.downstream_calls != before + 1 or result != NO_OP_RESULT:
                raise RuntimeError(f"protected call was refused or altered: {str(result)[:500]}")
            return
        module = self.journal_module
        operation_id = str(uuid.uuid4())
        if with_hook:
            if self.product_journal.unresolved():
                raise RuntimeError("journal has unresolved operations")
        self.product_journal.admit(
            operation_id=operation_id, tool=TOOL_NAME,
            args_hash=module.value_hash(TOOL_ARGS),
            fingerprint=module.fingerprint(TOOL_NAME, TOOL_ARGS),
            session_id="bench-session", tool_call_id=tool_call_id)
        result = self._no_op_tool()
        self.product_journal.record_outcome(
            operation_id, uncertain=False, result_hash=module.value_hash(result), reason="returned")

    def protected_call_with_hook(self) -> None:
        """``pre_tool_call`` hook, then the middleware: what Hermes runs per tool call."""
        self.protected_call(with_hook=True)

    def close(self) -> None:
        for candidate in (self.recovery_guard, self.product_journal,
                          getattr(self.recovery_guard, "_journal", None)):
            closer = getattr(candidate, "close", None)
            if callable(closer):
                closer()


# ============================================================ measurement ==

def time_call(function: Callable[[], None]) -> float:
    began = time.perf_counter()
    function()
    return time.perf_counter() - began


def measure_size(workdir: str, events: int, calls: int, *, syscall_calls: int,
                 full_mode: bool) -> Dict[str, Any]:
    """All per-size measurements: bulk write, cold first call, interleaved
    product/floor calls, os call counts, full-verification mode."""
    journal_dir = os.path.join(workdir, f"journal-{events}")
    floor_dir = os.path.join(workdir, f"floor-{events}")
    for stale in (journal_dir, floor_dir):  # left by an earlier run with --workdir
        shutil.rmtree(stale, ignore_errors=True)
    bulk = bulk_journal.write_journal(journal_dir, events, seed=events + 1)
    shutil.copytree(journal_dir, floor_dir)
    result: Dict[str, Any] = {"events": events, "bulk_write_seconds": round(bulk["seconds"], 3),
                              "calls": calls}

    product = ProductCaller(journal_dir)
    floor = DurableAppendFloor(floor_dir)
    try:
        result["entry_point"] = product.entry_point
        result["first_call_seconds"] = round(time_call(product.protected_call), 4)
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
        result["overhead_ratio_p50"] = result["protected_call_overhead_ratio_p50"]
        result["overhead_ratio_p99"] = result["protected_call_overhead_ratio_p99"]

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
            "python_fsync_per_protected_call": round(product_counter.fsync_calls / counted_calls, 3),
            "python_replace_per_protected_call": round(product_counter.replace_calls / counted_calls, 3),
            "python_fsync_per_append": round(product_counter.fsync_calls / max(1, appended), 3),
            "python_replace_per_append": round(product_counter.replace_calls / max(1, appended), 3),
            "floor_python_fsync_per_append": round(floor_counter.fsync_calls / (2 * counted_calls), 3),
            "floor_python_replace_per_append": round(floor_counter.replace_calls / (2 * counted_calls), 3),
        })
    finally:
        product.close()
        floor.close()

    if full_mode and events <= FULL_MODE_MAX_EVENTS:
        full_product = ProductCaller(journal_dir, full_verification=True)
        try:
            full_product.protected_call()
            samples: List[float] = []
            while len(samples) < FULL_MODE_CALLS and sum(samples) < FULL_MODE_TIME_BUDGET_SECONDS:
                samples.append(time_call(full_product.protected_call))
            result["full_verification_mode_call_p50_ms"] = milliseconds(percentile(samples, 0.5))
        finally:
            full_product.close()
    else:
        result["full_verification_mode_call_p50_ms"] = None

    result["journal_bytes"] = journal_bytes(journal_dir)
    result["journal_bytes_per_event"] = round(result["journal_bytes"] / max(1, current_count(journal_dir)), 1)
    if syscall_calls and strace_path():
        result.update(measure_sync_syscalls(workdir, events, syscall_calls))
    shutil.rmtree(floor_dir, ignore_errors=True)
    return result


def measure_sync_syscalls(workdir: str, events: int, calls: int) -> Dict[str, Any]:
    """fsync+fdatasync syscalls per protected call and per append, counted by
    strace in child processes (difference between ``calls`` calls and 0 calls,
    so start-up and the warm-up call cancel out)."""
    counts: Dict[str, Any] = {}
    for target in ("product", "floor"):
        totals = []
        for probe_calls in (0, calls):
            probe_dir = os.path.join(workdir, f"probe-{target}-{events}-{probe_calls}")
            shutil.copytree(os.path.join(workdir, f"journal-{events}"), probe_dir)
            totals.append(count_sync_syscalls(probe_dir, target, probe_calls))
            shutil.rmtree(probe_dir, ignore_errors=True)
        if None in totals:
            counts[f"{target}_sync_syscalls_per_append"] = None
            continue
        per_call = (totals[1] - totals[0]) / calls
        counts[f"{target}_sync_syscalls_per_protected_call"] = round(per_call, 3)
        counts[f"{target}_sync_syscalls_per_append"] = round(per_call / 2, 3)
    return counts


def current_count(data_dir: str) -> int:
    """Event count from head.json (the product keeps it equal to the journal)."""
    with open(os.path.join(data_dir, bulk_journal.HEAD_NAME), encoding="utf-8") as stream:
        return int(json.load(stream)["count"])


def journal_bytes(data_dir: str) -> int:
    """Bytes of journal.sqlite3 plus its -wal file (what the journal costs on disk)."""
    total = 0
    for name in (bulk_journal.DB_NAME, bulk_journal.DB_NAME + "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(os.path.join(data_dir, name))
    return total


# ========================================================== verification ==

def reference_verification(data_dir: str) -> Dict[str, float]:
    """Seconds of reference loops over the same rows, written here from docs/format.md §Hashes.

    * ``iterate_rows``: fetch every (seq, payload, previous, hash) row;
    * ``chain_only``: + recompute every event hash and check links;
    * ``chain_and_json``: + ``json.loads`` of every payload and transitions.

    They bound what a pure-Python verifier can reach on this machine.
    """
    database_uri = "file:" + os.path.join(data_dir, bulk_journal.DB_NAME) + "?mode=ro"
    query = "SELECT seq, payload, previous, hash FROM events ORDER BY seq"
    timings: Dict[str, float] = {}
    sha256 = hashlib.sha256
    with contextlib.closing(sqlite3.connect(database_uri, uri=True)) as connection:
        began = time.perf_counter()
        for _row in connection.execute(query):
            pass
        timings["iterate_rows_seconds"] = time.perf_counter() - began

        began = time.perf_counter()
        head = None
        for seq, payload, previous, stored_hash in connection.execute(query):
            if head is not None and previous != head:
                raise RuntimeError(f"broken link at {seq}")
            head = sha256(('{"payload":' + encode_basestring(payload) + ',"previous":"'
                           + previous + '"}').encode()).hexdigest()
            if head != stored_hash:
                raise RuntimeError(f"hash mismatch at {seq}")
        timings["chain_only_seconds"] = time.perf_counter() - began

        began = time.perf_counter()
        head = None
        states: Dict[str, str] = {}
        loads = json.loads
        for seq, payload, previous, stored_hash in connection.execute(query):
            if head is not None and previous != head:
                raise RuntimeError(f"broken link at {seq}")
            head = sha256(('{"payload":' + encode_basestring(payload) + ',"previous":"'
                           + previous + '"}').encode()).hexdigest()
            if head != stored_hash:
                raise RuntimeError(f"hash mismatch at {seq}")
            event = loads(payload)
            states[event["operation_id"]] = event["kind"]
        timings["chain_and_json_seconds"] = time.perf_counter() - began
    return {key: round(value, 3) for key, value in timings.items()}


def measure_verification(data_dir: str, profile: bool) -> Dict[str, Any]:
    """Product full verification (fresh read-only Journal) and reference loops."""
    journal_module, _guard = import_product()
    events = current_count(data_dir)
    product_journal = journal_module.Journal(data_dir, readonly=True)
    try:
        began = time.perf_counter()
        product_journal.verify()
        seconds = time.perf_counter() - began
    finally:
        product_journal.close()
    result: Dict[str, Any] = {"events": events, "seconds": round(seconds, 3),
                              "events_per_second": round(events / seconds) if seconds else None}
    reference = reference_verification(data_dir)
    result.update({f"reference_{key}": value for key, value in reference.items()})
    for key, value in reference.items():
        name = key.replace("_seconds", "_events_per_second")
        result[f"reference_{name}"] = round(events / value) if value else None
    if profile:
        result["profile_top"] = profile_verification(journal_module, data_dir)
    return result


def profile_verification(journal_module: Any, data_dir: str) -> List[str]:
    """cProfile of one product verification: the 15 most expensive functions."""
    product_journal = journal_module.Journal(data_dir, readonly=True)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        product_journal.verify()
        profiler.disable()
    finally:
        product_journal.close()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(15)
    return [line for line in stream.getvalue().splitlines() if line.strip()][-17:]


# =================================================================== CLI ==

def measure_cli(data_dir: str, repeats: int) -> Dict[str, Any]:
    """Median wall time of ``operator_cli.py status`` and ``verify`` on ``data_dir``."""
    cli_path = os.path.join(REPOSITORY_ROOT, "operator_cli.py")
    result: Dict[str, Any] = {"events": current_count(data_dir), "repeats": repeats}
    startup = []
    for _ in range(max(1, repeats)):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        startup.append(time.perf_counter() - began)
    result["python_startup_seconds"] = round(statistics.median(startup), 3)
    result["samples"] = {}
    if not os.path.isfile(cli_path):
        result["status_seconds"] = result["verify_seconds"] = None
        result["note"] = "operator_cli.py not found"
        return result
    for command in ("status", "verify"):
        samples: List[float] = []
        for _ in range(max(1, repeats)):
            if samples and sum(samples) > CLI_TIME_BUDGET_SECONDS:
                break  # a slow CLI at 1M events: one or two samples are enough
            began = time.perf_counter()
            completed = subprocess.run([sys.executable, cli_path, "--data-dir", data_dir, command],
                                       capture_output=True, text=True, cwd=REPOSITORY_ROOT)
            samples.append(time.perf_counter() - began)
            if completed.returncode != 0:
                raise RuntimeError(f"operator_cli.py {command} exited {completed.returncode}: "
                                   f"{completed.stdout[-1000:]} {completed.stderr[-1000:]}")
        result[f"{command}_seconds"] = round(statistics.median(samples), 3)
        result["samples"][command] = [round(sample, 3) for sample in samples]
    return result


# ================================================================ targets ==

def evaluate_targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per target of issue 5: name, measured, target, met (None = not measurable)."""
    sizes = report["sizes"]
    smallest, largest = sizes[0], sizes[-1]
    rows: List[Dict[str, Any]] = []

    def add(name: str, measured: Optional[float], target: str, met: Optional[bool], note: str = "") -> None:
        rows.append({"name": name, "measured": measured, "target": target, "met": met, "note": note})

    for entry in (smallest, largest) if smallest is not largest else (smallest,):
        for prefix, label in (("protected_call", "middleware"),
                              ("hook_and_protected_call", "pre_tool_call hook + middleware")):
            ratio = entry[f"{prefix}_overhead_ratio_p50"]
            add(f"overhead at {entry['events']:,} events, {label} (p50 / floor p50)", ratio,
                f"<= {TARGET_OVERHEAD_RATIO}", ratio <= TARGET_OVERHEAD_RATIO,
                f"{entry[f'{prefix}_p50_ms']:.2f} ms vs floor {entry['floor_call_p50_ms']:.2f} ms")
    verification = report["verification"]
    rate = verification["events_per_second"]
    add(f"full verification at {verification['events']:,} events (events/s)", rate,
        f">= {TARGET_VERIFY_EVENTS_PER_SECOND:,}", rate is not None and rate >= TARGET_VERIFY_EVENTS_PER_SECOND,
        f"{verification['seconds']} s; pure-Python chain-only loop here: "
        f"{verification['reference_chain_only_events_per_second']:,} events/s")
    traced = [entry["product_sync_syscalls_per_append"] for entry in sizes
              if entry.get("product_sync_syscalls_per_append") is not None]
    python_fsyncs = max(entry["python_fsync_per_append"] for entry in sizes)
    if traced:
        worst = max(traced)
        add("fsyncs per append (Python os.fsync + SQLite fsync/fdatasync, strace)", worst,
            f"<= {TARGET_FSYNCS_PER_APPEND}", worst <= TARGET_FSYNCS_PER_APPEND,
            f"Python os.fsync alone: {python_fsyncs}; worst over traced sizes")
    else:
        add("fsyncs per append (Python os.fsync only; strace unavailable)", python_fsyncs,
            f"<= {TARGET_FSYNCS_PER_APPEND}", None, "SQLite's own fsyncs not counted")
    cli = report["cli"]
    status = cli.get("status_seconds")
    add(f"operator_cli.py status at {cli['events']:,} events (s)", status,
        f"<= {TARGET_STATUS_SECONDS}", None if status is None else status <= TARGET_STATUS_SECONDS,
        f"python start-up alone {cli['python_startup_seconds']} s"
        + ("" if cli["events"] >= TARGET_STATUS_EVENTS else "; history smaller than the target's 1M"))
    return rows


def show(value: Any, digits: int = 2) -> str:
    """A number for the table, or '-' when it was not measured."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_tables(report: Dict[str, Any]) -> str:
    """Human-readable tables (also pasted into bench/RESULTS.md)."""
    lines = ["| target | measured | target | met | note |", "|---|---|---|---|---|"]
    for row in report["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[row["met"]]
        lines.append(f"| {row['name']} | {show(row['measured'], 3)} | {row['target']} | {met} | {row['note']} |")
    lines += ["", "| history (events) | first call (s) | middleware p50 / p99 (ms) "
              "| hook + middleware p50 / p99 (ms) | floor p50 / p99 (ms) | ratio p50: mw / hook+mw "
              "| full-verification mode p50 (ms) | os.fsync + os.replace per append "
              "| fsync syscalls per append (product / floor) | bytes/event |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for entry in report["sizes"]:
        lines.append(
            f"| {entry['events']:,} | {show(entry['first_call_seconds'], 3)} "
            f"| {show(entry['protected_call_p50_ms'])} / {show(entry['protected_call_p99_ms'])} "
            f"| {show(entry['hook_and_protected_call_p50_ms'])} / {show(entry['hook_and_protected_call_p99_ms'])} "
            f"| {show(entry['floor_call_p50_ms'])} / {show(entry['floor_call_p99_ms'])} "
            f"| {show(entry['protected_call_overhead_ratio_p50'])} / "
            f"{show(entry['hook_and_protected_call_overhead_ratio_p50'])} "
            f"| {show(entry.get('full_verification_mode_call_p50_ms'), 1)} "
            f"| {show(entry['python_fsync_per_append'])} + {show(entry['python_replace_per_append'])} "
            f"| {show(entry.get('product_sync_syscalls_per_append'))} / "
            f"{show(entry.get('floor_sync_syscalls_per_append'))} "
            f"| {show(entry['journal_bytes_per_event'], 1)} |")
    verification = report["verification"]
    lines += ["", f"Verification of {verification['events']:,} events: product "
              f"{show(verification['seconds'], 3)} s ({show(verification['events_per_second'])} events/s); "
              f"reference loops: iterate rows {show(verification['reference_iterate_rows_seconds'], 3)} s, "
              f"+ SHA-256 chain {show(verification['reference_chain_only_seconds'], 3)} s, "
              f"+ json.loads {show(verification['reference_chain_and_json_seconds'], 3)} s."]
    cli = report["cli"]
    lines.append(f"CLI at {cli['events']:,} events: status {show(cli['status_seconds'], 3)} s, verify "
                 f"{show(cli['verify_seconds'], 3)} s (python start-up {show(cli['python_startup_seconds'], 3)} s).")
    return "\n".join(lines)


# ================================================================== probe ==

def run_probe(data_dir: str, target: str, calls: int) -> int:
    """Child process body for strace: one warm-up call, then ``calls`` calls."""
    caller: Any = ProductCaller(data_dir) if target == "product" else DurableAppendFloor(data_dir)
    caller.protected_call()
    for _ in range(calls):
        caller.protected_call()
    caller.close()
    return 0


# =================================================================== main ==

def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes {QUICK_SIZES} and {QUICK_CALLS} calls (smoke test)")
    parser.add_argument("--sizes", help="comma-separated history sizes in events "
                        f"(default {','.join(map(str, FULL_SIZES))})")
    parser.add_argument("--calls", type=int, help=f"timed protected calls per size (default {FULL_CALLS})")
    parser.add_argument("--json", dest="json_path", default=os.path.join(BENCH_DIR, "results.json"),
                        help="where to write the JSON results (default bench/results.json)")
    parser.add_argument("--workdir", help="directory for the benchmark journals (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark journals")
    parser.add_argument("--no-strace", action="store_true", help="do not count syscalls with strace")
    parser.add_argument("--profile", action="store_true",
                        help="add a cProfile of the product's verification to the JSON")
    parser.add_argument("--probe-dir", help=argparse.SUPPRESS)
    parser.add_argument("--probe-target", choices=("product", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--probe-calls", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    options = parse_arguments(argv)
    if options.probe_dir:
        return run_probe(options.probe_dir, options.probe_target, options.probe_calls)
    began = time.perf_counter()
    if options.sizes:
        sizes = sorted({int(size) for size in options.sizes.split(",") if size.strip()})
    else:
        sizes = list(QUICK_SIZES if options.quick else FULL_SIZES)
    calls = options.calls or (QUICK_CALLS if options.quick else FULL_CALLS)
    syscall_calls = 0 if options.no_strace else (STRACE_CALLS_QUICK if options.quick else STRACE_CALLS_FULL)
    workdir = options.workdir or tempfile.mkdtemp(prefix="crash-recovery-bench-")
    os.makedirs(workdir, exist_ok=True)
    report: Dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "machine": machine_description(workdir),
        "settings": {"sizes": sizes, "calls": calls, "warmup_calls": WARMUP_CALLS,
                     "strace": None if options.no_strace else strace_path(),
                     "strace_calls": syscall_calls, "quick": options.quick},
        "sizes": [],
    }
    try:
        for events in sizes:
            print(f"[bench] history {events:,} events ...", file=sys.stderr, flush=True)
            # strace only at the smallest and largest size (counts do not depend on size
            # except for SQLite's periodic WAL checkpoints, which the average includes).
            probe = syscall_calls if events in (sizes[0], sizes[-1]) else 0
            report["sizes"].append(measure_size(workdir, events, calls, syscall_calls=probe,
                                                full_mode=True))
        largest_dir = os.path.join(workdir, f"journal-{sizes[-1]}")
        print("[bench] verification ...", file=sys.stderr, flush=True)
        report["verification"] = measure_verification(largest_dir, options.profile)
        print("[bench] operator CLI ...", file=sys.stderr, flush=True)
        report["machine"]["load_after"] = machine_load()
        report["cli"] = measure_cli(largest_dir,
                                    CLI_REPEATS_QUICK if options.quick else CLI_REPEATS_FULL)
        report["storage"] = {
            "events": current_count(largest_dir),
            "journal_bytes": journal_bytes(largest_dir),
            "journal_bytes_per_event": report["sizes"][-1]["journal_bytes_per_event"],
        }
        report["strace_note"] = (None if strace_path() and not options.no_strace else
                                 "strace not available (or --no-strace): SQLite's own fsyncs "
                                 "are not counted; only Python-level os.fsync calls are")
    finally:
        if not options.keep and not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
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
