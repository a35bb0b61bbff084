"""RecoveryGuard: the execution contract of docs/guard.md §Execution contract, inside Hermes.

One protected call, as the ``tool_execution`` middleware sees it::

    exempt tool? ---------------------------------------------> next_call()
    bound re-entry (same context, same tuple)? ----------------> next_call()
    refuse: bad arguments, poisoned guard, nested call, a call already in
            flight, journal failure, any unresolved operation -> blocked JSON
    owner lock, then journal.admit  (durable ``started``)
    bind the admission in a ContextVar
    next_call()  -- exactly once
       raises Exception      -> ``uncertain``/exception, re-raise
       raises BaseException  -> ``uncertain``/cancelled, re-raise
       error-shaped response -> ``uncertain``/error_response, return it
       normal response       -> ``returned``, return it
    recording failed after downstream ran -> poison this guard,
                                             return ``crash_recovery_record_failed``
    finally: reset the binding, release the owner lock

The middleware never raises before ``next_call``: Hermes skips a middleware that
raises and runs the tool unrecorded (fail open).  The ``pre_tool_call`` hook is
an earlier, read-only gate with the same verdicts; it never raises either.
"""
from __future__ import annotations

import contextvars
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

from . import report
from .classify import is_error_response
from .database import DEFAULT_BUSY_TIMEOUT_SECONDS
from .durable import reach_boundary
from .errors import AdmissionRefused, EncodingError, JournalError, JournalUnavailable
from .journal import Journal
from .owner import OwnerLock
from .record import fingerprint, value_hash

logger = logging.getLogger(__name__)

# docs/guard.md §Settings: exempt by default; a configured list replaces this pair.
DEFAULT_READ_ONLY_TOOLS = ("read_file", "search_files")
# docs/guard.md §Settings: always exempt, whatever the configuration says.
INSPECTION_TOOLS = ("crash_recovery_status", "crash_recovery_verify")
# result_hash when there is no response (exception, cancellation), docs/format.md §Events.
NO_RESPONSE_HASH = value_hash(None)


@dataclass
class Admission:
    """The binding of docs/guard.md §Inside Hermes: the admitted operation and the call's identity
    tuple ``(tool_name, session_id, tool_call_id, argument_digest)``.

    ``active`` turns False when the call ends.  A context copied during the call
    (a thread or task the tool started) keeps this same object, so a stale copy
    can never pass as re-entry after the call is over.
    """
    operation_id: str
    identity: tuple
    active: bool = True


# Per-context: Hermes' concurrent path runs each call in a copied context, so a
# binding never leaks to another call, thread or later call.
_ADMISSION: contextvars.ContextVar[Optional[Admission]] = contextvars.ContextVar(
    "crash_recovery_admission", default=None)


def _live_admission() -> Optional[Admission]:
    """This context's binding, if its call is still running."""
    admission = _ADMISSION.get()
    return admission if admission is not None and admission.active else None


class _Refusal(Exception):
    """Internal: a refusal with its code, explanation and operations."""

    def __init__(self, code: str, explanation: str, operations: Iterable[dict] = ()):
        super().__init__(code)
        self.code = code
        self.explanation = explanation
        self.operations = list(operations)


PathSource = Union[str, Callable[[], Any]]
ToolListSource = Union[Iterable[str], Callable[[], Any], None]


