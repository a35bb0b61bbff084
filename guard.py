"""RecoveryGuard: the execution contract around one protected call (docs/guard.md).

One call, as the ``tool_execution`` middleware sees it::

    not protected (settings), a Tool Search catalog read or connector batch,
      or a tool_call naming only unprotected tools? ----------> next_call()
    a tool_call the host left unresolved naming a protected tool -> blocked JSON
    the same call re-entered (host identity, this context)? ---> next_call()
    refuse: bad arguments, poisoned guard, nested call, a call already in
            flight, journal failure, any unresolved operation -> blocked JSON
    owner lock, then journal.admit  (durable ``started``)
    bind the admission in a ContextVar
    next_call()  -- exactly once
       raises Exception      -> ``uncertain``/exception, re-raise
       raises BaseException  -> ``uncertain``/cancelled, re-raise
       the guard refused its own inner entry -> ``returned``/not_run
       the host reported it refused the call before its handler
         (post_tool_call, status "blocked")  -> ``returned``/not_run_host_refused
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
from typing import Any, Callable, Optional

from .admission.binding import ADMISSION, Admission, live_admission, same_call
from .admission.bridge import PASS as BRIDGE_PASS, REFUSE as BRIDGE_REFUSE, bridge_verdict
from .admission.bridge import refusal_explanation as bridge_refusal_explanation
from .admission.isolation import ISOLATION_PROBLEM, NoDownstream, isolation_explanation
from .admission.host_refusal import NOT_RUN, NOT_RUN_HOST_REFUSED, host_refused, note_host_refusal
from .admission.gate import Gate, Refusal
from .classify import is_error_response
from .journal import NO_RESPONSE_HASH, Journal
from .reports.messages import RECORD_FAILED_ERROR, bounded, command_line, in_flight_explanation
from .storage.calls import CallLease
from .storage.durable import reach_boundary
from .storage.errors import AdmissionRefused, EncodingError, JournalError
from .storage.owner import OwnerLock, probe_lock, resolved_holders
from .storage.record import call_hashes, value_hash

logger = logging.getLogger(__name__)

class RecoveryGuard(Gate):
    """Admission, one downstream call, classification, uncertainty (docs/guard.md).

    ``data_dir``: a path, or a zero-argument callable returning one, resolved at
    first use (registration must not touch the disk).
    ``settings``: the raw ``settings`` mapping of docs/guard.md §Settings, a
    :class:`settings.Settings`, or a zero-argument callable returning the
    mapping (read at first use; an exception is a settings problem).
    ``registered_tools``: a zero-argument callable returning the host's tool
    names (None: unknown); listed names matching none are logged at the first
    call and shown by ``status`` (docs/guard.md §Settings).
    ``command_prefix``: a zero-argument callable returning the words that run
    the operator commands (:func:`reports.messages.hermes_prefix` inside Hermes);
    default
    the stand-alone ``operator_cli.py --data-dir DIR``.
    Keyword arguments named like settings (``read_only_tools``,
    ``protected_tools``, ``busy_timeout``, ``full_verification``, ...) override
    ``settings`` (library use).

    Public entry points never raise ``Exception`` before downstream runs.
    """

    journal_class = Journal
    # Held while this guard's call is out (storage/calls.py), made at first admission.
    _calls: Optional[CallLease] = None

    # ------------------------------------------------------------ identity --

    @staticmethod
    def _identity(tool_name: Any, args: Any, session_id: Any, tool_call_id: Any) -> tuple:
        """``(tool_name, session_id, tool_call_id, args_hash)`` and the
        fingerprint; raises :class:`Refusal` for arguments we cannot hash."""
        if not isinstance(tool_name, str) or not tool_name:
            raise Refusal("invalid_request", "The tool name is missing or not text; nothing was run.")
        if not isinstance(args, dict):
            raise Refusal("invalid_arguments",
                           f"The arguments of {tool_name} are a {type(args).__name__}, not a JSON "
                           "object, so the call cannot be journaled; nothing was run.")
        for name, value in (("session_id", session_id), ("tool_call_id", tool_call_id)):
            if value is not None and not isinstance(value, str):
                raise Refusal("invalid_request", f"{name} is not text; nothing was run.")
        try:
            args_hash, call_fingerprint = call_hashes(tool_name, args)
            for value in (tool_name, session_id, tool_call_id):
                if value is not None:
                    value.encode("utf-8")
        except (EncodingError, UnicodeEncodeError) as exc:
            problem = (f"in its arguments, {exc.message}" if isinstance(exc, JournalError)
                       else "its tool name, session id or call id is not valid UTF-8")
            raise Refusal("non_canonical_arguments",
                           f"The call to {tool_name} cannot be journaled: {problem}. "
                           "Nothing was run. Arguments must be plain JSON values (text, numbers, "
                           "true, false, null, arrays, objects with text keys), none inside "
                           "itself; tell the user the call was refused.") from None
        return (tool_name, session_id, tool_call_id, args_hash), call_fingerprint

    # ---------------------------------------------------------- refusals --

    def _bridge_verdict(self, tool_name: Any, args: Any) -> Optional[str]:
        """:func:`admission.bridge.bridge_verdict` that never raises (refuse)."""
        try:
            return bridge_verdict(tool_name, args, self.is_protected)
        except Exception:
            return BRIDGE_REFUSE

    # ------------------------------------------------------------ the hook --

    def pre_tool_call(self, tool_name: Any = None, args: Any = None, session_id: Any = None,
                      tool_call_id: Any = None, **kwargs: Any) -> Optional[dict]:
        """``pre_tool_call`` hook (docs/guard.md §Inside Hermes): None to allow, or
        ``{"action": "block", "message": <blocked JSON>}``.  Read-only; never
        raises ``Exception`` (Hermes 0.19 runs the tool when a hook raises)."""
        try:
            verdict = self._bridge_verdict(tool_name, args)
            if verdict == BRIDGE_PASS or (verdict is None and not self.is_protected(tool_name)):
                return None
            if verdict == BRIDGE_REFUSE:
                raise Refusal("bridge_call_unresolved", bridge_refusal_explanation(args))
            identity, _ = self._identity(tool_name, args, session_id, tool_call_id)
            if self.poisoned:
                raise Refusal("guard_poisoned", self.poisoned)
            journal, _ = self._open()
            self._check_gate(journal, identity)
            return None
        except Refusal as refusal:
            return {"action": "block", "message": self._blocked(refusal)}
        except JournalError as exc:
            return {"action": "block", "message": self._blocked(self._refusal_from(exc))}
        except Exception as exc:  # fail closed on our own bugs too
            logger.exception("crash-recovery: pre_tool_call failed")
            return {"action": "block", "message": self._blocked(Refusal(
                "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}); "
                "nothing was run. Do not retry; tell the user an operator must check it."))}

    def post_tool_call(self, tool_name: Any = None, session_id: Any = None,
                       tool_call_id: Any = None, status: Any = None, error_type: Any = None,
                       result: Any = None, **kwargs: Any) -> None:
        """``post_tool_call`` hook (docs/guard.md §Inside Hermes): when the host
        reports ``status="blocked"`` for the call this context has admitted, the
        middleware records that call as not run.  Observes only; returns None,
        never raises."""
        try:
            note_host_refusal(tool_name, session_id, tool_call_id, status, error_type, result)
        except Exception:  # an observer must never disturb the host
            logger.exception("crash-recovery: post_tool_call failed")

    # ------------------------------------------------------ the middleware --

    def tool_execution(self, tool_name: Any = None, args: Any = None, next_call: Any = None,
                       session_id: Any = None, tool_call_id: Any = None, **kwargs: Any) -> Any:
        """``tool_execution`` middleware (docs/guard.md §Execution contract).
        Returns downstream's result, a blocked JSON string, or the record-failed
        JSON string.  Downstream exceptions propagate unchanged after an
        ``uncertain`` record."""
        verdict = self._bridge_verdict(tool_name, args)
        unprotected = verdict == BRIDGE_PASS or (verdict is None
                                                 and not self.is_protected(tool_name))
        if not callable(next_call):  # e.g. Hermes' plugins.isolation: host
            self.isolation_problem = ISOLATION_PROBLEM
            if unprotected:
                raise NoDownstream()  # the host then skips this middleware: the tool runs
            return self._blocked(Refusal("isolation_unsupported",
                                         isolation_explanation(str(tool_name))))
        if unprotected:
            return next_call()
        binding = live_admission()
        try:
            if verdict == BRIDGE_REFUSE:
                raise Refusal("bridge_call_unresolved", bridge_refusal_explanation(args))
            identity, call_fingerprint = self._identity(tool_name, args, session_id, tool_call_id)
            if binding is not None and not same_call(binding.identity, identity):
                raise Refusal("nested_call",
                               f"A protected call ({tool_name}) was made from inside another "
                               f"protected call that is still running (operation "
                               f"{binding.operation_id}); protected calls cannot be nested, so "
                               f"{tool_name} was refused and not run.")
        except Refusal as refusal:
            blocked = self._blocked(refusal)
            if binding is not None:
                binding.inner_refusal = blocked  # the outer call learns that nothing ran
            return blocked
        except Exception as exc:
            logger.exception("crash-recovery: identity check failed")
            return self._blocked(Refusal("internal_error", f"The crash-recovery guard failed "
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
                    or probe_lock(journal.data_dir) is not None
                    or resolved_holders(journal.data_dir)):
                return
            sealed = journal.archive()
            logger.info("crash-recovery: archived %d events into %s (archive_after_events)",
                        sealed["archived"]["count"], sealed["archived"]["file"])
        except Exception as exc:
            logger.warning("crash-recovery: automatic archive skipped (%s)",
                           exc.code if isinstance(exc, JournalError) else type(exc).__name__)

    def _run_protected(self, identity: tuple, call_fingerprint: str, next_call: Callable) -> Any:
        tool_name = identity[0]
        in_flight = self._enter()
        if in_flight is None:
            # No admission is visible here (a nested entry was answered in
            # tool_execution), so this is a sibling call of another context: wait.
            current = self._current
            running = [current.view()] if current is not None else []
            return self._blocked(Refusal(
                "operation_in_flight",
                in_flight_explanation(tool_name, running, nested=False), running))
        admission: Optional[Admission] = None
        token = None
        # One finally for everything from here on: an interrupt at any point
        # (even between admit() and the binding) resets the binding and
        # releases both locks.
        try:
            try:
                journal, operation_id = self._admit(identity, call_fingerprint)
            except Refusal as refusal:
                return self._blocked(refusal)
            except Exception as exc:
                logger.exception("crash-recovery: admission failed")
                return self._blocked(Refusal(
                    "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}). "
                    "The call was NOT run; if the journal shows it as pending, its start was "
                    "recorded before the failure: settle it as not_applied."))
            admission = self._current = Admission(operation_id, identity, time.time_ns())
            token = ADMISSION.set(admission)
            return self._call_downstream(journal, admission, tool_name, next_call)
        finally:
            self._end_call(admission, token, in_flight)

    def _enter(self) -> Optional[Any]:
        """This process's slot for one protected call: the acquired in-flight
        lock, or None while another call of this process runs.  A call an
        operator resolved while it hung (``resolve --force``) gives its slot
        up here: it keeps its own owner lock and call lease until it ends (its
        late outcome still counts), and the next call gets fresh ones, so a
        resolved operation never keeps this worker busy either (docs/cli.md
        §Owner)."""
        with self._slot_lock:
            if self._in_flight.acquire(blocking=False):
                return self._in_flight
            current = self._current
        if current is None or not self._resolved_while_running(current.operation_id):
            return None
        with self._slot_lock:
            if self._current is not current:  # it ended, or another sibling took over
                return self._in_flight if self._in_flight.acquire(blocking=False) else None
            current.detached_locks = (self._owner, self._calls)
            self._detached.append(current)
            if self._owner is not None:
                self._owner = OwnerLock(self._owner.data_dir)
            self._calls, self._current = None, None
            self._in_flight = threading.Lock()
            self._in_flight.acquire()
            logger.warning("crash-recovery: operation %s (%s) was resolved by an operator while "
                           "it still runs in this worker; other protected calls of this worker "
                           "run again, and its late outcome will be recorded when it returns",
                           current.operation_id, bounded(current.identity[0]))
            return self._in_flight

    def _end_call(self, admission: Optional[Admission], token: Any, in_flight: Any) -> None:
        """Unbind and release, each step in its own ``finally``: an interrupt
        arriving meanwhile never leaves a lock held.  A call whose slot was
        given up (:meth:`_enter`) releases only its own locks."""
        try:
            try:
                if admission is not None:
                    admission.active = False
            finally:
                if token is not None:
                    ADMISSION.reset(token)
        finally:
            try:
                with self._slot_lock:
                    detached = admission is not None and admission.detached_locks is not None
                    if detached:
                        owner, calls = admission.detached_locks
                        self._detached = [other for other in self._detached
                                          if other is not admission]
                    else:
                        owner, calls, self._current = self._owner, self._calls, None
                try:
                    if calls is not None:
                        calls.release()
                        if detached:
                            calls.close()
                finally:
                    if owner is not None:
                        owner.release()
            finally:
                in_flight.release()

    def _call_lease(self, journal: Journal) -> CallLease:
        """This guard's :class:`calls.CallLease` on the journal's database."""
        if self._calls is None or self._calls.path != journal.database_path:
            if self._calls is not None:
                self._calls.close()
            self._calls = CallLease(journal.database_path)
        return self._calls

    def close(self) -> None:
        """Close the journal connection and give back the call lease's
        descriptor (idempotent); the next call reopens both."""
        if self._calls is not None:
            self._calls.close()
        super().close()

    def _admit(self, identity: tuple, call_fingerprint: str) -> tuple:
        """Gate, owner lock, durable ``started``: ``(journal, operation_id)``.
        Raises :class:`Refusal`.  The caller releases the owner lock."""
        tool_name, session_id, tool_call_id, args_hash = identity
        if self.poisoned:
            raise Refusal("guard_poisoned", self.poisoned)
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
            if not owner.acquire(operation_id, retire_if=self._resolved_while_running):
                holder = probe_lock(journal.data_dir) or {}
                raise Refusal(
                    "operation_in_flight",
                    f"Another process (pid {holder.get('pid')}) is running a protected call in "
                    f"this profile, so {tool_name} was refused and not run. Wait for it to "
                    "finish; do not retry automatically in a loop.")
        except OSError as exc:
            raise Refusal("storage_unavailable",
                           f"The owner lock cannot be used ({exc.strerror or exc}); nothing was "
                           "run.") from None
        try:
            leased = self._call_lease(journal).acquire()  # released by _end_call
        except OSError as exc:
            raise Refusal("storage_unavailable", f"The journal's call lock cannot be used "
                          f"({exc.strerror or exc}); nothing was run.") from None
        if not leased:
            raise Refusal("database_locked", f"An archive switch of this profile's journal was "
                          f"checking for running calls, so {tool_name} was refused and not run. "
                          "Try again in a moment.")
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

    def _resolved_while_running(self, operation_id: str) -> bool:
        """Whether the holder of the owner lock runs a call an operator has
        resolved (``resolve --force``): its lock is then moved aside."""
        try:
            return self._journal.resolved_while_running(operation_id)
        except JournalError:
            return False

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
            elif host_refused(admission, result):
                uncertain, reason = False, NOT_RUN_HOST_REFUSED
                logger.info("crash-recovery: operation %s (%s) was refused by the host before "
                            "its handler (%s); recorded as not run", operation_id, tool_name,
                            admission.host_refusal[0])
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
                                            reason="returned" if reason in NOT_RUN else reason)
                logger.warning("crash-recovery: operation %s (%s) returned (%s) after an operator "
                               "had resolved it; the late outcome is recorded and needs an "
                               "operator's acknowledgement (see: %s)", operation_id, tool_name,
                               reason, command_line(self._prefix() or (), "show",
                                                           operation_id))
                return None
            if uncertain:
                self._logged[f"unknown:{operation_id}"] = time.monotonic()  # said here already
                logger.warning("crash-recovery: operation %s (%s) is uncertain (%s): protected "
                               "calls are refused until a person settles it (see: %s)%s",
                               operation_id, bounded(tool_name), reason,
                               command_line(self._prefix() or (), "show", operation_id),
                               self.mode_hint(tool_name))
            return None
        except Exception as exc:
            code = exc.code if isinstance(exc, JournalError) else type(exc).__name__
            self.poisoned = (f"Recording the outcome of operation {operation_id} ({tool_name}) "
                             f"failed ({code}) after the tool ran. Its outcome is unknown; this "
                             "process refuses all protected calls until it restarts and an "
                             "operator settles the operation.")
            logger.error("crash-recovery: %s", self.poisoned)
            return json.dumps({"error": RECORD_FAILED_ERROR, "outcome_unknown": True,
                               "operation_id": operation_id, "tool": tool_name, "code": code,
                               "explanation": self.poisoned}, sort_keys=True)

    # ----------------------------------------------------- inspection tools --
