"""Orders a forced plugin discovery against tool calls, deterministically
(tests/host/check_discovery_race.py).  Its ``tool_execution`` middleware is
the outermost (its name sorts first) and only waits and signals; it never
changes a call:

* on ``read_file`` (the turn before the protected call): start Hermes' own
  ``discover_plugins(force=True)`` (what a plugin reload runs in a live
  gateway) on a thread, and return once that discovery is inside the slow
  plugin's registration (crash-recovery, loaded after it, is not registered);
* on the first ``book_trip``: the host has read its middleware list already
  (this probe only); create ``$DISCOVERY_RELEASE`` and wait for the discovery
  thread to end (crash-recovery registered again), then run the rest of the
  call -- its ``pre_tool_call`` hooks, now crash-recovery's among them.

Each step is appended to ``$RACE_PROBE_LOG`` as a JSON line.
"""
from __future__ import annotations

import json
import os
import threading
import time

RELOAD_THREAD = "forced-plugin-discovery"
# The reload re-imports this module: what must survive it lives in files and
# in the thread's name, never in module globals.


def _log(**entry) -> None:
    with open(os.environ["RACE_PROBE_LOG"], "a", encoding="utf-8") as stream:
        stream.write(json.dumps(entry, sort_keys=True) + "\n")


def _wait_for(path: str) -> bool:
    for _ in range(2400):
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def _reload_thread():
    return next((thread for thread in threading.enumerate() if thread.name == RELOAD_THREAD),
                None)


def tool_execution(tool_name=None, args=None, next_call=None, **kwargs):
    """See the module docstring."""
    started = os.environ["RACE_PROBE_LOG"] + ".reload"
    released = os.environ["RACE_PROBE_LOG"] + ".released"
    if tool_name == "read_file" and not os.path.exists(started):
        open(started, "w").close()
        from hermes_cli.plugins import discover_plugins
        if os.path.exists(os.environ["DISCOVERY_ENTERED"]):
            os.unlink(os.environ["DISCOVERY_ENTERED"])  # left by the start-up discovery
        threading.Thread(target=discover_plugins, kwargs={"force": True}, name=RELOAD_THREAD,
                         daemon=True).start()
        _log(step="reload_started", entered=_wait_for(os.environ["DISCOVERY_ENTERED"]))
    elif tool_name == "book_trip" and os.path.exists(started) and not os.path.exists(released):
        open(released, "w").close()
        reload = _reload_thread()
        with open(os.environ["DISCOVERY_RELEASE"], "w", encoding="utf-8") as stream:
            stream.write("go")
        if reload is not None:
            reload.join(120)
        _log(step="released_inside_the_call", call=kwargs.get("tool_call_id"),
             reload_done=reload is not None and not reload.is_alive())
    return next_call()


def register(ctx) -> None:
    """Register the middleware."""
    ctx.register_middleware("tool_execution", tool_execution)
