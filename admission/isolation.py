"""A host that gives the middleware no ``next_call`` it can call
(docs/guard.md §Isolation mode).

Hermes 0.22 with ``plugins.isolation: host`` hands a plugin's middleware an
opaque placeholder instead of ``next_call`` (``hermes_cli/plugin_host.py``), so
nothing can be journaled before it runs: protected calls are refused.  An
unprotected call is let through by raising, which makes the host skip this
middleware (``hermes_cli/middleware.py``, ``_run_execution_chain``).
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
    """Raised for an unprotected call without a callable ``next_call`` (the
    host then runs the tool); one message for every tool, logged once."""

    def __init__(self) -> None:
        super().__init__("crash-recovery: the host passed no callable next_call "
                         f"({ISOLATION_SETTING}: {ISOLATION_HOST}?); unprotected tools are left "
                         "to the host, protected ones are refused")


def isolation_explanation(tool_name: str) -> str:
    """What the model is told of a protected call refused for lack of ``next_call``."""
    return (f"{tool_name} is protected by crash-recovery, but this Hermes runs plugins in a "
            f"separate process ({ISOLATION_SETTING}: {ISOLATION_HOST}), where crash-recovery "
            "cannot record a call before it runs, so it was refused and not run. Tell the user: "
            f"to protect calls, set {ISOLATION_SETTING}: in_process (the default) in the "
            "profile's config.yaml and restart Hermes; isolation mode cannot be protected.")
