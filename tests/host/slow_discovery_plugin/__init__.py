"""A plugin whose registration waits on a file the test releases
(tests/host/check_discovery_race.py): while it waits, the host's plugin
discovery is still running, and every plugin after it (crash-recovery, by
name) is not registered yet.

``$DISCOVERY_ENTERED`` is created when ``register`` starts; ``register``
returns once ``$DISCOVERY_RELEASE`` exists (at most 120 s).  Registers nothing.
"""
from __future__ import annotations

import os
import time


def register(ctx) -> None:
    """Announce the wait, then wait for the release file."""
    entered, release = os.environ.get("DISCOVERY_ENTERED"), os.environ.get("DISCOVERY_RELEASE")
    if not entered or not release:
        return
    with open(entered, "a", encoding="utf-8") as stream:
        stream.write(f"{os.getpid()}\n")
    for _ in range(2400):
        if os.path.exists(release):
            os.unlink(release)  # each discovery waits for a release of its own
            return
        time.sleep(0.05)
