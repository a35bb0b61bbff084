"""The gate: which calls are protected, and why a call is refused
(docs/guard.md §Settings, §Concurrency, §While the gate is closed, §Blocked
result).

:class:`Gate` decides and explains, and runs nothing: it reads the settings
(once, failing closed), opens the journal at first use, and turns what one
verified read shows into the refusal a model can relay -- ``nested_call`` when
the caller is inside the running call, ``operation_in_flight`` for a sibling,
``unresolved_operations`` when a person must settle an unknown outcome, the
journal's verdict when it fails -- logging WARNINGs at most once per operation
and minute.  :class:`guard.RecoveryGuard` owns the call itself (the call's
lock, the admission, downstream, the outcome) and asks the gate through its
public methods only; neither reaches into the other's state.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional, Sequence, Union

from ..reports.messages import (blocked_result, bounded, command_line, in_flight_explanation,
                                integrity_explanation, next_command, next_step_of,
                                option_argument_explanation, standalone_prefix,
                                unresolved_explanation)
from ..reports.status import operation_waits_for_a_person, settled_views
from ..storage.call_lock import OWNER_RUNNING
from ..storage.errors import JournalError, JournalUnavailable
from ..storage.log_lines import plugin_logger
from ..storage.platform_support import platform_problem
from .binding import inherited_admission, live_admission, same_call
from .bridge import runs_while_closed
from .closed_gate import (journal_present, keeps_gate_open, option_argument_problem,
                          while_closed_text)
from .registered_tools import record_first_call
from .settings import (KNOWN_KEYS, MODE_PROTECTED_TOOLS, Settings, parse_settings,
                       tool_names_view)

# The guard's logger ("crash_recovery.guard", "hermes_plugins.crash_recovery.guard" inside
# Hermes): every WARNING an operator alerts on comes from one name.
logger = plugin_logger(__name__.rsplit(".", 2)[0] + ".guard")

# Refusals are logged at most once per operation (or code) in this many seconds.
REFUSAL_LOG_INTERVAL_SECONDS = 60.0
# Hermes' shell and file tools: in the default mode they are protected, and
# their first warning says how to choose the other mode.
CODING_TOOLS = frozenset(("terminal", "process", "execute_code", "write_file", "patch"))


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
    """Settings, the journal at first use, and the refusals of one profile.

    ``data_dir``, ``settings``, ``command_prefix``, ``registered_tools`` and
    the library settings are :class:`guard.RecoveryGuard`'s (its docstring);
    ``execution_chain_running(identity) -> bool``: whether the host runs its
    execution middleware for that call now (host/hermes.py; None outside
    Hermes); ``journal_class``: the journal to open (``journal.Journal``: the
    admission side sits below the top-level journal and never imports it).
    Public methods never run a tool; those that answer a call never raise
    ``Exception``, the ones that refuse raise :class:`Refusal`.
    """

    def __init__(self, data_dir: PathSource, *, journal_class: Callable[..., Any],
                 settings: Any = None,
                 command_prefix: Optional[Callable[[], Sequence[str]]] = None,
                 registered_tools: Optional[Callable[[], Any]] = None,
                 execution_chain_running: Optional[Callable[[tuple], bool]] = None,
                 **library_settings: Any):
        unknown = sorted(set(library_settings) - set(KNOWN_KEYS))
        if unknown:
            raise TypeError(f"unknown settings {unknown}; known: {KNOWN_KEYS}")
        self.journal_class = journal_class
        self._data_dir_source = data_dir
        self._settings_source = settings
        self._library_settings = library_settings
        self._command_prefix_source = command_prefix
        self.registered_tools = registered_tools
        self._execution_chain_running = execution_chain_running
        self._first_call_checked = self._open_operations_checked = self._mode_hinted = False
        self._settings: Optional[Settings] = None
        self._journal: Any = None  # a journal_class instance, opened at first use
        self._logged: dict = {}  # what was logged when (see warn_once)
        self.poisoned: Optional[str] = None  # why this guard refuses everything
        # Set when the host passed no callable next_call (docs/guard.md §Isolation mode).
        self.isolation_problem: Optional[str] = None
        self._lock, self._lock_pid = threading.Lock(), os.getpid()

    @property
    def _setup_lock(self) -> "threading.Lock":
        """Held while the settings or the journal are set up; a forked child
        gets a fresh one (a thread of the parent may have held it)."""
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

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
            if not self._first_call_checked:  # at the first call the host's tools are known
                self._first_call_checked = True
                self._first_call_checks()
            return self.settings().is_protected(tool_name)
        except Exception:
            return True

    def tool_names_view(self) -> dict:
        """:func:`settings.tool_names_view` against the host's registry now."""
        return tool_names_view(self.settings(), self.registered_tools)

    def mode_hint(self, tool_name: Any) -> str:
        """Once per process, the way out of the default mode for a coding
        profile, appended to the first warning about an operation of a shell
        or file tool ("" otherwise): there a failing ``ls`` blocks every
        protected call (README §Choose what to protect)."""
        if (self._mode_hinted or tool_name not in CODING_TOOLS
                or self.settings().mode == MODE_PROTECTED_TOOLS):
            return ""
        self._mode_hinted = True
        return (f". This profile protects every tool (the default mode), {tool_name} included, "
                "so one failing command blocks every protected call. For a coding profile, "
                "protect only the tools that act on the world: hermes config set "
                "plugins.entries.crash-recovery.settings.protected_tools '[\"send_payment\"]' "
                "(your tools), then restart Hermes; or add the tool to read_only_tools")

    def _first_call_checks(self) -> None:
        """The settings checked against the host, once, and what was found
        recorded for the operator surfaces; they only ever log."""
        try:
            settings = self.settings()
            unmatched = self.tool_names_view()["unmatched_tools"]
            if unmatched:
                effect = ("they protect nothing: check the spelling (a typo leaves the real "
                          "tool unprotected)" if settings.mode == MODE_PROTECTED_TOOLS
                          else "listing them changes nothing")
                self.warn_once("unmatched_tools", None, "crash-recovery: %s names tool(s) this "
                               "host has not registered: %s; %s", settings.mode,
                               ", ".join(unmatched), effect)
        except Exception:  # e.g. no host registry to ask
            logger.debug("crash-recovery: first-call check skipped", exc_info=True)
        record_first_call(self._data_dir_source, self.registered_tools, self.settings())

    def _check_open_operations(self, operations: Sequence[Any]) -> None:
        """At the first read: an open operation whose tool these settings no
        longer protect (the mode or the list changed meanwhile) runs
        unrecorded now, and the model may repeat the very call whose outcome
        nobody knows.  Only logs."""
        if self._open_operations_checked:
            return
        self._open_operations_checked = True
        settings = self.settings()
        for operation in operations:
            if not settings.is_protected(operation.tool):
                self.warn_once(f"unprotected_open:{operation.operation_id}", None,
                               "crash-recovery: operation %s of tool %s is %s, but the "
                               "settings (%s) no longer protect %s: calls of it now run "
                               "unrecorded and could repeat it. Settle it first, or protect "
                               "the tool again", operation.operation_id, operation.tool,
                               operation.state, settings.mode, operation.tool)

    # ------------------------------------------------------------- journal --

    def journal(self) -> Any:
        """The journal, opened at first use.  Raises :class:`JournalError`
        (``storage_unavailable`` when the data directory cannot be resolved,
        ``platform_unsupported``: checked again at the next call)."""
        if self._journal is None:
            settings = self.settings()
            with self._setup_lock:
                if self._journal is None:
                    directory = self._directory()
                    problem = platform_problem(directory)
                    if problem is not None:
                        raise JournalUnavailable("platform_unsupported", problem)
                    self._journal = self.journal_class(
                        directory, busy_timeout=settings.busy_timeout,
                        full_verification=settings.full_verification,
                        full_verification_interval=settings.full_verification_interval)
        return self._journal

    @property
    def opened_journal(self) -> Any:
        """The journal if it is open, else None (opens nothing)."""
        return self._journal

    def _directory(self) -> str:
        source = self._data_dir_source
        try:
            return str(source() if callable(source) else source)
        except Exception as exc:
            raise JournalUnavailable("storage_unavailable", f"the data directory could not be "
                                     f"resolved ({type(exc).__name__}: {exc})") from None

    def prefix(self) -> Optional[tuple]:
        """The words that run the operator commands, or None when unknown."""
        try:
            if self._command_prefix_source is not None:
                return tuple(self._command_prefix_source())
            journal = self._journal
            return standalone_prefix(journal.data_dir) if journal is not None else None
        except Exception:
            return None

    def close(self) -> None:
        """Close the journal connection (idempotent); the next call reopens it."""
        journal = self._journal
        if journal is not None:
            journal.close()

    def poison(self, reason: str) -> None:
        """From now on this guard refuses every protected call (``guard_poisoned``)."""
        self.poisoned = reason

    # ------------------------------------------------------------ refusals --

    def check(self, identity: Optional[tuple] = None) -> Any:
        """One verified read: return the journal when a protected call may be
        admitted now, else raise :class:`Refusal`.  With ``identity``, the
        operation this context has admitted for exactly that call is not
        counted (the hook's binding)."""
        if self.poisoned:
            raise Refusal("guard_poisoned", self.poisoned)
        try:
            journal = self.journal()
        except JournalError as exc:
            raise self.refusal_for(exc) from None
        read = self._reader(identity)
        views = settled_views(read(), read, journal.data_dir)
        if views:  # none left: every call seen open has just finished
            raise self._open_operations_refusal(views, identity[0] if identity else "this tool")
        return journal

    def admission_journal(self) -> Any:
        """The journal a protected call is admitted into, or :class:`Refusal`
        (a poisoned guard, a journal that cannot be opened).  Whether anything
        is open is then the admission's own question, under the writer lock."""
        if self.poisoned:
            raise Refusal("guard_poisoned", self.poisoned)
        try:
            return self.journal()
        except JournalError as exc:
            raise self.refusal_for(exc) from None

    def refusal_for(self, error: JournalError, tool_name: str = "this tool") -> Refusal:
        """The refusal for a journal error: open operations (admission's own
        ``unresolved_operations``) as :meth:`check` explains them, any other
        code as the journal's verdict (logged for the operator with its next
        step)."""
        if error.code == "unresolved_operations":
            views = settled_views(error.details["operations"], self._reader(None),
                                  self._journal.data_dir)
            return self._open_operations_refusal(views, tool_name)
        prefix = self.prefix()
        self.warn_once(f"journal:{error.code}", REFUSAL_LOG_INTERVAL_SECONDS,
                       "crash-recovery: the journal refuses protected calls (%s): %s; next: %s",
                       error.code, bounded(error.message),
                       next_command(prefix or (), next_step_of(error.to_json())) or "status")
        return Refusal(error.code, integrity_explanation(error, prefix))

    def _reader(self, identity: Optional[tuple]) -> Callable[[], tuple]:
        """Reads the open operations (verified), leaving out the one this
        context has admitted for exactly ``identity``; raises :class:`Refusal`
        when the journal fails."""
        def read() -> tuple:
            try:
                open_operations = self._journal.unresolved()
            except JournalError as exc:
                raise self.refusal_for(exc) from None
            self._check_open_operations(open_operations)
            binding = live_admission()
            if (identity is not None and binding is not None
                    and same_call(binding.identity, identity)):
                open_operations = tuple(operation for operation in open_operations
                                        if operation.operation_id != binding.operation_id)
            return open_operations
        return read

    def _open_operations_refusal(self, views: Sequence[dict],
                                 tool_name: str = "this tool") -> Refusal:
        """The refusal for open operations (:func:`settled_views`; none left:
        a call was in flight and has just ended): ``nested_call`` when the
        caller's own parent call is the one running, ``operation_in_flight``
        when another live call runs (wait), else ``unresolved_operations`` (a
        person must settle an unknown outcome)."""
        views = list(views)
        if not views:
            return Refusal("operation_in_flight", in_flight_explanation(tool_name, [],
                                                                        nested=False))
        running = [view for view in views
                   if view["state"] == "pending" and view["owner"] == OWNER_RUNNING]
        if running and len(running) == len(views):
            # Nested: this context is inside the running call (its admission is
            # visible, e.g. Hermes' execute_code bridge thread copies the
            # context), or this process was forked during it.  Siblings run in
            # fresh contexts: they wait.
            inside = live_admission() or inherited_admission()
            nested = inside is not None and running[0]["operation_id"] == inside.operation_id
            return Refusal("nested_call" if nested else "operation_in_flight",
                           in_flight_explanation(tool_name, running, nested=nested), running)
        unknown = [view for view in views if view not in running]
        for view in unknown:  # e.g. found pending after a restart: once per process
            self.note_unknown(view["operation_id"], view["tool"], view["state"])
        return Refusal("unresolved_operations",
                       unresolved_explanation(unknown, self.prefix()), unknown)

    def note_unknown(self, operation_id: str, tool: Any, state: str,
                     reason: Optional[str] = None) -> None:
        """The WARNING that an operation's outcome is unknown, once per
        operation and process (``reason``: why, when it became so here)."""
        self.warn_once(f"unknown:{operation_id}", None, "crash-recovery: operation %s (%s) is "
                       "%s%s: its outcome is unknown, and protected calls are refused until a "
                       "person settles it (see: %s)%s", operation_id, bounded(tool), state,
                       f" ({reason})" if reason else "",
                       command_line(self.prefix() or (), "show", operation_id),
                       self.mode_hint(tool))

    def refusal_while_closed(self, tool_name: Any, args: Any) -> Optional[str]:
        """For an unprotected call: None when it may run, or the blocked JSON
        when the gate is closed and the tool is not one that runs then, or is
        a file tool with an argument its command reads as an option
        (admission/closed_gate.py).  One verified read of the journal (none
        before a journal exists); never raises."""
        problem = None
        try:
            settings = self.settings()
            if runs_while_closed(tool_name, args, settings.runs_while_closed):
                problem = option_argument_problem(tool_name, args)
                if problem is None:
                    return None
            cause = self._closed_cause()
        except Exception as exc:  # fail closed on our own bugs too
            logger.exception("crash-recovery: the closed-gate check failed")
            settings = self.settings()
            cause = Refusal("internal_error", f"The crash-recovery guard failed "
                            f"({type(exc).__name__}). Tell the user an operator must check it.")
        if cause is None:
            return None
        tool = str(bounded(str(tool_name)))
        explanation = (while_closed_text(tool, cause.explanation, settings.while_closed())
                       if problem is None else
                       option_argument_explanation(tool, problem, cause.explanation))
        return self.blocked(Refusal(cause.code, explanation, cause.operations))

    def _closed_cause(self) -> Optional[Refusal]:
        """What closes the gate now (the refusal a protected call would get),
        or None while it is open or busy."""
        if self.poisoned:
            return Refusal("guard_poisoned", self.poisoned)
        if self._journal is None:
            try:
                directory: Optional[str] = self._directory()
            except JournalError:
                directory = None  # no data directory yet: nothing can be open
            if not journal_present(directory):
                return None
        try:
            journal = self.journal()
            read = self._reader(None)
            waiting = [view for view in settled_views(read(), read, journal.data_dir)
                       if operation_waits_for_a_person(view)]
        except Refusal as refusal:  # the journal failed (the reader says how)
            return None if keeps_gate_open(refusal.code) else refusal
        except JournalError as exc:
            return None if keeps_gate_open(exc.code) else self.refusal_for(exc)
        return self._open_operations_refusal(waiting) if waiting else None

    def refuse_unwrapped(self, identity: tuple) -> None:
        """Raise :class:`Refusal` ``middleware_not_run`` when the hook sees a
        protected call that the host's execution middleware is running right
        now without an admission of ours bound: our middleware did not wrap
        it (the host read its middleware list before this plugin had
        registered; docs/guard.md §The gate on every path).  Where the hook
        runs before the middleware (Hermes 0.19, and 0.20+'s
        ``model_tools.handle_function_call``) the host is not running that
        chain yet, and the middleware still decides."""
        binding = live_admission()
        if binding is not None and same_call(binding.identity, identity):
            return
        running = self._execution_chain_running
        if running is None or not running(identity):
            return
        logger.warning("crash-recovery: refused %s (session %s, call %s): the host ran it "
                       "without crash-recovery's middleware (its plugins were still loading "
                       "when the call began); nothing ran and nothing was journaled",
                       identity[0], identity[1], identity[2])
        raise Refusal("middleware_not_run", f"{identity[0]} was refused and not run: Hermes "
                      "started it before crash-recovery, which records protected calls before "
                      "they run, had finished loading. Nothing was run. Ask again in a moment; "
                      "do not retry automatically in a loop.")

    def blocked(self, refusal: Refusal) -> str:
        """The blocked JSON of ``refusal`` (docs/guard.md §Blocked result),
        logged at most once per code, operations and minute."""
        self.warn_once(f"refused:{refusal.code}:"
                       f"{','.join(op['operation_id'] for op in refusal.operations)}",
                       REFUSAL_LOG_INTERVAL_SECONDS, "crash-recovery: refused a protected call "
                       "(%s): %s", refusal.code, bounded(refusal.explanation))
        return blocked_result(refusal.code, refusal.explanation, prefix=self.prefix(),
                              operations=refusal.operations)

    def warn_once(self, key: str, interval: Optional[float], message: str, *args: Any) -> None:
        """Log a WARNING unless ``key`` was logged less than ``interval`` seconds
        ago (``0``/None: once per process)."""
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and (not interval or now - last < interval):
            return
        self._logged[key] = now
        logger.warning(message, *args)
