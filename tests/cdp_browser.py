"""Headless Chromium driven through the DevTools protocol, for the dashboard's
browser test: the standard library plus ``websockets`` (in every Hermes venv).

Waiting is event-driven: :meth:`Browser.wait_for` evaluates a JavaScript
condition inside the page and resolves on the first DOM mutation that makes it
true (a ``MutationObserver``); the bound on every wait turns a page that never
gets there into a failure, never into a pass.
"""
from __future__ import annotations

import base64
import json
import shutil
import tempfile
from typing import Any, Optional

from announcing_process import AnnouncingProcess

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# The flags this machine needs (no sandbox as root, no GPU, no network chatter).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync")
WAIT_SECONDS = 60


def chromium_program() -> Optional[str]:
    """The Chromium executable on PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(AssertionError):
    """The page did not do what the test waited for (or JavaScript threw)."""


class Browser:
    """One headless Chromium with a fresh profile and one page."""

    def __init__(self, program: str, width: int = 1280, height: int = 900):
        from websockets.sync.client import connect
        self.profile = tempfile.mkdtemp(prefix="crash-recovery-chromium-")
        self.chromium = AnnouncingProcess(
            [program, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "--remote-debugging-port=0", "about:blank"],
            "stderr")
        endpoint = self.chromium.announced("DevTools listening on ")
        if endpoint is None:
            self.close()
            raise RuntimeError("Chromium did not announce its DevTools endpoint")
        self.socket = connect(endpoint, max_size=64 * 1024 * 1024, open_timeout=WAIT_SECONDS)
        self._next_id = 0
        self._events: list = []
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(target for target in targets if target["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    def send(self, method: str, session: bool = False, **params: Any) -> dict:
        """One DevTools command; returns its result (events are noted)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.socket.send(json.dumps(message))
        while True:
            reply = json.loads(self.socket.recv(timeout=WAIT_SECONDS))
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                self._events.append(reply["method"])

    def _await_event(self, method: str) -> None:
        while method not in self._events:
            reply = json.loads(self.socket.recv(timeout=WAIT_SECONDS))
            if "method" in reply:
                self._events.append(reply["method"])
        self._events.clear()

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", session=True, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:200]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        """Load ``url`` and wait until its document has loaded."""
        self._events.clear()
        self.send("Page.navigate", session=True, url=url)
        self._await_event("Page.loadEventFired")

    def wait_for(self, condition: str, what: str = "") -> Any:
        """Wait until the JavaScript ``condition`` is truthy; returns its value."""
        script = """new Promise((resolve) => {
          let observer = null;
          const timer = setTimeout(() => { if (observer) observer.disconnect();
                                            resolve({timeout: true}); }, %d);
          const check = () => { let value = null;
            try { value = (%s); } catch (error) { value = null; }
            if (value) { clearTimeout(timer); if (observer) observer.disconnect();
                         resolve({value: value instanceof Node ? true : value}); return true; }
            return false; };
          if (!check()) {
            observer = new MutationObserver(check);
            observer.observe(document, {subtree: true, childList: true, attributes: true,
                                        characterData: true});
            document.addEventListener('readystatechange', check);
          }
        })""" % (WAIT_SECONDS * 1000, condition)
        outcome = self.evaluate(script)
        if outcome.get("timeout"):
            raise BrowserError(f"the page never showed {what or condition}; it shows:\n"
                               + str(self.evaluate("document.body && document.body.innerText"))[:3000])
        return outcome["value"]

    def click(self, test_id: str) -> None:
        """Click the element ``[data-testid=test_id]`` (waits for it, enabled)."""
        selector = json.dumps(f'[data-testid="{test_id}"]')
        self.wait_for(f"document.querySelector({selector}) && "
                      f"!document.querySelector({selector}).disabled", test_id)
        self.evaluate(f"document.querySelector({selector}).click()")

    def follow(self, test_id: str) -> None:
        """Click the link ``[data-testid=test_id]`` and wait for the page it loads."""
        self._events.clear()
        self.click(test_id)
        self._await_event("Page.loadEventFired")

    def type_into(self, test_id: str, text: str) -> None:
        """Focus ``[data-testid=test_id]`` and type ``text`` as a keyboard would."""
        selector = json.dumps(f'[data-testid="{test_id}"]')
        self.wait_for(f"document.querySelector({selector})", test_id)
        self.evaluate(f"document.querySelector({selector}).focus()")
        self.send("Input.insertText", session=True, text=text)

    def text_of(self, test_id: str) -> str:
        selector = json.dumps(f'[data-testid="{test_id}"]')
        return self.wait_for(f"document.querySelector({selector}) && "
                             f"document.querySelector({selector}).innerText", test_id)

    def screenshot(self, path: str) -> None:
        """A PNG of the whole page at ``path``."""
        data = self.send("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True)["data"]
        with open(path, "wb") as stream:
            stream.write(base64.b64decode(data))

    def close(self) -> None:
        """End Chromium (its process group only) and remove its profile."""
        try:
            if getattr(self, "socket", None) is not None:
                self.socket.close()
        finally:
            self.chromium.stop()
            shutil.rmtree(self.profile, True)
