"""Counting the product's file-system calls: per function, per file.

``OsCallCounter`` wraps functions of the ``os`` module (and the built-in
``open``) for the time of a ``with`` block and counts each call, by function
and by the file it names -- relative to a data directory, with operation ids
and temp-name suffixes generalised (``calls/<operation_id>``,
``head.json.<pid>-<random>.tmp``), descriptors traced back to the path they
were opened with, ``dir_fd`` arguments resolved.  Code that bound a function
earlier (``from os import stat``) is not counted; the product calls them
through the module.  SQLite's own calls (inside its C library) are not seen.

``measure_os_calls`` counts ``stat``/``lstat``/``fstat``/``open`` (and
directory listings) per protected call and per read (the ``pre_tool_call``
hook: the gate's verified read of the journal's snapshot), on a warm guard:
issue 27 asks that each snapshot stats its files once.  A counter can be
entered again and again (its counts add up), and counters nest.
"""
from __future__ import annotations

import builtins
import os
import re
from typing import Any, Callable, Dict, Iterable, Optional

from product import WARMUP_CALLS, ProductCaller

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PID_RANDOM_TEMP = re.compile(r"\.\d+-[0-9a-f]+\.tmp(?=/|$)")
PID_TEMP = re.compile(r"\.\d+\.tmp(?=/|$)")
DATA_DIRECTORY = "<data directory>"
# The functions themselves, taken before any counter wraps them: tracing a
# descriptor back to its path must not count as a call of the product's.
TRUE_STAT, TRUE_FSTAT = os.stat, os.fstat
UNKNOWN_DESCRIPTOR = "<descriptor>"
# Functions whose first argument names a file or a descriptor, and the keyword
# that can make it relative to a directory descriptor.
DIR_FD_KEYWORDS = ("dir_fd", "src_dir_fd")
STAT_FUNCTIONS = ("stat", "lstat", "fstat")
SNAPSHOT_FUNCTIONS = ("stat", "lstat", "fstat", "open", "builtin_open", "listdir", "scandir")


def generalised_name(path: str, data_dir: Optional[str]) -> str:
    """``path`` relative to ``data_dir`` (when inside it), operation ids and
    temp suffixes generalised; the directory itself is ``<data directory>``."""
    if data_dir:
        absolute, root = os.path.abspath(path), os.path.abspath(data_dir)
        if absolute == root:
            return DATA_DIRECTORY
        if absolute.startswith(root + os.sep):
            path = absolute[len(root) + 1:]
    path = UUID.sub("<operation_id>", path)
    path = PID_RANDOM_TEMP.sub(".<pid>-<random>.tmp", path)
    return PID_TEMP.sub(".<pid>.tmp", path)


class DescriptorPaths:
    """Which path each descriptor opened through ``os.open`` (or ``open``) names.

    ``path_of(fd)`` checks the remembered path still names the descriptor's
    file (descriptors are reused, and SQLite opens its own), and keeps the
    name of a file unlinked since (a call lock is unlocked after its unlink)."""

    def __init__(self, original_stat: Callable, original_fstat: Callable) -> None:
        self.paths: Dict[int, str] = {}
        self._stat, self._fstat = original_stat, original_fstat

    def remember(self, descriptor: int, path: str) -> None:
        self.paths[descriptor] = path

    def forget(self, descriptor: int) -> None:
        self.paths.pop(descriptor, None)

    def path_of(self, descriptor: int) -> Optional[str]:
        path = self.paths.get(descriptor)
        if path is None:
            return None
        try:
            held, named = self._fstat(descriptor), self._stat(path)
        except OSError:
            return path  # unlinked since it was opened: still that file
        return path if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino) else None

    def resolve(self, target: Any, keywords: Dict[str, Any]) -> Optional[str]:
        """The absolute path a call's first argument names, or None."""
        if isinstance(target, int):
            return self.path_of(target)
        try:
            path = os.fsdecode(target)
        except TypeError:
            return None
        for keyword in DIR_FD_KEYWORDS:
            directory = keywords.get(keyword)
            if directory is not None and not os.path.isabs(path):
                base = self.path_of(directory)
                return os.path.join(base, path) if base else None
        return os.path.abspath(path)


