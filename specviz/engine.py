"""The speculative decoding loop (METHODS §0): one target forward per round.

``Session(target, drafter, prompt, settings)``: ``step()`` runs one round and returns a
:class:`~specviz.trace.Round`; ``run()`` runs to EOS / max tokens and returns the
:class:`~specviz.trace.Trace`. The KV cache always holds every committed token except the last
one; a round feeds [last committed token, draft...] (a chain, or a tree with a 4D mask and
depth-based position ids), verifies, commits the accepted tokens plus the target's own token,
and crops the cache to the committed length (for a tree: gathers the accepted path's rows first).
"""
from __future__ import annotations

import functools
import inspect
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from transformers import DynamicCache

from . import __version__
from .drafters.base import Draft, DraftContext, Drafter, VerifyFeedback
from .errors import PromptError, SettingsError
from .models import Target
from .trace import Round, Trace
from .tree import TokenTree
from .verify import greedy_chain, greedy_tree, sample_chain, sample_tree, warp_probs

MAX_PROMPT_CHARS = 200_000
MAX_NEW_TOKENS_LIMIT = 8192


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


@functools.lru_cache(maxsize=None)
def _cache_kwarg_for(model_cls) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; use whichever forward takes."""
    return _cache_kwarg_for(type(model))


def _cache_len(cache) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


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
        self.generator = torch.Generator().manual_seed(int(self.settings.seed))
        self.eos = target.eos_token_ids
        self._want_hidden = drafter.hidden_state_layers is not None
        self.cache = DynamicCache(config=target.model.config)
        t0 = time.perf_counter()
        prefill_hidden = None
        if len(prompt_ids) > 1:
            out = self._forward(prompt_ids[:-1])
            prefill_hidden = out.hidden_states if self._want_hidden else None
        self.prefill_time = time.perf_counter() - t0
        t0 = time.perf_counter()
        drafter.begin(target, list(prompt_ids), prefill_hidden)
        self.prefill_time += time.perf_counter() - t0

    # ------------------------------------------------------------------ helpers
    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    def _forward(self, ids: list[int], attention_mask=None, position_ids=None):
        model = self.target.model
        dev = self.target.device
        inp = torch.tensor([ids], dtype=torch.long, device=dev)
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(dev)
            kwargs["position_ids"] = position_ids.to(dev)
        kwargs[_cache_kwarg(model)] = self.cache
        with self.target.lock, torch.inference_mode():
            return model(input_ids=inp, use_cache=True,
                         output_hidden_states=self._want_hidden, **kwargs)

    def _budget(self) -> int:
        """How many tokens this round may still commit."""
        left_tokens = self.settings.max_new_tokens - len(self.generated)
        left_context = self.target.max_context - len(self.tokens)
        return max(0, min(left_tokens, left_context))

    @staticmethod
    def _clip(draft: Draft, max_depth: int) -> Draft:
        if draft.parents is None:
            if len(draft.tokens) > max_depth:
                draft.tokens = draft.tokens[:max_depth]
                if draft.q is not None:
                    draft.q = draft.q[:max_depth]
                if draft.q_token is not None:
                    draft.q_token = draft.q_token[:max_depth]
            return draft
        tree = TokenTree(list(draft.tokens), list(draft.parents))
        keep = [i for i, d in enumerate(tree.depths) if d <= max_depth]
        if len(keep) < len(tree):
            remap = {old: new for new, old in enumerate(keep)}
            draft.tokens = [tree.tokens[i] for i in keep]
            draft.parents = [remap.get(tree.parents[i], -1) for i in keep]
            if draft.q_token is not None:
                draft.q_token = [draft.q_token[i] for i in keep]
        return draft

    # ------------------------------------------------------------------ the round
    def step(self) -> Round | None:
        """Run one speculative round; returns its Round, or None if the run is finished."""
        if self.done:
            return None
        budget = self._budget()
        if budget <= 0:
            self._finish("max_new_tokens" if len(self.generated) >= self.settings.max_new_tokens
                         else "context")
            return None
        greedy = self.settings.greedy
        t0 = time.perf_counter()
        draft = self.drafter.propose(DraftContext(tokens=list(self.tokens),
                                                  prompt_len=len(self.prompt_ids),
                                                  max_draft=budget - 1,
                                                  round_index=len(self.rounds)))
        draft = self._clip(draft, budget - 1)
        t_draft = time.perf_counter() - t0

        t0 = time.perf_counter()
        cache_len = _cache_len(self.cache)
        tree = None
        if draft.parents is not None and draft.tokens:
            tree = TokenTree(list(draft.tokens), list(draft.parents))
            if tree.is_chain:  # a single branch is verified as an ordinary chain
                tree = None
        ids = [self.tokens[-1]] + list(draft.tokens)
        if tree is not None:
            out = self._forward(ids, attention_mask=tree.attention_mask(cache_len),
                                position_ids=tree.position_ids(cache_len))
        else:
            out = self._forward(ids)
        logits = out.logits[0].float()
        if greedy:
            probs = torch.softmax(logits, dim=-1)
        else:
            probs = warp_probs(logits, self.settings.temperature, self.settings.top_p)

        if tree is not None:
            if greedy:
                path, next_tok = greedy_tree(tree.tokens, tree.parents, logits)
            else:
                path, next_tok = sample_tree(tree.tokens, tree.parents, probs, self.generator)
            accepted_tokens = [tree.tokens[i] for i in path]
            rows = [0] + [i + 1 for i in path]
            pred_rows = [p + 1 for p in tree.parents]  # row whose output predicts each node
        else:
            if greedy:
                a, next_tok = greedy_chain(draft.tokens, logits)
            else:
                a, next_tok = sample_chain(draft.tokens, probs, draft.q, self.generator)
            path = list(range(a))
            accepted_tokens = list(draft.tokens[:a])
            rows = list(range(a + 1))
            pred_rows = list(range(len(draft.tokens)))

        # commit, then drop the KV rows of rejected tokens (gather the path for a tree)
        committed = accepted_tokens + [next_tok]
        if tree is not None:
            keep = torch.tensor(list(range(cache_len)) + [cache_len + r for r in rows])
            for layer in self.cache.layers:
                idx = keep.to(layer.keys.device)
                layer.keys = layer.keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)
        else:
            drop = len(draft.tokens) - len(accepted_tokens)
            if drop:
                self.cache.crop(-drop)
        stop = None
        for j, t in enumerate(committed):
            if t in self.eos:
                committed = committed[:j + 1]
                stop = "eos"
                break
        committed = committed[:budget]  # never past max_new_tokens / the context window
        n_acc = min(len(accepted_tokens), len(committed))  # an accepted EOS ends the round early
        self.tokens.extend(committed)
        t_verify = time.perf_counter() - t0

        argmax = logits.argmax(-1)
        argmax_prob = probs.gather(-1, argmax.unsqueeze(-1)).squeeze(-1)
        p_draft = [float(probs[r, t]) for r, t in zip(pred_rows, draft.tokens)]
        rnd = Round(
            index=len(self.rounds), start=len(self.tokens) - len(committed),
            drafter=self.drafter.name, draft=[int(t) for t in draft.tokens],
            accepted=n_acc, committed=[int(t) for t in committed],
            target_argmax=[int(x) for x in argmax.tolist()],
            target_argmax_prob=[round(float(x), 6) for x in argmax_prob.tolist()],
            p_draft=[round(x, 6) for x in p_draft],
            q_draft=list(draft.q_token) if draft.q_token is not None else [None] * len(draft.tokens),
            parents=list(draft.parents) if tree is not None else None,
            accepted_path=path[:n_acc] if tree is not None else [],
            t_draft=t_draft, t_verify=t_verify, extras=dict(draft.extras))
        self.rounds.append(rnd)
        self.drafter.observe(VerifyFeedback(
            round=rnd, logits=logits,
            hidden_states=out.hidden_states if self._want_hidden else None, kept_rows=rows))
        if stop:
            self._finish(stop)
        elif self._budget() <= 0:
            self._finish("max_new_tokens" if len(self.generated) >= self.settings.max_new_tokens
                         else "context")
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
            "device": self.target.device,
            "dtype": str(self.target.dtype).replace("torch.", ""),
            "prefill_time": self.prefill_time,
            "stop_reason": self.stop_reason,
            "eos_token_ids": sorted(self.eos),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        return Trace(meta=meta, prompt_ids=list(self.prompt_ids), rounds=list(self.rounds),
                     token_texts=token_texts)


def generate(target: Target, method: str, prompt: str | list[int],
             settings: DecodeSettings | None = None, **drafter_params) -> Trace:
    """Convenience: build the drafter, run a Session to the end, return its Trace."""
    from .drafters import make_drafter

    drafter = make_drafter(method, target, **drafter_params)
    return Session(target, drafter, prompt, settings, method=method).run()
