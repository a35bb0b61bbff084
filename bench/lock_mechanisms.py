"""How many cross-process lock mechanisms the runtime has, counted from its code.

Two counts that must agree:

* **From the source** (``scan_sources``): every call in the runtime (the
  files runtime_lines.py counts) that takes, releases or tests a lock another
  process can see -- ``fcntl.flock``, ``fcntl.lockf`` / ``os.lockf``,
  ``fcntl.fcntl`` with a record-lock command (``F_SETLK``, ``F_SETLKW``,
  ``F_GETLK`` and their ``F_OFD_*`` forms), ``msvcrt.locking`` -- with the
  function it sits in; and whether the runtime opens SQLite databases
  (``sqlite3.connect``): SQLite takes POSIX record locks of its own on the
  database and its ``-shm`` inside its C library, where no Python call shows.
* **From a run** (``trace_locks``): those functions are wrapped while the
  product makes protected calls, refuses a sibling while a call is in flight,
  is read by a fresh reader and by ``operator_cli.py status``, archives and
  closes; each lock call is recorded with the file its descriptor names
  (os_calls.py traces descriptors back to paths) and the runtime function that
  made it.

A mechanism is a kind of lock (``flock``; a POSIX or an open-file-description
record lock) on one kind of file (``calls/<operation_id>``, the data directory,
``journal.sqlite3``); probing a lock (``LOCK_NB``, ``F_GETLK``) uses the same
mechanism.  A call site of the source that the run did not reach counts as a
mechanism of its own (it cannot be attributed), and is listed.  Also listed,
for the record: the in-process locks (``threading.Lock``/``RLock``/...) and
fork handlers (``os.register_at_fork``) the runtime creates.  Issue 27's
target: at most 4 mechanisms (SQLite's own, the per-call lock, the head lock,
the WAL keeper's byte range).
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import shutil
import stat
import struct
import sys
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from os_calls import DATA_DIRECTORY, TRUE_FSTAT, OsCallCounter, generalised_name
from product import NO_OP_RESULT, REPOSITORY_ROOT, TOOL_ARGS, TOOL_NAME, ProductCaller, load_product
from runtime_lines import runtime_files

try:
    import fcntl
except ImportError:  # the trace needs fcntl; the source scan does not
    fcntl = None  # type: ignore[assignment]

RECORD_COMMANDS = ("F_OFD_SETLKW", "F_OFD_SETLK", "F_OFD_GETLK", "F_SETLKW", "F_SETLK", "F_GETLK")
IN_PROCESS_LOCKS = ("Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore")
# Linux ``struct flock`` (64-bit off_t): l_type, l_whence, l_start, l_len, l_pid.
FLOCK_STRUCT = "@hhqqi4x"
# What issue 27 calls each mechanism it allows, by (kind, file).
ROLES = {("flock", "calls/<operation_id>"): "the per-call lock",
         ("flock", "<data directory>"): "the head lock",
         ("OFD record lock", "journal.sqlite3"): "the WAL keeper's byte range"}
SQLITE_MECHANISM = {"kind": "SQLite's own POSIX record locks",
                    "file": "journal.sqlite3 and its -shm (and every other database the runtime opens)",
                    "role": "SQLite's own", "sites": ["inside SQLite (sqlite3.connect)"]}


# ---------------------------------------------------------------- source --

def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _lock_kind(call: ast.Call) -> Optional[str]:
    """The lock kind a call takes or tests, or None when it is no lock call."""
    name = _dotted(call.func)
    if name == "fcntl.flock":
        return "flock"
    if name in ("fcntl.lockf", "os.lockf"):
        return "POSIX record lock"
    if name == "msvcrt.locking":
        return "Windows byte-range lock"
    if name == "fcntl.fcntl" and len(call.args) >= 2:
        command = ast.unparse(call.args[1])
        for known in RECORD_COMMANDS:
            if known in command:
                return "OFD record lock" if "OFD" in known else "POSIX record lock"
    return None


class _SourceScan(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: List[str] = []
        self.lock_sites: List[Dict[str, Any]] = []
        self.in_process: List[Dict[str, Any]] = []
        self.fork_handlers: List[Dict[str, Any]] = []
        self.opens_sqlite = False

    def _where(self, node: ast.AST) -> Dict[str, Any]:
        return {"file": self.path, "line": node.lineno, "function": ".".join(self.scope) or "<module>"}

    def _scoped(self, node: Any) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and _dotted(node.value.func).split(".")[-1] in IN_PROCESS_LOCKS \
                and _dotted(node.value.func).startswith("threading."):
            self.in_process.append({**self._where(node), "kind": _dotted(node.value.func),
                                    "target": ast.unparse(node.targets[0])})
        elif isinstance(node.value, ast.Tuple):  # ``self._lock, self._pid = threading.Lock(), ...``
            for target, value in zip(getattr(node.targets[0], "elts", ()), node.value.elts):
                if isinstance(value, ast.Call) and _dotted(value.func).startswith("threading.") \
                        and _dotted(value.func).split(".")[-1] in IN_PROCESS_LOCKS:
                    self.in_process.append({**self._where(node), "kind": _dotted(value.func),
                                            "target": ast.unparse(target)})
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        kind = _lock_kind(node)
        if kind:
            self.lock_sites.append({**self._where(node), "kind": kind,
                                    "call": ast.unparse(node)[:160]})
        name = _dotted(node.func)
        if name == "os.register_at_fork":
            for keyword in node.keywords:
                self.fork_handlers.append({**self._where(node), "when": keyword.arg,
                                           "handler": ast.unparse(keyword.value)})
        if name == "sqlite3.connect":
            self.opens_sqlite = True
        self.generic_visit(node)


def scan_sources(root: str = REPOSITORY_ROOT) -> Dict[str, Any]:
    """Lock call sites, in-process locks and fork handlers of the runtime's source."""
    sites: List[Dict[str, Any]] = []
    in_process: List[Dict[str, Any]] = []
    fork_handlers: List[Dict[str, Any]] = []
    sqlite_files: List[str] = []
    for path in runtime_files(root):
        with open(os.path.join(root, path), encoding="utf-8") as stream:
            scan = _SourceScan(path)
            scan.visit(ast.parse(stream.read(), filename=path))
        sites += scan.lock_sites
        in_process += scan.in_process
        fork_handlers += scan.fork_handlers
        if scan.opens_sqlite:
            sqlite_files.append(path)
    distinct = sorted({(entry["file"], entry["target"]) for entry in in_process})
    return {"lock_sites": sites, "sqlite_files": sqlite_files,
            "in_process_lock_sites": in_process,
            "in_process_locks": [f"{file}: {target}" for file, target in distinct],
            "fork_handlers": fork_handlers}


