"""One module per dashboard page, run by ``st.navigation`` (``app_pages/``, not ``pages/``, which
Streamlit would also pick up by its older automatic discovery)."""
