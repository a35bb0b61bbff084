"""The product under test, as the benchmark reaches it, and its journal on disk.

Loads crash-recovery from this checkout (``host/standalone.py``), makes
protected no-op calls the way Hermes does (``ProductCaller``), records how long
each append holds SQLite's writer lock (``LockHoldRecorder``), and reads the
facts of a data directory the measurements report (event count, bytes, an
operation in the middle of the history).  Also the paths and the call every
measurement shares.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import runpy
import sqlite3
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import bulk_journal
from stats import distribution_ms, milliseconds

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPOSITORY_ROOT = os.path.dirname(BENCH_DIR)
OPERATOR_CLI = os.path.join(REPOSITORY_ROOT, "operator_cli.py")
# Child processes (probes, workers) run the entry point in one of its hidden modes.
BENCH_SCRIPT = os.path.join(BENCH_DIR, "run.py")

# A checkout to load the product from instead of this one: set for a worker
# that measures the code before a change beside this one (side_by_side.py).
PRODUCT_ROOT_VARIABLE = "CRASH_RECOVERY_BENCH_PRODUCT_ROOT"

NO_OP_RESULT = "done"
TOOL_NAME = "send_payment"
TOOL_ARGS = {"amount": 125, "currency": "EUR", "to": "acct-4711", "memo": "bench"}
WARMUP_CALLS = 3


@functools.lru_cache(maxsize=None)
def product_loader() -> Callable[[str], Any]:
    """``load_module`` of this checkout's ``host/standalone.py`` (or that of the
    checkout ``$CRASH_RECOVERY_BENCH_PRODUCT_ROOT`` names), run by path: host/
    stays off sys.path, so its modules (``hermes.py``, ...) never become
    top-level imports; the product is imported only as ``crash_recovery``."""
    root = os.environ.get(PRODUCT_ROOT_VARIABLE) or REPOSITORY_ROOT
    return runpy.run_path(os.path.join(root, "host", "standalone.py"))["load_module"]


def load_product(name: str) -> Any:
    """``crash_recovery.<name>`` from this checkout, e.g. ``"guard"`` or ``"storage.schema"``."""
    return product_loader()(name)


def product_attribute(name: str, modules: Tuple[str, ...] = ("storage.schema", "storage.database")) -> Any:
    """``name`` from the first product module (in ``modules``) that defines it
    (the schema constants moved from the database module to the schema module)."""
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
    """Boundary hook (``storage.durable.set_boundary_hook``): how long each
    append held SQLite's writer lock, from ``begin`` (reached right after
    ``BEGIN IMMEDIATE`` succeeded) to ``committed`` (right after ``COMMIT``),
    per event kind; and, for ``started``, when each boundary was reached (ms
    after begin)."""

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
        load_product("storage.durable").set_boundary_hook(self)
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


# -------------------------------------------------------------- journals --

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


def read_only_connection(data_dir: str) -> sqlite3.Connection:
    uri = "file:" + os.path.join(data_dir, bulk_journal.DB_NAME) + "?mode=ro"
    return sqlite3.connect(uri, uri=True)


def middle_operation(data_dir: str) -> Optional[str]:
    """The id of an operation started in the middle of the journal (for ``show``)."""
    with contextlib.closing(read_only_connection(data_dir)) as connection:
        (count,) = connection.execute("SELECT count(*) FROM events").fetchone()
        for (payload,) in connection.execute("SELECT payload FROM events WHERE seq >= ? ORDER BY seq",
                                             (count // 2,)):
            event = json.loads(payload)
            if event.get("kind") == "started":
                return event["operation_id"]
    return None
