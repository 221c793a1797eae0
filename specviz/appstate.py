"""Plain-Python helpers behind the Streamlit pages (no streamlit import, so tests call them).

* example prompts (``examples/prompts.jsonl``),
* the sidebar's choices as one validated :class:`AppConfig`,
* the sidebar's method settings, from the method registry (:mod:`specviz.drafters`),
* a thread-safe target cache (the app keeps ONE of these in ``st.cache_resource``; loading runs
  outside streamlit's cache so the first load can report progress),
* reading an uploaded trace, and the Compare page's runner.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .costs import cost_model_for
from .drafters.registry import ParamSpec
from .engine import DecodeSettings, Session
from .errors import SettingsError, SpecvizError, TraceError
from .trace import Trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_PATH = ROOT / "examples" / "prompts.jsonl"
CATEGORIES = ("math", "code", "dialogue", "summarization", "rag")
# PLD accepts AND rejects tokens in its first rounds on this prompt (a good first demo)
DEFAULT_EXAMPLE_ID = "summarization-01"
DEFAULT_MODEL = "default"
DEFAULT_MAX_NEW_TOKENS = 128


# ---------------------------------------------------------------- example prompts
def load_examples(path: str | Path | None = None) -> list[dict]:
    """The example prompts; malformed lines are skipped."""
    path = Path(path) if path else EXAMPLES_PATH
    out: list[dict] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(d, dict) and {"id", "category", "prompt"} <= set(d):
            d.setdefault("title", d["id"])
            out.append(d)
    return out


def examples_by_category(examples: list[dict]) -> dict[str, list[dict]]:
    cats: dict[str, list[dict]] = {}
    for c in CATEGORIES:
        cats[c] = []
    for e in examples:
        cats.setdefault(e["category"], []).append(e)
    return {c: v for c, v in cats.items() if v}


def example_by_id(examples: list[dict], example_id: str) -> dict | None:
    return next((e for e in examples if e["id"] == example_id), None)


# ---------------------------------------------------------------- method parameters
def method_param_specs(method: str) -> list[ParamSpec]:
    """The sidebar's widgets for ``method``: its registry settings but the advanced ones
    (:mod:`specviz.drafters.registry`); [] for an unknown method."""
    from .drafters import METHODS

    spec = METHODS.get(method)
    return spec.sidebar_params() if spec is not None else []


# ---------------------------------------------------------------- the sidebar's choices
@dataclass
class AppConfig:
    model: str = DEFAULT_MODEL
    method: str = "pld"
    params: dict[str, Any] = field(default_factory=dict)
    settings: DecodeSettings = field(default_factory=DecodeSettings)
    prompt: str = ""
    prompt_id: str | None = None   # the example it came from (None: free text / edited)

    def key(self) -> str:
        """Identifies a run: a Session built from another key is stale."""
        blob = json.dumps([self.model, self.method, self.params, asdict(self.settings),
                           self.prompt], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


def build_config(model: str, method: str, params: dict[str, Any], sampling: bool,
                 temperature: Any, top_p: Any, max_new_tokens: Any, seed: Any,
                 chat_template: bool, prompt: str, prompt_id: str | None = None) -> AppConfig:
    """Validate the sidebar's raw values; raises :class:`SettingsError` with a clear message."""
    from .drafters import method_spec

    model = (model or "").strip()
    if not model:
        raise SettingsError("enter a model: a Hugging Face id or a local folder "
                            "(or pick the embedded default)")
    params = method_spec(method).check(params)
    try:
        mnt = _as_int(max_new_tokens, "max new tokens")
        sd = _as_int(seed, "seed")
        temp = float(temperature) if sampling else 0.0
        tp = float(top_p) if sampling else 1.0
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from exc
    if sampling and temp == 0.0:
        raise SettingsError("sampling needs a temperature above 0 (or choose greedy)")
    settings = DecodeSettings(max_new_tokens=mnt, temperature=temp, top_p=tp, seed=sd,
                              chat_template=bool(chat_template)).validate()
    if sd < 0:
        raise SettingsError("seed must be 0 or more")
    return AppConfig(model=model, method=method, params=dict(params), settings=settings,
                     prompt=prompt or "", prompt_id=prompt_id)


def _as_int(v, what: str) -> int:
    if isinstance(v, bool):
        raise SettingsError(f"{what} must be a whole number")
    if isinstance(v, float):
        if v != int(v):
            raise SettingsError(f"{what} must be a whole number")
        v = int(v)
    try:
        return int(v)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{what} must be a whole number") from exc


def new_session(target, cfg: AppConfig) -> Session:
    """Build the drafter and the Session for ``cfg`` (raises SpecvizError on bad input)."""
    from .drafters import make_drafter

    drafter = make_drafter(cfg.method, target, **cfg.params)
    return Session(target, drafter, cfg.prompt, cfg.settings, method=cfg.method)


