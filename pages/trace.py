"""Open a saved trace: explore a run from a JSON file without loading any model."""
from __future__ import annotations

import streamlit as st

from pages import ui

ss = st.session_state


def show(trace) -> None:
    """One line about the uploaded run, then the trace explorer."""
    meta = trace.meta
    settings = meta.get("settings") or {}
    mode = "greedy" if float(settings.get("temperature", 0) or 0) == 0 else \
        f"sampling T={settings.get('temperature')} top-p={settings.get('top_p')}"
    st.markdown(f"**{ss.get('uploaded_name', 'trace')}** · method "
                f"**{str(meta.get('method', '?')).upper()}** · model *{meta.get('model', '?')}* "
                f"· {mode} · {trace.num_rounds} rounds · stop: {meta.get('stop_reason') or '—'}")
    ui.trace_view(trace, prefix="up", downloads=True)


def main() -> None:
    st.markdown("## Open a saved trace")
    st.caption("Upload a trace downloaded from the Decode page (or written by "
               "`python -m specviz run`). It is shown exactly like a live run; no model is "
               "loaded.")
    ui.trace_upload("upload", id_key="uploaded_file_id", error_key="upload_error",
                    reset=("up_scrub",), drop_on_error=True)
    trace = ss.get("uploaded_trace")
    if trace is not None:
        show(trace)
    elif not ss.get("upload_error"):
        st.info("Choose a trace file to explore it.")


main()
