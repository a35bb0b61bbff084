"""RecoveryGuard: the execution contract around one protected call (docs/guard.md).

One call, as the ``tool_execution`` middleware sees it::

    not protected (settings), a Tool Search catalog read or connector batch,
      or a tool_call naming only unprotected tools? ----------> next_call()
      (while the gate is closed only read-only tools: else blocked JSON)
    a tool_call the host left unresolved naming a protected tool -> blocked JSON
    the same call re-entered (host identity, this context)? ---> next_call()
    refuse: bad arguments, poisoned guard, nested call, a call already in
            flight, journal failure, any unresolved operation -> blocked JSON
    the call's own lock (calls/<operation id>), then journal.admit
      (durable ``started``)
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
    finally: reset the binding, release the call's lock

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
import os
import time
import uuid
from typing import Any, Callable, Optional

from .admission.binding import ADMISSION, Admission, live_admission, same_call
from .admission.bridge import PASS as BRIDGE_PASS, REFUSE as BRIDGE_REFUSE, bridge_verdict
from .admission.bridge import refusal_explanation as bridge_refusal_explanation
from .admission.isolation import ISOLATION_PROBLEM, NoDownstream, isolation_explanation
from .admission.host_refusal import NOT_RUN, NOT_RUN_HOST_REFUSED, host_refused, note_host_refusal
from .admission import inspection
from .admission.gate import Gate, Refusal
from .classify import is_error_response
from .journal import NO_RESPONSE_HASH, Journal
from .reports.messages import RECORD_FAILED_ERROR, command_line
from .storage.call_lock import CallLock, held_calls
from .storage.durable import reach_boundary
from .storage.errors import AdmissionRefused, EncodingError, JournalError
from .storage.log_lines import plugin_logger
from .storage.record import call_hashes, value_hash

logger = plugin_logger(__name__)

# Automatic archives skipped in a row before the skip is logged as a WARNING.
ARCHIVE_SKIPS_BEFORE_WARNING = 3

def _forked_during(admission: Admission, tool_name: str) -> bool:
    """Whether this process is a child forked inside the admitted call that
    came back through the guard (returned or raised instead of exiting): the
    call is its parent's, so it records nothing and releases nothing
    (docs/guard.md §Child processes)."""
    if admission.pid == os.getpid():
        return False
    logger.warning("crash-recovery: a process forked inside protected call %s (%s) came back "
                   "through the guard; the call is its parent's: nothing recorded",
                   admission.operation_id, tool_name)
    return True


class RecoveryGuard:
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
    the operator commands (:func:`reports.messages.hermes_prefix` inside
    Hermes); default the stand-alone ``operator_cli.py --data-dir DIR``.
    ``execution_chain_running(identity) -> bool``: whether the host runs its
    execution middleware for that call now (host/hermes.py).
    Keyword arguments named like settings (``read_only_tools``,
    ``protected_tools``, ``busy_timeout``, ``full_verification``, ...) override
    ``settings`` (library use).

    The guard owns the call: its identity, its lock, the admission, the one
    downstream call and its outcome; :attr:`gate` (:class:`gate.Gate`) owns
    every decision to refuse and its explanation.  Public entry points never
    raise ``Exception`` before downstream runs.
    """

    journal_class = Journal

    def __init__(self, data_dir: Any, *, settings: Any = None,
                 command_prefix: Optional[Callable[[], Any]] = None,
                 registered_tools: Optional[Callable[[], Any]] = None,
                 execution_chain_running: Optional[Callable[[tuple], bool]] = None,
                 **library_settings: Any):
        self.gate = Gate(data_dir, journal_class=self.journal_class, settings=settings,
                         command_prefix=command_prefix, registered_tools=registered_tools,
                         execution_chain_running=execution_chain_running, **library_settings)
        # Automatic archives skipped in a row (see _maybe_archive).
        self._archive_skips = 0

    # ------------------------------------------------- what the gate holds --

    def settings(self) -> Any:
        """The parsed settings (:meth:`gate.Gate.settings`)."""
        return self.gate.settings()

    def is_protected(self, tool_name: Any) -> bool:
        """Whether calls of ``tool_name`` are journaled (never raises)."""
        return self.gate.is_protected(tool_name)

    def journal(self) -> Journal:
        """The journal, opened at first use (raises :class:`JournalError`)."""
        return self.gate.journal()

    @property
    def poisoned(self) -> Optional[str]:
        """Why this guard refuses every protected call, or None."""
        return self.gate.poisoned

    @poisoned.setter
    def poisoned(self, reason: Optional[str]) -> None:
        self.gate.poisoned = reason

    @property
    def isolation_problem(self) -> Optional[str]:
        """Set when the host passed no callable ``next_call`` (docs/guard.md
        §Isolation mode)."""
        return self.gate.isolation_problem

    @isolation_problem.setter
    def isolation_problem(self, problem: Optional[str]) -> None:
        self.gate.isolation_problem = problem

    def close(self) -> None:
        """Close the journal connection (idempotent); the next call reopens it."""
        self.gate.close()

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
            for value in (tool_name, session_id, tool_call_id):  # first: else "in its arguments"
                if value is not None:
                    value.encode("utf-8")
            args_hash, call_fingerprint = call_hashes(tool_name, args)
        except (EncodingError, UnicodeEncodeError) as exc:
            if isinstance(exc, JournalError):
                problem = (f"in its arguments, {exc.message}. Nothing was run. Arguments must be "
                           "plain JSON values (text, numbers, true, false, null, arrays, objects "
                           "with text keys), none inside itself")
            else:
                problem = ("its tool name, session id or call id is not valid UTF-8 (a lone "
                           "surrogate). Nothing was run")
            raise Refusal("non_canonical_arguments",
                           f"The call to {tool_name} cannot be journaled: {problem}; "
                           "tell the user the call was refused.") from None
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
                refused = self.gate.refusal_while_closed(tool_name, args)  # the gate is closed
                return None if refused is None else {"action": "block", "message": refused}
            if verdict == BRIDGE_REFUSE:
                raise Refusal("bridge_call_unresolved", bridge_refusal_explanation(args))
            identity, _ = self._identity(tool_name, args, session_id, tool_call_id)
            binding = live_admission()
            if binding is not None and same_call(binding.identity, identity):
                return None  # our middleware admitted this very call (Hermes 0.20+)
            self.gate.refuse_unwrapped(identity)  # our middleware did not wrap this call
            self.gate.check(identity)
            return None
        except Refusal as refusal:
            return {"action": "block", "message": self.gate.blocked(refusal)}
        except JournalError as exc:
            return {"action": "block", "message": self.gate.blocked(self.gate.refusal_for(exc))}
        except Exception as exc:  # fail closed on our own bugs too
            logger.exception("crash-recovery: pre_tool_call failed")
            return {"action": "block", "message": self.gate.blocked(Refusal(
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
        if unprotected:  # while the gate is closed only read-only tools run
            refused = self.gate.refusal_while_closed(tool_name, args)
            if refused is not None:
                return refused
        if not callable(next_call):  # e.g. Hermes' plugins.isolation: host
            self.isolation_problem = ISOLATION_PROBLEM
            if unprotected:
                raise NoDownstream()  # the host then skips this middleware: the tool runs
            return self.gate.blocked(Refusal("isolation_unsupported",
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
            blocked = self.gate.blocked(refusal)
            if binding is not None:
                binding.inner_refusal = blocked  # the outer call learns that nothing ran
            return blocked
        except Exception as exc:
            logger.exception("crash-recovery: identity check failed")
            return self.gate.blocked(Refusal("internal_error", f"The crash-recovery guard failed "
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
            limit, journal = self.settings().archive_after_events, self.gate.opened_journal
            if not limit or journal is None or self.poisoned:
                return
            status = journal.status()
            if (status.checkpoint["count"] < limit or status.unresolved or status.attention
                    or held_calls(journal.data_dir)):
                return
            sealed = journal.archive()
            self._archive_skips = 0
            logger.info("crash-recovery: archived %d events into %s (archive_after_events)",
                        sealed["archived"]["count"], sealed["archived"]["file"])
        except Exception as exc:
            # Another worker archiving first, or a call starting meanwhile, is
            # normal under concurrency: INFO, and a WARNING only when it keeps failing.
            self._archive_skips += 1
            keeps_failing = self._archive_skips >= ARCHIVE_SKIPS_BEFORE_WARNING
            logger.log(logging.WARNING if keeps_failing else logging.INFO,
                       "crash-recovery: automatic archive skipped (%s)%s",
                       exc.code if isinstance(exc, JournalError) else type(exc).__name__,
                       f", {self._archive_skips} times in a row: run "
                       f"{command_line(self.gate.prefix() or (), 'archive')} to see why"
                       if keeps_failing else "; the next call tries again")

    def _run_protected(self, identity: tuple, call_fingerprint: str, next_call: Callable) -> Any:
        tool_name = identity[0]
        admission: Optional[Admission] = None
        token = None
        call_lock: Optional[CallLock] = None
        # One finally for everything from here on: an interrupt at any point
        # (even between admit() and the binding) resets the binding and
        # releases the call's lock.
        try:
            try:
                journal, operation_id, call_lock = self._admit(identity, call_fingerprint)
            except Refusal as refusal:
                return self.gate.blocked(refusal)
            except Exception as exc:
                logger.exception("crash-recovery: admission failed")
                return self.gate.blocked(Refusal(
                    "internal_error", f"The crash-recovery guard failed ({type(exc).__name__}). "
                    "The call was NOT run; if the journal shows it as pending, its start was "
                    "recorded before the failure: settle it as not_applied."))
            admission = Admission(operation_id, identity, time.time_ns())
            token = ADMISSION.set(admission)
            return self._call_downstream(journal, admission, tool_name, next_call)
        finally:
            try:
                if admission is not None:
                    admission.active = False
                if token is not None:
                    ADMISSION.reset(token)
            finally:
                if call_lock is not None:
                    call_lock.release()

    def _admit(self, identity: tuple, call_fingerprint: str) -> tuple:
        """The call's lock and its durable ``started``, in one transaction of
        the journal (:meth:`journal.Journal.admit`): ``(journal, operation_id,
        call lock)``.  Raises :class:`Refusal` (then nothing is held and no
        file was touched).  The caller releases the call's lock."""
        tool_name, session_id, tool_call_id, args_hash = identity
        journal = self.gate.admission_journal()
        operation_id = str(uuid.uuid4())
        call_lock = CallLock(journal.data_dir, operation_id)
        try:
            journal.admit(operation_id=operation_id, tool=tool_name, args_hash=args_hash,
                          fingerprint=call_fingerprint, session_id=session_id,
                          tool_call_id=tool_call_id, call_lock=call_lock)
        except JournalError as exc:
            call_lock.release()
            if exc.code == "commit_failed":
                logger.warning("crash-recovery: the started event of operation %s (%s) may or "
                               "may not be durable; the tool was NOT run. If it shows as pending, "
                               "settle it as not_applied", operation_id, tool_name)
            raise self.gate.refusal_for(exc, tool_name) from None
        except BaseException:
            call_lock.release()
            raise
        return journal, operation_id, call_lock

    def _call_downstream(self, journal: Journal, admission: Admission, tool_name: str,
                         next_call: Callable) -> Any:
        operation_id = admission.operation_id
        try:
            result = next_call()
        except Exception:
            if not _forked_during(admission, tool_name):
                self._record(journal, operation_id, tool_name, uncertain=True,
                             result_hash=NO_RESPONSE_HASH, reason="exception")
            raise
        except BaseException:
            if not _forked_during(admission, tool_name):
                self._record(journal, operation_id, tool_name, uncertain=True,
                             result_hash=NO_RESPONSE_HASH, reason="cancelled")
            raise
        if _forked_during(admission, tool_name):
            return result
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
                               reason, command_line(self.gate.prefix() or (), "show",
                                                           operation_id))
                return None
            if uncertain:
                self.gate.note_unknown(operation_id, tool_name, "uncertain", reason)
            return None
        except Exception as exc:
            code = exc.code if isinstance(exc, JournalError) else type(exc).__name__
            self.gate.poison(f"Recording the outcome of operation {operation_id} ({tool_name}) "
                             f"failed ({code}) after the tool ran. Its outcome is unknown; this "
                             "process refuses all protected calls until it restarts and an "
                             "operator settles the operation.")
            logger.error("crash-recovery: %s", self.poisoned)
            return json.dumps({"error": RECORD_FAILED_ERROR, "outcome_unknown": True,
                               "operation_id": operation_id, "tool": tool_name, "code": code,
                               "explanation": self.poisoned}, sort_keys=True)

    # ----------------------------------------------------- inspection tools --

    def status_report(self) -> dict:
        """The full status for operator surfaces (:func:`inspection.status_report`)."""
        return inspection.status_report(self.gate)

    def verify_report(self, checkpoint: Any = None) -> dict:
        """A full verification (:func:`inspection.verify_report`)."""
        return inspection.verify_report(self.gate, checkpoint)

    def status_tool(self, args: Any = None, **kwargs: Any) -> str:
        """Handler of ``crash_recovery_status`` (:func:`inspection.status_tool`)."""
        return inspection.status_tool(self.gate)

    def verify_tool(self, args: Any = None, **kwargs: Any) -> str:
        """Handler of ``crash_recovery_verify`` (:func:`inspection.verify_tool`)."""
        return inspection.verify_tool(self.gate, args)
