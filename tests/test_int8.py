"""int8 drafter weights (specviz.drafters.dflash.int8): a faster forward for a CPU drafter that may
draft differently but never changes the output, and never touches the float model."""
import random

import pytest
import torch
from torch import nn

from specviz.analysis.lossless import compare_outputs
from specviz.drafters.dflash import int8
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.engine import DecodeSettings, Session
from specviz.errors import SettingsError
from specviz.run import generate


def _quantized(module):
    return [n for n, m in module.named_modules()
            if isinstance(m, nn.Module) and "quantized" in type(m).__module__
            and type(m).__name__ == "Linear"]


def test_int8_copy_quantizes_the_layers_and_head_not_fc_nor_the_float_model(tiny_target):
    m = new_dflash_for_target(tiny_target, num_layers=2, block_size=4, seed=1)
    m.draft_vocab = torch.arange(2, tiny_target.model.config.vocab_size, 3)
    head = tiny_target.model.get_output_embeddings()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    q = int8.int8_copy(m, head)
    names = _quantized(q)
    assert names and all(n.startswith("layers.") for n in names)
    assert len(names) == sum(isinstance(x, nn.Linear) for x in m.layers.modules())
    assert isinstance(q.fc, nn.Linear) and not _quantized(nn.Sequential(q.fc))
    assert _quantized(nn.Sequential(q.sub_head(head)))      # the draft-vocabulary rows
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert not _quantized(m)
    assert int8.int8_copy(m, head) is q                      # built once for these weights
    with torch.no_grad():
        m.layers[0].mlp.up_proj.weight.add_(0.01)            # e.g. a training step
    assert int8.int8_copy(m, head) is not q


def test_int8_drafter_is_greedy_lossless(tiny_target):
    target = tiny_target
    vocab = target.model.config.vocab_size
    rng = random.Random(4)
    for i in range(8):
        model = new_dflash_for_target(target, num_layers=2, block_size=rng.choice([4, 8]),
                                      seed=i)
        ids = [rng.randrange(2, vocab) for _ in range(rng.randint(2, 25))]
        s = DecodeSettings(max_new_tokens=rng.randint(8, 24))
        d = DFlashDrafter(target, model=model, cut="off", weights="int8")
        assert d.weights == "int8" and d.config()["weights_in_use"] == "int8"
        assert _quantized(d.model) and not _quantized(model)
        tr = Session(target, d, ids, s).run()
        ar = generate(target, "ar", ids, s)
        rep = compare_outputs(target, ids, ar.output_ids, tr.output_ids)
        assert rep.ok, f"prompt {i}: diverged at {rep.first_divergence}"
        assert sum(len(r.draft) for r in tr.rounds) > 0


def test_auto_keeps_small_drafters_float_and_bad_values_fail(tiny_target):
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=4, seed=0)
    assert int8.layer_params(model) < int8.MIN_PARAMS
    d = DFlashDrafter(tiny_target, model=model, weights="auto")
    assert d.weights == "float" and not _quantized(d.model)
    assert d.config()["weights"] == "auto" and d.config()["weights_in_use"] == "float"
    assert DFlashDrafter(tiny_target, model=model).config()["weights"] == "float"   # default
    assert DFlashDrafter(tiny_target, model=model, weights="float").weights == "float"
    with pytest.raises(SettingsError):
        DFlashDrafter(tiny_target, model=model, weights="int4")


@pytest.mark.integration
@pytest.mark.slow   # ~2 min; int8 lossless on tiny models runs by default
def test_bundled_drafter_in_int8_is_lossless_and_close_to_float(embedded_target):
    """The bundled drafter in int8 on real prompts: output identical to AR, and its drafts
    agree with the float drafter's on most slots (same network, quantized weights)."""
    from conftest import lossless_on_examples

    runs = lossless_on_examples(embedded_target, "dflash", 4, 1, cut="off", weights="int8")
    assert all(df.meta["drafter_config"]["weights_in_use"] == "int8" for _, df, _ in runs)
    tokens = sum(len(df.output_ids) for _, df, _ in runs)
    rounds = sum(df.num_rounds for _, df, _ in runs)
    assert tokens / rounds > 1.2, f"the int8 drafter's tau is only {tokens / rounds:.2f}"
