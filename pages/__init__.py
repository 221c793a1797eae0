"""Streamlit pages of the specviz app (run through st.navigation in app.py)."""
