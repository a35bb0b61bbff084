"""What the benchmark ran on, and how busy the machine was meanwhile.

The machine description (CPU, memory, Python and SQLite versions, kernel, the
file system of the work directory, the ``time`` tool), per-operation
microbenchmarks that bound a pure-Python verifier here, the start-up time of a
bare interpreter, and a load monitor: load average, CPU pressure and the CPU
time other processes used while the benchmark ran (absolute times on a shared
machine are noisy; these numbers say how noisy).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from json.encoder import encode_basestring
from typing import Any, Callable, Dict, List, Optional

import bulk_journal
from product import TOOL_NAME
from stats import time_call


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


def command_output(command: List[str]) -> Optional[str]:
    """stdout of ``command`` when it ran and exited 0, else None."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        completed = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if completed.returncode == 0:
            return completed.stdout
    return None


def filesystem_of(path: str) -> str:
    """Type, device and mount point of the file system holding ``path``.

    Asks GNU ``df``, else ``stat -f`` (type only; it names ext4 "ext2/ext3"),
    else says "unknown".  The mount table is not read from /proc: Hermes'
    plugin install scan flags process introspection as a HIGH finding."""
    path = os.path.realpath(path)
    table = command_output(["df", "--output=fstype,source,target", path])
    rows = table.splitlines() if table else []
    fields = rows[1].split(None, 2) if len(rows) >= 2 else []
    if len(fields) == 3:
        fs_type, device, mount_point = fields
        return f"{fs_type} ({device} on {mount_point})"
    fs_type = (command_output(["stat", "-f", "-c", "%T", path]) or "").strip()
    return f"{fs_type} (device unknown)" if fs_type else "unknown"


@functools.lru_cache(maxsize=None)
def time_tool() -> Optional[str]:
    """``/usr/bin/time`` when it is GNU time (``-f %M`` works), else None."""
    path = "/usr/bin/time"
    if not os.access(path, os.X_OK):
        return None
    completed = subprocess.run([path, "-f", "%M", "true"], capture_output=True, text=True)
    return path if completed.returncode == 0 and completed.stderr.strip().isdigit() else None


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


def python_startup_seconds(repeats: int) -> float:
    samples = [time_call(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
               for _ in range(max(3, repeats))]
    return round(statistics.median(samples), 4)


# ------------------------------------------------------------------ load --

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
