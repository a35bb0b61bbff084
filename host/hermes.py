"""What crash-recovery needs from its Hermes host (docs/guard.md §Inside Hermes):
the data directory, the settings, the profile's command line, ``/crash-recovery``.
Hermes is imported lazily inside the functions (never in ``register(ctx)``):
outside Hermes they raise ``ImportError``, which the callers turn into a refusal.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from ..admission.settings import KNOWN_KEYS
from ..reports.chat import chat_error
from ..reports.messages import (bounded, command_line, describe_age, hermes_prefix,
                                next_command, reach_warning, status_next_step)
from ..reports.status import GATE_CLOSED, check_reasons, operation_waits_for_a_person
from ..storage.errors import JournalError
from .program import host_program

PLUGIN_NAME = "crash-recovery"


def resolve_data_dir() -> Path:
    """The profile's data directory: ``plugins.plugin_storage.plugin_data_dir``
    (Hermes >= 0.20), else ``<get_hermes_home()>/plugin-data/crash-recovery``
    (follows ``HERMES_HOME`` and ``-p``).  Raises ``ImportError`` outside Hermes."""
    try:
        from plugins.plugin_storage import plugin_data_dir  # type: ignore[import-not-found]
    except ImportError:
        from hermes_constants import get_hermes_home  # type: ignore[import-not-found]
        return data_dir_of_home(get_hermes_home())
    return Path(plugin_data_dir(PLUGIN_NAME))


def settings_reader(ctx: Any) -> Callable[[], Optional[dict]]:
    """A zero-argument reader of the raw settings mapping (None: nothing set),
    the same on every host (docs/guard.md §Settings, "The same on every host").
    ``config.yaml`` via Hermes' loader gives the whole mapping (a typo is seen);
    ``settings`` wins whole over the legacy ``config`` subtree (0.20+'s key-by-key
    fallbacks are dropped); known keys' values come from ``ctx.get_config``
    where it exists, which expands ``${VAR}`` (0.20+)."""
    get_config: Optional[Callable] = getattr(ctx, "get_config", None)

    def read() -> Optional[dict]:
        settings, legacy = _settings_from_config_file()
        found = settings if settings is not None else legacy
        if not callable(get_config) or not (found is None or isinstance(found, dict)):
            return found  # a subtree that is not a mapping is itself the problem shown
        for key in KNOWN_KEYS:
            value = get_config(key, None)
            from_legacy = (settings is not None and key not in settings
                           and isinstance(legacy, dict) and key in legacy)
            if value is not None and not from_legacy:
                found = {**(found or {}), key: value}
        return found

    return read


def _settings_from_config_file() -> tuple:
    """The ``(settings, config)`` subtrees of ``plugins.entries.crash-recovery`` (None: absent)."""
    try:
        from hermes_cli.config import read_raw_config  # type: ignore[import-not-found]
    except ImportError:
        return None, None
    config = read_raw_config() or {}
    plugins = config.get("plugins") if isinstance(config, dict) else None
    entries = plugins.get("entries") if isinstance(plugins, dict) else None
    entry = entries.get(PLUGIN_NAME) if isinstance(entries, dict) else None
    if not isinstance(entry, dict):
        return None, None
    return entry.get("settings"), entry.get("config")


# The PluginContext Hermes handed to register(): its documented ``profile_name``
# is read at each use (it follows HERMES_HOME and `-p`), never at registration.
_HOST_CONTEXT: list = []


def use_host_context(ctx: Any) -> None:
    """Remember the host's PluginContext for :func:`profile_name` (touches no attribute)."""
    _HOST_CONTEXT[:] = [ctx]


def profile_name() -> Optional[str]:
    """The active profile's name from ``ctx.profile_name``; without a host
    context, that of ``$HERMES_HOME`` (:func:`profile_of_home`), else None."""
    name = getattr(_HOST_CONTEXT[0], "profile_name", None) if _HOST_CONTEXT else None
    if isinstance(name, str) and name:
        return name
    home = os.environ.get("HERMES_HOME")
    return profile_of_home(home) if home else None


def profile_of_home(home: Any) -> str:
    """The profile a Hermes home directory is: NAME for ``.../profiles/NAME``,
    ``default`` for ``~/.hermes``, else ``custom`` (its commands then need that
    ``HERMES_HOME``)."""
    home = Path(home)
    if home.parent.name == "profiles":
        return home.name
    default = Path(os.path.expanduser("~")) / ".hermes"
    return "default" if os.path.realpath(home) == os.path.realpath(default) else "custom"


