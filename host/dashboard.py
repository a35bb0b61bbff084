"""The crash-recovery page of the Hermes dashboard (docs/dashboard.md): each
route of ``dashboard/plugin_api.py`` is one call here, answered with the
operator command's own document (docs/cli.md) plus who acted and the profile.
One lock serialises this process's journal access, so a slow verification
never interleaves with a resolution.  Standard library only.
"""
from __future__ import annotations

import argparse
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Optional

from ..admission.registered_tools import operator_settings_view, workers_running
from ..reconciliation.caller import VIA_DASHBOARD, peer_caller, this_process
from ..reconciliation.commands import command_log, run_command
from ..reports.messages import hermes_prefix, next_command, next_step_of, status_next_step
from ..reports.status import (GATE_CLOSED, absent_journal_status, check_view,
                              note_platform_problem)
from ..storage import archive
from . import hermes
from .program import host_program

# HTTP status of a refused request, by error code (docs/dashboard.md §Routes);
# every other refusal and every integrity verdict is 409.
BAD_REQUEST_CODES = frozenset({"usage", "invalid_evidence", "invalid_operation_id"})
NOT_FOUND_CODES = frozenset({"unknown_operation"})
# Refused for who sent it (docs/dashboard.md §Who may settle).
FORBIDDEN_CODES = frozenset({"run_by_agent", "foreign_origin"})
OUTCOMES = ("completed", "not_applied")
# What a request body may hold, per writing command.
RESOLVE_FIELDS = {"outcome", "evidence", "force"}
ACKNOWLEDGE_FIELDS = {"evidence"}
# Dashboard users are shown, not trusted: bounded so a provider's odd profile
# cannot bloat every journal event.
IDENTITY_FIELD_MAX_CHARS = 256

_HTTP_STATUSES = ((BAD_REQUEST_CODES, 400), (FORBIDDEN_CODES, 403), (NOT_FOUND_CODES, 404))

_JOURNAL_ACCESS = threading.Lock()

# The page's own words for refusals whose CLI hint names command-line options
# (the page has a checkbox and buttons, not --force): docs/dashboard.md.
PAGE_HINTS = {
    "owner_running": "the call's worker still runs: stop it, or wait for the call to finish. "
                     "Tick \"force\" only when you know that worker can no longer act (it "
                     "hangs on a dead connection you cannot kill), and say why in the evidence",
    "operation_not_open": "it is already settled (another page or a shell did it): its History "
                          "shows who and how",
}


def http_status(document: dict) -> int:
    """The HTTP status of an error document: 400, 403, 404 or 409 (docs/dashboard.md §Routes)."""
    code = (document.get("error") or {}).get("code")
    return next((status for codes, status in _HTTP_STATUSES if code in codes), 409)


def dashboard_operator(session: Any = None, client: Optional[str] = None) -> dict:
    """``{"via": "dashboard", "dashboard_user": {...} or None, "client"}``: who
    acts, beside docs/cli.md's operator identity.  ``session``: the verified
    login (``user_id``, ``email``, ``display_name``, ``provider``); None on a
    loopback dashboard."""
    user = None
    if session is not None:
        user = {name: _bounded(getattr(session, name, None))
                for name in ("user_id", "email", "display_name", "provider")}
    return {"via": "dashboard", "dashboard_user": user, "client": _bounded(client)}


def origin_problem(origin: Optional[str], host: Optional[str],
                   fetch_site: Optional[str]) -> Optional[str]:
    """Why a writing request must be refused for the page that sent it
    (``Origin``, ``Sec-Fetch-Site``), or None: only the dashboard's own page
    may settle.  Hermes' CORS admits every loopback port, so another port (or
    ``Origin: null``) is refused here; without ``Origin`` the sending process
    is judged instead."""
    if fetch_site is not None and fetch_site.strip().lower() not in ("same-origin", "none"):
        return f"the request came from another site's page (Sec-Fetch-Site: {fetch_site[:40]})"
    if origin is None:
        return None
    own = _netloc(host)
    try:
        parsed = urllib.parse.urlsplit(origin.strip())
        sent = _netloc(parsed.netloc) if parsed.scheme in ("http", "https") else None
    except ValueError:
        sent = None
    if sent is None or own is None or sent != own:
        return f"the request came from a page of another origin ({origin[:80]!r})"
    return None


