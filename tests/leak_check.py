"""No connection, file or lock of ours is left to the garbage collector.

Imported by ``support`` (so by every test run, and by every child script that
imports ``support``) and by the test modules that do not import it.  Not a
test module.

* ``ResourceWarning`` is an error, so one raised where the garbage collector
  finalises an object still open (an unclosed ``sqlite3`` connection on
  Python 3.13+, an unclosed file on every Python) becomes an "unraisable"
  exception, which Python reports to ``sys.unraisablehook`` and otherwise
  ignores;
* :func:`record_unraisable` (the hook) writes each one as a line of JSON to a
  log the test runner shares with its child processes (``LOG_VARIABLE``);
* every test's last cleanup collects garbage and fails that test when the log
  grew while it ran, quoting each record (a leak found between two tests is
  reported by the next one); at exit the runner fails, exit status 1, on
  records no test reported.

``PYTHONTRACEMALLOC=20`` adds where each leaked object was allocated.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import tempfile
import traceback
import tracemalloc
import unittest
import warnings
from typing import List

# The log's path, set by the test runner and inherited by its children.
LOG_VARIABLE = "CRASH_RECOVERY_LEAK_LOG"
_state = {"offset": 0, "installed": False}


class LeakFound(AssertionError):
    """A connection, file or lock was left to the garbage collector."""


def record_unraisable(unraisable) -> None:
    """``sys.unraisablehook``: a ``ResourceWarning`` goes to the log; anything
    else to Python's own hook."""
    if not (isinstance(unraisable.exc_type, type)
            and issubclass(unraisable.exc_type, ResourceWarning)):
        sys.__unraisablehook__(unraisable)
        return
    entry = {"pid": os.getpid(), "process": " ".join(sys.argv)[:200],
             "warning": str(unraisable.exc_value), "object": _safe_repr(unraisable.object)}
    allocated = (tracemalloc.get_object_traceback(unraisable.object)
                 if tracemalloc.is_tracing() and unraisable.object is not None else None)
    if allocated is not None:
        entry["allocated"] = allocated.format()
        entry["finalized"] = traceback.format_stack()[-10:-1]
    try:
        with open(os.environ[LOG_VARIABLE], "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")
    except (KeyError, OSError):  # no log: say it where a person sees it
        sys.__unraisablehook__(unraisable)


def _safe_repr(value) -> str:
    try:
        return repr(value)[:200]
    except Exception:  # noqa: BLE001 - a repr that raises must not hide the leak
        return f"<{type(value).__name__}>"


def new_records() -> List[dict]:
    """The log's records since the last call (after collecting garbage)."""
    gc.collect()
    try:
        with open(os.environ[LOG_VARIABLE], encoding="utf-8") as log:
            log.seek(_state["offset"])
            text = log.read()
            _state["offset"] = log.tell()
    except (KeyError, OSError):
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def describe(records: List[dict]) -> str:
    lines = []
    for entry in records:
        lines.append(f"{entry['warning']} (object {entry['object']}; process {entry['pid']}: "
                     f"{entry['process']})")
        # The innermost frames of where it was allocated (tracemalloc, oldest first).
        lines.extend("    " + line for line in entry.get("allocated", [])[-16:])
        if "finalized" in entry:
            lines.append("  finalized at:")
            lines.extend("    " + line.rstrip() for line in entry["finalized"])
    if not any("allocated" in entry for entry in records):
        lines.append("(PYTHONTRACEMALLOC=20 shows where each was allocated)")
    return "\n".join(lines)


def _check_after_test(test: unittest.TestCase) -> None:
    records = new_records()
    if records:
        raise LeakFound(f"{test.id()} left {len(records)} resource(s) to the garbage "
                        f"collector (or the test before it did):\n" + describe(records))


_original_run = unittest.TestCase.run


def _run_checked(self, result=None):
    # The runner installs its own warnings filter around the run ("default"):
    # ours goes in front again for each test.
    warnings.filterwarnings("error", category=ResourceWarning)
    self.addCleanup(_check_after_test, self)  # the first cleanup added runs last
    return _original_run(self, result)


def _check_at_exit(path: str) -> None:
    records = new_records()
    os.unlink(path)
    if records:
        sys.stdout.flush()
        sys.stderr.write("\nFAILED: resources left to the garbage collector outside any "
                         "test:\n" + describe(records) + "\n")
        sys.stderr.flush()
        os._exit(1)  # the exit status the run would otherwise not have


def install() -> None:
    """Install the check in this process (once).  The first process to install
    it is the runner: it creates the log; processes it starts append to it."""
    if _state["installed"]:
        return
    _state["installed"] = True
    warnings.filterwarnings("error", category=ResourceWarning)
    sys.unraisablehook = record_unraisable
    if LOG_VARIABLE in os.environ:  # a child of the runner: record only
        atexit.register(gc.collect)  # finalise cycles while the hook still runs
        return
    descriptor, path = tempfile.mkstemp(prefix="crash-recovery-leaks-", suffix=".jsonl")
    os.close(descriptor)
    os.environ[LOG_VARIABLE] = path
    unittest.TestCase.run = _run_checked
    atexit.register(_check_at_exit, path)


install()