# Hermes writes its config.yaml into every home it makes (``hermes profile
# create``, the first run): a directory holding one is a Hermes home.
HOME_CONFIG_NAME = "config.yaml"


def is_hermes_home(path: Any) -> bool:
    """Whether ``path`` is a Hermes home (a directory holding ``config.yaml``)."""
    return os.path.isfile(os.path.join(os.fspath(path), HOME_CONFIG_NAME))


def data_dir_of_home(home: Any) -> Path:
    """The crash-recovery data directory of the Hermes home ``home``
    (``<home>/plugin-data/crash-recovery``, as :func:`resolve_data_dir`)."""
    return Path(home) / "plugin-data" / PLUGIN_NAME


def home_of_data_dir(data_dir: Any) -> Optional[Path]:
    """The Hermes home whose data directory ``data_dir`` is, or None (a typo, a file)."""
    path = Path(os.path.abspath(os.fspath(data_dir)))
    home = path.parent.parent
    if path.name == PLUGIN_NAME and path.parent.name == "plugin-data" and is_hermes_home(home):
        return home
    return None


def nearest_profile_data_dir(path: Any, default_home: Any) -> Optional[Path]:
    """The data directory a person most likely meant instead of ``path``: the
    nearest Hermes home's above it, else ``default_home``'s; None when neither
    is a home, or the answer is ``path`` itself."""
    path = Path(os.path.abspath(os.fspath(path)))
    for candidate in (*path.parents, Path(os.path.abspath(os.fspath(default_home)))):
        if is_hermes_home(candidate) and data_dir_of_home(candidate) != path:
            return data_dir_of_home(candidate)
    return None


def command_prefix() -> tuple:
    """``PROGRAM [-p PROFILE] crash-recovery`` for this profile (no paths: safe
    for a chat); PROGRAM from :func:`host.program.host_program`."""
    return hermes_prefix(profile_name(), host_program())


def registered_tool_names(load: bool = False) -> Optional[list]:
    """Every tool name in ``tools.registry.registry``, or None when unreachable.
    ``load``: first ``discover_builtin_tools()`` (an operator command's process
    has only the plugins' tools until then).  Only the documented
    ``tools.registry``, so ``hermes plugins validate`` names no private import."""
    try:
        from tools.registry import registry  # type: ignore[import-not-found]
        if load:
            from tools.registry import discover_builtin_tools  # type: ignore[import-not-found]
            discover_builtin_tools()
        return list(registry.get_all_tool_names())
    except Exception:  # any Hermes without this public registry: "unknown"
        return None


# Where Hermes runs a tool call through the tool_execution middleware: the same
# function in 0.19.0, 0.20.1 and 0.22.2, ``run_tool_execution_middleware(
# tool_name, args, next_call, **context)`` with the call's id in ``context``.
EXECUTION_RUNNER_MODULE = "hermes_cli.middleware"
EXECUTION_RUNNER = "run_tool_execution_middleware"


def execution_chain_running(identity: tuple) -> bool:
    """Whether a frame of :data:`EXECUTION_RUNNER` in any thread runs the call
    ``identity`` (``(tool_name, session_id, tool_call_id, ...)``) now
    (docs/guard.md §Inside Hermes, "The gate on every path"): 0.20+ runs
    ``pre_tool_call`` hooks inside its ``next_call`` (0.22 on a ``hermes-hook-*``
    thread), so a hook that finds it without our admission knows our middleware
    did not wrap the call; where the hook runs first (0.19, 0.20+'s
    ``handle_function_call``) it has not started.  False without a tool-call id
    or outside Hermes; never raises."""
    try:
        tool_name, tool_call_id = identity[0], identity[2]
        module = sys.modules.get(EXECUTION_RUNNER_MODULE)
        code = getattr(getattr(module, EXECUTION_RUNNER, None), "__code__", None)
        if not tool_call_id or code is None:
            return False
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code is code:
                    local = frame.f_locals
                    context = local.get("context")
                    if (local.get("tool_name") == tool_name and isinstance(context, dict)
                            and context.get("tool_call_id") == tool_call_id):
                        return True
                frame = frame.f_back
    except Exception:
        return False
    return False