def _netloc(text: Optional[str]) -> Optional[str]:
    """``host:port`` in lower case, the default port spelled out; None if empty."""
    if not text:
        return None
    text = text.strip().lower()
    return text if ":" in text.rsplit("]", 1)[-1] else text + ":80"


def refused_origin(problem: str) -> tuple:
    """``(foreign_origin error document, 403)``."""
    document = {"ok": False, "error": {
        "code": "foreign_origin", "message": f"refused: {problem}. Settle from the dashboard's "
        "own Crash recovery page (not inside another page or frame)"}}
    return document, http_status(document)


def _bounded(value: Any) -> Optional[str]:
    return None if value is None else str(value)[:IDENTITY_FIELD_MAX_CHARS]


def profile_view() -> dict:
    """The profile served: ``{"name", "home", "command"}``; ``name`` as
    :func:`hermes.profile_of_home` (None outside Hermes), ``command`` as
    :func:`command_words`."""
    home = name = None
    try:
        from hermes_constants import get_hermes_home  # type: ignore[import-not-found]
        home = Path(get_hermes_home())
    except Exception:  # outside Hermes: the page still works, unnamed
        pass
    if home is not None:
        name = hermes.profile_of_home(home)
    return {"name": name, "home": None if home is None else str(home),
            "command": " ".join(command_words(name))}


def command_words(profile: Optional[str]) -> tuple:
    """``PROGRAM [-p PROFILE] crash-recovery`` (``hermes``; ``hermesx`` on 0.20.1)."""
    return hermes_prefix(profile, host_program())


class DashboardCommands:
    """The routes' answers for one profile, each ``(document, http status)``.
    ``journal_class``: ``journal.Journal``; ``data_dir()`` and ``settings()``
    default to what Hermes resolves for the dashboard's process."""

    def __init__(self, journal_class: Callable[..., Any],
                 data_dir: Callable[[], Any] = hermes.resolve_data_dir,
                 settings: Optional[Callable[[], Any]] = None,
                 registered_tools: Optional[Callable[[], Any]] = None):
        self.journal_class = journal_class
        self.data_dir = data_dir
        self.settings = settings if settings is not None else hermes.settings_reader(None)
        self.registered_tools = (registered_tools if registered_tools is not None
                                 else _host_tool_names)

    def _run(self, command: Any, **arguments: Any) -> tuple:
        args = argparse.Namespace(**arguments)
        with _JOURNAL_ACCESS:
            document, ok = run_command(command, args, str(self.data_dir()), self.journal_class)
        # The next command as this profile runs it (docs/cli.md §Output).
        prefix = command_words(profile_view()["name"])
        if not ok:
            error = document["error"]
            error["next"] = next_command(prefix, next_step_of(error))
        elif command == "status":
            document["next"] = next_command(prefix, status_next_step(document))
        return document, 200 if ok else http_status(document)

    # ------------------------------------------------------------- reading --

    def status(self) -> tuple:
        """``status`` as ``hermes crash-recovery status`` answers it, plus
        ``profile``; no journal yet is ``journal: "absent"`` (gate open), an
        error document gets ``gate: closed``."""
        data_dir = str(self.data_dir())
        document, code = self._run("status", check=False)
        if (document.get("error") or {}).get("code") == "journal_absent":
            document, code = absent_journal_status(data_dir), 200
            document["next"] = None
        document.setdefault("data_dir", data_dir)  # error documents too
        document["settings"] = operator_settings_view(self.settings, data_dir,
                                                      self.registered_tools)
        document["profile"] = profile_view()
        if not document.get("ok"):
            document["gate"] = GATE_CLOSED
        note_platform_problem(document, data_dir)  # as the CLI's status says
        document["workers_running"] = workers_running(document, data_dir)
        document["check"] = check_view(document)
        return document, code

    def show(self, operation_id: Any) -> tuple:
        """``show OP``: the operation and its whole verified history."""
        return self._run("show", operation_id=str(operation_id))

    def verify(self) -> tuple:
        """``verify``: a full verification (also lists past repairs)."""
        return self._run("verify", checkpoint=None, all=False)

    def checkpoint(self) -> tuple:
        """``checkpoint``: the current checkpoint, exactly as the CLI prints it."""
        return self._run("checkpoint")

    def archives(self) -> tuple:
        """``{"ok", "integrity", "data_dir", "archives": [anchor, ...]}``, newest
        first, after a full verification (docs/format.md §Archives)."""
        document, code = self._run(_list_archives, since=0, all=False)
        if (document.get("error") or {}).get("code") == "journal_absent":  # no call yet
            document, code = {"ok": True, "integrity": "ok", "data_dir": str(self.data_dir()),
                              "archives": []}, 200
        return document, code

    # ------------------------------------------------------------- writing --

    def resolve(self, operation_id: Any, body: Any, operator_via: dict,
                connection: Optional[tuple] = None) -> tuple:
        """``resolve`` from a JSON body ``{"outcome", "evidence", "force"?}``.
        ``connection``: ``((client host, port), (server host, port))``, whose
        sender must not be an agent (docs/dashboard.md §Who may settle)."""
        problem = _body_problem(body, RESOLVE_FIELDS)
        if problem is None and body.get("outcome") not in OUTCOMES:
            problem = "outcome must be completed or not_applied"
        if problem is None and not isinstance(body.get("force", False), bool):
            problem = "force must be true or false"
        if problem:
            return usage(problem)
        return _in_page_words(self._run(
            "resolve", operation_id=str(operation_id), outcome=body["outcome"],
            evidence=body["evidence"], force=body.get("force", False),
            operator_via=operator_via, caller=_caller(connection)))

    def acknowledge(self, operation_id: Any, body: Any, operator_via: dict,
                    connection: Optional[tuple] = None) -> tuple:
        """``acknowledge OP --evidence E`` from a JSON body ``{"evidence"}``
        (``connection`` as for :meth:`resolve`)."""
        problem = _body_problem(body, ACKNOWLEDGE_FIELDS)
        if problem:
            return usage(problem)
        return _in_page_words(self._run("acknowledge", operation_id=str(operation_id),
                                        evidence=body["evidence"], operator_via=operator_via,
                                        caller=_caller(connection)))


