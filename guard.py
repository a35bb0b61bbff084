"""RecoveryGuard: the execution contract around one protected call (docs/guard.md).

One call, as the ``tool_execution`` middleware sees it::

    not protected (settings)? --------------------------------> next_call()
    the same call re-entered (host identity, this context)? ---> next_call()
    refuse: bad arguments, poisoned guard, nested call, a call already in
            flight, journal failure, any unresolved operation -> blocked JSON
    owner lock, then journal.admit  (durable ``started``)
    bind the admission in a ContextVar
    next_call()  -- exactly once
       raises Exception      -> ``uncertain``/exception, re-raise
       raises BaseException  -> ``uncertain``/cancelled, re-raise
       the guard refused its own inner entry -> ``returned``/not_run
       error-shaped response -> ``uncertain``/error_response, return it
       normal response       -> ``returned``, return it
    force-resolved meanwhile -> ``late_outcome``, return the response
    recording failed after downstream ran -> poison this guard,
                                             return ``crash_recovery_record_failed``
    finally: reset the binding, release the owner lock

The middleware never raises before ``next_call``: Hermes skips a middleware that
raises and runs the tool unrecorded (fail open).  The ``pre_tool_call`` hook is
an earlier, read-only gate with the same verdicts; it never raises either.
Operators hear about trouble through ``logging`` (WARNING): an operation that
became uncertain, one found pending, refusals (at most one line per operation
and minute), late outcomes.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence, Union

from . import forksafe, report
from .binding import ADMISSION, Admission, live_admission, same_call
from .classify import is_error_response
from .durable import reach_boundary
from .errors import AdmissionRefused, EncodingError, JournalError, JournalUnavailable
from .journal import NO_RESPONSE_HASH, Journal
from .owner import OWNER_RUNNING, OwnerLock, probe_lock
from .record import fingerprint, value_hash
from .settings import KNOWN_KEYS, Settings, parse_settings

logger = logging.getLogger(__name__)

# Refusals are logged at most once per operation (or code) in this many seconds.
REFUSAL_LOG_INTERVAL_SECONDS = 60.0


class _Refusal(Exception):
    """Internal: a refusal with its code, explanation and operations."""

    def __init__(self, code: str, explanation: str, operations: Sequence[dict] = ()):
        super().__init__(code)
        self.code = code
        self.explanation = explanation
        self.operations = list(operations)


PathSource = Union[str, Callable[[], Any]]


class RecoveryGuard:
    """Admission, one downstream call, classification, uncertainty (docs/guard.md).

    ``data_dir``: a path, or a zero-argument callable returning one, resolved at
    first use (registration must not touch the disk).
    ``settings``: the raw ``settings`` mapping of docs/guard.md §Settings, a
    :class:`settings.Settings`, or a zero-argument callable returning the
    mapping (read at first use; an exception is a settings problem).
    ``command_prefix``: a zero-argument callable returning the words that run
    the operator commands (:func:`report.hermes_prefix` inside Hermes); default
    the stand-alone ``operator_cli.py --data-dir DIR``.
    Keyword arguments named like settings (``read_only_tools``,
    ``protected_tools``, ``busy_timeout``, ``full_verification``, ...) override
    ``settings`` (library use).

    Public entry points never raise ``Exception`` before downstream runs.
    """

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
        self._journal: Optional[Journal] = None
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

    # ------------------------------------------------------------ settings --

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
                    self._journal = Journal(
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
            return report.standalone_prefix(journal.data_dir) if journal is not None else None
        except Exception:
            return None

    # ------------------------------------------------------------ identity --

    @staticmethod
    def _identity(tool_name: Any, args: Any, session_id: Any, tool_call_id: Any) -> tuple:
        """``(tool_name, session_id, tool_call_id, args_hash)`` and the
        fingerprint; raises :class:`_Refusal` for arguments we cannot hash."""
        if not isinstance(tool_name, str) or not tool_name:
            raise _Refusal("invalid_request", "The tool name is missing or not text; nothing was run.")
        if not isinstance(args, dict):
            raise _Refusal("invalid_arguments",
                           f"The arguments of {tool_name} are a {type(args).__name__}, not a JSON "
                           "object, so the call cannot be journaled; nothing was run.")
        for name, value in (("session_id", session_id), ("tool_call_id", tool_call_id)):
            if value is not None and not isinstance(value, str):
                raise _Refusal("invalid_request", f"{name} is not text; nothing was run.")
        try:
            args_hash = value_hash(args)
            call_fingerprint = fingerprint(tool_name, args)
            for value in (tool_name, session_id, tool_call_id):
                if value is not None:
                    value.encode("utf-8")
        except (EncodingError, UnicodeEncodeError) as exc:
            message = exc.message if isinstance(exc, JournalError) else "text is not valid UTF-8"
            raise _Refusal("non_canonical_arguments",
                           f"The call to {tool_name} cannot be journaled: {message} (NaN, "
                           "infinity, bytes, sets, non-text keys and lone surrogates have no "
                           "canonical JSON form). Nothing was run; send plain JSON values.") from None
        return (tool_name, session_id, tool_call_id, args_hash), call_fingerprint

    # ---------------------------------------------------------- refusals --

    def _refusal_from(self, error: JournalError) -> _Refusal:
        if error.code == "unresolved_operations":
            return self._open_operations_refusal(error.details["operations"], None)
        return _Refusal(error.code, report.integrity_explanation(error, self._prefix()))

    def _open_operations_refusal(self, operations: Sequence[Any], identity: Optional[tuple],
                                 tool_name: str = "this tool") -> _Refusal:
        """The refusal for open operations: ``nested_call`` when the caller's own
        parent call is the one running, ``operation_in_flight`` when another
        live call runs (wait), else ``unresolved_operations`` (a person must
        settle an unknown outcome)."""
        journal = self._journal
        views = [report.operation_view(operation, journal.data_dir) for operation in operations]
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
            return _Refusal(code, report.in_flight_explanation(tool_name, running, nested=nested),
                            running)
        unknown = [view for view in views if view not in running]
        for view in unknown:  # e.g. found pending after a restart: once per process
            self._warn_once(f"unknown:{view['operation_id']}", None, "crash-recovery: operation "
                            "%s (%s) is %s: its outcome is unknown, and protected calls are "
                            "refused until a person settles it (see: %s)", view["operation_id"],
                            view["tool"], view["state"],
                            report.command_line(self._prefix() or (), "show",
                                                view["operation_id"]))
        return _Refusal("unresolved_operations",
                        report.unresolved_explanation(unknown, self._prefix()), unknown)

    def _check_gate(self, journal: Journal, identity: Optional[tuple] = None) -> None:
        """Verify the journal; raise :class:`_Refusal` if it fails or any
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

    def _blocked(self, refusal: _Refusal) -> str:
        self._warn_once(f"refused:{refusal.code}:{','.join(op['operation_id'] for op in refusal.operations)}",
                        REFUSAL_LOG_INTERVAL_SECONDS, "crash-recovery: refused a protected call "
                        "(%s): %s", refusal.code, refusal.explanation)
        return report.blocked_result(refusal.code, refusal.explanation, prefix=self._prefix(),
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

    # ------------------------------------------------------------ the hook --

    def pre_tool_call(self, tool_name: Any = None, args: Any = None, session_id: Any = None,
                      tool_call_id: Any = None, **kwargs: Any) -> Optional[dict]:
        """``pre_tool_call`` hook (docs/guard.md §Inside Hermes): None to allow, or
        ``{"action": "block", "message": <blocked JSON>}``.  Read-only; never
        raises ``Exception`` (Hermes 0.19 runs the tool when a hook raises)."""
        try:
            if not self.is_protected(tool_name):
                return None
            identity, _ = self._identity(tool_name, args, session_id, tool_call_id)
            if self.poisoned:
                raise _Refusal("guard_poisoned", self.poisoned)
            journal, _ = self._open()
            self._check_gate(journal, identity)
            return None
        except _Refusal as refusal:
            return {"action": "block", "message": self._blocked(refusal)}
        except JournalError as exc:
            return {"action": "block", "message": self._blocked(self._refusal_from(exc))}
        except Exception as exc:  # fail closed on our own bugs too
            logger.exception("crash-recovery: pre_tool_call failed")
            return {"action": "block", "message": self._blocked(_Refusal(
                "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}); "
                "nothing was run. Do not retry; tell the user an operator must check it."))}

    # ------------------------------------------------------ the middleware --

    def tool_execution(self, tool_name: Any = None, args: Any = None, next_call: Any = None,
                       session_id: Any = None, tool_call_id: Any = None, **kwargs: Any) -> Any:
        """``tool_execution`` middleware (docs/guard.md §Execution contract).
        Returns downstream's result, a blocked JSON string, or the record-failed
        JSON string.  Downstream exceptions propagate unchanged after an
        ``uncertain`` record."""
        if not callable(next_call):
            return self._blocked(_Refusal("invalid_request",
                                          "The host passed no next_call; nothing was run."))
        if not self.is_protected(tool_name):
            return next_call()
        binding = live_admission()
        try:
            identity, call_fingerprint = self._identity(tool_name, args, session_id, tool_call_id)
            if binding is not None and not same_call(binding.identity, identity):
                raise _Refusal("nested_call",
                               f"A protected call ({tool_name}) was made from inside another "
                               f"protected call that is still running (operation "
                               f"{binding.operation_id}); protected calls cannot be nested, so "
                               f"{tool_name} was refused and not run.")
        except _Refusal as refusal:
            blocked = self._blocked(refusal)
            if binding is not None:
                binding.inner_refusal = blocked  # the outer call learns that nothing ran
            return blocked
        except Exception as exc:
            logger.exception("crash-recovery: identity check failed")
            return self._blocked(_Refusal("internal_error", f"The crash-recovery guard failed "
                                          f"({type(exc).__name__}); nothing was run."))
        if binding is not None:
            return next_call()  # re-entry: the host nested this middleware for one call
        result = self._run_protected(identity, call_fingerprint, next_call)
        self._maybe_archive()
        return result

    def _maybe_archive(self) -> None:
        """``archive_after_events``: seal the live segment once it is that long
        and nothing is open or running (never raises)."""
        try:
            limit, journal = self.settings().archive_after_events, self._journal
            if not limit or journal is None or self.poisoned:
                return
            status = journal.status()
            if (status.checkpoint["count"] < limit or status.unresolved or status.attention
                    or probe_lock(journal.data_dir) is not None):
                return
            sealed = journal.archive()
            logger.info("crash-recovery: archived %d events into %s (archive_after_events)",
                        sealed["archived"]["count"], sealed["archived"]["file"])
        except Exception as exc:
            logger.warning("crash-recovery: automatic archive skipped (%s)",
                           exc.code if isinstance(exc, JournalError) else type(exc).__name__)

    def _run_protected(self, identity: tuple, call_fingerprint: str, next_call: Callable) -> Any:
        tool_name = identity[0]
        if not self._in_flight.acquire(blocking=False):
            # No admission is visible here (a nested entry was answered in
            # tool_execution), so this is a sibling call of another context: wait.
            current = self._current
            running = [current.view()] if current is not None else []
            return self._blocked(_Refusal(
                "operation_in_flight",
                report.in_flight_explanation(tool_name, running, nested=False), running))
        admission: Optional[Admission] = None
        token = None
        # One finally for everything from here on: an interrupt at any point
        # (even between admit() and the binding) resets the binding and
        # releases both locks.
        try:
            try:
                journal, operation_id = self._admit(identity, call_fingerprint)
            except _Refusal as refusal:
                return self._blocked(refusal)
            except Exception as exc:
                logger.exception("crash-recovery: admission failed")
                return self._blocked(_Refusal(
                    "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}). "
                    "The call was NOT run; if the journal shows it as pending, its start was "
                    "recorded before the failure: settle it as not_applied."))
            admission = self._current = Admission(operation_id, identity, time.time_ns())
            token = ADMISSION.set(admission)
            return self._call_downstream(journal, admission, tool_name, next_call)
        finally:
            self._end_call(admission, token)

    def _end_call(self, admission: Optional[Admission], token: Any) -> None:
        """Unbind and release, each step in its own ``finally``: an interrupt
        arriving meanwhile never leaves a lock held."""
        try:
            try:
                if admission is not None:
                    admission.active = False
            finally:
                if token is not None:
                    ADMISSION.reset(token)
        finally:
            try:
                self._current = None
                if self._owner is not None:
                    self._owner.release()
            finally:
                self._in_flight.release()

    def _admit(self, identity: tuple, call_fingerprint: str) -> tuple:
        """Gate, owner lock, durable ``started``: ``(journal, operation_id)``.
        Raises :class:`_Refusal`.  The caller releases the owner lock."""
        tool_name, session_id, tool_call_id, args_hash = identity
        if self.poisoned:
            raise _Refusal("guard_poisoned", self.poisoned)
        try:
            journal, owner = self._open()
        except JournalError as exc:  # e.g. the data directory cannot be resolved
            raise self._refusal_from(exc) from None
        operation_id = str(uuid.uuid4())
        # Checked before the owner lock is touched: a refusal changes no file,
        # and a killed worker's tag in owner.lock stays as the operator's
        # evidence.  admit() below checks again under the writer lock.
        self._check_gate(journal, identity)
        try:
            if not owner.acquire(operation_id):
                holder = probe_lock(journal.data_dir) or {}
                raise _Refusal(
                    "operation_in_flight",
                    f"Another process (pid {holder.get('pid')}) is running a protected call in "
                    f"this profile, so {tool_name} was refused and not run. Wait for it to "
                    "finish; do not retry automatically in a loop.")
        except OSError as exc:
            raise _Refusal("storage_unavailable",
                           f"The owner lock cannot be used ({exc.strerror or exc}); nothing was "
                           "run.") from None
        try:
            journal.admit(operation_id=operation_id, tool=tool_name, args_hash=args_hash,
                          fingerprint=call_fingerprint, session_id=session_id,
                          tool_call_id=tool_call_id)
        except JournalError as exc:
            if exc.code == "commit_failed":
                logger.warning("crash-recovery: the started event of operation %s (%s) may or "
                               "may not be durable; the tool was NOT run. If it shows as pending, "
                               "settle it as not_applied", operation_id, tool_name)
            raise self._refusal_from(exc) from None
        return journal, operation_id

    def _call_downstream(self, journal: Journal, admission: Admission, tool_name: str,
                         next_call: Callable) -> Any:
        operation_id = admission.operation_id
        try:
            result = next_call()
        except Exception:
            self._record(journal, operation_id, tool_name, uncertain=True,
                         result_hash=NO_RESPONSE_HASH, reason="exception")
            raise
        except BaseException:
            self._record(journal, operation_id, tool_name, uncertain=True,
                         result_hash=NO_RESPONSE_HASH, reason="cancelled")
            raise
        reach_boundary("downstream_returned", "started")
        try:
            result_hash = value_hash(result)
            if admission.inner_refusal is not None and result == admission.inner_refusal:
                uncertain, reason = False, "not_run"  # this guard refused the call itself
            else:
                uncertain = is_error_response(result)
                reason = "error_response" if uncertain else "returned"
        except Exception:
            # A response with no canonical form (or one whose own methods raise)
            # is not a normal response.
            result_hash, uncertain, reason = NO_RESPONSE_HASH, True, "error_response"
        failure = self._record(journal, operation_id, tool_name, uncertain=uncertain,
                               result_hash=result_hash, reason=reason)
        return result if failure is None else failure

    def _record(self, journal: Journal, operation_id: str, tool_name: str, *, uncertain: bool,
                result_hash: str, reason: str) -> Optional[str]:
        """Append the outcome (a late outcome if an operator resolved the
        operation meanwhile); on failure poison the guard and return the
        record-failed JSON (docs/guard.md §Execution contract).  Never raises
        ``Exception``."""
        try:
            try:
                journal.record_outcome(operation_id, uncertain=uncertain,
                                       result_hash=result_hash, reason=reason)
            except AdmissionRefused as exc:
                if not (exc.code == "operation_not_pending" and exc.details.get("resolved")):
                    raise
                journal.record_late_outcome(operation_id, result_hash=result_hash,
                                            reason="returned" if reason == "not_run" else reason)
                logger.warning("crash-recovery: operation %s (%s) returned (%s) after an operator "
                               "had resolved it; the late outcome is recorded and needs an "
                               "operator's acknowledgement (see: %s)", operation_id, tool_name,
                               reason, report.command_line(self._prefix() or (), "show",
                                                           operation_id))
                return None
            if uncertain:
                self._logged[f"unknown:{operation_id}"] = time.monotonic()  # said here already
                logger.warning("crash-recovery: operation %s (%s) is uncertain (%s): protected "
                               "calls are refused until a person settles it (see: %s)",
                               operation_id, tool_name, reason,
                               report.command_line(self._prefix() or (), "show", operation_id))
            return None
        except Exception as exc:
            code = exc.code if isinstance(exc, JournalError) else type(exc).__name__
            self.poisoned = (f"Recording the outcome of operation {operation_id} ({tool_name}) "
                             f"failed ({code}) after the tool ran. Its outcome is unknown; this "
                             "process refuses all protected calls until it restarts and an "
                             "operator settles the operation.")
            logger.error("crash-recovery: %s", self.poisoned)
            return json.dumps({"error": report.RECORD_FAILED_ERROR, "outcome_unknown": True,
                               "operation_id": operation_id, "tool": tool_name, "code": code,
                               "explanation": self.poisoned}, sort_keys=True)

    def close(self) -> None:
        """Close the journal connection (idempotent); the next call reopens it."""
        journal = self._journal
        if journal is not None:
            journal.close()

    # ----------------------------------------------------- inspection tools --

    def status_report(self) -> dict:
        """``crash_recovery_status`` (docs/guard.md §Inspection tools): verified
        integrity, the gate, unresolved operations with owner and age, late
        outcomes needing attention, the settings."""
        settings = self.settings()
        try:
            journal, _ = self._open()
        except JournalError as exc:
            return {"ok": False, "integrity": exc.code, "gate": report.GATE_CLOSED,
                    "error": exc.to_json(), "unresolved": [], "settings": settings.to_json()}
        result = report.status_report(journal, journal.data_dir)
        result["settings"] = settings.to_json()
        if self.poisoned:
            result.update(ok=False, gate=report.GATE_CLOSED, poisoned=self.poisoned)
        return result

    def verify_report(self, checkpoint: Any = None) -> dict:
        """``crash_recovery_verify`` (docs/guard.md §Inspection tools): a full
        verification, optionally against an external ancestor ``checkpoint``."""
        try:
            journal, _ = self._open()
            # A fresh read-only connection: the worker's own connection may keep
            # pages cached that were edited on disk behind SQLite's back.
            with Journal(journal.data_dir, readonly=True) as fresh:
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