def slash_command(status_report: Callable[[], dict]) -> Callable[[str], str]:
    """The ``/crash-recovery`` handler: a read-only summary of ``status_report()``."""
    def handle(raw_args: str = "") -> str:
        try:
            return summary_text(status_report(), command_prefix())
        except (Exception, JournalError) as exc:  # a slash command must answer, not raise
            return f"crash-recovery: status unavailable ({type(exc).__name__}: {exc})"
    return handle


# Reasons of `status --check` that the headline of /crash-recovery already says.
SAID_ABOVE = frozenset(("guard_poisoned", "isolation_unsupported", "unresolved_operations"))


def summary_text(status: dict, prefix: tuple) -> str:
    """The ``/crash-recovery`` text: the gate, each open operation and the
    command that settles it, the other ``status --check`` reasons (an open gate
    is never called calm while one remains), forced calls still running."""
    lines = []
    reasons = check_reasons(status)
    error = status.get("error") or {}
    worker_problem = status.get("poisoned") or status.get("isolation_problem")
    if worker_problem and not error.get("code"):
        # This worker refuses, not the journal: its own sentence says what to do.
        lines.append(f"crash-recovery: gate CLOSED in this worker -- {bounded(worker_problem)}")
        lines.append(f"The profile's journal: {command_line(prefix, 'status')}")
    elif not status.get("ok"):
        # A chat gets the sentence for the code; the detail names files and paths.
        why = chat_error(error)["message"] if error.get("code") else "unknown"
        lines.append(f"crash-recovery: gate CLOSED -- the journal cannot be used "
                     f"({status.get('integrity')}: {why})")
        lines.append(f"Inspect: {command_line(prefix, 'verify')}")
        step = next_command(prefix, status_next_step(status))
        if step:
            lines.append(f"Then, with every worker stopped: {step}")
    elif status.get("gate") == GATE_CLOSED:
        waiting = [operation for operation in status.get("unresolved") or []
                   if operation_waits_for_a_person(operation)]
        lines.append(f"crash-recovery: gate CLOSED -- {len(waiting)} protected "
                     "call(s) with an unknown outcome block every protected tool in this profile:")
        for operation in waiting:
            worker = {"running": f"its worker still runs (pid {operation.get('owner_pid')})",
                      "gone": "its worker is gone"}.get(operation.get("owner"), "worker unknown")
            reason = f", {operation['reason']}" if operation.get("reason") else ""
            lines.append(f"- {operation['operation_id']} {operation['tool']}: "
                         f"{operation['state']}{reason}, started "
                         f"{describe_age(operation['age_seconds'])} ago, {worker}")
            lines.append("  settle it: " + command_line(
                prefix, "resolve", operation["operation_id"], "--outcome",
                "<completed|not_applied>", "--evidence", "<what you checked>"))
    else:
        state = "busy (a protected call is running)" if status.get("gate") == "busy" else "open"
        count = (status.get("checkpoint") or {}).get("count", 0)
        lines.append(f"crash-recovery: gate {state}, but something NEEDS A PERSON:" if reasons
                     else f"crash-recovery: gate {state} -- nothing unresolved; the journal "
                          f"verified ({count} events).")
    # What else needs a person, in the words of `status --check` (the branch
    # above said the journal's verdict and the unknown outcomes already).
    for reason in reasons:
        if reason["code"] not in SAID_ABOVE and reason["code"] != error.get("code"):
            lines.append(f"! {reason['code']}: {bounded(reason['message'])}")
    for operation in status.get("attention") or []:
        lines.append(f"  acknowledge {operation['operation_id']}: " + command_line(
            prefix, "acknowledge", operation["operation_id"], "--evidence", "<what you did>"))
    running = status.get("resolved_running") or []
    if running:
        lines.append(f"{len(running)} call(s) resolved with force still run (pid "
                     f"{', '.join(str(entry.get('pid')) for entry in running)}): a late outcome "
                     "may still arrive, and archive waits for them.")
    reach = reach_warning((status.get("settings") or {}).get("agent_reaches_journal") or [])
    if reach:
        lines.append(f"! {reach}")
    lines.append("This command only reports; it never resolves anything. Settling an outcome "
                 "needs a person who has stopped the workers and checked the real service.")
    return "\n".join(lines)
