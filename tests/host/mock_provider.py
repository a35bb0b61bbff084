"""Scripted OpenAI-compatible chat-completions provider for offline host tests.

Standard library only. Binds 127.0.0.1 on a free port, answers streaming (SSE
``chat.completion.chunk``) and plain chat completions from a script of turns,
tolerates the model-list and metadata probes Hermes sends, records every
request body, and, when given ``timeout_seconds``, shuts itself down after
it (for a server nobody else bounds: the demo, manual probing). The host
checks pass none: their conversations last as long as the machine needs, and
the parent's scenario timeout kills the child, and its server, if one hangs.

A turn is ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or
``{"text": "..."}``. Only requests that offer ``tools`` (the agent loop)
consume turns; auxiliary requests (titles, summaries) get a short text reply.
When the script is exhausted the provider answers ``SCRIPT_EXHAUSTED``.

Tool Search (Hermes >= 0.20, on by default) hides plugin tools behind the
bridge tool ``tool_call``. A scripted call naming a tool the request does not
offer, while it offers ``tool_call``, is sent the way a real model reaches it:
as ``tool_call`` with that name and arguments, in the shape the offered
schema asks for (``{"calls": [{name, arguments}]}`` on 0.22, ``{name,
arguments}`` on 0.20), under the same call id. ``"direct": true`` on a call
sends it by its own name regardless. :attr:`ScriptedProvider.bridged` lists
the call ids sent through the bridge.
"""
from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

MODEL_ID = "mock-model"
EXHAUSTED_TEXT = "SCRIPT_EXHAUSTED"
AUXILIARY_TEXT = "Mock title"


BRIDGE_CALL = "tool_call"  # Tool Search's bridge (Hermes >= 0.20)


def bridge_arguments(schema: Dict[str, Any], name: str,
                     arguments: Dict[str, Any]) -> Dict[str, Any]:
    """The arguments of a ``tool_call`` that invokes ``name(arguments)``, in the
    shape the offered bridge ``schema`` declares: a ``calls`` array (0.22) or
    the single ``name``/``arguments`` pair (0.20)."""
    properties = (schema.get("parameters") or {}).get("properties") or {}
    if "calls" in properties:
        return {"calls": [{"name": name, "arguments": arguments}]}
    return {"name": name, "arguments": arguments}