# ----------------------------------------------------------------- trace --

def _runtime_site() -> Tuple[str, str]:
    """(file, function) of the innermost runtime frame that called a lock function."""
    frame = sys._getframe(2)
    bench = os.path.join(REPOSITORY_ROOT, "bench") + os.sep
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(REPOSITORY_ROOT + os.sep) and not path.startswith(bench):
            return os.path.relpath(path, REPOSITORY_ROOT), frame.f_code.co_qualname
        frame = frame.f_back
    return "<not the runtime>", "?"


def lock_file(name: str, is_directory: bool) -> str:
    """The kind of file a lock is on: ``<data directory>`` for any directory
    (the profile's, or the one a journal is being built in), a call lock by
    its final name (``calls/<operation_id>``; it is locked under its temp
    name), any other file by its name alone (the journal a restart builds
    in a staging directory has the same files)."""
    if is_directory:
        return DATA_DIRECTORY
    directory, base = os.path.split(name)
    if base.startswith(".<operation_id>") and base.endswith(".<pid>.tmp"):
        base = "<operation_id>"
    return f"calls/{base}" if os.path.basename(directory) == "calls" else base


def _describe_operation(function: str, positional: tuple) -> str:
    if function == "flock":
        operation = positional[1] if len(positional) > 1 else 0
        words = [word for bit, word in ((fcntl.LOCK_SH, "LOCK_SH"), (fcntl.LOCK_EX, "LOCK_EX"),
                                        (fcntl.LOCK_UN, "LOCK_UN"), (fcntl.LOCK_NB, "LOCK_NB"))
                 if operation & bit]
        return "|".join(words) or str(operation)
    command = positional[1] if len(positional) > 1 else None
    names = [name for name in RECORD_COMMANDS if getattr(fcntl, name, object()) == command]
    text = names[0] if names else str(command)
    if len(positional) > 2 and isinstance(positional[2], bytes) and len(positional[2]) == struct.calcsize(FLOCK_STRUCT):
        kind, _whence, start, length, _pid = struct.unpack(FLOCK_STRUCT, positional[2])
        kind_name = {fcntl.F_RDLCK: "F_RDLCK", fcntl.F_WRLCK: "F_WRLCK", fcntl.F_UNLCK: "F_UNLCK"}.get(kind, kind)
        text += f" {kind_name} bytes {start}+{length}"
    return text


