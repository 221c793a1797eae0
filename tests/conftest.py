"""Shared fixtures: tiny random models (unit tests, seconds) and the embedded target."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see specviz/__init__.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))


class ToyTokenizer:
    """Minimal tokenizer for tiny random models: token i <-> the text ' t{i}'."""

    chat_template = None

    def __init__(self, vocab_size: int, eos_token_id: int = 1):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def __call__(self, text, add_special_tokens=True):
        ids = [int(w[1:]) % self.vocab_size for w in text.split() if w[1:].isdigit()]
        return {"input_ids": ids or [2]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" t{int(i)}" for i in ids)


def make_tiny_target(vocab_size: int = 64, seed: int = 0, layers: int = 2, eos: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    from specviz.models import target_from_model

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, eos_token_id=eos, bos_token_id=0,
                      pad_token_id=eos, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    # sharpen the output distribution so greedy runs are not all near-ties
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return target_from_model(model, ToyTokenizer(vocab_size, eos), name=f"tiny-llama-{seed}")


@pytest.fixture(scope="session")
def tiny_target():
    return make_tiny_target()


@pytest.fixture(scope="session")
def embedded_target():
    from specviz.models import load_target

    return load_target("default")
