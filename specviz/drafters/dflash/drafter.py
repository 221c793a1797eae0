"""DFlash: a block-diffusion drafter conditioned on the target's hidden states
(docs/methods/dflash.md).

The drafter is a few Qwen3-style decoder layers that see the TARGET's hidden states as context
and denoise one block [last committed token, MASK x (B-1)] in a single forward; slot i >= 1
predicts the token at its own position (no shift) and the draft is the argmax of slots 1..B-1.
Embedding and LM head are the target's (frozen, never stored in the drafter checkpoint).

Architecture (checkpoint-compatible with the released z-lab ``DFlashDraftModel`` checkpoints,
e.g. ``z-lab/Qwen3-8B-DFlash-b16``; loaded WITHOUT ``trust_remote_code``, strict key matching):

* context features: the hidden states of k target layers (HF ``output_hidden_states`` index =
  layer id + 1) concatenated on the feature dim -> ``fc`` (k*H -> H, no bias) -> ``hidden_norm``.
* every layer: K, V = [k_proj/v_proj(context); k_proj/v_proj(block)], Q from the block only;
  ``q_norm`` / ``k_norm`` per head (as Qwen3) on queries and on BOTH context and block keys;
  RoPE at absolute positions (context 0..n-1, block n..n+B-1); no mask at all (bidirectional
  inside the block, full attention to the context); GQA.
  Design choice, following the public reference: the context features (after fc + hidden_norm)
  go to k_proj / v_proj DIRECTLY -- they are not passed through the layer's input_layernorm, and
  every layer projects the same features (so per-layer context K/V can be cached exactly).
* decoder layer: x += attn(input_layernorm(x), ctx); x += mlp(post_attention_layernorm(x));
  then the final ``norm`` and the target's LM head.
* weights: ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``,
  ``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``,
  ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``,
  ``layers.{i}.mlp.{gate,up,down}_proj.weight``; plus, only for targets without a spare
  embedding row, ``mask_embedding`` [H] (config ``dflash_config.learned_mask_embedding: true``).
  The layouts published since (sliding windows, sinks, DFlash2, Domino): :mod:`.layouts`.
* optional (specviz-trained drafters): ``draft_vocab`` int64 [Vd] in model.safetensors and
  ``dflash_config.draft_vocab_size`` -- the sorted target word ids the drafter may propose (the
  words of its training replies). Only those rows of the LM head are computed (FR-Spec-style;
  on a CPU the 49k-word head costs more than two drafter layers); published checkpoints have no
  such key and score the full vocabulary.

Bundled drafter: ``specviz/weights/dflash-smollm2-135m-instruct``, trained with ``python -m
specviz train rollouts`` + ``train dflash`` for the embedded target on its greedy replies (bench
prompts and Magpie dialogue the target writes itself), with soft labels (the target's top-8) for
2,000 steps; how, and what it measures: docs/methods/dflash.md. It is used when ``checkpoint``
is left empty and the target is SmolLM2-135M-Instruct.

Weights at run time (``weights``: float, int8, auto; packed CPU kernels): :mod:`.runtime`.

Modules: the torch model in :mod:`.model`, checkpoints (published layout, bundled
drafters, warm start) in :mod:`.checkpoint`, its settings in :mod:`.params`;
this module is the drafter. Before each forward the
forward gate (:mod:`.block_cut`, charging each drafted round what it measurably cost) and, when
fitted and on, the state probe (:mod:`.state_probe`) may make the round a plain step; the
drafter's side of both, and what they learn after the verify: :mod:`.gating`.

Runtime (:class:`DFlashDrafter`): the drafter keeps a per-layer cache of the context K/V,
one row per committed position except the last committed token (which is the block's slot 0):
the prefill hidden states fill it in ``begin``; ``observe`` appends only the newly committed rows
of the verify forward (``feedback.kept_rows``), so no extra target forward is ever run.

Sampling: by default the draft is the argmax of each slot and ``Draft.q`` is None, i.e. the
verifier treats it as a point mass (accept x with prob p(x)) -- lossless for greedy and sampled
verification alike; ``q_token`` then carries the drafter's softmax prob for display only. With
``draft_temperature > 0`` the drafter instead SAMPLES each slot from softmax(logits / T_d) with
its own seeded generator and returns those distributions as ``q`` (Leviathan acceptance
min(1, p/q)); this is lossless too because slot distributions depend only on the committed
prefix, never on the other draft tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...costs import cost_curve
from ...errors import SettingsError
from ..base import Draft, DraftContext, Drafter, VerifyFeedback
from ..registry import MethodSpec
from .block_cut import BlockCut, ForwardGate, SharedDraft
from .block_tree import TREE_TOPK, TreeNode, best_first, tree_draft
from .checkpoint import check_compatible
from .context import LazyContextKV
from .gating import GatedBlock
from .model import DFlashDraftModel
from .params import PARAMS, check_block_size, check_settings, drafter_checkpoint, drafter_dtype
from .runtime import drafter_model

TOPK = 4  # drafter top-k ids/probs recorded per slot (rejected-suffix alignment)


# --------------------------------------------------------------------------- the drafter
class DFlashDrafter(GatedBlock, Drafter):
    """DFlash behind the engine's Drafter interface (see the module docstring)."""

    name = "dflash"
    #: True where ``draft_logits`` drafts left to right itself (DSpark's chains)
    chains = False

    def __init__(self, target=None, checkpoint: str | Path | None = None,
                 model: DFlashDraftModel | None = None, block_size: int | None = None,
                 draft_temperature: float = 0.0, seed: int = 0, dtype: str | torch.dtype | None = None,
                 device: str | None = None, cut: str = "auto", weights: str = "float",
                 tree: int | None = None, state_probe: str = "off",
                 gate_cost: str = "measured"):
        """Check the settings, load the drafter for ``target`` (``checkpoint``, else the one
        bundled for it; or adopt ``model``) and set up its context cache and state probe."""
        if target is None:
            raise SettingsError("dflash needs the target model (make_drafter('dflash', target, ...))")
        s = check_settings(tree, checkpoint, draft_temperature, block_size, seed, cut, weights)
        self.tree_nodes, self.cut_mode = s["tree"], s["cut"]
        self.cut: BlockCut | None = None
        self.shared: SharedDraft | None = None   # a draft sharing the verify (hybrid.py)
        self._last_cut: tuple[list[float], int] | None = None
        self._last_tree: tuple[list[TreeNode], list[list[float]]] | None = None
        checkpoint = s["checkpoint"] if model is not None \
            else drafter_checkpoint(s["checkpoint"], target)
        dev = device or target.device
        self.dtype = drafter_dtype(dtype, target)
        self.weights_setting = s["weights"]
        model, self.weights = drafter_model(model, checkpoint, target, dev, self.dtype,
                                            s["weights"])
        self.block_size = check_block_size(s["block_size"], int(model.block_size))
        # DFlash2's selector walk or Domino's corrections in the last block: (extras key, info)
        self._chain_info: tuple[str, dict] | None = None
        if model.layout in ("dflash2", "domino"):   # both draft the block left to right
            self.chains = True
        self.target, self.model, self.device = target, model, torch.device(dev)
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.draft_temperature, self.seed = s["draft_temperature"], s["seed"]
        self.hidden_state_layers = [i + 1 for i in model.target_layer_ids]
        self._ctx = LazyContextKV(self.hidden_state_layers, model.context_kv, self.device,
                                  self.dtype)
        self.gate_cost = PARAMS["gate_cost"].check(gate_cost)
        self._load_state_probe(checkpoint, state_probe)
        self._reset()

    # -- context cache (.context.LazyContextKV): every drafter layer's context K/V, projected
    # from queued tapped features when the next block needs them.
    @property
    def context_len(self) -> int:
        return len(self._ctx)

    def _reset(self) -> None:
        self._ctx.reset()
        self.generator = torch.Generator().manual_seed(self.seed)

    def _context_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self._ctx.kv() or self._empty_kv()

    # -- Drafter interface
    def begin(self, target, prompt_ids, prefill_hidden=None):
        if target is not self.target:
            check_compatible(self.model, target)
            self.target = target
        self._reset()
        if self.cut_mode != "off":  # the verify-cost model of this machine, learned afresh
            self.cut = BlockCut(cost_curve("auto", target),
                                gate=ForwardGate() if self.cut_mode == "auto" else None)
        if len(prompt_ids) > 1:
            self._ctx.append(prefill_hidden, None, 0)
            self._ctx.flush()
            self._keep_probe_features(prefill_hidden, len(prompt_ids) - 2)

    def block_input(self, tokens: list[int]) -> torch.Tensor:
        """The block's input embeddings [1, B, H]: the last committed token, then B-1 masks
        (a subclass may add to them -- ReTrace's fused rejected-suffix memory)."""
        B = self.block_size
        emb = self.target.model.get_input_embeddings()
        m = self.model
        mask_id = m.mask_token_id if not m.learned_mask else tokens[-1]
        ids = torch.tensor([[tokens[-1]] + [mask_id] * (B - 1)], device=emb.weight.device)
        x = emb(ids).to(device=self.device, dtype=self.dtype)
        if m.learned_mask:
            x = torch.cat([x[:, :1], m.mask_embedding.view(1, 1, -1).expand(1, B - 1, -1)], 1)
        return x

    def block_logits(self, tokens: list[int]) -> torch.Tensor:
        """Drafter logits [B-1, V] (float32) of slots 1..B-1 for the committed ``tokens``; the
        slots' final hidden states stay in ``self.last_hidden`` [B-1, H] until the next block."""
        with self.target.lock, torch.inference_mode():
            h = self.block_hidden(tokens)
            logits = self.model.slot_logits(h, self.target.model.get_output_embeddings())
        return logits.float()

    def block_hidden(self, tokens: list[int]) -> torch.Tensor:
        """Final hidden states [B-1, H] of slots 1..B-1 for the committed ``tokens`` (one
        drafter forward; kept in ``self.last_hidden``). Call under the target's lock."""
        return self.block_states(tokens)[1:]

    def block_states(self, tokens: list[int]) -> torch.Tensor:
        """Final hidden states [B, H] of every slot, the anchor's first (one drafter forward;
        slots 1..B-1 kept in ``self.last_hidden``). Call under the target's lock."""
        x = self.block_input(tokens)
        h = self.model.forward_block(x, self._context_kv(), len(tokens) - 1)[0]
        self.last_hidden = h[1:]
        return h

    def draft_logits(self, tokens: list[int], k: int) -> tuple[torch.Tensor, list[int] | None]:
        """(logits [k, V] of slots 1..k on the CPU, the drafted tokens when the drafter chose
        them itself -- left to right, as DSpark, DFlash2's candidate selector and Domino do --
        else None: argmax / sampling follow)."""
        layout = self.model.layout
        if layout in ("dflash2", "domino"):
            from .dflash2 import select_block
            from .domino import domino_block

            head = self.target.model.get_output_embeddings()
            T, g = self.draft_temperature, self.generator
            with self.target.lock, torch.inference_mode():
                if layout == "dflash2":
                    rows, chain, info = select_block(self.model, self.block_hidden(tokens)[:k],
                                                     head, tokens[-1], T, g)
                else:
                    rows, chain, info = domino_block(
                        self.model, self.block_states(tokens), head,
                        self.target.model.get_input_embeddings(), tokens[-1], k, T, g)
            self._chain_info = ("selector" if layout == "dflash2" else "domino", info)
            return rows, chain
        return self.block_logits(tokens)[:k].cpu(), None

    def greedy_scores(self, tokens: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The greedy path's logits: (scores [k, C] of slots 1..k, float32 on the CPU; the word
        id of each column, or None when the columns are the whole vocabulary). With a draft
        vocabulary every other word's logit is -inf, so its columns alone give the same softmax,
        argmax and top-k without building a [k, 49k] tensor (one drafter forward, head over k
        slots only)."""
        head = self.target.model.get_output_embeddings()
        with self.target.lock, torch.inference_mode():
            h = self.block_hidden(tokens)[:k]
            scores = self.model.draft_scores(h, head, None).float().cpu()
        dv = self.model.draft_vocab
        return scores, None if dv is None else dv.to(scores.device)

    def _empty_kv(self):
        a = self.model.layers[0].self_attn
        z = torch.zeros(1, a.n_kv, 0, a.head_dim, device=self.device, dtype=self.dtype)
        return [(z, z) for _ in self.model.layers]

    def propose(self, ctx: DraftContext) -> Draft:
        n = len(ctx.tokens)
        self._ctx.crop(n - 1)
        if self.context_len != n - 1:
            raise RuntimeError(f"dflash context cache holds {self.context_len} positions but "
                               f"{n - 1} are committed (was observe() skipped?)")
        k = max(0, min(self.block_size - 1, int(ctx.max_draft)))
        extras = {"block_size": self.block_size, "confidence": []}
        if k == 0:
            return Draft(extras=extras)
        if self._skips_forward(ctx.round_index, k, extras):
            return Draft(extras=extras)   # a plain decoding step, no drafter forward
        logits, chain, words = None, None, None
        if self.draft_temperature > 0 or self.chains:
            logits, chain = self.draft_logits(list(ctx.tokens), k)
            probs = torch.softmax(logits, dim=-1)
        else:   # greedy: scores over the draft vocabulary's columns only (greedy_scores)
            scores, words = self.greedy_scores(list(ctx.tokens), k)
            probs = torch.softmax(scores, dim=-1)
        if self._drafts_tree():
            return self._propose_tree(probs, words, k, extras)
        draft = self._propose_chain(probs, logits, chain, words, k, extras)
        if self._chain_info and draft.tokens:   # DFlash2's walk / Domino's corrections, as kept
            key, info = self._chain_info
            extras[key] = {name: v[:len(draft.tokens)] for name, v in info.items()}
        return draft

    def _propose_chain(self, probs: torch.Tensor, logits: torch.Tensor | None,
                       chain: list[int] | None, words: torch.Tensor | None, k: int,
                       extras: dict) -> Draft:
        """The block as a chain: each slot's top word (or DSpark's left-to-right ``chain``, or a
        sample at the draft temperature), cut to the prefix that pays (BlockCut)."""
        conf, top = probs.max(-1)
        if words is not None:
            top = words[top]
        if chain is not None:   # drafted left to right (DSpark): the slots' own tokens
            top = torch.tensor(chain[:len(top)])
            conf = probs.gather(-1, top.unsqueeze(-1)).squeeze(-1)
        if self.cut is not None:  # verify only the prefix that pays for itself (BlockCut)
            block_conf = [float(c) for c in conf]
            kept, value = self.cut.choose(block_conf, self.shared)
            self._last_cut = (block_conf, kept)
            extras["cut"] = {"kept": kept, "block": k,
                             "block_confidence": [round(c, 3) for c in block_conf],
                             "value": [round(v, 3) for v in value],
                             **self._gate_state(drafted=True)}
            conf, top = conf[:kept], top[:kept]
            logits = None if logits is None else logits[:kept]
            if kept == 0:
                return Draft(extras=extras)
        extras["confidence"] = [round(float(c), 6) for c in conf]
        tk_p, tk_i = probs[:len(conf)].topk(min(TOPK, probs.shape[-1]), dim=-1)
        if words is not None:
            tk_i = words[tk_i]
        extras["topk"] = tk_i.tolist()  # the drafter's top-k per slot (alignment analysis)
        extras["topk_p"] = [[round(float(x), 3) for x in row] for row in tk_p]
        if self.draft_temperature > 0:
            q = torch.softmax(logits / self.draft_temperature, dim=-1)
            tokens = top if chain is not None else \
                torch.multinomial(q, 1, generator=self.generator).squeeze(-1)
            q_token = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            return Draft(tokens=[int(t) for t in tokens], q=q,
                         q_token=[round(float(x), 6) for x in q_token], extras=extras)
        return Draft(tokens=[int(t) for t in top], q=None,
                     q_token=[round(float(c), 6) for c in conf], extras=extras)

    def _drafts_tree(self) -> bool:
        """Draft a token tree this round? Only greedy drafts of a drafter scoring slots in
        parallel, for a target that verifies unpadded trees."""
        return (self.tree_nodes > 0 and self.draft_temperature == 0 and not self.chains
                and int(getattr(self.target, "min_width", 1)) <= 1)

    def _propose_tree(self, probs: torch.Tensor, words: torch.Tensor | None, k: int,
                      extras: dict) -> Draft:
        """The block as a token tree (:mod:`.block_tree`): the slots' top words, best paths
        first, as many nodes as the cut finds worth verifying (``tree`` nodes with cut off)."""
        tk_p, tk_i = probs.topk(min(TREE_TOPK, probs.shape[-1]), dim=-1)
        if words is not None:
            tk_i = words[tk_i]
        raw, ids = tk_p.tolist(), tk_i.tolist()
        if self.cut is not None:
            nodes, value = self.cut.choose_tree(raw, self.tree_nodes, self.shared)
            self._last_tree = (nodes, raw)
            extras["cut"] = {"kept": len(nodes), "block": k, "tree": True,
                             "block_confidence": [round(r[0], 3) for r in raw],
                             "value": [round(v, 3) for v in value],
                             **self._gate_state(drafted=True)}
        else:
            nodes = best_first(raw, self.tree_nodes)
        return tree_draft(nodes, raw, ids, extras)

    def observe(self, feedback: VerifyFeedback) -> None:
        rnd = feedback.round
        self.observe_context(feedback)
        view = self.pop_cut(rnd.path)
        if self.cut is not None and view is not None:
            conf, kept, nodes = view
            self.cut.observe(conf, kept, int(rnd.accepted), float(rnd.t_draft), int(rnd.index),
                             len(rnd.committed), nodes=nodes, gate_cost=self._round_cost(rnd))

    def observe_context(self, feedback: VerifyFeedback) -> None:
        """Queue the newly committed rows' tapped features (the verify forward's hidden states
        at ``feedback.kept_rows``: a chain's first rows, a tree's accepted path)."""
        rnd = feedback.round
        rows = list(feedback.kept_rows if feedback.kept_rows is not None else [0])
        rows = rows[:len(rnd.committed)]  # an EOS / budget cut commits fewer tokens
        start = int(rnd.start) - 1        # position of the verify input's row 0
        self._ctx.crop(start)
        self._ctx.append(feedback.hidden_states, rows, start)
        if rows:
            self._keep_probe_features(feedback.hidden_states, rows[-1])

    def config(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "block_size": self.block_size,
                "checkpoint_block_size": int(self.model.block_size),
                "target_layer_ids": list(self.model.target_layer_ids),
                "num_layers": len(self.model.layers), "draft_temperature": self.draft_temperature,
                "mask": "learned" if self.model.learned_mask else int(self.model.mask_token_id),
                "draft_vocab_size": None if self.model.draft_vocab is None
                else int(self.model.draft_vocab.numel()), "cut": self.cut_mode,
                "weights": self.weights_setting, "weights_in_use": self.weights,
                "tree": self.tree_nodes, "state_probe": self.state_probe_setting,
                "gate_cost": self.gate_cost,
                "state_probe_in_use": self.state_probe is not None}


SPECS = (MethodSpec("dflash", DFlashDrafter, "DFlash", "DFlash: block-diffusion drafter on the "
                    "target's hidden states (bundled for the embedded model)", kind="learned",
                    needs_target=True, params=tuple(PARAMS.values())),)
