"""The Streamlit dashboard over a results store (``tpubench dashboard``; ``streamlit run dashboard/app.py``).

``app.py`` builds the navigation and the shared sidebar, ``app_pages/`` holds one page per
file, ``data.py`` every cached load (store reads through :mod:`tpubench.store`, analyses
through :mod:`tpubench.analysis`), ``state.py`` the query-parameter sync, ``ui.py`` the
widgets pages share and ``charts.py`` the plotly figures. Pages compute no statistic of
their own: the CLI, the reports and the dashboard show the same numbers.
"""

#: where the store is: ``tpubench dashboard --results`` sets it; a local folder or an s3:// URL,
#: or several (``--results A --results B``: stores of several machines) one per line
RESULTS_ENV = "TPUBENCH_RESULTS"
STORE_SEPARATOR = "\n"
