"""vLLM's own code on specviz's test inputs, run by .venv-vllm's python in one process
(tests/test_dflash_vllm.py compares the results with specviz's): DFlash2's grouped convolution
and edge scores, each layer's attention resolution, and whole DFlash / DFlash2 block forwards.

vLLM's ``DFlash2Qwen3DecoderLayer`` or ``DFlashQwen3DecoderLayer`` (their forward: norms,
grouped convolutions, QKV, q/k norms, RoPE, MLP, residuals), its final ``RMSNorm``,
``LogitsProcessor.get_top_k_tokens`` (multiplier, softcap) and ``CandidateSelector`` (DFlash2)
run as vLLM builds them. Two stand-ins, as vLLM's engine is not built here: the context K/V are projected as ``precompute_and_store_context_kv`` does
(fc, hidden_norm, the K/V rows of each layer's qkv_proj, k_norm, RoPE) with the same layer
modules, and the paged-attention kernel is a plain softmax over [context; block] keys with the
layer's own resolved window, causality and sinks.

    python vllm_reference.py jobs.pt results.pt

``jobs.pt``: {name: ("pieces", tensors) | ("resolve", [config.json dicts]) |
("forward", (config.json dict, inputs))}; ``results.pt``: {name: result}.
"""
import os
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F


_KEEP: list = []


class _Config(SimpleNamespace):
    def __getattr__(self, name):   # vLLM reads optional fields; absent ones are None here
        return None


def _setup():
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    vc = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))
    _KEEP.append(set_current_vllm_config(vc))   # entered for the whole run
    _KEEP[-1].__enter__()
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method="tcp://127.0.0.1:0")
    initialize_model_parallel(1, 1)
    vc.model_config = _Config(dtype=torch.float32)
    vc.speculative_config = _Config(num_speculative_tokens=3, enable_adaptive_verification=False)
    # vLLM builds mixed sliding/full drafters only for its V2 runner (the layers are the same)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    return vc


class _Attention(torch.nn.Module):
    """The paged-attention stand-in: softmax over [context K/V; block K/V] per head (GQA), with
    the layer's sliding window, block causality and sinks as vLLM resolved them."""

    def __init__(self, attn, ctx_k, ctx_v):
        super().__init__()
        self.attn, self.ctx_k, self.ctx_v = attn, ctx_k, ctx_v

    def forward(self, q, k, v):
        a = self.attn
        t, d, nh, nkv = q.shape[0], a.head_dim, a.num_heads, a.num_kv_heads
        n = self.ctx_k.shape[0]
        q = q.view(t, nh, d).transpose(0, 1)
        k = torch.cat([self.ctx_k, k.view(t, nkv, d)]).transpose(0, 1)
        v = torch.cat([self.ctx_v, v.view(t, nkv, d)]).transpose(0, 1)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        logits = q @ k.transpose(1, 2) * a.scaling
        qpos = torch.arange(n, n + t).view(-1, 1)
        kpos = torch.arange(n + t).view(1, -1)
        allowed = torch.ones(t, n + t, dtype=torch.bool)
        if a.sliding_window:
            allowed &= (qpos - kpos) < a.sliding_window
        if a.causal:
            allowed &= kpos <= qpos
        logits = logits.masked_fill(~allowed, float("-inf"))
        if a.attention_sink_bias is not None:
            sink = a.attention_sink_bias.view(nh, 1, 1).expand(nh, t, 1)
            probs = torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]
        else:
            probs = torch.softmax(logits, -1)
        return (probs @ v).transpose(0, 1).reshape(t, nh * d)