# ---------------------------------------------------------------- models
ProgressFn = Callable[[float, str], None]


class TargetCache:
    """Loaded targets by name, shared by every browser tab (one instance lives in
    ``st.cache_resource``). Each name is loaded once even when two tabs ask at the same
    time; a failed load is remembered so the page does not retry it on every rerun."""

    def __init__(self, max_models: int = 2, loader: Callable | None = None):
        self.max_models = max_models
        self._loader = loader
        self._targets: dict[str, Any] = {}
        self._errors: dict[str, str] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def loaded(self, name: str) -> bool:
        return name in self._targets

    def error(self, name: str) -> str | None:
        return self._errors.get(name)

    def forget_error(self, name: str) -> None:
        self._errors.pop(name, None)

    def get(self, name: str, progress: ProgressFn | None = None):
        if name in self._targets:
            return self._targets[name]
        if name in self._errors:
            from .models import ModelLoadError

            raise ModelLoadError(self._errors[name])
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name in self._targets:
                return self._targets[name]
            try:
                target = self._load(name, progress)
            except SpecvizError as exc:
                self._errors[name] = str(exc)
                raise
            with self._guard:
                while len(self._targets) >= self.max_models:
                    self._targets.pop(next(iter(self._targets)))
                self._targets[name] = target
            return target

    def _load(self, name: str, progress: ProgressFn | None):
        if self._loader is not None:
            return self._loader(name, progress)
        from .models import load_target

        if progress:
            progress(0.05, f"Loading {name} …")
        target = load_target(name, progress=progress)
        if progress:
            progress(0.9, "Warming up (one short generation) …")
        warm_up(target)
        if progress:
            progress(0.95, "Measuring what a verify of k tokens costs on this machine …")
        cost_model_for(target)  # every run's trace carries the curve (the speedup estimate)
        if progress:
            progress(1.0, "Model ready")
        return target


def warm_up(target) -> None:
    """A few short rounds so the first Next round click does not pay one-time costs
    (PyTorch's first calls at new shapes are several times slower than later ones)."""
    from .drafters import make_drafter

    text = " ".join(["the quick brown fox jumps over the lazy dog."] * 20)
    try:
        Session(target, make_drafter("pld"), text,
                DecodeSettings(max_new_tokens=12, chat_template=False)).run(max_rounds=3)
    except SpecvizError:
        pass


# ---------------------------------------------------------------- uploaded traces
def load_trace_bytes(data: bytes | str | None) -> Trace:
    """Read an uploaded trace, checked against its declared schema
    (:mod:`specviz.trace_schema`); anything that cannot be shown raises :class:`TraceError`."""
    trace = Trace.from_json(data if data is not None else b"")
    if not trace.rounds and not trace.prompt_ids:
        raise TraceError("the trace has no rounds and no prompt")
    return trace


def trace_filename(trace: Trace) -> str:
    method = str(trace.meta.get("method") or "trace")
    stamp = str(trace.meta.get("created") or "").replace(":", "").replace("-", "")
    return f"specviz-{method}-{stamp or 'run'}.json"


# ---------------------------------------------------------------- Compare page
@dataclass
class ComparePrompt:
    id: str
    title: str
    prompt: str


def compare_runs(target, methods: list[str], prompts: list[ComparePrompt],
                 settings: DecodeSettings, params: dict[str, dict] | None = None,
                 baseline: str = "ar", progress: ProgressFn | None = None
                 ) -> Iterator[tuple[int, int, Any]]:
    """Run the baseline and every method on every prompt; yields ``(done, total, CompareRun)``.

    The baseline runs first on each prompt, then the methods, so every method is timed on the
    same prompt under the same machine load as its baseline. ``progress(fraction, text)`` is
    called as tokens are generated.
    """
    from .bench import PromptItem, iter_side_by_side
    from .viz.tables import CompareRun

    items = [PromptItem(p.id, p.title, p.prompt) for p in prompts]
    n_methods = len([baseline] + [m for m in dict.fromkeys(methods) if m != baseline])
    total = n_methods * len(items)

    def on_tokens(generated: int, limit: int, m: str, item, done: int) -> None:
        if progress:
            frac = (done + min(generated / max(limit, 1), 1.0)) / total
            progress(frac, f"run {done + 1}/{total}: {m.upper()} on {item.id} — "
                           f"{generated}/{limit} tokens")

    done = 0
    for item, m, session, wall in iter_side_by_side(target, methods, items, settings,
                                                    method_params=params, baseline=baseline,
                                                    on_tokens=on_tokens):
        done += 1
        yield done, total, CompareRun(item.id, item.category, m, session.trace(), wall)
