"""A protected call beside its floor and the peers, on disk and on tmpfs, from one run.

On each file system -- ``disk``: the run's work directory; ``tmpfs``: a
directory under /dev/shm, removed afterwards -- five series run on fresh
journals of their own:

* ``floor``: two bare durable appends (floor.py), the protocol's floor;
* ``middleware`` and ``hook_and_middleware``: the product's protected call
  (product.py), without and with the ``pre_tool_call`` hook;
* ``dbos`` and ``langgraph``: the peers (peers.py), each in its own worker
  process of the peers' interpreter;
* ``baseline`` (with ``--baseline-root DIR``): the hook + middleware of the
  code in another checkout -- the code before a change -- in a warm worker
  process (workers.py) that loads the product from there.

Every series makes one call per round, in an order that rotates from round to
round, across both file systems (ten series in one loop), so drift on a noisy
machine hits every series alike.  Each call is timed where it runs: wall time
(``perf_counter``) and the process's CPU time (``process_time``: user +
system, every thread), the product and the floor in this process, a peer in
its worker.  The peers' CPU over the whole phase (background threads
included) is reported apart.  Targets (issue 27): a protected call at most
1.25 x the floor on disk and 3 x on tmpfs (p50), and its CPU time halved
against the code before (the ``baseline`` series, else the figures of
``--cpu-baseline-us``).
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import bulk_journal
from floor import DurableAppendFloor
from machine import filesystem_of
from peers import PEER_KINDS, PeerProcess
from product import PRODUCT_ROOT_VARIABLE, WARMUP_CALLS, ProductCaller
from stats import log, milliseconds, percentile, ratio
from workers import WorkerProcess

TMPFS_ROOT = "/dev/shm"
PRODUCT_SERIES = ("floor", "middleware", "hook_and_middleware")
SERIES_LABELS = {"floor": "floor (two bare durable appends)", "middleware": "product: middleware",
                 "hook_and_middleware": "product: hook + middleware",
                 "dbos": "DBOS: one-step workflow", "langgraph": "LangGraph: one-node invoke",
                 "baseline": "baseline (--baseline-root): hook + middleware"}


def tmpfs_directory() -> Tuple[Optional[str], str]:
    """(a new directory on tmpfs, why none) -- /dev/shm when it is tmpfs."""
    if not os.path.isdir(TMPFS_ROOT):
        return None, f"{TMPFS_ROOT} does not exist"
    described = filesystem_of(TMPFS_ROOT)
    if not described.startswith("tmpfs"):
        return None, f"{TMPFS_ROOT} is {described}, not tmpfs"
    return tempfile.mkdtemp(prefix="crash-recovery-bench-", dir=TMPFS_ROOT), ""


def timed_here(function: Callable[[], None]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def summary_ms(samples: List[float]) -> Dict[str, Any]:
    """p50 / p99 / mean / max (ms) and the count of ``samples`` (seconds)."""
    return {"n": len(samples), "p50_ms": milliseconds(percentile(samples, 0.5)),
            "p99_ms": milliseconds(percentile(samples, 0.99)),
            "mean_ms": milliseconds(statistics.fmean(samples)) if samples else None,
            "max_ms": milliseconds(max(samples)) if samples else None}


class FileSystemSetup:
    """The five series on one file system: their callables and what to close."""

    def __init__(self, name: str, root: str, peers_python: Optional[str],
                 baseline_root: Optional[str]) -> None:
        self.name, self.root = name, root
        product_dir, floor_dir = os.path.join(root, "product"), os.path.join(root, "floor")
        for stale in (product_dir, floor_dir):
            shutil.rmtree(stale, ignore_errors=True)
        bulk_journal.write_journal(product_dir, 0, seed=7)
        shutil.copytree(product_dir, floor_dir)
        self.product = ProductCaller(product_dir)
        self.floor = DurableAppendFloor(floor_dir)
        self.series: Dict[str, Callable[[], Tuple[float, float]]] = {
            "floor": lambda: timed_here(self.floor.protected_call),
            "middleware": lambda: timed_here(self.product.middleware),
            "hook_and_middleware": lambda: timed_here(self.product.protected_call_with_hook),
        }
        self.baseline: Optional[WorkerProcess] = None
        if baseline_root:
            baseline_dir = os.path.join(root, "baseline")
            shutil.rmtree(baseline_dir, ignore_errors=True)
            bulk_journal.write_journal(baseline_dir, 0, seed=7)
            self.baseline = WorkerProcess(baseline_dir, "baseline",
                                          environment={PRODUCT_ROOT_VARIABLE: os.path.abspath(baseline_root)})
            self.series["baseline"] = self._baseline_call
        self.peers: Dict[str, PeerProcess] = {}
        self.peer_problems: Dict[str, str] = {}
        if peers_python is None:
            return
        for kind in PEER_KINDS:
            peer_dir = os.path.join(root, kind)
            shutil.rmtree(peer_dir, ignore_errors=True)
            try:
                self.peers[kind] = PeerProcess(kind, peer_dir, peers_python)
            except (RuntimeError, OSError) as exc:  # OSError: the interpreter cannot be started
                self.peer_problems[kind] = f"{type(exc).__name__}: {exc}"[:500]
                continue
            self.series[kind] = self.peers[kind].call

    def _baseline_call(self) -> Tuple[float, float]:
        """One hook + middleware of the baseline's worker, timed there (wall, CPU)."""
        reply = self.baseline.request({"op": "call"})
        return reply["hook_seconds"] + reply["middleware_seconds"], reply["cpu_seconds"]

    def close(self) -> None:
        if self.baseline is not None:
            self.baseline.close()
        for peer in self.peers.values():
            peer.close()
        self.product.close()
        self.floor.close()


