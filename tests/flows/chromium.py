"""Headless Chromium over the DevTools protocol, for the report's browser tests and benchmark.

One :class:`Browser` per use: Debian's ``/usr/bin/chromium`` is started headless with its own
profile and ``--remote-debugging-port=0``; the page's websocket is driven with ``websockets``'
synchronous client.  Every console message, uncaught exception, log entry and failed request is
collected, so a test can require that there are none.  ``offline=True`` disables the network for
the page (``Network.emulateNetworkConditions``) and points any stray request at a dead proxy.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")


@dataclass
class Events:
    console: list[str] = field(default_factory=list)  # console.* calls, exceptions, log entries
    failed: list[str] = field(default_factory=list)  # requests that failed, with their URL
    requests: list[str] = field(default_factory=list)  # every URL the page requested


class Browser:
    """``with Browser(offline=True) as page: page.open(path); page.evaluate("1 + 1")``."""

    def __init__(self, *, offline: bool, width: int = 1200, height: int = 1600) -> None:
        self.offline = offline
        self.size = (width, height)
        self.events = Events()
        self._ids = 0
        self._requests: dict[str, str] = {}

    def __enter__(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="dprelease-chromium-")
        arguments = [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-port=0",
            f"--user-data-dir={self._profile}",
            f"--window-size={self.size[0]},{self.size[1]}",
        ]
        if self.offline:
            arguments += ["--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
        self._log = Path(self._profile) / "stderr.log"  # a file: a full pipe would block chromium
        with open(self._log, "w") as log:
            self._process = subprocess.Popen(
                [*arguments, "about:blank"], stdout=subprocess.DEVNULL, stderr=log
            )
        try:
            self._connect()
        except BaseException:
            self._stop()
            raise
        return self

    def _connect(self) -> None:
        from websockets.sync.client import connect

        port = self._devtools_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as reply:
            targets = json.loads(reply.read())
        page = next(t for t in targets if t.get("type") == "page")
        self._socket = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.size[0],
            height=self.size[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        if self.offline:
            self.call(
                "Network.emulateNetworkConditions",
                offline=True,
                latency=0,
                downloadThroughput=-1,
                uploadThroughput=-1,
            )

    def __exit__(self, *exc: object) -> None:
        try:
            self._socket.close()
        finally:
            self._stop()

    def _stop(self) -> None:
        self._process.kill()  # the process this object started, by its handle
        self._process.wait(timeout=30)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _devtools_port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", self._log.read_text())
            if found:
                return int(found.group(1))
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(
            f"chromium did not report a DevTools port: {self._log.read_text()[-2000:]}"
        )

    def call(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self._ids += 1
        ident = self._ids
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._record(message)

    def _record(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.events.console.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.events.console.append(f"exception: {text}")
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.events.console.append(
                f"log.{entry['level']}: {entry['text']} {entry.get('url', '')}"
            )
        elif method == "Network.requestWillBeSent":
            self._requests[params["requestId"]] = params["request"]["url"]
            self.events.requests.append(params["request"]["url"])
        elif method == "Network.loadingFailed":
            url = self._requests.get(params["requestId"], "?")
            self.events.failed.append(f"{url}: {params.get('errorText')}")

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            self._record(message)
            if message.get("method") == method:
                return message.get("params", {})

    def open(self, page: Path, timeout: float = 60) -> None:
        """Navigate to ``page`` (a file) and wait for its load event."""
        self.call("Page.navigate", url=page.resolve().as_uri())
        self.wait_for("Page.loadEventFired", timeout=timeout)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def settle(self, seconds: float = 0.3) -> None:
        """Let pending events (late console messages, failed requests) arrive."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._record(json.loads(self._socket.recv(timeout=left)))
            except TimeoutError:
                break

    def screenshot(self, path: Path, *, selector: str | None = None) -> Path:
        """A PNG of the viewport, or of the element ``selector`` scrolled into view (its part
        that fits the viewport: capturing beyond it would lay the page out again)."""
        params: dict[str, Any] = {"format": "png"}
        if selector is not None:
            measure = (
                f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                " e.scrollIntoView(); const r = e.getBoundingClientRect();"
                " return [r.x + scrollX, r.y + scrollY, r.width,"
                " Math.min(r.height, innerHeight - Math.max(r.y, 0))]; })()"
            )
            box, previous = self.evaluate(measure), None
            for _ in range(20):  # sections above may resize (content-visibility, lazy charts)
                if box == previous:
                    break
                self.settle(0.2)
                box, previous = self.evaluate(measure), box
            x, y, width, height = box
            params["clip"] = {
                "x": x,
                "y": y,
                "width": max(width, 1),
                "height": max(height, 1),  # the part in the viewport: no re-layout
                "scale": 1,
            }
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
