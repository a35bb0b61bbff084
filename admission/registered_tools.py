"""What a worker found at its first call, kept for the operator surfaces
(docs/guard.md §Settings, docs/cli.md §status).

Only a running agent knows every tool (MCP too), so its first call writes
``registered_tools.json``: the host's tool names and the enforced settings.
Evidence only: no hash covers it, no call depends on it, unreadable is absent.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Callable, Optional

from ..reports.messages import iso_utc
from ..storage.durable import (TEMP_SUFFIX, make_durable_directories, process_alive,
                               read_regular_file, remove_files_of_dead_processes,
                               write_atomically)
from ..storage.errors import JournalError
from ..storage.call_lock import process_start_ticks, process_start_time
from ..storage.log_lines import plugin_logger
from ..storage.record import canonical_text
from .settings import Settings, settings_view, tool_names_view, with_attention

logger = plugin_logger(__name__.rsplit(".", 2)[0] + ".guard")

RECORD_NAME = "registered_tools.json"
# A host registers a few hundred tools: anything larger is not our record.
MAX_RECORD_BYTES = 1 << 20
MAX_NAMES = 10000
MAX_NAME_CHARS = 256
# A write's temporary file (durable.temp_path_for), removed once its writer died.
_LEFTOVER_TEMP = re.compile(re.escape(RECORD_NAME) + r"\.(\d+)-[0-9a-f]+" + re.escape(TEMP_SUFFIX))


def record_first_call(data_dir: Any, registered: Optional[Callable[[], Any]],
                      settings: Settings) -> None:
    """Write ``{"tool_names" (sorted), "settings" (view), "recorded_at" (ISO
    UTC), "recorded_ns", "pid", "process_start", "process_start_ticks"}``
    into ``data_dir`` (or ``data_dir()``), unless ``registered()`` knows no
    names.  Never raises (a failure is logged at DEBUG)."""
    try:
        names = registered() if registered is not None else None
        names = sorted({name for name in names or () if isinstance(name, str)
                        and 0 < len(name) <= MAX_NAME_CHARS})[:MAX_NAMES]
        if not names:
            return
        directory = str(data_dir() if callable(data_dir) else data_dir)
        view = with_attention({**settings.to_json(), **tool_names_view(settings, lambda: names)})
        now_ns = time.time_ns()
        content = canonical_text({"tool_names": names, "settings": view,
                                  "recorded_at": iso_utc(now_ns), "recorded_ns": now_ns,
                                  "pid": os.getpid(), "process_start": process_start_time(),
                                  "process_start_ticks": process_start_ticks(os.getpid())}) + "\n"
        make_durable_directories(directory)
        remove_files_of_dead_processes(directory, _LEFTOVER_TEMP)  # a crash mid-write
        write_atomically(os.path.join(directory, RECORD_NAME), content.encode("utf-8"))
    except (Exception, JournalError):  # evidence for people: never in a call's way
        logger.debug("crash-recovery: the registered tools were not recorded", exc_info=True)


def read_record(data_dir: str) -> Optional[dict]:
    """The last :func:`record_first_call` record (``settings``: dict or None),
    or None when absent, unreadable or malformed."""
    try:
        raw = read_regular_file(os.path.join(data_dir, RECORD_NAME), MAX_RECORD_BYTES)
        if len(raw) > MAX_RECORD_BYTES:
            return None
        record = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    names = record.get("tool_names")
    if not isinstance(names, list) or not names or not all(
            isinstance(name, str) for name in names):
        return None
    settings = record.get("settings")
    return {"tool_names": names[:MAX_NAMES],
            "settings": settings if isinstance(settings, dict) else None,
            "recorded_at": record.get("recorded_at") if isinstance(
                record.get("recorded_at"), str) else None,
            "pid": record.get("pid") if isinstance(record.get("pid"), int) else None,
            "process_start": record.get("process_start"),
            "process_start_ticks": record.get("process_start_ticks")}


def operator_settings_view(settings: Optional[Callable[[], Any]], data_dir: str,
                           own_names: Optional[Callable[[], Any]] = None) -> Optional[dict]:
    """``status``'s ``settings`` (docs/cli.md §status): ``settings()``'s view
    against ``own_names()`` and the recorded names (``tool_list`` ``host`` or
    ``recorded``, ``tool_list_recorded_at``); without ``settings``, the
    recorded view with ``recorded_at``, ``recorded_by_pid``, or None.  Never raises."""
    record = read_record(data_dir)
    if settings is None:
        if record is None or record["settings"] is None:
            return None
        return {**record["settings"], "recorded_at": record["recorded_at"],
                "recorded_by_pid": record["pid"]}
    own: list = []

    def names() -> Optional[list]:
        try:
            own[:] = [name for name in (own_names() if own_names else None) or ()
                      if isinstance(name, str)]
        except Exception:  # the registry could not be read: the record may still know
            own[:] = []
        return own + (record["tool_names"] if record else []) or None

    view = settings_view(settings, names, partial=record is None)
    if view.get("tool_list") == "host" and not own:
        view["tool_list"] = "recorded"
    view["tool_list_recorded_at"] = record["recorded_at"] if record else None
    return view


# Seconds a start time (boot time + ticks) may drift with a stepped wall clock; a
# later boot's process with the same pid and ticks differs by far more.
_START_TIME_DRIFT_SECONDS = 300


def _same_process(record: dict) -> bool:
    """Whether the record's pid is still its writer: the same start ticks and
    about the same start time (without ticks: exactly the same start time)."""
    recorded, now = record["process_start"], process_start_time(record["pid"])
    ticks = record["process_start_ticks"]
    if not isinstance(ticks, int):
        return recorded in (None, now)
    return (process_start_ticks(record["pid"]) == ticks and isinstance(recorded, (int, float))
            and now is not None and abs(recorded - now) <= _START_TIME_DRIFT_SECONDS)


def workers_running(document: dict, data_dir: str) -> list:
    """``[{"pid", "known_as"}]``, each pid once: the live workers a ``status``
    document and the record show, ``known_as`` ``running_call``,
    ``resolved_call``, ``owner``, ``journal_open`` (named by its error, e.g.
    ``wal_missing``) or ``recorded_first_call`` (docs/cli.md §status)."""
    found: dict = {}
    candidates = [((document.get("in_flight") or {}).get("pid"), "running_call")]
    candidates += [(pid, "journal_open")
                   for pid in (document.get("error") or {}).get("workers_running") or []]
    candidates += [(entry.get("pid"), "resolved_call")
                   for entry in document.get("resolved_running") or []]
    candidates += [(view.get("owner_pid"), "owner") for view in document.get("unresolved") or []]
    record = read_record(data_dir)
    if record is not None and isinstance(record["pid"], int) and process_alive(record["pid"]) \
            and _same_process(record):
        candidates.append((record["pid"], "recorded_first_call"))
    for pid, known_as in candidates:
        if isinstance(pid, int) and pid > 0 and pid not in found:
            found[pid] = {"pid": pid, "known_as": known_as}
    return list(found.values())
