"""Views of a Trace: token HTML, Plotly figures, pandas tables and the numbers behind them.

Pure functions of a :class:`~specviz.trace.Trace` (no streamlit, no model): a trace uploaded
from a file renders exactly like the live run that produced it. One module per view: token
HTML (:mod:`.tokens`), the prompt as the model read it (:mod:`.prompt`), the round sentence
(:mod:`.rounds`), figures (:mod:`.charts`, the block tree :mod:`.tree`), tables
(:mod:`.tables`, a round's extras in words :mod:`.extras`), live numbers (:mod:`.stats`), the
glossary (:mod:`.glossary`) and the method pages' views (:mod:`.adapld`, :mod:`.retrace`,
:mod:`.edr`).
"""
