"""Run a DFlash or DFlash2 drafter's block forward with vLLM's own modules (run by
.venv-vllm's python; tests/test_dflash_layouts.py compares the result with specviz's model on
the same weights).

vLLM's ``DFlash2Qwen3DecoderLayer`` or ``DFlashQwen3DecoderLayer`` (their forward: norms,
grouped convolutions, QKV, q/k norms, RoPE, MLP, residuals), its final ``RMSNorm``,
``LogitsProcessor.get_top_k_tokens`` (multiplier, softcap) and ``CandidateSelector`` (DFlash2)
run as vLLM builds them. Two stand-ins, as vLLM's engine is not built here: the context K/V are projected as ``precompute_and_store_context_kv`` does
(fc, hidden_norm, the K/V rows of each layer's qkv_proj, k_norm, RoPE) with the same layer
modules, and the paged-attention kernel is a plain softmax over [context; block] keys with the
layer's own resolved window, causality and sinks.

    python vllm_dflash_forward.py config.json inputs.pt out.pt
    python vllm_dflash_forward.py --resolve configs.json out.json   (each layer's attention)
"""
import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F


_KEEP: list = []


class _Config(SimpleNamespace):
    def __getattr__(self, name):   # vLLM reads optional fields; absent ones are None here
        return None


def _setup(num_speculative_tokens: int):
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
    # vLLM builds mixed sliding/full drafters only for its V2 runner (the layers are the same)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    vc.speculative_config = _Config(num_speculative_tokens=num_speculative_tokens,
                                    enable_adaptive_verification=False)
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


def main(config_path: str, inputs_path: str, out_path: str) -> None:
    from transformers import Qwen3Config

    raw = json.loads(open(config_path).read())
    t = torch.load(inputs_path)
    block = t["block_emb"].shape[0]
    vc = _setup(block - 1)
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3DecoderLayer
    from vllm.model_executor.models.qwen3_dflash2 import (CandidateSelector,
                                                          DFlash2Qwen3DecoderLayer)

    cfg = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("dflash_config",)})
    cfg.dflash_config = raw["dflash_config"]
    dc, state = raw["dflash_config"], t["state"]
    dflash2 = "conv_kernel_size" in dc
    layer_class = DFlash2Qwen3DecoderLayer if dflash2 else DFlashQwen3DecoderLayer
    H, n = cfg.hidden_size, t["context"].shape[0]
    with torch.no_grad():
        layers = []
        for i in range(cfg.num_hidden_layers):
            layer = layer_class(vc, config=cfg, layer_idx=i, prefix=f"layers.{i}")
            res = layer.load_state_dict(_vllm_layer_state(state, i), strict=False)
            # every tensor used; only the kernel's quantisation scales keep their defaults
            assert not res.unexpected_keys, res.unexpected_keys
            assert all(".attn._" in k for k in res.missing_keys), res.missing_keys
            _after_loading(layer)
            layers.append(layer)
        hidden_norm = RMSNorm(H, eps=cfg.rms_norm_eps)
        hidden_norm.weight.copy_(state["hidden_norm.weight"])
        norm = RMSNorm(H, eps=cfg.rms_norm_eps)
        norm.weight.copy_(state["norm.weight"])
        # the context K/V, as precompute_and_store_context_kv computes them
        ctx = hidden_norm(F.linear(t["context"], state["fc.weight"]))
        ctx_pos = torch.arange(n)
        for layer in layers:
            a = layer.self_attn
            qkv, _ = a.qkv_proj(ctx)
            _, k, v = qkv.split([a.q_size, a.kv_size, a.kv_size], -1)
            k = a.k_norm(k.reshape(n, -1, a.head_dim)).reshape(n, -1)
            _, k = a.rotary_emb(ctx_pos, k.clone(), k.clone())
            if a.v_scale is not None:
                v = v * a.v_scale
            a.attn = _Attention(a, k.reshape(n, -1, a.head_dim), v.reshape(n, -1, a.head_dim))
        # the block: DFlash2Qwen3Model.forward over input embeddings times the scale
        x = t["block_emb"] * float(dc.get("input_embedding_scale", 1.0))
        positions = torch.arange(n, n + block)
        residual = None
        for layer in layers:
            x, residual = layer(positions=positions, hidden_states=x, residual=residual)
        hidden, _ = norm(x, residual)
        if not dflash2:
            torch.save({"hidden": hidden}, out_path)
            return
        # candidates (DFlash2Qwen3ForCausalLM.compute_candidates) and the selector's edges
        V = cfg.vocab_size
        lm_head = ParallelLMHead(V, H)
        lm_head.weight.copy_(t["lm_head"])
        _after_loading(lm_head)
        softcap = float(dc.get("final_logit_softcapping") or 0.0)
        proc = LogitsProcessor(V, scale=float(dc.get("output_multiplier", 1.0)),
                               soft_cap=softcap if softcap > 0 else None)
        slots = hidden[1:]
        ids, unary = proc.get_top_k_tokens(lm_head, slots, int(dc["selector_top_k"]))
        selector = CandidateSelector(hidden_size=H, vocab_size=V, rank=int(dc["selector_rank"]),
                                     top_k=int(dc["selector_top_k"]), params_dtype=torch.float32,
                                     prefix="candidate_selector")
        selector.load_state_dict({k[len("candidate_selector."):]: v for k, v in state.items()
                                  if k.startswith("candidate_selector.")}, strict=True)
        _after_loading(selector)
        edges = selector(ids[None], unary[None], slots[None], t["anchor"].view(1))
    torch.save({"hidden": hidden, "ids": ids, "unary": unary, "edges": edges[0]}, out_path)


def resolve(configs_path: str, out_path: str) -> None:
    """vLLM's ``_resolve_layer_attention`` on each config.json (loaded as vLLM loads it, through
    transformers' Qwen3Config): per layer [window, causal], or the error's text."""
    from transformers import Qwen3Config

    _setup(3)
    from vllm.model_executor.models.qwen3_dflash import _resolve_layer_attention

    out = []
    for raw in json.loads(open(configs_path).read()):
        cfg = Qwen3Config(**{k: v for k, v in raw.items() if k != "dflash_config"})
        cfg.dflash_config = raw.get("dflash_config")
        for key in ("is_causal",):
            if key in raw:
                setattr(cfg, key, raw[key])
        try:
            out.append([list(_resolve_layer_attention(cfg, i))
                        for i in range(cfg.num_hidden_layers)])
        except (ValueError, NotImplementedError) as exc:
            out.append(f"error: {exc}")
    open(out_path, "w").write(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--resolve":
        resolve(*sys.argv[2:4])
    else:
        main(*sys.argv[1:4])