class ScriptedProvider:
    """A bounded, scripted chat-completions server running in a daemon thread."""

    def __init__(self, turns: Optional[List[Dict[str, Any]]] = None, *,
                 timeout_seconds: Optional[float] = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self._lock = threading.Lock()
        self._turns: List[Dict[str, Any]] = list(turns or [])
        self._call_numbers = itertools.count(1)
        self.requests: List[Dict[str, Any]] = []
        self.bridged: List[str] = []
        self.timeout_seconds = timeout_seconds
        provider = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30

            def log_message(self, *_args: Any) -> None:
                return

            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                provider._answer_get(self)

            def do_POST(self) -> None:  # noqa: N802
                provider._answer_post(self)

        self._server = ThreadingHTTPServer((host, port), RequestHandler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="scripted-provider", daemon=True)
        self._deadline_timer: Optional[threading.Timer] = None
        if timeout_seconds is not None:
            self._deadline_timer = threading.Timer(timeout_seconds, self.stop)
            self._deadline_timer.daemon = True
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "ScriptedProvider":
        self._thread.start()
        if self._deadline_timer is not None:
            self._deadline_timer.start()
        return self

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "ScriptedProvider":
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()

    # -- script and records ------------------------------------------------

    def load_script(self, turns: List[Dict[str, Any]]) -> None:
        """Replace the remaining turns (e.g. before the next session)."""
        with self._lock:
            self._turns = list(turns)

    def remaining_turns(self) -> int:
        with self._lock:
            return len(self._turns)

    def chat_requests(self) -> List[Dict[str, Any]]:
        """Bodies of agent-loop chat requests (those offering tools)."""
        with self._lock:
            return [r["body"] for r in self.requests
                    if r["path"].endswith("/chat/completions") and r["body"].get("tools")]

    def tool_messages(self) -> List[Dict[str, Any]]:
        """Every distinct ``role: tool`` message the model was sent, in order."""
        seen = set()
        found: List[Dict[str, Any]] = []
        for body in self.chat_requests():
            for message in body.get("messages") or []:
                if message.get("role") != "tool":
                    continue
                key = (message.get("tool_call_id"), json.dumps(message.get("content"), sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    found.append(message)
        return found

    def offered_tool_names(self) -> List[str]:
        """Tool names offered to the model in the most recent agent-loop request."""
        bodies = self.chat_requests()
        if not bodies:
            return []
        return sorted(t.get("function", {}).get("name", "") for t in bodies[-1].get("tools") or [])

    # -- HTTP --------------------------------------------------------------

    def _record(self, method: str, path: str, body: Any) -> None:
        with self._lock:
            self.requests.append({"method": method, "path": path, "body": body,
                                  "time": time.time()})

    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, status: int, document: Any) -> None:
        encoded = json.dumps(document).encode("utf-8")
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(encoded)))
        handler.end_headers()
        handler.wfile.write(encoded)

    @staticmethod
    def _model_entry() -> Dict[str, Any]:
        return {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "mock",
                "context_length": 131072, "max_model_len": 131072}

    def _answer_get(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.split("?", 1)[0].rstrip("/")
        self._record("GET", path, None)
        if path.endswith("/models"):
            self._send_json(handler, 200, {"object": "list", "data": [self._model_entry()]})
        elif "/models/" in path:
            self._send_json(handler, 200, self._model_entry())
        else:
            self._send_json(handler, 404, {"error": {"message": "not found", "type": "not_found"}})

    def _answer_post(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.split("?", 1)[0].rstrip("/")
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        self._record("POST", path, body)
        if not path.endswith("/chat/completions"):
            self._send_json(handler, 404, {"error": {"message": "not found", "type": "not_found"}})
            return
        turn = self._next_turn(body)
        if body.get("stream"):
            self._stream(handler, turn, body)
        else:
            self._send_json(handler, 200, self._completion(turn, body))

    def _next_turn(self, body: Dict[str, Any]) -> Dict[str, Any]:
        if not body.get("tools"):
            return {"text": AUXILIARY_TEXT}
        with self._lock:
            if not self._turns:
                return {"text": EXHAUSTED_TEXT}
            return self._turns.pop(0)

    def _tool_calls(self, turn: Dict[str, Any], body: Dict[str, Any]) -> List[Dict[str, Any]]:
        offered = {tool.get("function", {}).get("name"): tool.get("function", {})
                   for tool in body.get("tools") or [] if isinstance(tool, dict)}
        calls = []
        for index, call in enumerate(turn.get("tool_calls") or []):
            call_id = call.get("id") or f"call_mock_{next(self._call_numbers)}"
            name, arguments = call["name"], call.get("arguments") or {}
            if not call.get("direct") and name not in offered and BRIDGE_CALL in offered:
                name, arguments = BRIDGE_CALL, bridge_arguments(offered[BRIDGE_CALL], name,
                                                                arguments)
                with self._lock:
                    self.bridged.append(call_id)
            calls.append({"index": index, "id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments)}})
        return calls

    @staticmethod
    def _usage() -> Dict[str, int]:
        return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}

    def _completion(self, turn: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
        calls = self._tool_calls(turn, body)
        message: Dict[str, Any] = {"role": "assistant", "content": None if calls else turn.get("text", "")}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        return {"id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion",
                "created": int(time.time()), "model": MODEL_ID,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": self._usage()}

    def _stream(self, handler: BaseHTTPRequestHandler, turn: Dict[str, Any], body: Dict[str, Any]) -> None:
        completion_id = f"chatcmpl-{int(time.time() * 1000)}"
        created = int(time.time())

        def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> Dict[str, Any]:
            return {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                    "model": MODEL_ID,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        calls = self._tool_calls(turn, body)
        events: List[Dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        if calls:
            for call in calls:
                events.append(chunk({"tool_calls": [call]}))
            events.append(chunk({}, "tool_calls"))
        else:
            events.append(chunk({"content": turn.get("text", "")}))
            events.append(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": MODEL_ID, "choices": [], "usage": self._usage()})
        payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        encoded = payload.encode("utf-8")
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Content-Length", str(len(encoded)))
        handler.end_headers()
        handler.wfile.write(encoded)
        handler.wfile.flush()


def main() -> int:
    """Serve a script from a JSON file until the timeout (for manual probing)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", help="JSON file holding a list of turns")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--record", help="write received requests to this JSON file on exit")
    options = parser.parse_args()
    turns = []
    if options.script:
        with open(options.script, encoding="utf-8") as script_file:
            turns = json.load(script_file)
    provider = ScriptedProvider(turns, timeout_seconds=options.timeout, port=options.port).start()
    print(json.dumps({"base_url": provider.base_url}), flush=True)
    try:
        provider._thread.join()
    except KeyboardInterrupt:
        provider.stop()
    if options.record:
        with open(options.record, "w", encoding="utf-8") as record_file:
            json.dump(provider.requests, record_file, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
