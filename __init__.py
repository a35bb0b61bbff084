"""crash-recovery: a Hermes Agent plugin that journals protected tool calls before
they run and refuses further ones while an earlier outcome is unknown.

``register(ctx)`` (docs/guard.md §Inside Hermes) only calls ``ctx.register_*``
and reads nothing: the data directory, the settings and the journal are
resolved at the first tool call, so registration works against Hermes'
validation stub and never touches the profile.
"""
from __future__ import annotations

from typing import Any

from .guard import RecoveryGuard
from .host import hermes
from .operator_cli import hermes_command_handler, setup_hermes_command

PLUGIN_NAME = hermes.PLUGIN_NAME
TOOLSET = "crash_recovery"
COMMAND_NAME = "crash-recovery"

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


def register(ctx: Any) -> None:
    """Hermes entry point: the ``tool_execution`` middleware, the
    ``pre_tool_call`` and ``post_tool_call`` hooks, the two read-only
    inspection tools, and -- where the host has them -- ``hermes
    crash-recovery ...`` and ``/crash-recovery``."""
    hermes.use_host_context(ctx)
    settings = hermes.settings_reader(ctx)
    guard = RecoveryGuard(hermes.resolve_data_dir, settings=settings,
                          command_prefix=hermes.command_prefix,
                          registered_tools=hermes.registered_tool_names,
                          execution_chain_running=hermes.execution_chain_running)
    ctx.register_middleware("tool_execution", guard.tool_execution)
    ctx.register_hook("pre_tool_call", guard.pre_tool_call)
    ctx.register_hook("post_tool_call", guard.post_tool_call)
    for schema, handler in ((STATUS_SCHEMA, guard.status_tool), (VERIFY_SCHEMA, guard.verify_tool)):
        ctx.register_tool(name=schema["name"], toolset=TOOLSET, schema=schema, handler=handler,
                          description=schema["description"])
    register_cli_command = getattr(ctx, "register_cli_command", None)
    if callable(register_cli_command):
        register_cli_command(COMMAND_NAME, "Inspect and settle the crash-recovery journal",
                             setup_hermes_command,
                             hermes_command_handler(hermes.resolve_data_dir, hermes.command_prefix,
                                                    settings, lambda: hermes.registered_tool_names(
                                                        load=True)),
                             description="Inspect and settle this profile's journal: status, "
                                         "show, resolve, ... (--help lists them), on the active "
                                         "profile's data directory (respects -p / HERMES_HOME).")
    register_command = getattr(ctx, "register_command", None)
    if callable(register_command):
        register_command(COMMAND_NAME, hermes.slash_command(guard.status_report),
                         description="crash-recovery status: gate, unresolved operations, the "
                                     "command that settles each (read-only)")
