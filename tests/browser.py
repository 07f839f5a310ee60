"""Headless Chromium over the DevTools protocol, for report tests.

Loads one page and records what a person's browser would do with it: console messages and
uncaught exceptions, every network request the page makes, the rendered text, and a screenshot.
Uses Debian's /usr/bin/chromium (installed by .ci/run when absent) and the `websockets` client.
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--window-size=1200,900",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageVisit:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    text: str = ""
    screenshot: bytes = b""


class Page:
    """An open page to act on: evaluate JavaScript, click, hover and press keys with real input
    events (Input.dispatchMouseEvent / dispatchKeyEvent); console errors and requests recorded
    as in `visit`. Made by `open_page`."""

    KEYS = {"ArrowLeft": 37, "ArrowUp": 38, "ArrowRight": 39, "ArrowDown": 40, "Enter": 13, "Tab": 9,
            "Home": 36, "End": 35, " ": 32}

    def __init__(self, call, url: str, record: PageVisit) -> None:
        self._call, self.url, self._record = call, url, record

    @property
    def console_errors(self) -> list[str]:
        return list(self._record.console_errors)

    @property
    def requests(self) -> list[str]:
        return [u for u in self._record.requests if u != self.url and not u.startswith("data:")]

    def evaluate(self, expression: str):
        """The value of a JavaScript expression (returned by value; raises on an exception)."""
        reply = self._call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression!r} raised: {json.dumps(reply['exceptionDetails'])[:500]}")
        return reply.get("result", {}).get("value")

    def _centre(self, selector: str) -> tuple[float, float]:
        box = self.evaluate(
            f"(function(){{var e=document.querySelector({json.dumps(selector)});if(!e)return null;"
            "e.scrollIntoView({block:'center',inline:'center'});var r=e.getBoundingClientRect();"
            "return [r.left+r.width/2,r.top+r.height/2];})()")
        if box is None:
            raise LookupError(f"no element matches {selector!r}")
        return box[0], box[1]

    def hover(self, selector: str) -> None:
        x, y = self._centre(selector)
        self._call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, selector: str, shift: bool = False) -> None:
        x, y = self._centre(selector)
        self._call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self._call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1,
                       modifiers=8 if shift else 0)

    def screenshot(self) -> bytes:
        """The visible page as PNG bytes."""
        return base64.b64decode(self._call("Page.captureScreenshot", format="png")["data"])

    def press(self, key: str) -> None:
        """A key press on the focused element (named keys as in KeyboardEvent.key)."""
        code = self.KEYS.get(key, ord(key.upper()) if len(key) == 1 else 0)
        for kind in ("rawKeyDown", "keyUp"):
            self._call("Input.dispatchKeyEvent", type=kind, key=key, code=key if len(key) > 1 else f"Key{key.upper()}",
                       windowsVirtualKeyCode=code, nativeVirtualKeyCode=code)

    def settle(self, seconds: float = 0.2) -> None:
        """Wait, then let pending events (errors, requests) arrive."""
        time.sleep(seconds)
        self.evaluate("0")




@contextmanager
def open_page(path: Path, timeout: float = 60.0):
    """Open file://path in headless Chromium and yield a Page to act on (closed on exit)."""
    import urllib.request

    from websockets.sync.client import connect

    profile = tempfile.mkdtemp(prefix="headscope-chromium-")
    proc = subprocess.Popen(
        [chromium_path(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.time() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("Chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        record = PageVisit()
        with connect(ws_url, max_size=64 * 2**20, open_timeout=timeout) as ws:
            ids = iter(range(1, 1_000_000))
            pending: dict[int, dict] = {}

            def handle(msg: dict) -> None:
                if "id" in msg:
                    pending[msg["id"]] = msg.get("result", msg.get("error", {}))
                    return
                method, params = msg.get("method"), msg.get("params", {})
                if method == "Network.requestWillBeSent":
                    record.requests.append(params["request"]["url"])
                elif method == "Runtime.exceptionThrown":
                    record.console_errors.append(json.dumps(params["exceptionDetails"])[:500])
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    record.console_errors.append(str(params.get("args"))[:500])
                elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                    record.console_errors.append(params["entry"].get("text", "")[:500])
                elif method == "Page.loadEventFired":
                    pending[-1] = {}

            def call(method: str, **params) -> dict:
                msg_id = next(ids)
                ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
                while msg_id not in pending:
                    handle(json.loads(ws.recv(timeout=timeout)))
                return pending.pop(msg_id)

            for domain in ("Network", "Runtime", "Log", "Page"):
                call(f"{domain}.enable")
            url = Path(path).resolve().as_uri()
            call("Page.navigate", url=url)
            while -1 not in pending:
                handle(json.loads(ws.recv(timeout=timeout)))
            page = Page(call, url, record)
            page.settle(0.3)
            yield page
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


def visit(path: Path, timeout: float = 60.0) -> PageVisit:
    """Open file://path in headless Chromium and record console errors, requests, text and a screenshot."""
    with open_page(path, timeout) as page:
        page.settle(0.5)  # let late requests or errors surface
        text = page.evaluate("document.body.innerText") or ""
        shot = page._call("Page.captureScreenshot", format="png")
        return PageVisit(console_errors=page.console_errors, requests=page.requests, text=text,
                         screenshot=base64.b64decode(shot["data"]))
