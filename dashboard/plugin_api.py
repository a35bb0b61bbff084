"""API routes of the crash-recovery page in the Hermes dashboard (docs/dashboard.md).
The dashboard imports this file by path and mounts ``router`` under
``/api/plugins/crash-recovery/`` behind its own authentication; each route
answers with the operator command's document via ``host/dashboard.py``.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import types
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

# The plugin directory as the package Hermes makes of it: an agent the dashboard
# runs in its process shares this copy and the storage layer's per-process
# bookkeeping of open databases and locks (two copies would each believe they
# alone hold the journal's files).
_PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERMES_NAMESPACE = "hermes_plugins"
if HERMES_NAMESPACE not in sys.modules:  # as Hermes' loader creates it
    _namespace = types.ModuleType(HERMES_NAMESPACE)
    _namespace.__path__ = []
    _namespace.__package__ = HERMES_NAMESPACE
    sys.modules[HERMES_NAMESPACE] = _namespace
_PACKAGE = runpy.run_path(os.path.join(_PLUGIN_DIR, "host", "standalone.py"))["load_package"](
    f"{HERMES_NAMESPACE}.crash_recovery")
_journal = importlib.import_module(f"{_PACKAGE.__name__}.journal")
_dashboard = importlib.import_module(f"{_PACKAGE.__name__}.host.dashboard")
_render = importlib.import_module(f"{_PACKAGE.__name__}.reports.render")

# A larger JSON body is refused (evidence is at most 64 Ki characters: at
# most 256 KiB of UTF-8, plus escapes).
MAX_BODY_BYTES = 1 << 20

router = APIRouter()
commands = _dashboard.DashboardCommands(_journal.Journal)


def _answer(result: tuple) -> Response:
    """The document as JSON; ASCII escapes keep any text the model chose (a
    lone surrogate in a tool name) from failing the response."""
    document, status = result
    return Response(json.dumps(document, ensure_ascii=True, sort_keys=True), status_code=status,
                    media_type="application/json", headers={"Cache-Control": "no-store"})


def _operator(request: Request) -> dict:
    """Who acts, as far as the dashboard knows (its login, if any; the client)."""
    return _dashboard.dashboard_operator(getattr(request.state, "session", None),
                                         request.client.host if request.client else None)


async def _json_body(request: Request) -> tuple:
    """``(body, None)`` or ``(None, usage answer)``.  Only ``application/json``:
    a plain form post from another site cannot reach a writing route."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return None, _dashboard.usage("send the request body as application/json")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return None, _dashboard.usage(f"the request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8")), None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, _dashboard.usage("the request body is not JSON")


@router.get("/status")
def status() -> Response:
    """``status`` with the settings as read and the profile served."""
    return _answer(commands.status())


@router.get("/operations/{operation_id}")
def show(operation_id: str) -> Response:
    """``show OP``."""
    return _answer(commands.show(operation_id))


@router.get("/verify")
def verify() -> Response:
    """``verify``."""
    return _answer(commands.verify())


@router.get("/archives")
def archives() -> Response:
    """The archives of the journal, newest first."""
    return _answer(commands.archives())


@router.get("/checkpoint")
def checkpoint() -> Response:
    """``checkpoint`` as a download, byte for byte what the CLI prints."""
    document, status = commands.checkpoint()
    if status != 200:
        return _answer((document, status))
    return Response(_render.json_text(document, 1) + "\n", media_type="application/json",
                    headers={"Cache-Control": "no-store", "Content-Disposition":
                             f'attachment; filename="{_dashboard.checkpoint_file_name(document)}"'})


@router.post("/operations/{operation_id}/resolve")
async def resolve(operation_id: str, request: Request) -> Response:
    """``resolve OP --outcome O --evidence E [--force]``."""
    return await _settle(commands.resolve, operation_id, request)


@router.post("/operations/{operation_id}/acknowledge")
async def acknowledge(operation_id: str, request: Request) -> Response:
    """``acknowledge OP --evidence E``."""
    return await _settle(commands.acknowledge, operation_id, request)


def _connection(request: Request) -> tuple:
    """``((client host, port), (server host, port))`` (either may be None)."""
    client = (request.client.host, request.client.port) if request.client else None
    server = request.scope.get("server")
    return client, (tuple(server) if server else None)


async def _settle(command: Any, operation_id: str, request: Request) -> Response:
    """A writing command with the JSON body and the dashboard's identity, off
    the event loop (it fsyncs, may wait for the writer lock); refused for a
    page of another origin (``foreign_origin``) or a sender inside an agent
    (``run_by_agent``, docs/dashboard.md §Who may settle)."""
    problem = _dashboard.origin_problem(request.headers.get("origin"),
                                        request.headers.get("host"),
                                        request.headers.get("sec-fetch-site"))
    if problem:
        return _answer(_dashboard.refused_origin(problem))
    body, refused = await _json_body(request)
    if refused:
        return _answer(refused)
    return _answer(await run_in_threadpool(command, operation_id, body, _operator(request),
                                           _connection(request)))
