"""The floor -- the bare durable writes of a protected call -- and fsync counting.

A protected call appends two events, so its floor is two bare durable appends
(``DurableAppendFloor``) on a copy of the benchmark journal of the same size
(same B-tree depth, same triggers).  Fsyncs per append are counted twice:
``os.fsync`` calls in this process (os_calls.py's ``OsCallCounter``), and every fsync /
fdatasync syscall, SQLite's own included, with ``strace -f -c`` around a child
process running this benchmark in its probe mode (``run_probe``).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, Optional

import bulk_journal
from product import BENCH_SCRIPT, TOOL_NAME, ProductCaller


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


# ---------------------------------------------------------------- strace --

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
                   sys.executable, BENCH_SCRIPT, "--probe-dir", data_dir,
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