class LockTracer:
    """Records every ``fcntl.flock`` / ``fcntl.fcntl`` (record-lock commands) /
    ``fcntl.lockf`` call made while the ``with`` block runs."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.records: Dict[Tuple[str, str, str, str, str, str], int] = {}
        self._descriptors = OsCallCounter((), data_dir=data_dir)
        self._originals: Dict[str, Callable] = {}

    def _wrap(self, function: str, original: Callable) -> Callable:
        tracer = self

        def traced(*positional: Any, **keywords: Any) -> Any:
            kind = {"flock": "flock", "lockf": "POSIX record lock"}.get(function)
            if function == "fcntl":
                command = positional[1] if len(positional) > 1 else None
                names = [name for name in RECORD_COMMANDS if getattr(fcntl, name, object()) == command]
                kind = (None if not names else "OFD record lock" if "OFD" in names[0]
                        else "POSIX record lock")
            if kind is not None:
                descriptor = positional[0] if positional else None
                if hasattr(descriptor, "fileno"):
                    descriptor = descriptor.fileno()
                path = tracer._descriptors.descriptors.path_of(descriptor) if isinstance(descriptor, int) else None
                instance = generalised_name(path, tracer.data_dir) if path else "<descriptor>"
                try:
                    is_directory = stat.S_ISDIR(TRUE_FSTAT(descriptor).st_mode)
                except (OSError, TypeError):
                    is_directory = False
                key = (kind, lock_file(instance, is_directory) if path else instance, instance,
                       *_runtime_site(), _describe_operation(function, positional))
                tracer.records[key] = tracer.records.get(key, 0) + 1
            return original(*positional, **keywords)
        return traced

    def __enter__(self) -> "LockTracer":
        self._descriptors.__enter__()
        for function in ("flock", "fcntl", "lockf"):
            self._originals[function] = getattr(fcntl, function)
            setattr(fcntl, function, self._wrap(function, self._originals[function]))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for function, original in self._originals.items():
            setattr(fcntl, function, original)
        self._descriptors.__exit__(*exc_info)

    def calls(self) -> List[Dict[str, Any]]:
        return [{"kind": kind, "file": name, "instance": instance, "site": f"{site}:{function}",
                 "operation": operation, "count": count}
                for (kind, name, instance, site, function, operation), count in sorted(self.records.items())]


def _operator(data_dir: str, *words: str) -> int:
    """``operator_cli.py --data-dir DATA_DIR WORDS`` in this process (output dropped)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return load_product("operator_cli").main(["--data-dir", data_dir, *words])


def _exercise(data_dir: str) -> Dict[str, Any]:
    """What the trace runs: protected calls; while one is in flight (inside
    its tool), a sibling refused (a thread with a fresh context) and an
    operator's ``status``; a fresh read-only reader; an archive that finds a
    dead worker's call lock left behind; closing; and, on a journal whose
    ``head.json`` was then damaged, ``restart-journal`` (it asks whether any
    process has the journal open)."""
    caller = ProductCaller(data_dir)
    seen: Dict[str, Any] = {}

    def tool_with_a_sibling(*positional: Any, **keywords: Any) -> str:
        def sibling_call() -> None:
            verdict = caller.recovery_guard.pre_tool_call(TOOL_NAME, TOOL_ARGS, session_id="sibling",
                                                          tool_call_id="sibling-1")
            seen["sibling_hook"] = "allowed" if verdict is None else "blocked"
            result = caller.recovery_guard.tool_execution(TOOL_NAME, TOOL_ARGS, lambda **_: "ran",
                                                          session_id="sibling", tool_call_id="sibling-2")
            seen["sibling_middleware"] = "ran" if result == "ran" else "refused"
        thread = threading.Thread(target=sibling_call)
        thread.start()
        thread.join()
        seen["status_in_flight_exit"] = _operator(data_dir, "status")
        return NO_OP_RESULT

    journal_class = load_product("journal").Journal
    try:
        caller.protected_call_with_hook()
        caller.protected_call_with_hook()
        result = caller.recovery_guard.tool_execution(TOOL_NAME, TOOL_ARGS, tool_with_a_sibling,
                                                      session_id="bench-session", tool_call_id="in-flight")
        if result != NO_OP_RESULT:
            raise RuntimeError(f"lock trace: the protected call was refused: {str(result)[:300]}")
        reader = journal_class(data_dir, readonly=True)
        try:
            reader.verify()
            reader.unresolved()
        finally:
            reader.close()
        seen["status_exit"] = _operator(data_dir, "status")
        # A dead worker's call lock (nobody holds it): the archive removes it.
        leftover = os.path.join(data_dir, "calls", str(uuid.uuid4()))
        with open(leftover, "w", encoding="utf-8") as stream:
            json.dump({"operation_id": os.path.basename(leftover), "pid": 0, "process_start": 0}, stream)
        archiver = journal_class(data_dir, create=False)
        try:
            archiver.archive()
        finally:
            archiver.close()
        seen["leftover_removed_by_archive"] = not os.path.exists(leftover)
        caller.protected_call_with_hook()
    finally:
        caller.close()
    with open(os.path.join(data_dir, "head.json"), "w", encoding="utf-8") as stream:
        stream.write("{}")  # damaged: the journal now fails verification
    seen["restart_journal_exit"] = _operator(data_dir, "restart-journal", "--evidence",
                                             "bench/lock_mechanisms.py: head.json damaged on purpose")
    return seen


