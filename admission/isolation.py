"""A host that gives the middleware no ``next_call`` it can call
(docs/guard.md §Isolation mode).

Hermes 0.22 with ``plugins.isolation: host`` runs third-party plugins in a
separate plugin-host process and hands their ``tool_execution`` middleware an
opaque placeholder instead of ``next_call`` (``hermes_cli/plugin_host.py``):
the middleware can neither run the tool nor journal a call before it runs.
Protected calls are then refused, naming the setting and what to do; an
unprotected call must still run untouched, and the only way a middleware can
let it through there is to raise, which makes the host skip this middleware
and run the rest of its chain (``hermes_cli/middleware.py``,
``_run_execution_chain``).
"""
from __future__ import annotations

ISOLATION_SETTING = "plugins.isolation"
ISOLATION_HOST = "host"
# What ``status`` says once the host has called the middleware without next_call.
ISOLATION_PROBLEM = (f"The host runs plugins in a separate process ({ISOLATION_SETTING}: "
                     f"{ISOLATION_HOST}) and gives the middleware no next_call: every protected "
                     "call is refused (isolation mode cannot be protected). Set "
                     f"{ISOLATION_SETTING}: in_process in config.yaml and restart to protect "
                     "calls; unprotected tools run.")


class NoDownstream(Exception):
    """Raised only for an unprotected call when the host passed no callable
    ``next_call``: the host then skips this middleware and runs the tool.
    The message is the same for every tool, so the host logs it once."""

    def __init__(self) -> None:
        super().__init__("crash-recovery: the host passed no callable next_call "
                         f"({ISOLATION_SETTING}: {ISOLATION_HOST}?); unprotected tools are left "
                         "to the host, protected ones are refused")


def isolation_explanation(tool_name: str) -> str:
    """What a model (and the operator) is told when a protected call is refused
    because the middleware got no ``next_call``."""
    return (f"{tool_name} is protected by crash-recovery, but this Hermes runs plugins in a "
            f"separate process ({ISOLATION_SETTING}: {ISOLATION_HOST}), where crash-recovery "
            "cannot record a call before it runs, so it was refused and not run. Tell the user: "
            f"to protect calls, set {ISOLATION_SETTING}: in_process (the default) in the "
            "profile's config.yaml and restart Hermes; isolation mode cannot be protected.")