def _after_loading(module: torch.nn.Module) -> None:
    """What vLLM's loader does once weights are in (the CPU GEMM dispatch, among others)."""
    for m in module.modules():
        method = getattr(m, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(m)


def _vllm_layer_state(state: dict, i: int) -> dict:
    p = f"layers.{i}."
    out = {k[len(p):]: v for k, v in state.items() if k.startswith(p)}
    out["self_attn.qkv_proj.weight"] = torch.cat([out.pop(f"self_attn.{n}_proj.weight")
                                                  for n in "qkv"])
    out["mlp.gate_up_proj.weight"] = torch.cat([out.pop("mlp.gate_proj.weight"),
                                                out.pop("mlp.up_proj.weight")])
    return out


def pieces(t: dict) -> dict:
    """DFlash2's ``_grouped_conv`` and ``_score_edges`` on the given tensors."""
    from vllm.model_executor.models import qwen3_dflash2 as vllm_d2   # its module-private code

    return {"conv": vllm_d2._grouped_conv(t["x"], t["delta"], t["base"], t["block"],
                                          t["groups"], t["gsize"], t["taps"]),
            "edges": vllm_d2._score_edges(t["pred"], t["succ"], t["cand"], t["unary"], t["hid"],
                                          t["anchor"], t["k"])}


def _qwen3(raw: dict):
    """The config as vLLM loads it: transformers' Qwen3Config plus the DFlash keys."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(**{k: v for k, v in raw.items() if k != "dflash_config"})
    cfg.dflash_config = raw.get("dflash_config")
    if "is_causal" in raw:
        cfg.is_causal = raw["is_causal"]
    return cfg


def resolve(configs: list[dict]) -> list:
    """vLLM's ``_resolve_layer_attention`` per layer of each config: [window, causal] per layer,
    or the error's text."""
    from vllm.model_executor.models import qwen3_dflash as vllm_d1   # its module-private code

    out = []
    for raw in configs:
        cfg = _qwen3(raw)
        try:
            out.append([list(vllm_d1._resolve_layer_attention(cfg, i))
                        for i in range(cfg.num_hidden_layers)])
        except (ValueError, NotImplementedError) as exc:
            out.append(f"error: {exc}")
    return out


def _layers(vc, cfg, state: dict, name: str) -> list:
    """vLLM's decoder layers of the drafter with its weights loaded (every tensor used)."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3DecoderLayer
    from vllm.model_executor.models.qwen3_dflash2 import DFlash2Qwen3DecoderLayer

    layer_class = DFlash2Qwen3DecoderLayer if "conv_kernel_size" in cfg.dflash_config \
        else DFlashQwen3DecoderLayer
    layers = []
    for i in range(cfg.num_hidden_layers):
        layer = layer_class(vc, config=cfg, layer_idx=i, prefix=f"{name}.layers.{i}")
        res = layer.load_state_dict(_vllm_layer_state(state, i), strict=False)
        # every tensor used; only the kernel's quantisation scales keep their defaults
        assert not res.unexpected_keys, res.unexpected_keys
        assert all(".attn._" in k for k in res.missing_keys), res.missing_keys
        _after_loading(layer)
        layers.append(layer)
    return layers


def _context_kv(layers: list, ctx: torch.Tensor) -> None:
    """Each layer's context K/V as ``precompute_and_store_context_kv`` computes them, handed to
    the attention stand-in."""
    n = ctx.shape[0]
    for layer in layers:
        a = layer.self_attn
        qkv, _ = a.qkv_proj(ctx)
        _, k, v = qkv.split([a.q_size, a.kv_size, a.kv_size], -1)
        k = a.k_norm(k.reshape(n, -1, a.head_dim)).reshape(n, -1)
        _, k = a.rotary_emb(torch.arange(n), k.clone(), k.clone())
        if a.v_scale is not None:
            v = v * a.v_scale
        a.attn = _Attention(a, k.reshape(n, -1, a.head_dim), v.reshape(n, -1, a.head_dim))


def _candidates(cfg, t: dict, slots: torch.Tensor) -> dict:
    """DFlash2Qwen3ForCausalLM.compute_candidates and the selector's edge scores."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_dflash2 import CandidateSelector

    dc, state, H, V = cfg.dflash_config, t["state"], cfg.hidden_size, cfg.vocab_size
    lm_head = ParallelLMHead(V, H)
    lm_head.weight.copy_(t["lm_head"])
    _after_loading(lm_head)
    softcap = float(dc.get("final_logit_softcapping") or 0.0)
    proc = LogitsProcessor(V, scale=float(dc.get("output_multiplier", 1.0)),
                           soft_cap=softcap if softcap > 0 else None)
    ids, unary = proc.get_top_k_tokens(lm_head, slots, int(dc["selector_top_k"]))
    selector = CandidateSelector(hidden_size=H, vocab_size=V, rank=int(dc["selector_rank"]),
                                 top_k=int(dc["selector_top_k"]), params_dtype=torch.float32,
                                 prefix="candidate_selector")
    selector.load_state_dict({k[len("candidate_selector."):]: v for k, v in state.items()
                              if k.startswith("candidate_selector.")}, strict=True)
    _after_loading(selector)
    edges = selector(ids[None], unary[None], slots[None], t["anchor"].view(1))
    return {"ids": ids, "unary": unary, "edges": edges[0]}


def forward(vc, raw: dict, t: dict, name: str) -> dict:
    """One block through vLLM's layers and final norm (DFlashQwen3Model.forward over the input
    embeddings times DFlash2's scale); DFlash2's candidates and edges too."""
    from vllm.model_executor.layers.layernorm import RMSNorm

    cfg, state = _qwen3(raw), t["state"]
    block, H = t["block_emb"].shape[0], cfg.hidden_size
    vc.speculative_config.num_speculative_tokens = block - 1
    layers = _layers(vc, cfg, state, name)
    hidden_norm, norm = RMSNorm(H, eps=cfg.rms_norm_eps), RMSNorm(H, eps=cfg.rms_norm_eps)
    hidden_norm.weight.copy_(state["hidden_norm.weight"])
    norm.weight.copy_(state["norm.weight"])
    _context_kv(layers, hidden_norm(F.linear(t["context"], state["fc.weight"])))
    x = t["block_emb"] * float(cfg.dflash_config.get("input_embedding_scale", 1.0))
    n = t["context"].shape[0]
    positions, residual = torch.arange(n, n + block), None
    for layer in layers:
        x, residual = layer(positions=positions, hidden_states=x, residual=residual)
    hidden, _ = norm(x, residual)
    out = {"hidden": hidden}
    if "conv_kernel_size" in cfg.dflash_config:
        out.update(_candidates(cfg, t, hidden[1:]))
    return out


def main(jobs_path: str, out_path: str) -> None:
    jobs = torch.load(jobs_path)
    vc = _setup()
    results = {}
    with torch.no_grad():
        for name, (kind, arg) in jobs.items():
            if kind == "pieces":
                results[name] = pieces(arg)
            elif kind == "resolve":
                results[name] = resolve(arg)
            else:
                results[name] = forward(vc, *arg, name)
    torch.save(results, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
