"""The speculative decoding loop (docs/architecture.md): one target forward per round.

``Session(target, drafter, prompt, settings)``: ``step()`` runs one round and returns a
:class:`~specviz.trace.Round`; ``run()`` runs to EOS / max tokens and returns the
:class:`~specviz.trace.Trace`. The KV cache always holds every committed token except the last
one; a round feeds [last committed token, draft...] (a chain, or a tree with a 4D mask and
depth-based position ids), verifies, commits the accepted tokens plus the target's own token,
and crops the cache to the committed length (for a tree: gathers the accepted path's rows first).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from transformers import DynamicCache

from . import __version__
from .costs import cached_model
from .drafters.base import Draft, DraftContext, Drafter, VerifyFeedback, clip_draft
from .errors import PromptError, SettingsError
from .kvcache import accepts_logits_to_keep, cache_kwarg, cache_len, keep_rows
from .models import Target
from .numerics import first_branch_only, pad_tree_inputs, padded
from .trace import Round, Trace
from .tree import TokenTree
from .verify import Verdict, target_probs, verify

MAX_PROMPT_CHARS = 200_000
MAX_NEW_TOKENS_LIMIT = 8192
TARGET_TOPK = 4  # the target's top-k ids / probs recorded per verify row (the top-k view)


@dataclass
class DecodeSettings:
    """Decoding settings. ``temperature == 0`` means greedy verification."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    chat_template: bool | None = None  # None: apply it when the tokenizer has one

    def validate(self) -> "DecodeSettings":
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool):
            raise SettingsError("max_new_tokens must be an integer")
        if self.max_new_tokens <= 0:
            raise SettingsError("max_new_tokens must be at least 1")
        if self.max_new_tokens > MAX_NEW_TOKENS_LIMIT:
            raise SettingsError(f"max_new_tokens must be at most {MAX_NEW_TOKENS_LIMIT}")
        if not (0.0 <= float(self.temperature) <= 10.0):
            raise SettingsError("temperature must be between 0 (greedy) and 10")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise SettingsError("top_p must be in (0, 1]")
        return self

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0


