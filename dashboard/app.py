"""The dashboard's entry point: page config, the navigation, the shared sidebar, the URL state.

Run by ``tpubench dashboard`` (or ``streamlit run dashboard/app.py``); the store comes from
``$TPUBENCH_RESULTS`` (default ``results``).
"""

import streamlit as st

from dashboard import catalog, state, ui

st.set_page_config(page_title="tpubench", page_icon=ui.favicon(), layout="wide")
state.begin()
pages = [
    st.Page(page.path, title=page.title, icon=page.icon, default=page is catalog.PAGES[0]) for page in catalog.PAGES
]
current = st.navigation(pages)
ui.sidebar()
current.run()
state.publish()
