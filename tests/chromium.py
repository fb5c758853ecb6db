"""A headless Chromium driven over the DevTools protocol, and the dashboard served on a free
port: what the browser tests (tests/test_app_browser.py) and the first-paint benchmark
(bench/paint.py) share.

Chromium is Debian's package, installed here when missing (as root). It is driven through
``--remote-debugging-pipe``: DevTools messages on file descriptors 3 and 4, so no driver and
no Python package beyond the standard library are needed.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

STATE_JS = """(() => {
  const q = (s) => [...document.querySelectorAll(s)];
  return JSON.stringify({
    app: q('[data-testid="stApp"]').length > 0,
    running: q('[data-testid^="stStatusWidgetRunning"]').length > 0,
    spinners: q('[data-testid="stSpinner"], [data-testid="stSkeleton"], '
                + '[data-testid="stSkeletonElement"], [data-testid="stAppSkeleton"]').length,
    charts: q('[data-testid="stPlotlyChart"]').length,
    plotted: q('[data-testid="stPlotlyChart"]').filter((e) => e.querySelector('.main-svg'))
      .length,
    errors: q('[data-testid="stException"], [data-testid="stAlertContentError"]')
      .map((e) => e.innerText),
    text: document.body ? document.body.innerText : "",
  });
})()"""


def install_chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("Chromium is missing and cannot be installed here: installing Debian's "
                    "chromium package needs apt-get and root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:  # stale package lists are the usual reason
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    found = shutil.which("chromium")
    if found is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        pytest.skip(f"installing Chromium with apt-get failed: {' / '.join(tail)}")
    return found


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, exe: str, profile: Path, log: Path) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        # High numbers, so that moving them to 3 and 4 in the child cannot clobber either.
        child_in = fcntl.fcntl(to_child, fcntl.F_DUPFD, 20)
        child_out = fcntl.fcntl(from_child, fcntl.F_DUPFD, 20)
        for fd in (to_child, from_child):
            os.close(fd)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--hide-scrollbars", "--mute-audio", "--window-size=1400,1800",
                 f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        script = f'exec "$0" "$@" 3<&{child_in} 4>&{child_out}'
        with open(log, "wb") as fh:
            # bash, not sh: dash cannot redirect file descriptors above 9.
            self.proc = subprocess.Popen(["bash", "-c", script, exe, *flags],
                                         stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                         pass_fds=(child_in, child_out))
        os.close(child_in)
        os.close(child_out)
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session = self._attach()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies[-1] = {"error": {"message": "the browser closed the pipe"}}
                    self._cond.notify_all()
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data):]
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._replies and -1 not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply to {method} in {timeout:.0f} s")
                self._cond.wait(left)
            reply = self._replies.pop(ident, None) or self._replies[-1]
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error'].get('message')}")
        return dict(reply.get("result", {}))

    def _attach(self) -> str:
        self.session = ""
        infos = self.call("Target.getTargets", session=False)["targetInfos"]
        page = next((t["targetId"] for t in infos if t["type"] == "page"), None)
        if page is None:
            page = self.call("Target.createTarget", {"url": "about:blank"},
                             session=False)["targetId"]
        found = self.call("Target.attachToTarget", {"targetId": page, "flatten": True},
                          session=False)
        return str(found["sessionId"])

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def state(self) -> dict[str, Any]:
        out = self.call("Runtime.evaluate", {"expression": STATE_JS, "returnByValue": True})
        return dict(json.loads(out["result"]["value"]))

    def evaluate(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return out["result"].get("value")

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", session=False, timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._in, self._out):
            with contextlib.suppress(OSError):
                os.close(fd)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """The dashboard served by `launch` on a free port over ``root``: its address."""
    port = free_port()
    log = root.parent / "streamlit.log"
    code = ("import sys; from analyzer.dashboard import launch; "
            "sys.exit(launch(sys.argv[1], port=int(sys.argv[2])))")
    with open(log, "wb") as fh:
        server = subprocess.Popen([sys.executable, "-c", code, str(root), str(port)],
                                  cwd=root.parent, stdout=fh, stderr=fh)
    from analyzer.dashboard import url, wait_until_up

    try:
        if not wait_until_up(port, timeout=120, alive=server):
            raise AssertionError(f"the dashboard did not come up:\n{log.read_text()[-3000:]}")
        yield url(port)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