class Session:
    """One speculative decoding run of ``target`` with ``drafter`` on ``prompt``."""

    def __init__(self, target: Target, drafter: Drafter, prompt: str | list[int],
                 settings: DecodeSettings | None = None, method: str | None = None):
        self.target = target
        self.drafter = drafter
        self.settings = (settings or DecodeSettings()).validate()
        self.method = method or drafter.name
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError("the prompt is empty")
            if len(prompt) > MAX_PROMPT_CHARS:
                raise PromptError(f"the prompt is {len(prompt):,} characters; the limit is "
                                  f"{MAX_PROMPT_CHARS:,}")
            self.prompt_text = prompt
            prompt_ids = target.encode_prompt(prompt, self.settings.chat_template)
        else:
            self.prompt_text = None
            prompt_ids = [int(t) for t in prompt]
        if not prompt_ids:
            raise PromptError("the prompt is empty")
        if len(prompt_ids) >= target.max_context:
            raise PromptError(f"the prompt has {len(prompt_ids):,} tokens but the model's context "
                              f"is {target.max_context:,} tokens")
        self.prompt_ids = prompt_ids
        self.tokens: list[int] = list(prompt_ids)
        self.rounds: list[Round] = []
        self.done = False
        self.stop_reason: str | None = None
        self.last_forward_s = 0.0
        self.last_wait_s = 0.0
        self.generator = torch.Generator().manual_seed(int(self.settings.seed))
        self.eos = target.eos_token_ids
        self._want_hidden = drafter.hidden_state_layers is not None
        self.cache = DynamicCache(config=target.model.config)
        t0 = time.perf_counter()
        prefill_hidden = None
        if len(prompt_ids) > 1:
            out = self._forward(prompt_ids[:-1], last_logits_only=True)
            prefill_hidden = out.hidden_states if self._want_hidden else None
        self.prefill_time = time.perf_counter() - t0
        t0 = time.perf_counter()
        drafter.begin(target, list(prompt_ids), prefill_hidden)
        self.prefill_time += time.perf_counter() - t0

    # ------------------------------------------------------------------ helpers
    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    def _forward(self, ids: list[int], attention_mask=None, position_ids=None,
                 last_logits_only: bool = False):
        """One target forward over ``ids`` on the KV cache. ``last_logits_only`` (the prefill:
        nobody reads its logits) skips the LM head on all other rows where the model allows it,
        which on a CPU is a fifth of a long prompt's prefill."""
        model = self.target.model
        dev = self.target.device
        inp = torch.tensor([ids], dtype=torch.long, device=dev)
        kwargs = {}
        if last_logits_only and accepts_logits_to_keep(model):
            kwargs["logits_to_keep"] = 1
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(dev)
            kwargs["position_ids"] = position_ids.to(dev)
        kwargs[cache_kwarg(model)] = self.cache
        t_ask = time.perf_counter()
        with self.target.lock, torch.inference_mode():
            self.last_wait_s = time.perf_counter() - t_ask   # another tab's turn on the model
            t0 = time.perf_counter()   # compute only: waiting for another tab's turn excluded
            out = model(input_ids=inp, use_cache=True,
                        output_hidden_states=self._want_hidden, **kwargs)
            self.last_forward_s = time.perf_counter() - t0
        return out

    def _budget(self) -> int:
        """How many tokens this round may still commit."""
        left_tokens = self.settings.max_new_tokens - len(self.generated)
        left_context = self.target.max_context - len(self.tokens)
        return max(0, min(left_tokens, left_context))

    def _stop_if_spent(self) -> bool:
        """Finish the run when the token budget or the context window is used up."""
        if self._budget() > 0:
            return False
        self._finish("max_new_tokens" if len(self.generated) >= self.settings.max_new_tokens
                     else "context")
        return True

    # ------------------------------------------------------------------ the round
    def step(self) -> Round | None:
        """One speculative round, as in the paper: propose -> verify -> commit -> record.
        Returns the Round, or None when the run is finished."""
        if self.done or self._stop_if_spent():
            return None
        budget = self._budget()
        t0 = time.perf_counter()
        draft = self._propose(budget)
        t_draft = time.perf_counter() - t0
        t0 = time.perf_counter()
        tree, out, logits, probs, verdict = self._verify(draft)
        committed, n_acc, stop = self._commit(tree, verdict, budget)
        t_verify = time.perf_counter() - t0
        rnd = self._record(draft, tree, logits, probs, verdict, committed, n_acc,
                           t_draft, t_verify)
        self.drafter.observe(VerifyFeedback(
            round=rnd, logits=logits,
            hidden_states=out.hidden_states if self._want_hidden else None,
            kept_rows=verdict.rows))
        if stop:
            self._finish(stop)
        else:
            self._stop_if_spent()
        return rnd

    def _propose(self, budget: int) -> Draft:
        """The drafter's proposal, clipped so the round never commits past the budget."""
        ctx = DraftContext(tokens=list(self.tokens), prompt_len=len(self.prompt_ids),
                           max_draft=budget - 1, round_index=len(self.rounds))
        return clip_draft(self.drafter.propose(ctx), budget - 1)

    def _verify(self, draft: Draft
                ) -> tuple[TokenTree, object, torch.Tensor, torch.Tensor, Verdict]:
        """ONE target forward over [last committed token, draft...] (a tree with its 4D mask and
        depth positions), the verdict, and the KV cache cut back to the committed rows."""
        tree = draft.tree
        start = cache_len(self.cache)
        ids = [self.tokens[-1]] + list(tree.tokens)
        n, width = len(ids), max(len(ids), self.target.min_width)
        if tree.is_chain:
            out = self._forward(padded(ids, width))
        else:
            mask, pos = pad_tree_inputs(tree.attention_mask(start), tree.position_ids(start), width)
            out = self._forward(padded(ids, width), attention_mask=mask, position_ids=pos)
        if width > n:  # the padding rows (after the real ones, unseen by them) are dropped
            out.logits = out.logits[:, :n]
            if self._want_hidden:
                out.hidden_states = tuple(h[:, :n] for h in out.hidden_states)
        logits = out.logits[0].float()
        s = self.settings
        probs = target_probs(logits, s.temperature, s.top_p)
        verdict = verify(tree, logits, probs, s.greedy, draft.q, self.generator)
        self._path_cut = None
        if self.target.min_width > 1 and verdict.rows != list(range(len(verdict.rows))):
            verdict, self._path_cut = first_branch_only(tree, verdict), len(verdict.path)
        keep_rows(self.cache, start, verdict.rows)
        cost_model = cached_model(self.target)
        if cost_model is not None:  # refine the verify-cost curve online with this forward
            cost_model.observe(width, self.last_forward_s)
        return tree, out, logits, probs, verdict

    def _commit(self, tree: TokenTree, verdict: Verdict, budget: int
                ) -> tuple[list[int], int, str | None]:
        """Append the accepted tokens and the target's token, cut at EOS and at the budget.
        Returns (committed, accepted count, stop reason or None)."""
        committed = [int(tree.tokens[i]) for i in verdict.path] + [int(verdict.token)]
        stop = None
        eos_at = next((j for j, t in enumerate(committed) if t in self.eos), None)
        if eos_at is not None:
            committed, stop = committed[:eos_at + 1], "eos"
        committed = committed[:budget]  # never past max_new_tokens / the context window
        n_acc = min(len(verdict.path), len(committed))  # an accepted EOS ends the round early
        self.tokens.extend(committed)
        return committed, n_acc, stop

    def _record(self, draft: Draft, tree: TokenTree, logits: torch.Tensor, probs: torch.Tensor,
                verdict: Verdict, committed: list[int], n_acc: int, t_draft: float,
                t_verify: float) -> Round:
        """The round as a plain record (what every view reads)."""
        argmax = logits.argmax(-1)
        argmax_prob = probs.gather(-1, argmax.unsqueeze(-1)).squeeze(-1)
        top_p, top_i = probs.topk(min(TARGET_TOPK, probs.shape[-1]), dim=-1)
        p_draft = [float(probs[TokenTree.row_of(par), t]) for par, t in zip(tree.parents,
                                                                         tree.tokens)]
        chain = tree.is_chain
        rnd = Round(
            index=len(self.rounds), start=len(self.tokens) - len(committed),
            drafter=self.drafter.name, draft=list(tree.tokens), accepted=n_acc,
            committed=committed, target_argmax=[int(x) for x in argmax.tolist()],
            target_argmax_prob=[round(float(x), 6) for x in argmax_prob.tolist()],
            target_topk=top_i.tolist(),
            target_topk_prob=[[round(float(x), 4) for x in row] for row in top_p.tolist()],
            p_draft=[round(x, 6) for x in p_draft],
            q_draft=list(draft.q_token) if draft.q_token is not None else [None] * len(tree),
            parents=None if chain else list(tree.parents),
            accepted_path=[] if chain else verdict.path[:n_acc],
            t_draft=t_draft, t_verify=t_verify, t_forward=self.last_forward_s,
            t_wait=self.last_wait_s,
            extras=dict(draft.extras, **({"path_cut": self._path_cut} if self._path_cut else {})))
        self.rounds.append(rnd)
        return rnd

    def _finish(self, reason: str) -> None:
        self.done = True
        self.stop_reason = reason

    def run(self, max_rounds: int | None = None,
            progress: Callable[[int, int], None] | None = None) -> Trace:
        """Step until EOS / max tokens (or ``max_rounds``); ``progress(generated, max)``."""
        n = 0
        while not self.done and (max_rounds is None or n < max_rounds):
            if self.step() is None:
                break
            n += 1
            if progress:
                progress(len(self.generated), self.settings.max_new_tokens)
        return self.trace()

    # ------------------------------------------------------------------ the record
    def trace(self) -> Trace:
        tok = self.target.tokenizer
        ids = set(self.tokens)
        for r in self.rounds:
            ids.update(r.draft)
            ids.update(r.target_argmax)
            for row in r.target_topk + _id_rows((r.extras or {}).get("topk")):
                ids.update(row)
        token_texts = {i: tok.decode([i], skip_special_tokens=False) for i in sorted(ids)}
        meta = {
            "specviz_version": __version__,
            "model": self.target.name,
            "method": self.method,
            "drafter": self.drafter.name,
            "drafter_config": self.drafter.config(),
            "settings": asdict(self.settings),
            "prompt": self.prompt_text,
            "prompt_len": len(self.prompt_ids),
            "vocab_size": self.target.vocab_size,
            "device": self.target.device,
            "dtype": str(self.target.dtype).replace("torch.", ""),
            "min_width": self.target.min_width,
            "numerics": self.target.numerics.summary() if self.target.numerics else None,
            "kernels": self.target.kernels.summary() if self.target.kernels else None,
            "prefill_time": self.prefill_time,
            "stop_reason": self.stop_reason,
            "eos_token_ids": sorted(self.eos),
            "cost_model": (lambda m: m.to_dict() if m is not None else None)(
                cached_model(self.target)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        return Trace(meta=meta, prompt_ids=list(self.prompt_ids), rounds=list(self.rounds),
                     token_texts=token_texts)


def _id_rows(rows) -> list[list[int]]:
    """A drafter's per-slot top-k ids (extras ``topk``) as lists of ints; [] if absent."""
    if not isinstance(rows, list):
        return []
    return [[int(x) for x in row] for row in rows if isinstance(row, list)]
