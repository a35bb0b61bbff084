"""Shared support of the dashboard tests: a Hermes home with the plugin
installed as a copied directory and enabled, the real ``hermes dashboard`` on
127.0.0.1, HTTP with and without the session token, and real protected calls
in worker processes (tests/dashboard_worker.py).

The dashboard is the one installed beside the interpreter running the tests
(``hermes`` for 0.19.0, ``hermesx`` for 0.20.1): run the tests with each
host's Python, e.g. ``/work/venvs/h020/bin/python -m unittest
tests.test_dashboard_api``.  Without it the tests skip with the reason, unless
``CRASH_RECOVERY_REQUIRE_HOST=1``.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

from announcing_process import AnnouncingProcess
from support import REPO, TESTS

DASHBOARD_PROGRAMS = ("hermes", "hermesx")
# What a plugin directory installed by copying leaves out: tests, benchmarks,
# caches and, at the top only, pip's build output (dashboard/dist is the page).
NOT_COPIED = shutil.ignore_patterns(".git", "tests", "bench", "__pycache__", "*.pyc", ".venv*",
                                    "cr-demo*", "*.egg-info")
NOT_COPIED_AT_TOP = {"build", "dist"}


def _not_installed(folder: str, names: list) -> set:
    ignored = set(NOT_COPIED(folder, names))
    if os.path.abspath(folder) == REPO:
        ignored |= NOT_COPIED_AT_TOP & set(names)
    return ignored
REQUIRE_HOST = os.environ.get("CRASH_RECOVERY_REQUIRE_HOST", "") == "1"
# A bound on waiting for a worker; reaching it is a failure, never a pass.
WORKER_TIMEOUT_SECONDS = 60
WORKER = os.path.join(TESTS, "dashboard_worker.py")


def dashboard_program() -> tuple:
    """``(path of the host's dashboard program, None)`` or ``(None, reason)``."""
    try:
        import hermes_cli  # noqa: F401
    except ImportError as exc:
        return None, f"Hermes is not importable from {sys.executable} ({exc})"
    folder = os.path.dirname(sys.executable)
    for name in DASHBOARD_PROGRAMS:
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path, None
    return None, f"no {' or '.join(DASHBOARD_PROGRAMS)} program beside {sys.executable}"


def has_web_ui() -> bool:
    """Whether the installed host ships its built web UI (0.19.0 does)."""
    import hermes_cli
    return os.path.isfile(os.path.join(os.path.dirname(hermes_cli.__file__), "web_dist",
                                       "index.html"))


def hermes_version() -> str:
    """The installed host's version, e.g. ``0.19.0``."""
    import hermes_cli
    return str(getattr(hermes_cli, "__version__", "unknown"))


# The dashboard serves the profile of its process: `hermes dashboard` the
# default one (a named profile's launch re-routes to it unless --isolated).
PROFILE = "default"


def make_home(root: str, profile: str = "default", settings: str = "") -> str:
    """The home of ``profile`` of a user whose home directory is ``root``
    (``ROOT/.hermes``, or ``ROOT/.hermes/profiles/NAME``), with crash-recovery
    copied into its ``plugins/crash-recovery`` and enabled, ``settings`` (one
    YAML line) as its settings; returns the Hermes home."""
    home = os.path.join(root, ".hermes")
    if profile != "default":
        os.makedirs(home, exist_ok=True)
        home = os.path.join(home, "profiles", profile)
    shutil.copytree(REPO, os.path.join(home, "plugins", "crash-recovery"), ignore=_not_installed)
    with open(os.path.join(home, "config.yaml"), "w", encoding="utf-8") as stream:
        stream.write("plugins:\n  enabled:\n    - crash-recovery\n")
        if settings:
            stream.write(f"  entries:\n    crash-recovery:\n      settings:\n        {settings}\n")
    return home


def command_prefix(program: str) -> str:
    """How the profile's operator commands are run with the host's program."""
    return f"{os.path.basename(program)} -p {PROFILE} crash-recovery"


def data_dir_of(home: str) -> str:
    """The profile's crash-recovery data directory (both hosts)."""
    return os.path.join(home, "plugin-data", "crash-recovery")


class Dashboard:
    """A real ``hermes dashboard --skip-build --no-open`` on 127.0.0.1 for the
    profile at ``home`` (``HOME`` is ``user_home``, by default its parent), on
    a port the OS picks; ``isolated``: its own server, as ``hermes -p NAME
    dashboard --isolated`` starts for a named profile (without it Hermes
    routes a named profile to the default profile's dashboard);
    :meth:`stop` ends it (and only it)."""

    def __init__(self, program: str, home: str, log_path: str, user_home: str = "",
                 isolated: bool = False):
        self.token = secrets.token_urlsafe(24)
        env = dict(os.environ, HOME=user_home or os.path.dirname(home), HERMES_HOME=home,
                   HERMES_DASHBOARD_SESSION_TOKEN=self.token, NO_COLOR="1", PYTHONUNBUFFERED="1")
        if not has_web_ui():
            # 0.20.1's wheel has no built web UI and `--skip-build` then refuses
            # to start; a placeholder page lets the real server serve its API.
            placeholder = os.path.join(os.path.dirname(log_path), "web_dist")
            os.makedirs(os.path.join(placeholder, "assets"), exist_ok=True)
            with open(os.path.join(placeholder, "index.html"), "w", encoding="utf-8") as stream:
                stream.write("<!doctype html><title>no web UI in this wheel</title>")
            env["HERMES_WEB_DIST"] = placeholder
        self._log = open(log_path, "w", encoding="utf-8")
        self.server = AnnouncingProcess(
            [program, "dashboard", "--skip-build", "--no-open", "--host", "127.0.0.1",
             "--port", "0", *(["--isolated"] if isolated else [])], "stdout", env=env,
            log=self._log)
        self.process = self.server.process
        port = self.server.announced("HERMES_DASHBOARD_READY port=")
        if port is None:
            self.stop()
            with open(log_path, encoding="utf-8", errors="replace") as stream:
                raise RuntimeError("hermes dashboard did not start:\n" + stream.read()[-2000:])
        self.port = int(port)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """End the dashboard's process group (only it)."""
        self.server.stop()
        self._log.close()

    def request(self, method: str, path: str, body=None, *, token: bool = True,
                content_type: str = "application/json", raw: bytes = None,
                headers: dict = None) -> tuple:
        """``(HTTP status, parsed JSON or text, headers)`` of one request to
        ``/api/plugins/crash-recovery`` + ``path`` (or ``path`` itself when it
        starts with ``/api/`` or is ``/``), with any extra ``headers`` (as a
        browser's ``Origin``)."""
        url = self.url + (path if path.startswith(("/api/", "/dashboard-plugins/")) or path == "/"
                          else "/api/plugins/crash-recovery" + path)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        if token:
            request.add_header("X-Hermes-Session-Token", self.token)
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                status, text, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, text, headers = error.code, error.read(), error.headers
        try:
            return status, json.loads(text), headers
        except ValueError:
            return status, text.decode("utf-8", "replace"), headers


def run_worker(mode: str, data_dir: str, tool: str, call_id: str) -> dict:
    """Run one protected call to its end; returns the worker's last JSON line."""
    completed = subprocess.run([sys.executable, WORKER, mode, data_dir, tool, call_id],
                               capture_output=True, text=True, timeout=WORKER_TIMEOUT_SECONDS)
    if completed.returncode != 0:
        raise RuntimeError(f"worker failed: {completed.stderr}")
    return json.loads(completed.stdout.splitlines()[-1])


class HeldCall:
    """A protected call whose tool is running (``self.operation_id``) until
    :meth:`finish` or :meth:`kill`."""

    def __init__(self, data_dir: str, tool: str, call_id: str):
        self.process = subprocess.Popen([sys.executable, WORKER, "hold", data_dir, tool, call_id],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()  # printed inside the tool, after `started` committed
        if not line:
            self.process.wait()
            raise RuntimeError("the held call never reached its tool")
        self.operation_id = str(uuid.UUID(json.loads(line)["in_tool"]))

    def kill(self) -> None:
        """SIGKILL mid-call: the operation stays `pending`, its owner gone."""
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()
        self.process.stdin.close()

    def finish(self) -> dict:
        """Let the tool return; the worker records the outcome and exits."""
        output, _ = self.process.communicate("done\n", timeout=WORKER_TIMEOUT_SECONDS)
        return json.loads(output.splitlines()[-1])
