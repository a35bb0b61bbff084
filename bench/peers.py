"""The peers: a one-step DBOS workflow and a one-node LangGraph graph, each
doing what the benchmark's protected tool does, durable as they are by default.

* **DBOS** (package ``dbos``) with SQLite as its system database
  (``system_database_url = sqlite:///<dir>/dbos.sqlite3``): a workflow that
  runs one step, ``send_payment(args)``, which returns ``"done"``.  Every call
  is a new workflow (a new workflow id); DBOS records its status and the
  step's output in the system database before the call returns.  Nothing is
  set but the database and the log level.
* **LangGraph** (``langgraph`` + ``langgraph-checkpoint-sqlite``): a graph
  ``START -> send_payment -> END`` compiled with a ``SqliteSaver`` on its own
  ``sqlite3`` connection (as its documentation shows); every invoke is a new
  thread (``thread_id``) with the tool's arguments as input and returns
  ``{"result": "done"}`` in its state.  ``invoke`` runs with its default
  durability (``"async"``: checkpoints are written on a background thread
  while the graph runs, and ``invoke`` returns once all of them are
  committed).

Which SQLite settings each ends up with (``journal_mode``, ``synchronous``,
``busy_timeout``) is read from its own connection at start and reported.

They are benchmark dependencies only, never the runtime's: installed into a
virtual environment of their own from ``bench/requirements-peers.txt`` (see
bench/RESULTS.md).  Each peer runs in a worker process of that interpreter
(this benchmark in its hidden ``--peer-worker`` mode, ``peer_worker_main``),
driven over pipes like the warm workers; each call is timed in the worker
(wall time and the process's CPU time).  Without the environment, the
benchmark runs and says why the peers were not measured.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import sqlite3
import sys
import time
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

from product import NO_OP_RESULT, REPOSITORY_ROOT, TOOL_ARGS
from workers import WorkerProcess

PEER_KINDS = ("dbos", "langgraph")
PEERS_VENV = os.path.join(REPOSITORY_ROOT, ".venv-bench-peers")
PEERS_PYTHON_VARIABLE = "CRASH_RECOVERY_BENCH_PEERS_PYTHON"
PEERS_REQUIREMENTS = os.path.join(REPOSITORY_ROOT, "bench", "requirements-peers.txt")
DISTRIBUTIONS = {"dbos": ("dbos", "SQLAlchemy"),
                 "langgraph": ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite")}
PRAGMAS = ("journal_mode", "synchronous", "busy_timeout")
SYNCHRONOUS_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def peers_python(explicit: Optional[str]) -> Tuple[Optional[str], str]:
    """(interpreter, how it was found) for the peer workers: ``explicit``
    (``--peers-python``), else ``$CRASH_RECOVERY_BENCH_PEERS_PYTHON``, else the
    ``.venv-bench-peers`` virtual environment at the repository root, else this
    interpreter (the peers may be installed in it).  Whether the peers import
    there, each worker finds out."""
    if explicit:
        return explicit, "--peers-python"
    if os.environ.get(PEERS_PYTHON_VARIABLE):
        return os.environ[PEERS_PYTHON_VARIABLE], f"${PEERS_PYTHON_VARIABLE}"
    candidate = os.path.join(PEERS_VENV, "bin", "python")
    if os.access(candidate, os.X_OK):
        return candidate, ".venv-bench-peers at the repository root"
    return sys.executable, "this interpreter (no .venv-bench-peers at the repository root)"


# ----------------------------------------------------- inside the worker --

def _pragmas(execute: Callable[[str], Any]) -> Dict[str, Any]:
    found: Dict[str, Any] = {}
    for name in PRAGMAS:
        value = execute(f"PRAGMA {name}")
        found[name] = SYNCHRONOUS_NAMES.get(value, value) if name == "synchronous" else value
    return found


def dbos_system(data_dir: str) -> Dict[str, Any]:
    """DBOS launched on a SQLite system database in ``data_dir``: the call,
    its settings, a row counter and the shutdown."""
    from dbos import DBOS  # the peers' environment only
    import sqlalchemy

    path = os.path.join(data_dir, "dbos.sqlite3")
    instance = DBOS(config={"name": "crash-recovery-bench", "system_database_url": f"sqlite:///{path}",
                            "log_level": "WARNING"})

    @DBOS.step()
    def send_payment(args: dict) -> str:
        return NO_OP_RESULT

    @DBOS.workflow()
    def protected_call(args: dict) -> str:
        return send_payment(args)

    DBOS.launch()
    engine = instance._sys_db.engine  # DBOS's own engine: the settings its connections have

    def pragma(statement: str) -> Any:
        with engine.connect() as connection:
            return connection.execute(sqlalchemy.text(statement)).scalar()

    def rows() -> Dict[str, int]:
        with sqlite3.connect(path) as connection:
            return {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                    for table in ("workflow_status", "operation_outputs")}
    return {"call": lambda: protected_call(TOOL_ARGS), "settings": {**_pragmas(pragma), "durability":
            "DBOS's defaults (the workflow's status and its step's output written during the call)"},
            "rows": rows, "close": DBOS.destroy}


def langgraph_system(data_dir: str) -> Dict[str, Any]:
    """A one-node LangGraph graph with a SqliteSaver in ``data_dir``."""
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver  # the peers' environment only
    from langgraph.graph import END, START, StateGraph

    state = TypedDict("PaymentState", {"args": dict, "result": str})

    def send_payment(current: dict) -> dict:
        return {"result": NO_OP_RESULT}

    graph = StateGraph(state)
    graph.add_node("send_payment", send_payment)
    graph.add_edge(START, "send_payment")
    graph.add_edge("send_payment", END)
    path = os.path.join(data_dir, "langgraph.sqlite3")
    connection = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(connection)
    saver.setup()  # invoke would do it on first use; done here so the settings can be read
    application = graph.compile(checkpointer=saver)

    def call() -> str:
        output = application.invoke({"args": TOOL_ARGS}, {"configurable": {"thread_id": str(uuid.uuid4())}})
        return output["result"]

    def rows() -> Dict[str, int]:
        with saver.lock:
            return {table: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                    for table in ("checkpoints", "writes")}
    with saver.lock:
        settings = _pragmas(lambda statement: connection.execute(statement).fetchone()[0])
    return {"call": call, "settings": {**settings, "durability": "async (invoke's default)"},
            "rows": rows, "close": connection.close}


PEER_SYSTEMS = {"dbos": dbos_system, "langgraph": langgraph_system}


def _versions(kind: str) -> Dict[str, Optional[str]]:
    found: Dict[str, Optional[str]] = {}
    for name in DISTRIBUTIONS[kind]:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def peer_worker_main(data_dir: str, kind: str) -> int:
    """Worker body (the peers' interpreter): set the peer up in ``data_dir``,
    reply ``ready`` (versions, settings) or the error, then answer ``call``
    (one timed call: wall and process CPU seconds), ``facts`` (rows in its
    database, the process's CPU seconds so far) and ``exit``.  The peers'
    own output goes to stderr: stdout carries only the replies."""
    replies = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)

    def reply(message: Dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    began = time.perf_counter()
    try:
        os.makedirs(data_dir, exist_ok=True)
        system = PEER_SYSTEMS[kind](data_dir)
    except Exception as exc:  # e.g. ModuleNotFoundError: reported, not raised
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500], "python": sys.executable})
        return 0
    reply({"ok": True, "ready": True, "setup_seconds": round(time.perf_counter() - began, 3),
           "versions": _versions(kind), "settings": system["settings"], "python": sys.executable,
           "python_version": sys.version.split()[0], "sqlite": sqlite3.sqlite_version})
    for line in sys.stdin:
        operation = json.loads(line)["op"]
        try:
            if operation == "call":
                wall, cpu = time.perf_counter(), time.process_time()
                result = system["call"]()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                if result != NO_OP_RESULT:
                    raise RuntimeError(f"{kind} returned {result!r}")
                reply({"ok": True, "wall_seconds": wall, "cpu_seconds": cpu})
            elif operation == "facts":
                reply({"ok": True, "rows": system["rows"](), "process_cpu_seconds": _process_cpu_seconds()})
            elif operation == "exit":
                break
            else:
                reply({"ok": False, "error": f"unknown op {operation}"})
        except Exception as exc:  # reported to the coordinator, which fails the run
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
    system["close"]()
    return 0


# ------------------------------------------------------ the coordinator --

class PeerProcess:
    """A peer worker (``kind`` in PEER_KINDS) on ``data_dir``, run by ``python``.
    ``ready`` holds its first reply; raises RuntimeError when it cannot start
    (the message says why: the peers are then reported as not measured)."""

    def __init__(self, kind: str, data_dir: str, python: str) -> None:
        self.kind = kind
        self.worker = WorkerProcess(data_dir, kind, mode="--peer-worker", python=python)
        try:
            self.ready = self.worker.receive()
        except RuntimeError:
            self.worker.close()
            raise

    def call(self) -> Tuple[float, float]:
        """One timed call: (wall seconds, CPU seconds), measured in the worker."""
        reply = self.worker.request({"op": "call"})
        return reply["wall_seconds"], reply["cpu_seconds"]

    def facts(self) -> Dict[str, Any]:
        return self.worker.request({"op": "facts"})

    def close(self) -> None:
        self.worker.close()