class OsCallCounter:
    """Counts calls of ``os.<function>`` (``builtin_open``: the built-in
    ``open``) made in this process while the ``with`` block runs.

    ``counts[function]`` is the number of calls; ``per_file[name][function]``
    the same by generalised file name (see :func:`generalised_name`; a
    descriptor that cannot be traced is ``<descriptor>``).  ``os.open`` and
    ``os.close`` are always wrapped so descriptors can be traced, but counted
    only when listed.  Not thread-safe; counters nest (innermost restored
    first)."""

    def __init__(self, functions: Iterable[str] = ("fsync", "replace"),
                 data_dir: Optional[str] = None) -> None:
        self.functions = tuple(functions)
        self.data_dir = data_dir
        self.counts: Dict[str, int] = {name: 0 for name in self.functions}
        self.per_file: Dict[str, Dict[str, int]] = {}
        self._originals: Dict[str, Callable] = {}
        self.descriptors = DescriptorPaths(TRUE_STAT, TRUE_FSTAT)

    def count(self, function: str) -> int:
        return self.counts.get(function, 0)

    def _record(self, function: str, target: Any, keywords: Dict[str, Any]) -> None:
        if function not in self.counts:
            return
        self.counts[function] += 1
        path = self.descriptors.resolve(target, keywords) if target is not None else None
        name = generalised_name(path, self.data_dir) if path else UNKNOWN_DESCRIPTOR
        per_function = self.per_file.setdefault(name, {})
        per_function[function] = per_function.get(function, 0) + 1

    def _wrapper(self, function: str, original: Callable) -> Callable:
        counter = self

        def counted(*positional: Any, **keywords: Any) -> Any:
            target = positional[0] if positional else keywords.get("path", keywords.get("fd"))
            if function == "close":
                counter.descriptors.forget(target)
            result = original(*positional, **keywords)
            if function == "open" and isinstance(result, int):
                path = counter.descriptors.resolve(target, keywords)
                if path:
                    counter.descriptors.remember(result, path)
            elif function == "builtin_open" and hasattr(result, "fileno") and isinstance(target, (str, bytes)):
                try:
                    counter.descriptors.remember(result.fileno(), os.path.abspath(os.fsdecode(target)))
                except (OSError, ValueError):
                    pass
            counter._record(function, target, keywords)
            return result
        return counted

    def __enter__(self) -> "OsCallCounter":
        for function in dict.fromkeys((*self.functions, "open", "close")):
            owner = builtins if function == "builtin_open" else os
            attribute = "open" if function == "builtin_open" else function
            original = getattr(owner, attribute)
            self._originals[function] = original
            setattr(owner, attribute, self._wrapper(function, original))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for function, original in reversed(list(self._originals.items())):
            setattr(builtins if function == "builtin_open" else os,
                    "open" if function == "builtin_open" else function, original)
        self._originals.clear()


# ---------------------------------------------------------- measurement --

def per_unit(counter: OsCallCounter, units: int) -> Dict[str, Any]:
    """Counts divided by ``units`` (calls or reads): per function, per file,
    and the most stat-family calls (stat + lstat + fstat) of one file."""
    per_file = {name: {function: round(count / units, 3) for function, count in sorted(functions.items())}
                for name, functions in sorted(counter.per_file.items())}
    stats = {name: round(sum(functions.get(function, 0) for function in STAT_FUNCTIONS), 3)
             for name, functions in per_file.items()}
    worst = max(stats.items(), key=lambda item: item[1], default=(None, 0.0))
    return {"units": units,
            "per_function": {function: round(count / units, 3) for function, count in counter.counts.items()},
            "per_file": per_file,
            "stats_per_file": {name: value for name, value in stats.items() if value},
            "most_stats_of_one_file": worst[1], "most_statted_file": worst[0]}


def measure_os_calls(data_dir: str, calls: int) -> Dict[str, Any]:
    """On a warm guard, averaged over ``calls``: file-system calls per
    protected call (hook + middleware), per read right after a write (the
    hook of the next call: a new snapshot to check), per middleware alone,
    and per read with nothing written since the last (the hook again)."""
    caller = ProductCaller(data_dir)
    try:
        for _ in range(WARMUP_CALLS):
            caller.protected_call_with_hook()

        def read() -> None:
            verdict = caller.hook()
            if verdict is not None:
                raise RuntimeError(f"pre_tool_call refused: {str(verdict)[:300]}")
        counters = {kind: OsCallCounter(SNAPSHOT_FUNCTIONS, data_dir=data_dir)
                    for kind in ("protected_call", "read", "middleware", "read_unchanged")}
        for _ in range(calls):
            with counters["protected_call"]:  # counters nest: both count the hook
                with counters["read"]:
                    read()
                with counters["middleware"]:
                    caller.middleware()
        read()  # the first read after the last write checks a new snapshot
        for _ in range(calls):
            with counters["read_unchanged"]:
                read()
        return {"functions": list(SNAPSHOT_FUNCTIONS),
                **{kind: per_unit(counter, calls) for kind, counter in counters.items()}}
    finally:
        caller.close()


def format_os_call_table(sizes: list) -> str:
    """Per-file counts (per protected call / per read) at each size, as Markdown."""
    lines = ["| file | " + " | ".join(f"{entry['events']:,} events: per call / per read"
                                       for entry in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    names = sorted({name for entry in sizes for kind in ("protected_call", "read")
                    for name in entry["os_calls"][kind]["per_file"]})

    def cell(counts: Optional[Dict[str, float]]) -> str:
        if not counts:
            return "-"
        return ", ".join(f"{function} {value:g}" for function, value in counts.items())
    for name in names:
        lines.append(f"| `{name}` | " + " | ".join(
            f"{cell(entry['os_calls']['protected_call']['per_file'].get(name))} / "
            f"{cell(entry['os_calls']['read']['per_file'].get(name))}" for entry in sizes) + " |")
    lines.append("| most stat+lstat+fstat of one file | " + " | ".join(
        f"{entry['os_calls']['protected_call']['most_stats_of_one_file']:g} "
        f"(`{entry['os_calls']['protected_call']['most_statted_file']}`) / "
        f"{entry['os_calls']['read']['most_stats_of_one_file']:g} "
        f"(`{entry['os_calls']['read']['most_statted_file']}`)" for entry in sizes) + " |")
    return "\n".join(lines)
