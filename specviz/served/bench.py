"""Bench a served endpoint beside specviz's own methods (docs/served.md).

:class:`EndpointRuns` is the bench's ``extra_runs`` hook (:func:`specviz.bench.run_bench`): for
each prompt, right after specviz's local runs on it, one request per endpoint at concurrency 1,
turned into a Trace (:mod:`specviz.served.run`), so tau, the accepted-length histogram, tokens/s
per category and the lossless check come out of the same table as the local methods'.

:func:`throughput` measures what a served engine is for: many requests at once. All prompts
are sent with ``concurrency`` requests in flight (a thread pool); generated tokens / wall time
of the whole batch, plus the mean request latency.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from .client import complete, complete_all
from .ngram_rule import NgramConfig
from .run import Endpoint, completion_trace


def parse_endpoints(specs: list[str]) -> dict[str, str]:
    """``[LABEL=]URL`` items -> {label: url}; a bare URL is labelled ``vllm``, ``vllm-2``, ..."""
    from .client import EndpointError, normalise

    out: dict[str, str] = {}
    for i, spec in enumerate(specs):
        label, sep, url = spec.partition("=")
        if not sep or "://" in label or ":" in label:
            label, url = ("vllm" if i == 0 else f"vllm-{i + 1}"), spec
        label = label.strip().lower()
        if not label or label in out or label == "ar":
            raise EndpointError(f"endpoint label {label!r} is empty, repeated or 'ar'")
        out[label] = normalise(url)
    return out


class EndpointRuns:
    """``extra_runs`` for the bench: each prompt through each endpoint (concurrency 1)."""

    def __init__(self, target, endpoints: dict[str, Endpoint], settings,
                 spec_method: str = "ngram", ngram: NgramConfig | None = None):
        self.target, self.endpoints, self.settings = target, endpoints, settings
        self.spec_method, self.ngram = spec_method, ngram or NgramConfig()
        self.labels = list(endpoints)

    def __call__(self, item):
        ids = self.target.encode_prompt(item.text, self.settings.chat_template)
        for label, ep in self.endpoints.items():
            c = complete(ep.info.url, ep.info.model, ids, self.settings.max_new_tokens,
                         self.settings.temperature, self.settings.top_p, self.settings.seed)
            trace = completion_trace(self.target, ep, c, item.text, self.settings,
                                     self.spec_method, self.ngram)
            trace.meta["method"] = label
            yield label, trace, c.wall_s


@dataclass
class ThroughputRow:
    endpoint: str
    concurrency: int
    requests: int
    new_tokens: int
    wall_s: float
    tokens_per_s: float
    mean_latency_s: float


def throughput(label: str, ep: Endpoint, prompt_ids: list[list[int]], max_tokens: int,
               concurrency: int, progress: Callable[[int], None] | None = None) -> ThroughputRow:
    """Every prompt once, ``concurrency`` requests in flight (greedy); batch tokens/s."""
    done, wall = complete_all(ep.info.url, ep.info.model, prompt_ids, max_tokens, concurrency,
                              progress=progress)
    toks = sum(len(c.output_ids) for c in done)
    lat = [c.wall_s for c in done]
    return ThroughputRow(label, concurrency, len(prompt_ids), toks, round(wall, 3),
                         round(toks / wall, 2) if wall > 0 else 0.0,
                         round(sum(lat) / max(1, len(lat)), 3))


def throughput_rows(target, endpoints: dict[str, Endpoint], prompts, settings,
                    levels: list[int], bar=None) -> list[dict]:
    """:func:`throughput` of every endpoint at every concurrency level, as table rows."""
    ids = [target.encode_prompt(p.text, settings.chat_template) for p in prompts]
    rows = []
    for label, ep in endpoints.items():
        for c in levels:
            step = (lambda n: bar.update(n)) if bar is not None else None
            rows.append(asdict(throughput(label, ep, ids, settings.max_new_tokens, c, step)))
    return rows


def parse_levels(text: str) -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16] (each 1..256); empty -> []."""
    from ..errors import SettingsError

    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SettingsError(f"--concurrency {text!r}: give numbers like 1,4,16") from None
    if any(not 1 <= c <= 256 for c in levels):
        raise SettingsError("--concurrency levels must be between 1 and 256")
    return levels
