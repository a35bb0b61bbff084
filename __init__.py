"""crash-recovery: a Hermes Agent plugin that journals protected tool calls before
they run and refuses further ones while an earlier outcome is unknown.

``register(ctx)`` (docs/guard.md §Inside Hermes) only calls ``ctx.register_*`` (and reads nothing from
disk): the data directory, the settings and the journal are resolved at the
first tool call, so registration works against Hermes' validation stub and
never touches the profile.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from .guard import RecoveryGuard

PLUGIN_NAME = "crash-recovery"
SETTINGS_KEY = "read_only_tools"
TOOLSET = "crash_recovery"

STATUS_SCHEMA = {
    "name": "crash_recovery_status",
    "description": ("Show whether the crash-recovery journal verifies and which protected tool "
                    "calls have an unknown outcome (they block further protected calls until a "
                    "person settles them). Read-only."),
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}
VERIFY_SCHEMA = {
    "name": "crash_recovery_verify",
    "description": ("Fully verify the crash-recovery journal's hash chain and checkpoint; "
                    "optionally check that an external checkpoint is an ancestor. Read-only."),
    "parameters": {
        "type": "object",
        "properties": {"checkpoint": {
            "type": "object",
            "description": "An exported checkpoint {schema, journal_id, count, head}."}},
        "additionalProperties": False,
    },
}


def resolve_data_dir() -> Path:
    """The profile's data directory (docs/guard.md §Inside Hermes): the host's
    ``plugins.plugin_storage.plugin_data_dir`` where it exists (Hermes >= 0.20),
    else ``<HERMES_HOME>/plugin-data/crash-recovery`` from ``get_hermes_home()``.
    Raises ``ImportError`` outside Hermes."""
    try:
        from plugins.plugin_storage import plugin_data_dir  # type: ignore[import-not-found]
    except ImportError:
        from hermes_constants import get_hermes_home  # type: ignore[import-not-found]
        return Path(get_hermes_home()) / "plugin-data" / PLUGIN_NAME
    return Path(plugin_data_dir(PLUGIN_NAME))


def settings_reader(ctx: Any) -> Callable[[], Any]:
    """A zero-argument reader of ``read_only_tools`` (docs/guard.md §Settings, §Inside Hermes): through
    ``ctx.get_config`` where the host has it, else from the profile's
    ``config.yaml`` via the host's raw config loader.  None means "not set"."""
    get_config: Optional[Callable] = getattr(ctx, "get_config", None)

    def read() -> Any:
        if callable(get_config):
            return get_config(SETTINGS_KEY, None)
        from hermes_cli.config import read_raw_config  # type: ignore[import-not-found]
        config = read_raw_config() or {}
        entry = (((config.get("plugins") or {}).get("entries") or {}).get(PLUGIN_NAME) or {})
        for subtree in ("settings", "config"):  # "config" is the legacy spelling
            section = entry.get(subtree)
            if isinstance(section, dict) and SETTINGS_KEY in section:
                return section[SETTINGS_KEY]
        return None

    return read


def register(ctx: Any) -> None:
    """Hermes entry point: the ``tool_execution`` middleware, the
    ``pre_tool_call`` hook and the two read-only inspection tools (docs/guard.md §Inside Hermes, §Inspection tools)."""
    guard = RecoveryGuard(resolve_data_dir, read_only_tools=settings_reader(ctx))
    ctx.register_middleware("tool_execution", guard.tool_execution)
    ctx.register_hook("pre_tool_call", guard.pre_tool_call)
    for schema, handler in ((STATUS_SCHEMA, guard.status_tool), (VERIFY_SCHEMA, guard.verify_tool)):
        ctx.register_tool(name=schema["name"], toolset=TOOLSET, schema=schema, handler=handler,
                          description=schema["description"])