def _summarise(setup: FileSystemSetup, wall: Dict[str, List[float]], cpu: Dict[str, List[float]],
               peer_cpu_before: Dict[str, float], calls: int) -> Dict[str, Any]:
    result: Dict[str, Any] = {"directory_filesystem": filesystem_of(setup.root), "series": {}}
    for name in setup.series:
        result["series"][name] = {"label": SERIES_LABELS[name], "wall": summary_ms(wall[name]),
                                  "cpu": summary_ms(cpu[name])}
    series = result["series"]
    floor = series["floor"]
    for name in ("middleware", "hook_and_middleware"):
        entry = series[name]
        entry["wall_ratio_to_floor_p50"] = ratio(entry["wall"]["p50_ms"], floor["wall"]["p50_ms"])
        entry["cpu_ratio_to_floor_mean"] = ratio(entry["cpu"]["mean_ms"], floor["cpu"]["mean_ms"])
        entry["extra_cpu_over_floor_mean_ms"] = round(entry["cpu"]["mean_ms"] - floor["cpu"]["mean_ms"], 4)
        for kind in (*setup.peers, *(("baseline",) if setup.baseline else ())):
            entry[f"wall_ratio_to_{kind}_p50"] = ratio(entry["wall"]["p50_ms"], series[kind]["wall"]["p50_ms"])
            entry[f"cpu_ratio_to_{kind}_mean"] = ratio(entry["cpu"]["mean_ms"], series[kind]["cpu"]["mean_ms"])
    for kind, peer in setup.peers.items():
        facts = peer.facts()
        series[kind].update({
            "versions": peer.ready["versions"], "settings": peer.ready["settings"],
            "setup_seconds": peer.ready["setup_seconds"], "python": peer.ready["python_version"],
            "sqlite": peer.ready["sqlite"], "rows_after": facts["rows"],
            "rows_per_call": {table: round(count / (calls + WARMUP_CALLS), 2)
                              for table, count in facts["rows"].items()},
            "process_cpu_per_call_ms": milliseconds(
                (facts["process_cpu_seconds"] - peer_cpu_before[kind]) / calls),
            "wall_ratio_to_floor_p50": ratio(series[kind]["wall"]["p50_ms"], floor["wall"]["p50_ms"])})
    if setup.baseline is not None:
        series["baseline"]["wall_ratio_to_floor_p50"] = ratio(series["baseline"]["wall"]["p50_ms"],
                                                              floor["wall"]["p50_ms"])
        series["baseline"]["cpu_ratio_to_floor_mean"] = ratio(series["baseline"]["cpu"]["mean_ms"],
                                                              floor["cpu"]["mean_ms"])
    result["peers_not_measured"] = setup.peer_problems
    return result


