"""The dashboard's server process: Streamlit's own command line, with the modules every
first page needs imported while the server waits for its first browser.

Streamlit runs a page's script only once a browser has connected, so the first visitor
would otherwise wait for pandas, pyarrow, plotly and the analyzer's readers to import
(about two seconds on a busy two-core machine) before anything is drawn. Here they are
imported on a background thread as soon as the server starts; the page's script then finds
them in ``sys.modules``. torch is not among them: it is imported only by a page that needs
it (a checkpoint scan, a replay).

    python app/serve.py run app/streamlit_app.py [streamlit options] -- --runs PATH

It is run by its path, not with ``-m``: ``-m`` would put the working folder first on the
path, and an ``app`` package there (the folder being analysed, say) would be imported in
place of this one.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

# Run by path, Python puts this file's folder first on the path; the app imports itself as
# the ``app`` package from the folder above, ahead of any other ``app`` (as streamlit_app.py
# does).
_ABOVE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [_ABOVE]:
    if _ABOVE in sys.path:  # once: each rerun of the script comes through here again
        sys.path.remove(_ABOVE)
    sys.path.insert(0, _ABOVE)

WARM = ("pandas", "pyarrow", "plotly.graph_objects", "plotly.subplots", "analyzer.pipeline",
        "analyzer.wording", "app.data", "app.ui", "app.views", "app.charts", "app.tables")
"""What a first page imports (the Runs page and a run's page), heaviest first."""


def warm(names: tuple[str, ...] = WARM) -> list[str]:
    """Import ``names``; the ones that cannot be imported are left to the page, which then
    reports its own error. Returns those imported."""
    done = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the page imports it again and says why
            continue
        done.append(name)
    return done


_warming: threading.Thread | None = None


def start() -> None:
    """Begin the warm-up on a thread of its own (once per process)."""
    global _warming
    if _warming is None:
        _warming = threading.Thread(target=warm, name="forensics-warm", daemon=True)
        _warming.start()


def wait() -> None:
    """Let the warm-up finish before a page's script imports the same modules: two threads
    importing at once can see a module half made (plotly looks pandas up in sys.modules
    without importing it). The wait costs nothing extra: it is the imports the page would
    make itself. Outside a server started here (AppTest, a bare ``streamlit run``) there is
    nothing to wait for."""
    if _warming is not None:
        _warming.join()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    from streamlit.web.cli import main as streamlit_main  # before the thread: see wait()

    # The state lives in the ``app.serve`` module the pages import, not in ``__main__``.
    importlib.import_module("app.serve").start()
    sys.argv = ["streamlit", *args]
    streamlit_main()


if __name__ == "__main__":
    main()
