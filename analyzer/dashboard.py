"""``forensics app``: start the Streamlit dashboard on a folder of runs.

The server is bound to 127.0.0.1, runs headless (no browser opened by Streamlit, no e-mail
prompt) and sends no usage statistics. The folder reaches the app after ``--`` as
``--runs PATH``; it may be a URL of object storage (``s3://bucket/runs/``), read through
:mod:`analyzer.ingest.storage` with the store's usual credentials, and checked to exist
before the server starts. Streamlit is neither imported here nor by the CLI: it runs in a child
process, ``python -m streamlit run``.

The entry script is looked up next to this package (a source checkout or an editable
install), then as the installed ``app`` package (a wheel that ships it).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from analyzer.errors import UsageError
from analyzer.ingest import storage

ENTRY = "streamlit_app.py"
HOST = "127.0.0.1"
THEME = {
    "theme.base": "light",
    "theme.primaryColor": "#1d4ed8",
    "theme.linkColor": "#1d4ed8",
    "theme.textColor": "#0e1014",
}
"""The dashboard's colours. Blue for what is picked or pressed, so that red means failure and
non-finite only (Streamlit's default primary is red); a text colour dark enough that small
text Streamlit draws at 60 % opacity (captions, the sidebar's) stays above 4.5:1 against
the page and the sidebar. Given as flags of the child's command line: the server reads no
config file from the folder being analysed, and writes none into it."""


def _is_app(folder: Path) -> bool:
    return (folder / ENTRY).is_file() and (folder / "app_pages").is_dir()


def app_script() -> str:
    """The dashboard's entry script; UsageError when this installation lacks it."""
    beside = Path(__file__).resolve().parent.parent / "app"
    candidates = [beside]
    spec = importlib.util.find_spec("app") if not _is_app(beside) else None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) for p in spec.submodule_search_locations]
    for folder in candidates:
        if _is_app(folder):
            return str(folder / ENTRY)
    raise UsageError("the dashboard is not part of this installation (no app/streamlit_app.py "
                     "beside the analyzer package); install the project from its source tree")


def _check_exists(path: str, what: str) -> None:
    """UsageError unless ``path`` names an existing folder (a URL: an object or prefix)."""
    where = storage.normalize(path)
    if not storage.is_url(where):
        if not os.path.exists(where):
            raise UsageError(f"{what}{path}: no such file or folder")
        return
    try:
        found = storage.info(where)
    except OSError as exc:  # an unreachable store, refused credentials
        raise UsageError(f"{what}{path}: cannot be looked at: {exc.strerror or exc}") from None
    if found is None:
        raise UsageError(f"{what}{path}: no such object or folder")


def command(path: str, *, port: int = 8501, import_paths: Sequence[str] = (),
            run_roots: Sequence[str] = ()) -> list[str]:
    """The command line that serves the dashboard on ``path``; ``import_paths`` are
    folders whose code the user trusts for this session's replays, ``run_roots`` folders
    each taken as one run (``--run-root``)."""
    trusted = [arg for p in import_paths for arg in ("--import-path", os.path.abspath(p))]
    trusted += [arg for p in run_roots for arg in ("--run-root", storage.absolute(p))]
    script = app_script()
    # The server's own launcher beside the entry script, run by its path (not ``-m``, which
    # would import an ``app`` from the working folder first): Streamlit's command line with
    # the first page's modules imported while it waits for a browser.
    return [sys.executable, str(Path(script).with_name("serve.py")), "run", script,
            "--server.address", HOST, "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--browser.serverAddress", HOST, "--server.fileWatcherType", "none",
            "--client.toolbarMode", "viewer",
            *[arg for key, value in THEME.items() for arg in (f"--{key}", value)],
            "--", "--runs", storage.absolute(path), *trusted]


def url(port: int) -> str:
    return f"http://{HOST}:{port}/"


def wait_until_up(port: int, timeout: float = 60.0,
                  alive: subprocess.Popen[bytes] | None = None) -> bool:
    """Poll Streamlit's health endpoint until it answers ``ok``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url(port)}_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def launch(path: str, *, port: int = 8501, open_browser: bool = False,
           import_paths: Sequence[str] = (), run_roots: Sequence[str] = ()) -> int:
    """Serve the dashboard on ``path`` until the server stops; its exit status.

    Ctrl-C or SIGTERM stop the server too. ``open_browser`` opens the page once the server
    answers.
    """
    _check_exists(path, "")
    for folder in import_paths:  # code is imported from local folders only
        if not os.path.isdir(folder):
            raise UsageError(f"--import-path {folder}: not a folder")
    for folder in run_roots:
        if storage.is_url(storage.normalize(folder)):
            _check_exists(folder, "--run-root ")
        elif not os.path.isdir(folder):
            raise UsageError(f"--run-root {folder}: not a folder")
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: not a TCP port")
    if importlib.util.find_spec("streamlit") is None:
        raise UsageError("the dashboard needs streamlit: pip install streamlit")
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    print(f"forensics: dashboard on {url(port)} for {storage.absolute(path)} (Ctrl-C stops it)",
          file=sys.stderr)
    proc = subprocess.Popen(command(path, port=port, import_paths=import_paths,
                                    run_roots=run_roots), env=env)
    if open_browser:
        threading.Thread(target=_open_when_up, args=(port, proc), daemon=True).start()
    previous = _forward_sigterm(proc)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return _stop(proc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _open_when_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    import webbrowser

    if wait_until_up(port, alive=proc):
        webbrowser.open(url(port))


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 130


def _forward_sigterm(proc: subprocess.Popen[bytes]) -> Any:
    """Pass SIGTERM on to the server, so that stopping this process does not orphan it."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        proc.terminate()

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, handler)
    return previous if previous is not None else signal.SIG_DFL
