"""caprag dashboard: `streamlit run experiments/dashboard/app.py` (reads MLFLOW_TRACKING_URI)."""

from __future__ import annotations

import streamlit as st

import caprag  # noqa: F401  (first: switches telemetry off before streamlit/mlflow report anything)
from experiments.dashboard import store

st.set_page_config(page_title="caprag dashboard", page_icon=":material/menu_book:", layout="wide")

PAGES = [
    st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", default=True),
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("views/regressions.py", title="Regressions", icon=":material/difference:"),
    st.Page("views/trace.py", title="Trace viewer", icon=":material/account_tree:"),
    st.Page("views/ask.py", title="Ask", icon=":material/chat:"),
    st.Page("views/decisions.py", title="Decision log", icon=":material/fact_check:"),
]

page = st.navigation(PAGES)
with st.sidebar:
    st.caption(f"MLflow store: `{store.uri()}`")
    if st.button("Reload runs", help="Read the store again (runs are cached for a minute)"):
        st.cache_data.clear()
page.run()