class RecoveryGuard:
    """Admission, one downstream call, classification, uncertainty (docs/guard.md §Execution contract, §Inside Hermes).

    ``data_dir``: a path, or a zero-argument callable returning one, resolved at
    first use (registration must not touch the disk).
    ``read_only_tools``: names exempt from journaling; a sequence, a callable
    returning one (resolved at first use), or None for the default pair.  A
    value that is not a list of strings exempts nothing but the inspection
    tools (fail closed) and is reported by :meth:`status_report`.
    ``busy_timeout``: seconds to wait for the journal's writer lock.
    ``full_verification``: re-verify the whole history on every admission.

    Public entry points never raise ``Exception`` before downstream runs.
    """

    def __init__(self, data_dir: PathSource, *, read_only_tools: ToolListSource = None,
                 busy_timeout: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
                 full_verification: bool = False):
        self._data_dir_source = data_dir
        self._read_only_source = read_only_tools
        self._busy_timeout = busy_timeout
        self._full_verification = full_verification
        self._setup_lock = threading.Lock()
        # One protected call at a time in this process (docs/guard.md §Settings); the owner lock
        # and the journal's pending state extend that to the whole profile.
        self._in_flight = threading.Lock()
        self._journal: Optional[Journal] = None
        self._owner: Optional[OwnerLock] = None
        self._exempt: Optional[frozenset] = None
        self.settings_problem: Optional[str] = None
        self.poisoned: Optional[str] = None  # why this instance refuses everything

    # ------------------------------------------------------------ settings --

    def exempt_tools(self) -> frozenset:
        """Tool names never journaled: the read-only list plus the inspection tools."""
        if self._exempt is None:
            with self._setup_lock:
                if self._exempt is None:
                    self._exempt = frozenset(self._load_read_only()) | frozenset(INSPECTION_TOOLS)
        return self._exempt

    def _load_read_only(self) -> tuple:
        source = self._read_only_source
        try:
            value = source() if callable(source) else source
        except Exception as exc:  # a broken config loader must not open the gate
            self.settings_problem = f"read_only_tools could not be read ({type(exc).__name__}: {exc})"
            logger.warning("crash-recovery: %s; only the inspection tools are exempt",
                           self.settings_problem)
            return ()
        if value is None:
            return DEFAULT_READ_ONLY_TOOLS
        if isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value):
            return tuple(value)
        self.settings_problem = f"read_only_tools must be a list of tool names, got {value!r:.200}"
        logger.warning("crash-recovery: %s; only the inspection tools are exempt",
                       self.settings_problem)
        return ()

    def is_protected(self, tool_name: Any) -> bool:
        """Every name outside the exempt set is protected, unknown ones included."""
        return not (isinstance(tool_name, str) and tool_name in self.exempt_tools())

    def _open(self) -> tuple:
        """(journal, owner lock), created at first use.  Raises JournalError."""
        if self._journal is None:
            with self._setup_lock:
                if self._journal is None:
                    source = self._data_dir_source
                    try:
                        directory = source() if callable(source) else source
                        directory = str(directory)
                    except Exception as exc:
                        raise JournalUnavailable(
                            "storage_unavailable",
                            f"the data directory could not be resolved ({type(exc).__name__}: "
                            f"{exc})") from None
                    self._owner = OwnerLock(directory)
                    self._journal = Journal(directory, busy_timeout=self._busy_timeout,
                                            full_verification=self._full_verification)
        return self._journal, self._owner

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

    def _refusal_from(self, error: JournalError, journal: Optional[Journal]) -> _Refusal:
        data_dir = journal.data_dir if journal else None
        if error.code == "unresolved_operations":
            operations = [report.operation_view(operation, data_dir or "", with_owner=False)
                          for operation in error.details["operations"]]
            return _Refusal(error.code, report.unresolved_explanation(operations, data_dir),
                            operations)
        return _Refusal(error.code, report.integrity_explanation(error, data_dir))

    def _check_gate(self, journal: Journal, identity: Optional[tuple] = None) -> None:
        """Verify the journal; raise :class:`_Refusal` if it fails or any
        operation is open.  With ``identity``, the operation this context has
        admitted for exactly that call is not counted (docs/guard.md §Inside Hermes, admission binding)."""
        try:
            open_operations = journal.unresolved()
        except JournalError as exc:
            raise self._refusal_from(exc, journal) from None
        binding = _live_admission()
        if identity is not None and binding is not None and binding.identity == identity:
            open_operations = tuple(operation for operation in open_operations
                                    if operation.operation_id != binding.operation_id)
        if open_operations:
            raise self._refusal_from(AdmissionRefused(
                "unresolved_operations", "unresolved operations",
                operations=[operation.to_json() for operation in open_operations]), journal)

    def _blocked(self, refusal: _Refusal) -> str:
        journal = self._journal
        return report.blocked_result(refusal.code, refusal.explanation,
                                     data_dir=journal.data_dir if journal else None,
                                     operations=refusal.operations)

    # ------------------------------------------------------------ the hook --

    def pre_tool_call(self, tool_name: Any = None, args: Any = None, session_id: Any = None,
                      tool_call_id: Any = None, **kwargs: Any) -> Optional[dict]:
        """``pre_tool_call`` hook (docs/guard.md §Inside Hermes): None to allow, or
        ``{"action": "block", "message": <blocked JSON>}``.  Read-only; never raises
        ``Exception`` (Hermes 0.19 runs the tool when a hook raises)."""
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
            return {"action": "block",
                    "message": self._blocked(self._refusal_from(exc, self._journal))}
        except Exception as exc:  # fail closed on our own bugs too
            logger.exception("crash-recovery: pre_tool_call failed")
            return {"action": "block", "message": self._blocked(_Refusal(
                "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}); "
                "nothing was run. Do not retry; tell the user an operator must check it."))}

    # ------------------------------------------------------ the middleware --

    def tool_execution(self, tool_name: Any = None, args: Any = None, next_call: Any = None,
                       session_id: Any = None, tool_call_id: Any = None, **kwargs: Any) -> Any:
        """``tool_execution`` middleware (docs/guard.md §Execution contract, §Inside Hermes).  Returns downstream's
        result, a blocked JSON string, or the record-failed JSON string.
        Downstream exceptions propagate unchanged after an ``uncertain`` record."""
        if not callable(next_call):
            return self._blocked(_Refusal("invalid_request",
                                          "The host passed no next_call; nothing was run."))
        try:
            protected = self.is_protected(tool_name)
        except Exception:
            protected = True
        if not protected:
            return next_call()
        try:
            identity, call_fingerprint = self._identity(tool_name, args, session_id, tool_call_id)
            binding = _live_admission()
            if binding is not None:
                if binding.identity == identity:
                    # docs/guard.md §Inside Hermes, re-entry: the host nested this middleware for the same call.
                    return_through = True
                else:
                    raise _Refusal("nested_call",
                                   f"A protected call ({tool_name}) was made while another "
                                   "protected call was running in the same context; it was "
                                   "refused and not run.")
            else:
                return_through = False
        except _Refusal as refusal:
            return self._blocked(refusal)
        except Exception as exc:
            logger.exception("crash-recovery: identity check failed")
            return self._blocked(_Refusal("internal_error",
                                          f"The crash-recovery guard failed ({type(exc).__name__});"
                                          " nothing was run."))
        if return_through:
            return next_call()
        return self._run_protected(identity, call_fingerprint, next_call)

    def _run_protected(self, identity: tuple, call_fingerprint: str, next_call: Callable) -> Any:
        tool_name = identity[0]
        admission: Optional[Admission] = None
        token = None
        if not self._in_flight.acquire(blocking=False):
            return self._blocked(_Refusal(
                "operation_in_flight",
                f"Another protected call is running in this process, so {tool_name} was refused "
                "and not run (one protected call at a time). Do not retry automatically."))
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
                    "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}); "
                    "nothing was run."))
            admission = Admission(operation_id, identity)
            token = _ADMISSION.set(admission)
            return self._call_downstream(journal, operation_id, tool_name, next_call)
        finally:
            if admission is not None:
                admission.active = False
            if token is not None:
                _ADMISSION.reset(token)
            self._release()

    def _admit(self, identity: tuple, call_fingerprint: str) -> tuple:
        """Gate, owner lock, durable ``started``: ``(journal, operation_id)``.
        Raises :class:`_Refusal`.  The caller's ``finally`` releases the owner
        lock whatever happened (a no-op when this call never took it)."""
        tool_name, session_id, tool_call_id, args_hash = identity
        if self.poisoned:
            raise _Refusal("guard_poisoned", self.poisoned)
        try:
            journal, owner = self._open()
        except JournalError as exc:  # e.g. the data directory cannot be resolved
            raise self._refusal_from(exc, None) from None
        operation_id = str(uuid.uuid4())
        # Checked before the owner lock is touched (this also creates a fresh
        # profile's data directory): a refusal changes no file (docs/guard.md §Blocked result), and a
        # killed worker's tag in owner.lock stays as the operator's evidence.
        # admit() below re-checks under the writer lock.
        self._check_gate(journal)
        try:
            if not owner.acquire(operation_id):
                raise _Refusal(
                    "operation_in_flight",
                    f"Another process is running a protected call in this profile, so "
                    f"{tool_name} was refused and not run. Do not retry automatically.")
        except OSError as exc:
            raise _Refusal("storage_unavailable",
                           f"The owner lock in {journal.data_dir} cannot be used "
                           f"({exc.strerror or exc}); nothing was run.") from None
        try:
            journal.admit(operation_id=operation_id, tool=tool_name, args_hash=args_hash,
                          fingerprint=call_fingerprint, session_id=session_id,
                          tool_call_id=tool_call_id)
        except JournalError as exc:
            raise self._refusal_from(exc, journal) from None
        return journal, operation_id

    def _release(self) -> None:
        """Release the owner lock (a no-op when not held) and the in-flight lock.
        Only one call at a time holds ``_in_flight``, so the owner lock, if
        held, is that call's."""
        try:
            if self._owner is not None:
                self._owner.release()
        finally:
            self._in_flight.release()

    def _call_downstream(self, journal: Journal, operation_id: str, tool_name: str,
                         next_call: Callable) -> Any:
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
            uncertain = is_error_response(result)
        except Exception:
            # A response with no canonical form (or one whose own methods raise)
            # is not a normal response.
            result_hash, uncertain = NO_RESPONSE_HASH, True
        failure = self._record(journal, operation_id, tool_name, uncertain=uncertain,
                               result_hash=result_hash,
                               reason="error_response" if uncertain else "returned")
        return result if failure is None else failure

    def _record(self, journal: Journal, operation_id: str, tool_name: str, *, uncertain: bool,
                result_hash: str, reason: str) -> Optional[str]:
        """Append the outcome; on failure poison the guard and return the
        record-failed JSON (docs/guard.md §Inside Hermes).  Never raises ``Exception``."""
        try:
            journal.record_outcome(operation_id, uncertain=uncertain, result_hash=result_hash,
                                   reason=reason)
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
        """``crash_recovery_status`` (docs/guard.md §Blocked result): verified integrity plus the
        unresolved operations with owner, age and ISO start time."""
        try:
            journal, _ = self._open()
        except JournalError as exc:
            return {"ok": False, "integrity": exc.code, "error": exc.to_json(), "unresolved": []}
        result = report.status_report(journal, journal.data_dir)
        result["read_only_tools"] = sorted(self.exempt_tools())
        if self.settings_problem:
            result["settings_problem"] = self.settings_problem
        if self.poisoned:
            result["ok"] = False
            result["poisoned"] = self.poisoned
        return result

    def verify_report(self, checkpoint: Any = None) -> dict:
        """``crash_recovery_verify`` (docs/guard.md §Blocked result): a full verification, optionally
        against an external ancestor ``checkpoint`` dict."""
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
