"""The dashboard's server process (app/serve.py): Streamlit's command line with the first
page's modules imported while it waits for a browser, run by its path so that an ``app``
package in the working folder is never imported in its place."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_warming_up_imports_the_first_pages_modules_but_not_torch() -> None:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from app.serve import WARM, warm\n"
            "done = warm()\n"
            "assert done == list(WARM), (done, WARM)\n"
            "print(sorted(m for m in ('torch', 'streamlit', 'pandas', 'app.data') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "['app.data', 'pandas', 'streamlit']"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_server_ignores_an_app_package_in_the_working_folder(tmp_path: Path) -> None:
    from analyzer.dashboard import command, wait_until_up

    # A folder that holds a package named like the dashboard's, as an analysed folder or a
    # user's project may: `python -m app.serve` from there would run its code.
    hostile = tmp_path / "app"
    hostile.mkdir()
    marker = tmp_path / "ran"
    for name in ("__init__.py", "serve.py", "data.py", "ui.py"):
        (hostile / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    port = _free_port()
    proc = subprocess.Popen(command(str(runs), port=port), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        up = wait_until_up(port, timeout=120, alive=proc)
        if not up:
            err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
            pytest.fail(f"the server did not come up: {err[-2000:]}")
        import time

        time.sleep(3.0)  # the warm-up thread imports app.* meanwhile
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not marker.exists(), marker.read_text()


def test_a_page_waits_for_the_warm_up_to_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from app import serve

    release = threading.Event()
    finished = []

    def slow_warm() -> list[str]:
        release.wait(timeout=30)
        finished.append(True)
        return []

    monkeypatch.setattr(serve, "warm", slow_warm)
    monkeypatch.setattr(serve, "_warming", None)
    serve.start()
    assert serve._warming is not None and serve._warming.is_alive()
    threading.Timer(0.2, release.set).start()
    serve.wait()  # what streamlit_app.py does before its own imports
    assert finished == [True]


def test_without_a_warm_up_a_page_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from app import serve

    monkeypatch.setattr(serve, "_warming", None)
    serve.wait()  # AppTest, a bare `streamlit run`: returns at once


def test_regression_reruns_of_the_dashboard_do_not_grow_sys_path() -> None:
    from streamlit.testing.v1 import AppTest

    entry = ROOT / "app" / "streamlit_app.py"
    at = AppTest.from_file(str(entry), default_timeout=120).run()
    size = len(sys.path)
    for _ in range(3):
        at.run()
    assert len(sys.path) == size
    assert sys.path.count(str(ROOT)) <= 1
