"""A server the tests start (``hermes dashboard``, Chromium) that announces on
one of its pipes when it is ready: its own process group, the announced line
read as it arrives, and an end that touches that group only.
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from typing import Optional, TextIO

# Bounds on waiting; reaching one is a failure, never a pass.
ANNOUNCE_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 30


class AnnouncingProcess:
    """``argv`` in a new process group; ``announces_on`` is ``"stdout"`` or
    ``"stderr"`` (the other goes to ``log``, or nowhere); every line read from
    the announcing pipe is copied to ``log`` too."""

    def __init__(self, argv: list, announces_on: str, env: Optional[dict] = None,
                 log: Optional[TextIO] = None):
        sink = log if log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(
            argv, env=env, text=True, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if announces_on == "stdout" else sink,
            stderr=subprocess.PIPE if announces_on == "stderr" else sink)
        self._stream = getattr(self.process, announces_on)
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump() -> None:
            for line in self._stream:
                if log is not None:
                    log.write(line)
                    log.flush()
                self._lines.put(line)
            self._lines.put(None)

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()

    def announced(self, prefix: str) -> Optional[str]:
        """The rest of the first line starting with ``prefix``, or None if the
        process ended (or stayed silent past the bound) without it."""
        while True:
            try:
                line = self._lines.get(timeout=ANNOUNCE_TIMEOUT_SECONDS)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL if it lingers; close the pipe."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._pump.join(timeout=STOP_TIMEOUT_SECONDS)  # it ends at the pipe's end
        self._stream.close()
