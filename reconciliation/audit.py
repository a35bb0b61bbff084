"""``operator.log``: one canonical JSON line per operator action, beside the
journal (docs/cli.md §operator.log).  The journal event is the source of
truth; this log is for people and their tools, so a failure to write it is
reported, never raised.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Optional

from ..reports.messages import iso_utc
from ..storage.durable import fsync_directory, open_regular_file
from ..storage.record import canonical_text
from .caller import Caller, os_identity, this_process

OPERATOR_LOG_NAME = "operator.log"
# Enough to re-run a verification on many past repairs, bounded so a huge log
# cannot make `verify` slow.
OPERATOR_LOG_MAX_LINES = 10000
OPERATOR_LOG_MAX_BYTES = 16 * 1024 * 1024


def append_operator_log(data_dir: str, entry: dict) -> Optional[str]:
    """Append one JSON line and fsync; returns an error text instead of raising
    (the journal event is already durable and is the source of truth)."""
    # One action, one line, for any reader: the separators JSON leaves raw
    # (NEL, U+2028, U+2029) break lines for many, so they are escaped too.
    text = canonical_text(entry)
    for separator in ("\x85", "\u2028", "\u2029"):
        text = text.replace(separator, f"\\u{ord(separator):04x}")
    line = (text + "\n").encode("utf-8")
    try:
        descriptor = open_regular_file(os.path.join(data_dir, OPERATOR_LOG_NAME),
                                       os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            size = os.fstat(descriptor).st_size
            if size and os.pread(descriptor, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a torn line (a full disk): this one stands alone
            written = os.write(descriptor, line)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        fsync_directory(data_dir)  # the file's name, when this append created it
    except OSError as exc:
        return f"{OPERATOR_LOG_NAME} not written: {exc.strerror or exc}"
    if written != len(line):
        return (f"{OPERATOR_LOG_NAME} not written completely ({written} of {len(line)} bytes; "
                "is the disk full?)")
    return None


def read_operator_log(data_dir: str) -> list:
    """Past operator actions (dicts), oldest first: the newest
    ``OPERATOR_LOG_MAX_LINES`` of the log's last ``OPERATOR_LOG_MAX_BYTES``;
    a line that is not a JSON object is reported as ``{"unreadable_line": N}``."""
    path = os.path.join(data_dir, OPERATOR_LOG_NAME)
    try:
        lines = _log_tail(path).splitlines()[-OPERATOR_LOG_MAX_LINES:]
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [{"unreadable": str(exc)}]
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line:
            continue  # two appends that both ended a torn line
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        entries.append(entry if isinstance(entry, dict) else {"unreadable_line": number})
    return entries


def _log_tail(path: str) -> bytes:
    """The whole lines in the last ``OPERATOR_LOG_MAX_BYTES`` of the log (its
    newest actions: a restart's line must be found however long the log)."""
    descriptor = open_regular_file(path, os.O_RDONLY)
    try:
        start = max(0, os.fstat(descriptor).st_size - OPERATOR_LOG_MAX_BYTES)
        text = os.pread(descriptor, OPERATOR_LOG_MAX_BYTES, start)
    finally:
        os.close(descriptor)
    return text if start == 0 else text.partition(b"\n")[2]


def command_caller(args: argparse.Namespace) -> Caller:
    """The :class:`caller.Caller` of a command: ``args.caller`` (the
    dashboard's request peer), else this process run from a shell (``cli``)."""
    caller = getattr(args, "caller", None)
    return caller if isinstance(caller, Caller) else this_process()


def acting_operator(args: argparse.Namespace) -> dict:
    """Who acts, as the journal event and ``operator.log`` record it: the
    caller's identity (:meth:`caller.Caller.identity`) plus what the caller
    knows of the person (``args.operator_via``, docs/dashboard.md)."""
    return {**command_caller(args).identity(), **(getattr(args, "operator_via", None) or {})}


def log_action(data_dir: str, action: str, result: dict,
                operator: Optional[dict] = None, **entry: Any) -> None:
    """Append one ``operator.log`` line (docs/cli.md §operator.log); a failure
    is reported in ``result`` (the journal event is the source of truth)."""
    problem = append_operator_log(data_dir, {
        "time": iso_utc(time.time_ns()), "action": action,
        "operator": operator or os_identity(), **entry})
    if problem:
        result["operator_log_error"] = problem
