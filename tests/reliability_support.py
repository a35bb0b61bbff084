"""Helpers shared by the reliability tests (crash matrix, tamper, bad input,
fail-closed, concurrency, worker processes).  Not a test module."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap

from support import TESTS, JournalTestCase, reference


def logical_snapshot(case, data_dir=None):
    """What a refusal must not change: every file's bytes except SQLite's own
    (``journal.sqlite3`` is compared by content -- a later process may
    checkpoint the WAL into it, which rewrites bytes but not rows), the event
    rows and the metadata rows."""
    data_dir = data_dir or case.data_dir
    state = case.snapshot(data_dir)
    state["files"].pop("journal.sqlite3", None)
    if "rows" in state and not isinstance(state["rows"], str):
        try:
            state["metadata"] = sorted(reference.read_rows(data_dir).get("metadata", []))
        except Exception as exc:  # noqa: BLE001 - an unreadable database is a state too
            state["metadata"] = f"unreadable: {type(exc).__name__}"
    return state


# tmpfs makes fsync free.  A SIGKILL leaves the page cache intact, so every
# process-crash verdict is the same on tmpfs as on a disk; only power loss
# differs, which no test here simulates.  CRASH_RECOVERY_TEST_TMP overrides.
FAST_TMP = os.environ.get("CRASH_RECOVERY_TEST_TMP") or (
    "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)


class ReliabilityCase(JournalTestCase):
    """:class:`JournalTestCase` whose temporary directories live on tmpfs."""

    def setUp(self):
        saved = tempfile.tempdir
        tempfile.tempdir = FAST_TMP or saved
        try:
            super().setUp()
        finally:
            tempfile.tempdir = saved


class Tool:
    """A protected tool with a side effect we can count: each call adds to
    ``calls``, then raises ``error`` or returns ``result``."""

    def __init__(self, result='{"status": "booked"}', error=None):
        self.result, self.error, self.calls = result, error, 0

    def __call__(self):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.result


def call(guard, tool, name="c", tool_name="book_trip"):
    """One protected call through the guard's middleware: argument ``n``
    and tool call id ``name``, session ``s``.  Returns what the guard returns."""
    return guard.tool_execution(tool_name=tool_name, args={"n": name}, next_call=tool,
                                session_id="s", tool_call_id=name)


class ProtectedCallCase(JournalTestCase):
    """:class:`JournalTestCase` with a payment call and a reader of refusal codes."""

    def call(self, guard, tool, call_id="call-1", tool_name="send_payment"):
        """``tool_name`` paying ``bob`` in session ``session-1``; the guard's result."""
        return guard.tool_execution(tool_name=tool_name, args={"to": "bob"}, next_call=tool,
                                    session_id="session-1", tool_call_id=call_id)

    def blocked_code(self, result):
        """The code of a blocked result; fails when ``result`` is not a refusal."""
        parsed = json.loads(result)
        self.assertEqual(parsed["error"], "crash_recovery_blocked", result)
        return parsed["code"]


# Seconds a worker process may take for one protected call: only a hang gets near.
WORKER_TIMEOUT_SECONDS = 60

# One protected call in a fresh worker process: the hook, then the middleware.
# argv: DATA_DIR BUSY_TIMEOUT [hold] [pause].  One JSON document per stdout line:
#   hold   the tool says {"in_tool": true}, then returns after a line on stdin;
#   pause  the first full verification says {"verifying": true} once it has read
#          the first event, and reads the rest after a line on stdin.
# Last line: {"hook": <the hook's directive>, "result": <the guard's result>}.
ONE_CALL_WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import support
    from crash_recovery.guard import RecoveryGuard
    from crash_recovery.storage import snapshot
    data_dir, busy, words = sys.argv[1], float(sys.argv[2]), sys.argv[3:]

    def say(message):
        print(json.dumps(message), flush=True)

    def tool():
        if "hold" in words:
            say({{"in_tool": True}})
            sys.stdin.readline()
        return '{{"status": "booked"}}'

    real_extend, paused = snapshot.extend_chain, []

    def extend_pausing(chain, rows, *, full=False):
        if not full or paused:
            return real_extend(chain, rows, full=full)
        paused.append(True)

        def rows_with_a_pause():
            remaining = iter(rows)
            first = next(remaining, None)
            if first is not None:
                yield first
            say({{"verifying": True}})
            sys.stdin.readline()
            yield from remaining
        return real_extend(chain, rows_with_a_pause(), full=full)

    if "pause" in words:
        snapshot.extend_chain = extend_pausing
    guard = RecoveryGuard(data_dir, busy_timeout=busy)
    hook = guard.pre_tool_call(tool_name="book_trip", args={{"n": os.getpid()}},
                               session_id="s", tool_call_id="c")
    result = guard.tool_execution(tool_name="book_trip", args={{"n": os.getpid()}},
                                  next_call=tool, session_id="s", tool_call_id="c")
    say({{"hook": hook, "result": result}})
""").format(tests=TESTS)


def one_call_in_a_fresh_worker(case, busy_timeout=5):
    """``{"hook": ..., "result": ...}`` of one protected call by
    :data:`ONE_CALL_WORKER` in a new process on ``case.data_dir``; anything
    else fails the test, quoting what the worker printed."""
    completed = subprocess.run([sys.executable, "-c", ONE_CALL_WORKER, case.data_dir,
                                str(busy_timeout)], capture_output=True, text=True,
                               timeout=WORKER_TIMEOUT_SECONDS)
    try:
        return json.loads(completed.stdout)
    except ValueError:
        case.fail(f"expected one JSON line from the worker, received {completed.stdout!r} "
                  f"(exit status {completed.returncode}); its stderr:\n{completed.stderr}")


def start_worker(case, script, *argv):
    """Start ``python -c script argv...`` with stdin and stdout as pipes and
    stderr in a file under ``case.root`` (quoted by :func:`next_message`);
    killed and reaped when the test ends.  Returns the ``Popen``."""
    descriptor, errors_path = tempfile.mkstemp(prefix="worker-", suffix=".stderr", dir=case.root)
    with os.fdopen(descriptor, "w") as errors:
        process = subprocess.Popen([sys.executable, "-c", script, *map(str, argv)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                   text=True)
    process.errors_path = errors_path
    case.addCleanup(stop_process, process)
    return process


def stop_process(process):
    """Kill and reap a process started with pipes, and close its pipes."""
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def tell(process, line="go"):
    """Write one line to a worker started by :func:`start_worker`."""
    process.stdin.write(line + "\n")
    process.stdin.flush()


def next_message(case, process):
    """The next JSON line a worker from :func:`start_worker` prints.  Anything
    else (a traceback, the end of its output) fails the test, quoting what the
    worker printed and its stderr."""
    line = process.stdout.readline()
    try:
        return json.loads(line)
    except ValueError:
        if not line:
            process.wait()
        with open(process.errors_path) as stream:
            errors = stream.read()
        case.fail(f"expected one JSON line from the worker, received {line!r} "
                  f"(exit status {process.poll()}); its stderr:\n{errors}")
