"""Entry script of the dashboard: ``streamlit run app/streamlit_app.py -- --runs PATH``.

It sets up the page, puts the run picker in the sidebar and hands over to the page chosen
in the navigation; the pages live in ``app_pages/`` and hold UI only.
"""

from __future__ import annotations

import os
import sys

# Streamlit puts this script's own folder on sys.path; the app imports itself as the
# ``app`` package from the folder above, ahead of any other ``app`` the path may hold.
_ABOVE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [_ABOVE]:
    if _ABOVE in sys.path:  # once: each rerun of the script comes through here again
        sys.path.remove(_ABOVE)
    sys.path.insert(0, _ABOVE)

from app import serve  # noqa: E402

serve.wait()  # the server's warm-up imports what follows; let it finish first

import streamlit as st  # noqa: E402

from app import ui  # noqa: E402

st.set_page_config(page_title=ui.APP_NAME, page_icon=":material/troubleshoot:",
                   layout="wide")
page = st.navigation([st.Page(path, title=title, icon=icon, default=path == ui.PAGES[0][0])
                      for path, title, icon in ui.PAGES])
run = ui.sidebar()
# Called again once the page and the run are known: each tab says which page of which run.
st.set_page_config(page_title=ui.tab_title(page.title, run))
page.run()
