"""The gate: which calls are protected, and why a call is refused
(docs/guard.md §Settings, §Concurrency, §Blocked result, §Inspection tools).

:class:`Gate` is the part of :class:`guard.RecoveryGuard` that decides and
explains, without running anything: it reads the settings (once, failing
closed), opens the journal and the owner lock at first use, turns an open
operation or an integrity verdict into the refusal a model can relay --
``nested_call`` when the caller is inside the running call, ``operation_in_flight``
for a sibling, ``unresolved_operations`` when a person must settle an unknown
outcome -- logs WARNINGs at most once per operation and minute, and answers the
model's two read-only inspection tools.  It also keeps the guard's state
across ``fork``.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence, Union

from ..reports.messages import (blocked_result, command_line, in_flight_explanation,
                                integrity_explanation, operation_view, standalone_prefix,
                                unresolved_explanation)
from ..reports.status import GATE_CLOSED, status_report
from ..storage import forksafe
from ..storage.errors import AdmissionRefused, JournalError, JournalUnavailable
from ..storage.owner import OWNER_RUNNING, OwnerLock
from .binding import Admission, live_admission, same_call
from .settings import KNOWN_KEYS, Settings, parse_settings

# The guard's logger ("crash_recovery.guard", "hermes_plugins.crash_recovery.guard" inside
# Hermes): every WARNING an operator alerts on comes from one name.
logger = logging.getLogger(__name__.rsplit(".", 2)[0] + ".guard")

# Refusals are logged at most once per operation (or code) in this many seconds.
REFUSAL_LOG_INTERVAL_SECONDS = 60.0


class Refusal(Exception):
    """A refusal (inside the guard only): its code, the explanation a model
    relays, and the operation views it names."""

    def __init__(self, code: str, explanation: str, operations: Sequence[dict] = ()):
        super().__init__(code)
        self.code = code
        self.explanation = explanation
        self.operations = list(operations)


PathSource = Union[str, Callable[[], Any]]


class Gate:
    """Settings, the journal at first use, refusals and inspection for one
    profile; the base of :class:`guard.RecoveryGuard` (its docstring lists the
    constructor's arguments).  Methods here never run a tool and never raise
    ``Exception`` from a public entry point.

    ``journal_class`` is the journal it opens (``journal.Journal``, set by
    the subclass): the admission side sits below the top-level journal and
    never imports it."""

    journal_class: Callable[..., Any]

    def __init__(self, data_dir: PathSource, *, settings: Any = None,
                 command_prefix: Optional[Callable[[], Sequence[str]]] = None,
                 **library_settings: Any):
        unknown = sorted(set(library_settings) - set(KNOWN_KEYS))
        if unknown:
            raise TypeError(f"unknown settings {unknown}; known: {KNOWN_KEYS}")
        self._data_dir_source = data_dir
        self._settings_source = settings
        self._library_settings = library_settings
        self._command_prefix_source = command_prefix
        self._settings: Optional[Settings] = None
        self._journal: Any = None  # a journal_class instance, opened at first use
        self._owner: Optional[OwnerLock] = None
        self._current: Optional[Admission] = None  # the call in flight in this process
        self._forked_during: Optional[str] = None  # in a forked child: the parent's call
        self._logged: dict = {}  # what was logged when (see _warn_once)
        self.poisoned: Optional[str] = None  # why this instance refuses everything
        self._reset_locks()
        forksafe.register(self)

    def _reset_locks(self) -> None:
        self._setup_lock = threading.Lock()
        # One protected call at a time in this process; the owner lock and the
        # journal's pending state extend that to the whole profile.
        self._in_flight = threading.Lock()

    def _after_fork_in_child(self) -> None:
        """A child forked during a call is not that call: its copy of the
        binding ends, and it starts with fresh locks (the parent's may be held)."""
        if self._current is not None:
            self._current.active = False
            self._forked_during = self._current.operation_id
        self._current = None
        self._reset_locks()

    def settings(self) -> Settings:
        """The parsed settings (read once, at first use; never raises)."""
        if self._settings is None:
            with self._setup_lock:
                if self._settings is None:
                    self._settings = self._read_settings()
        return self._settings

    def _read_settings(self) -> Settings:
        source = self._settings_source
        if isinstance(source, Settings) and not self._library_settings:
            return source
        try:
            raw = source() if callable(source) else source
        except Exception as exc:  # a broken config loader must not open the gate
            parsed = parse_settings(f"<unreadable: {type(exc).__name__}: {exc}>")
        else:
            if self._library_settings and (raw is None or isinstance(raw, dict)):
                raw = {**(raw or {}), **self._library_settings}
            parsed = parse_settings(raw)
        if parsed.problem:
            logger.warning("crash-recovery: settings problem, every tool but the inspection "
                           "tools is protected until it is fixed: %s", parsed.problem)
        return parsed

    def is_protected(self, tool_name: Any) -> bool:
        """Whether calls of ``tool_name`` are journaled and gated (never raises)."""
        try:
            return self.settings().is_protected(tool_name)
        except Exception:
            return True

    def _open(self) -> tuple:
        """(journal, owner lock), created at first use.  Raises JournalError."""
        if self._journal is None:
            settings = self.settings()
            with self._setup_lock:
                if self._journal is None:
                    source = self._data_dir_source
                    try:
                        directory = str(source() if callable(source) else source)
                    except Exception as exc:
                        raise JournalUnavailable(
                            "storage_unavailable",
                            f"the data directory could not be resolved ({type(exc).__name__}: "
                            f"{exc})") from None
                    self._owner = OwnerLock(directory)
                    self._journal = self.journal_class(
                        directory, busy_timeout=settings.busy_timeout,
                        full_verification=settings.full_verification,
                        full_verification_interval=settings.full_verification_interval)
        return self._journal, self._owner

    def _prefix(self) -> Optional[tuple]:
        """The words that run the operator commands, or None when unknown."""
        try:
            if self._command_prefix_source is not None:
                return tuple(self._command_prefix_source())
            journal = self._journal
            return standalone_prefix(journal.data_dir) if journal is not None else None
        except Exception:
            return None

    def _refusal_from(self, error: JournalError) -> Refusal:
        if error.code == "unresolved_operations":
            return self._open_operations_refusal(error.details["operations"], None)
        return Refusal(error.code, integrity_explanation(error, self._prefix()))

    def _open_operations_refusal(self, operations: Sequence[Any], identity: Optional[tuple],
                                 tool_name: str = "this tool") -> Refusal:
        """The refusal for open operations: ``nested_call`` when the caller's own
        parent call is the one running, ``operation_in_flight`` when another
        live call runs (wait), else ``unresolved_operations`` (a person must
        settle an unknown outcome)."""
        journal = self._journal
        views = [operation_view(operation, journal.data_dir) for operation in operations]
        current = self._current
        running = [view for view in views if view["state"] == "pending" and (
            view["owner"] == OWNER_RUNNING
            or (current is not None and view["operation_id"] == current.operation_id))]
        if running and len(running) == len(views):
            # Nested: this context is inside the running call (its admission is
            # visible, e.g. Hermes' execute_code bridge thread copies the
            # context), or this process was forked during it.  Siblings run in
            # fresh contexts: they wait.
            binding = live_admission()
            nested = (running[0]["operation_id"] == self._forked_during
                      or (binding is not None
                          and running[0]["operation_id"] == binding.operation_id))
            code = "nested_call" if nested else "operation_in_flight"
            return Refusal(code, in_flight_explanation(tool_name, running, nested=nested),
                            running)
        unknown = [view for view in views if view not in running]
        for view in unknown:  # e.g. found pending after a restart: once per process
            self._warn_once(f"unknown:{view['operation_id']}", None, "crash-recovery: operation "
                            "%s (%s) is %s: its outcome is unknown, and protected calls are "
                            "refused until a person settles it (see: %s)", view["operation_id"],
                            view["tool"], view["state"],
                            command_line(self._prefix() or (), "show",
                                                view["operation_id"]))
        return Refusal("unresolved_operations",
                        unresolved_explanation(unknown, self._prefix()), unknown)

    def _check_gate(self, journal: Any, identity: Optional[tuple] = None) -> None:
        """Verify the journal; raise :class:`Refusal` if it fails or any
        operation is open.  With ``identity``, the operation this context has
        admitted for exactly that call is not counted (the hook's binding)."""
        try:
            open_operations = journal.unresolved()
        except JournalError as exc:
            raise self._refusal_from(exc) from None
        binding = live_admission()
        if identity is not None and binding is not None and same_call(binding.identity, identity):
            open_operations = tuple(operation for operation in open_operations
                                    if operation.operation_id != binding.operation_id)
        if open_operations:
            raise self._open_operations_refusal(open_operations, identity,
                                                identity[0] if identity else "this tool")

    def _blocked(self, refusal: Refusal) -> str:
        self._warn_once(f"refused:{refusal.code}:{','.join(op['operation_id'] for op in refusal.operations)}",
                        REFUSAL_LOG_INTERVAL_SECONDS, "crash-recovery: refused a protected call "
                        "(%s): %s", refusal.code, refusal.explanation)
        return blocked_result(refusal.code, refusal.explanation, prefix=self._prefix(),
                                     operations=refusal.operations)

    def _warn_once(self, key: str, interval: Optional[float], message: str, *args: Any) -> None:
        """Log a WARNING unless ``key`` was logged less than ``interval`` seconds
        ago (``0``/None: once per process)."""
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and (not interval or now - last < interval):
            return
        self._logged[key] = now
        logger.warning(message, *args)

    def close(self) -> None:
        """Close the journal connection (idempotent); the next call reopens it."""
        journal = self._journal
        if journal is not None:
            journal.close()

    def status_report(self) -> dict:
        """``crash_recovery_status`` (docs/guard.md §Inspection tools): verified
        integrity, the gate, unresolved operations with owner and age, late
        outcomes needing attention, the settings."""
        settings = self.settings()
        try:
            journal, _ = self._open()
        except JournalError as exc:
            return {"ok": False, "integrity": exc.code, "gate": GATE_CLOSED,
                    "error": exc.to_json(), "unresolved": [], "settings": settings.to_json()}
        result = status_report(journal, journal.data_dir)
        result["settings"] = settings.to_json()
        if self.poisoned:
            result.update(ok=False, gate=GATE_CLOSED, poisoned=self.poisoned)
        return result

    def verify_report(self, checkpoint: Any = None) -> dict:
        """``crash_recovery_verify`` (docs/guard.md §Inspection tools): a full
        verification, optionally against an external ancestor ``checkpoint``."""
        try:
            journal, _ = self._open()
            # A fresh read-only connection: the worker's own connection may keep
            # pages cached that were edited on disk behind SQLite's back.
            with self.journal_class(journal.data_dir, readonly=True) as fresh:
                status = fresh.verify(checkpoint)
        except AdmissionRefused as exc:  # a malformed checkpoint; the journal verified
            return {"ok": False, "integrity": "ok", "error": exc.to_json()}
        except JournalError as exc:
            return {"ok": False, "integrity": exc.code, "error": exc.to_json()}
        return {"ok": True, "integrity": "ok", "checkpoint": status.checkpoint,
                "unresolved_count": len(status.unresolved),
                "external_checkpoint": "ancestor" if checkpoint is not None else None}

    def status_tool(self, args: Any = None, **kwargs: Any) -> str:
        """Handler of ``crash_recovery_status``: JSON text; never raises."""
        try:
            return json.dumps(self.status_report(), sort_keys=True, default=str)
        except Exception as exc:
            return json.dumps({"ok": False, "error": {"code": "internal_error",
                                                      "message": type(exc).__name__}})

    def verify_tool(self, args: Any = None, **kwargs: Any) -> str:
        """Handler of ``crash_recovery_verify``: ``{}`` or ``{"checkpoint": {...}}``."""
        try:
            checkpoint = args.get("checkpoint") if isinstance(args, dict) else None
            return json.dumps(self.verify_report(checkpoint), sort_keys=True, default=str)
        except Exception as exc:
            return json.dumps({"ok": False, "error": {"code": "internal_error",
                                                      "message": type(exc).__name__}})