def measure_side_by_side(workdir: str, calls: int, peers_python: Optional[str],
                         peers_reason: str, baseline_root: Optional[str] = None) -> Dict[str, Any]:
    """The series above on disk and on tmpfs, ``calls`` rounds after
    WARMUP_CALLS of each.  ``peers_python`` None: the peers are not measured
    (``peers_reason`` says why).  ``baseline_root``: a checkout of the code
    before (e.g. the commit before issue 27) whose hook + middleware runs as
    one more series, in a worker process of its own (``baseline``)."""
    roots: Dict[str, Optional[str]] = {"disk": os.path.join(workdir, "side-by-side")}
    result: Dict[str, Any] = {"calls": calls, "filesystems": {}, "not_measured": {},
                              "baseline_root": os.path.abspath(baseline_root) if baseline_root else None}
    tmpfs, why = tmpfs_directory()
    roots["tmpfs"] = tmpfs
    if tmpfs is None:
        result["not_measured"]["tmpfs"] = why
    setups: List[FileSystemSetup] = []
    try:
        for name, root in roots.items():
            if root is None:
                continue
            log(f"side by side on {name}: fresh journals{', starting the peers' if peers_python else ''} ...")
            setups.append(FileSystemSetup(name, root, peers_python, baseline_root))
        series = [(setup, name) for setup in setups for name in setup.series]
        for setup, name in series:
            for _ in range(WARMUP_CALLS):
                setup.series[name]()
        peer_cpu_before = {(setup.name, kind): peer.facts()["process_cpu_seconds"]
                           for setup in setups for kind, peer in setup.peers.items()}
        wall: Dict[Tuple[str, str], List[float]] = {key: [] for key in ((s.name, n) for s, n in series)}
        cpu: Dict[Tuple[str, str], List[float]] = {key: [] for key in wall}
        for index in range(calls):
            shift = index % len(series)
            for setup, name in series[shift:] + series[:shift]:
                seconds, cpu_seconds = setup.series[name]()
                wall[(setup.name, name)].append(seconds)
                cpu[(setup.name, name)].append(cpu_seconds)
        for setup in setups:
            result["filesystems"][setup.name] = _summarise(
                setup, {name: wall[(setup.name, name)] for name in setup.series},
                {name: cpu[(setup.name, name)] for name in setup.series},
                {kind: peer_cpu_before[(setup.name, kind)] for kind in setup.peers}, calls)
    finally:
        for setup in setups:
            setup.close()
        if tmpfs is not None:
            shutil.rmtree(tmpfs, ignore_errors=True)
        shutil.rmtree(roots["disk"], ignore_errors=True)
    problems = {f"{name}: {kind}": problem for name, entry in result["filesystems"].items()
                for kind, problem in entry["peers_not_measured"].items()}
    if peers_python is None:
        result["peers"] = {"measured": False, "why": peers_reason}
    elif problems:
        result["peers"] = {"measured": False, "why": "; ".join(f"{key}: {value}" for key, value in problems.items())}
    else:
        result["peers"] = {"measured": True, "why": None, "python": peers_python, "found": peers_reason}
    return result


def format_side_by_side(measured: Dict[str, Any]) -> str:
    """The side-by-side table (ms; ratios to the floor and the product), as Markdown."""
    systems = measured["filesystems"]
    lines = ["| series | " + " | ".join(f"{name}: wall p50 / p99 (ms) | {name}: CPU per call mean (ms)"
                                        for name in systems) + " |",
             "|---|" + "---|---|" * len(systems)]
    names = list(dict.fromkeys(name for entry in systems.values() for name in entry["series"]))
    for name in names:
        cells = []
        for entry in systems.values():
            found = entry["series"].get(name)
            cells += ([f"{found['wall']['p50_ms']:.2f} / {found['wall']['p99_ms']:.2f}",
                       f"{found['cpu']['mean_ms']:.3f}"] if found else ["-", "-"])
        lines.append(f"| {SERIES_LABELS[name]} | " + " | ".join(cells) + " |")
    for name in ("middleware", "hook_and_middleware"):
        for other in ("floor", *PEER_KINDS, "baseline"):
            key_wall, key_cpu = f"wall_ratio_to_{other}_p50", f"cpu_ratio_to_{other}_mean"
            if other == "floor":
                key_cpu = "cpu_ratio_to_floor_mean"
            if not any(key_wall in entry["series"][name] for entry in systems.values()):
                continue
            cells = []
            for entry in systems.values():
                found = entry["series"][name]
                cells += [f"{found.get(key_wall, '-')}", f"{found.get(key_cpu, '-')}"]
            lines.append(f"| ratio {SERIES_LABELS[name]} / {other} | " + " | ".join(cells) + " |")
    peers = measured["peers"]
    if peers["measured"]:
        for kind in PEER_KINDS:
            entry = next(iter(systems.values()))["series"][kind]
            versions = ", ".join(f"{name} {version}" for name, version in entry["versions"].items())
            settings = ", ".join(f"{key} {value}" for key, value in entry["settings"].items())
            rows = ", ".join(f"{count:g} `{table}`" for table, count in entry["rows_per_call"].items())
            per_fs = "; ".join(f"{name}: {entry_fs['series'][kind]['process_cpu_per_call_ms']} ms of "
                               "process CPU per call over the phase, background threads included"
                               for name, entry_fs in systems.items())
            lines.append(f"\n{SERIES_LABELS[kind]}: {versions}; SQLite settings: {settings}; rows "
                         f"written per call: {rows}; {per_fs}.")
    else:
        lines.append(f"\nThe peers were not measured: {peers['why']}.")
    for name, why in measured["not_measured"].items():
        lines.append(f"\n{name} was not measured: {why}.")
    return "\n".join(lines)