def _caller(connection: Optional[tuple]) -> Any:
    """The :class:`caller.Caller` of a request; without a connection, this process."""
    if connection is None:
        return this_process(VIA_DASHBOARD)
    client, server = connection
    return peer_caller(client, server)


def _in_page_words(answer: tuple) -> tuple:
    """A writing command's answer with :data:`PAGE_HINTS` in place of the CLI's hints."""
    document, status = answer
    error = document.get("error") or {}
    if error.get("code") in PAGE_HINTS:
        error["hint"] = PAGE_HINTS[error["code"]]
    return document, status


# The built-in tools are registered in this process once, at the first status:
# the dashboard then judges protected_tools as `hermes crash-recovery` does.
_BUILTINS_LOADED: list = []


def _host_tool_names() -> Optional[list]:
    """The host's tool names as the dashboard's process can read them."""
    names = hermes.registered_tool_names(load=not _BUILTINS_LOADED)
    _BUILTINS_LOADED[:] = [True]
    return names


def _list_archives(args: argparse.Namespace, data_dir: str, journal_class: Callable) -> dict:
    """The archives command of the page (see :meth:`DashboardCommands.archives`)."""
    events = command_log(args, data_dir, journal_class)["events"]
    try:
        first = next(events, None)  # started: closing it closes the journal
    finally:
        events.close()
    anchor = first.get("archive") if first and first.get("kind") == "archived" else None
    return {"ok": True, "integrity": "ok", "data_dir": data_dir,
            "archives": archive.anchors(data_dir, anchor)}


def _body_problem(body: Any, fields: set) -> Optional[str]:
    """What is wrong with a request body, or None (the command judges the evidence's text)."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    unknown = sorted(str(key)[:40] for key in body if key not in fields)
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}"
    if not isinstance(body.get("evidence"), str):
        return "evidence is required: the text of what you checked"
    return None


def usage(message: str) -> tuple:
    """A malformed request: ``(usage error document, 400)``."""
    document = {"ok": False, "error": {"code": "usage", "message": message}}
    return document, http_status(document)


def checkpoint_file_name(checkpoint: dict) -> str:
    """``crash-recovery-checkpoint-<profile>-<count>.json``: ASCII letters, digits, ``-``, ``_``."""
    profile = "".join(character if character.isascii() and (character.isalnum()
                                                            or character in "-_") else "_"
                      for character in str(profile_view()["name"] or "profile"))[:64]
    return f"crash-recovery-checkpoint-{profile}-{int(checkpoint.get('count', 0))}.json"
