"""An OpenAI-compatible client for a served run (docs/served.md): what specviz asks a vLLM
endpoint and what it reads back. Standard library only (urllib), any host: a GPU cluster behind
a load balancer is the same URL as the local server.

Prompts are sent as token ids (``/v1/completions`` with ``prompt: [ids]``), tokenized here with
the target's own chat template, so the served run and specviz's local runs see the same context;
``return_token_ids`` returns the generated ids. A server started with
``--per-request-spec-decode-metrics detailed`` adds ``metrics.speculative_decoding`` with the
per-step counts (:class:`specviz.served.rebuild.StepCounts`).
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlparse

from ..errors import SpecvizError

DEFAULT_ENDPOINT = "http://127.0.0.1:8123"


class EndpointError(SpecvizError):
    """The endpoint cannot be used: unreachable, not OpenAI-compatible, no detailed metrics,
    another tokenizer. One sentence each, shown as is by the CLI and the app."""


def normalise(url: str) -> str:
    """``host:port`` or a URL, with or without ``/v1`` -> ``http://host:port`` (no slash)."""
    url = (url or "").strip()
    if not url:
        raise EndpointError("give an endpoint URL, e.g. http://127.0.0.1:8123")
    if "://" not in url:
        url = "http://" + url
    p = urlparse(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise EndpointError(f"{url!r} is not an http(s) URL")
    path = p.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{p.scheme}://{p.netloc}{path}"


def _request(url: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    """GET (no body) or POST JSON; the parsed reply, or one EndpointError sentence."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        try:
            detail = json.loads(detail).get("error", {}).get("message", detail)
        except (ValueError, AttributeError):
            pass
        raise EndpointError(f"{url} answered HTTP {exc.code}: {detail}".strip()) from None
    except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointError(f"cannot reach {url} ({reason}); is the server running? "
                            "(python -m specviz serve-vllm starts a local one)") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise EndpointError(f"{url} did not answer JSON; is it an OpenAI-compatible "
                            "server?") from None


@dataclass
class ServerInfo:
    url: str
    model: str
    max_model_len: int | None
    root: str | None = None


def server_info(url: str, timeout: float = 10.0) -> ServerInfo:
    """The served model (``/v1/models``: its name, context length and the folder it came from)."""
    url = normalise(url)
    d = _request(url + "/v1/models", timeout=timeout)
    models = d.get("data") if isinstance(d, dict) else None
    if not models:
        raise EndpointError(f"{url} serves no model (/v1/models is empty)")
    m = models[0]
    return ServerInfo(url, str(m.get("id")), m.get("max_model_len"), m.get("root"))


def server_tokens(url: str, model: str, text: str, timeout: float = 30.0) -> list[int]:
    """The server's tokenization of ``text`` (vLLM's ``/tokenize``; no special tokens)."""
    d = _request(normalise(url) + "/tokenize",
                 {"model": model, "prompt": text, "add_special_tokens": False}, timeout)
    return [int(t) for t in d.get("tokens", [])]


@dataclass
class Completion:
    """One served completion: ids, finish reason, the spec-decode metrics and the wall time."""
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str | None
    spec: dict | None
    wall_s: float
    text: str = ""
    raw_metrics: dict = field(default_factory=dict)


def complete(url: str, model: str, prompt_ids: list[int], max_tokens: int,
             temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
             timeout: float = 600.0) -> Completion:
    """One ``/v1/completions`` request on token ids; the wall time is the client's."""
    body = {"model": model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_tokens),
            "temperature": float(temperature), "top_p": float(top_p), "return_token_ids": True}
    if seed is not None:
        body["seed"] = int(seed)
    t0 = time.perf_counter()
    d = _request(normalise(url) + "/v1/completions", body, timeout)
    wall = time.perf_counter() - t0
    try:
        ch = d["choices"][0]
        out = [int(t) for t in ch["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise EndpointError(f"{url} did not return token ids (return_token_ids); a vLLM "
                            "server is needed") from None
    metrics = d.get("metrics") or {}
    return Completion(prompt_ids=[int(t) for t in prompt_ids], output_ids=out,
                      finish_reason=ch.get("finish_reason"),
                      spec=metrics.get("speculative_decoding"), wall_s=wall,
                      text=str(ch.get("text") or ""), raw_metrics=metrics)


def complete_all(url: str, model: str, prompt_ids: list[list[int]], max_tokens: int,
                 concurrency: int, temperature: float = 0.0, seed: int | None = None,
                 progress=None) -> tuple[list[Completion], float]:
    """Every prompt once with ``concurrency`` requests in flight (the server batches them):
    (completions in prompt order, wall time of the whole set). ``progress(1)`` per answer."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futs = [pool.submit(complete, url, model, ids, max_tokens, temperature, 1.0, seed)
                for ids in prompt_ids]
        for f in as_completed(futs):
            f.result()
            if progress:
                progress(1)
    return [f.result() for f in futs], time.perf_counter() - t0
