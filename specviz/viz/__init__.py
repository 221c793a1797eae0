"""Views of a Trace: token HTML, Plotly figures, pandas tables and the numbers behind them.

Pure functions of a :class:`~specviz.trace.Trace` (no streamlit, no model): a trace uploaded
from a file renders exactly like the live run that produced it.
"""
from .charts import (block_confidences, confidence_calibration, fig_accepted_hist, fig_compare,
                     fig_cost_curve, fig_gate, gate_rounds,
                     fig_confidence_calibration, fig_position_acceptance, fig_round_lengths,
                     fig_slot_confidence, has_confidence, slot_confidences)
from .stats import (PositionStat, SpeedupEstimate, accepted_lengths, live_metrics,
                    position_acceptance, speedup_estimate, trace_prefix)
from .glossary import GLOSSARY, glossary_html
from .prompt import PromptToken, copied_from_prompt, copy_sources, prompt_html, prompt_tokens
from .rounds import WAIT_SHOWN_S, RoundNotes, round_summary_html, round_time_text
from .tables import (CompareRun, compare_runs_table, compare_summary_table, compare_verdict,
                     describe_extras, join_tokens, position_table, rounds_table, to_csv_bytes,
                     topk_table, topk_text)
from .tree import block_tree_figure
from .tokens import (KIND_LABELS, TOKEN_CSS, TokenView, legend_html, round_views, token_views,
                     tokens_html, visible_text)

__all__ = [
    "GLOSSARY", "glossary_html",
    "block_confidences", "block_tree_figure", "confidence_calibration", "fig_accepted_hist", "fig_compare",
    "fig_cost_curve", "fig_gate", "gate_rounds",
    "fig_confidence_calibration",
    "fig_position_acceptance", "fig_round_lengths", "fig_slot_confidence", "has_confidence",
    "slot_confidences",
    "PositionStat", "SpeedupEstimate", "accepted_lengths", "live_metrics",
    "position_acceptance", "speedup_estimate", "trace_prefix",
    "PromptToken", "copied_from_prompt", "copy_sources", "prompt_html", "prompt_tokens",
    "WAIT_SHOWN_S", "RoundNotes", "round_summary_html", "round_time_text",
    "CompareRun", "compare_runs_table", "compare_summary_table", "compare_verdict",
    "describe_extras", "join_tokens", "position_table", "rounds_table", "to_csv_bytes",
    "topk_table", "topk_text",
    "KIND_LABELS", "TOKEN_CSS", "TokenView", "legend_html", "round_views", "token_views",
    "tokens_html", "visible_text",
]
