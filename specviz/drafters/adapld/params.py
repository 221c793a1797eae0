"""AdaPLD's settings (docs/methods/adapld.md): the parameter table every front end reads (CLI
``--param``, bench ``--params``, the app's sidebar) and the ablation presets. One record per setting
(:class:`~specviz.drafters.registry.ParamSpec`: type, default, range or choices, label, help).
"""
from __future__ import annotations

from ...costs import COST_CHOICES
from ..registry import ParamSpec, params_by_name

SEMANTIC_CHOICES = ("off", "minilm", "target_embed")
DEFAULT_SEMANTIC = "target_embed"
DEFAULT_SIM_THRESHOLD = {"minilm": 0.5, "target_embed": 0.9, "off": 0.5}
DEFAULT_HISTORY = "auto"
ABLATIONS = {
    "lexical": {"semantic": "off", "branches": False, "history": "off"},
    "semantic": {"semantic": DEFAULT_SEMANTIC, "branches": False, "history": "off"},
    "branches": {"semantic": DEFAULT_SEMANTIC, "branches": True, "history": "off"},
    "full": {"semantic": DEFAULT_SEMANTIC, "branches": True, "history": DEFAULT_HISTORY},
}
PARAMS = params_by_name(
    ParamSpec("max_ngram", int, 4, range=(1, 16), label="Longest n-gram",
              help="Longest suffix n-gram looked up. The longest one found earlier in prompt + "
                   "output wins."),
    ParamSpec("min_ngram", int, 1, range=(1, 16), label="Shortest n-gram",
              help="Shortest suffix n-gram looked up (at most the longest n-gram)."),
    ParamSpec("max_draft", int, 16, range=(1, 64), label="Longest draft",
              help="Most tokens in the best branch; the adaptive control picks the length up "
                   "to this."),
    ParamSpec("max_branches", int, 3, range=(1, 16), label="Most branches",
              help="Most hypotheses merged into the draft tree; 1 = always a chain."),
    ParamSpec("node_budget", int, 24, range=(1, 256), label="Tree node budget",
              help="Most nodes in a draft tree: all branches together, verified in one target "
                   "forward."),
    ParamSpec("semantic", str, DEFAULT_SEMANTIC, choices=SEMANTIC_CHOICES,
              label="Semantic retrieval",
              help="Used when lexical matching finds < 2 tokens: target_embed (the target's own "
                   "embeddings, free), minilm (needs the MiniLM package) or off."),
    ParamSpec("history", str, DEFAULT_HISTORY, label="History store",
              help="When prompt lookup finds nothing to copy: draft what the target most often "
                   "wrote next after the last 1-3 tokens in its own earlier greedy replies, and "
                   "in a reply's first round how it opened replies to similar prompts "
                   "(auto = the store bundled for the loaded model, if any; off; or the path "
                   "of a store made with `python -m specviz train store`)."),
    ParamSpec("window", int, 8, range=(2, 64), label="Semantic window",
              help="Tokens per window compared by semantic retrieval."),
    ParamSpec("adaptive", bool, True, label="Adaptive draft length",
              help="Adapt draft length and branch count to the recent acceptance of each "
                   "retrieval source, and pause sources that do not pay."),
    ParamSpec("cost", str, "auto", choices=COST_CHOICES, label="Verify-cost model",
              help="What a longer verify costs, for the adaptive draft length: auto = measured "
                   "on the loaded model at start and refined from every round (flat on a GPU); "
                   "cpu = a fixed curve timed once on a busy 2-core CPU; flat = accelerators."),
    ParamSpec("learn", bool, False, label="Carry experience across prompts",
              help="Start each source where earlier runs of this model in this process left "
                   "it (its acceptance, and whether it was paused), instead of from the same "
                   "prior every prompt: a source that never pays on this machine is not "
                   "re-probed from scratch on every prompt.", advanced=True),
    ParamSpec("max_copy", int, 64, range=(1, 256), label="Longest copy",
              help="A copy that keeps being accepted doubles its draft each round (up to this "
                   "many tokens); the first rejection falls back to the normal draft length. At "
                   "or below the longest draft, long copies are off."),
    ParamSpec("sim_threshold", float, None, range=(0, 1), label="Semantic similarity threshold",
              help="Cosine similarity a window needs to be copied; unset = by embedder "
                   "(target_embed 0.9, minilm 0.5).", advanced=True),
    ParamSpec("free_threshold", float, None, range=(0, 1), label="Free-match threshold",
              help="Similarity a window with no shared token needs; unset = two thirds of the "
                   "way from the similarity threshold to 1.", advanced=True),
    ParamSpec("branches", bool, True, label="Token trees",
              help="Merge alternative hypotheses into a token tree (false = single chain).",
              advanced=True),
)