def trace_locks(workdir: str) -> Dict[str, Any]:
    """Lock calls the runtime makes in the scenario of :func:`_exercise`."""
    if fcntl is None:
        return {"calls": [], "scenario": None, "note": "no fcntl on this platform: not traced"}
    data_dir = os.path.join(workdir, "lock-trace")
    shutil.rmtree(data_dir, ignore_errors=True)
    try:
        with LockTracer(data_dir) as tracer:
            scenario = _exercise(data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return {"calls": tracer.calls(), "scenario": scenario}


def measure_lock_mechanisms(workdir: str) -> Dict[str, Any]:
    """The mechanisms (kind, file, role, the runtime functions using each),
    from the source scan and the trace together; their count."""
    source, traced = scan_sources(), trace_locks(workdir)
    mechanisms: Dict[Tuple[str, str], Dict[str, Any]] = {}
    reached = set()
    for call in traced["calls"]:
        entry = mechanisms.setdefault((call["kind"], call["file"]), {
            "kind": call["kind"], "file": call["file"],
            "role": ROLES.get((call["kind"], call["file"]), "not one issue 27 names"),
            "sites": [], "operations": [], "instances": []})
        for field, value in (("sites", call["site"]), ("operations", call["operation"]),
                             ("instances", call["instance"])):
            if value not in entry[field]:
                entry[field].append(value)
        reached.add(call["site"])
    unreached = [site for site in source["lock_sites"] if f"{site['file']}:{site['function']}" not in reached]
    for site in unreached:  # cannot be attributed to a file: a mechanism of its own
        mechanisms[(site["kind"], f"{site['file']}:{site['function']}")] = {
            "kind": site["kind"], "file": "unknown: not reached by the trace",
            "role": "not one issue 27 names", "sites": [f"{site['file']}:{site['function']}"],
            "operations": [site["call"]], "instances": []}
    listed = ([dict(SQLITE_MECHANISM, sites=[f"sqlite3.connect in {path}" for path in source["sqlite_files"]])]
              if source["sqlite_files"] else []) + list(mechanisms.values())
    return {"count": len(listed), "mechanisms": listed, "source": source, "trace": traced,
            "unreached_sites": unreached}


def format_lock_mechanisms(measured: Dict[str, Any]) -> str:
    lines = [f"Cross-process lock mechanisms: {measured['count']}", "",
             "| kind | file | issue 27's name | taken / tested in | seen on |", "|---|---|---|---|---|"]
    for mechanism in measured["mechanisms"]:
        lines.append(f"| {mechanism['kind']} | `{mechanism['file']}` | {mechanism['role']} | "
                     f"{', '.join(mechanism['sites'])} | "
                     f"{', '.join(f'`{name}`' for name in mechanism.get('instances', ())) or '-'} |")
    source = measured["source"]
    lines += ["", f"Lock calls in the source: {len(source['lock_sites'])} "
              f"({len(measured['unreached_sites'])} not reached by the trace); in-process locks: "
              f"{len(source['in_process_locks'])} ({', '.join(source['in_process_locks']) or 'none'}); "
              f"fork handlers: {len(source['fork_handlers'])} ("
              + (", ".join(f"{entry['file']}: {entry['when']}={entry['handler']}"
                           for entry in source["fork_handlers"]) or "none") + ")."]
    return "\n".join(lines)
