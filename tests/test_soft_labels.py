"""Soft labels for DFlash training (#10 item 1): the target's top-k beside rollouts is the
target's real next-token distribution at the row that judges each slot; the soft loss reduces
to the hard one for one-hot targets; training with them runs, resumes and fails clearly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specviz.bench import PromptItem
from specviz.errors import SettingsError, SpecvizError
from specviz.train.rollout_store import RolloutSet
from specviz.train.rollouts import make_rollouts
from specviz.train.soft_labels import (make_soft_labels, read_soft, slot_soft_targets, soft_ce,
                                       sidecar_name)

from conftest import make_tiny_target


def _rollouts(tmp_path, target, n=4, name="ro", holdout=0.0):
    items = [PromptItem(f"e{i}", "c", f"t{i} t{i + 4} t9", "e") for i in range(n)]
    make_rollouts(target, items, tmp_path / name, max_new_tokens=12, layer_ids=[0, 1],
                  holdout=holdout, store_dtype="float32")
    return tmp_path / name


def test_soft_labels_are_the_targets_distribution(tmp_path):
    """Row t of the sidecar = the target's top-k of p(. | tokens[:t+1]) from an unpadded forward
    of that rollout alone; its top word is the stored greedy next token; rerun = nothing redone."""
    target = make_tiny_target(seed=3)
    ro = _rollouts(tmp_path, target)
    res = make_soft_labels(target, ro, k=5, batch_tokens=30)
    assert res["shards"] >= 1 and res["argmax_agree"] == 1.0
    assert make_soft_labels(target, ro, k=5)["shards"] == 0          # resumable
    rs = RolloutSet(ro)
    for i in range(len(rs)):
        toks, _, plen = rs.load(i)
        ids, p = read_soft(rs, i)
        with torch.no_grad():
            ref = torch.softmax(target.model(toks.view(1, -1)).logits[0].float(), -1)
        top = ref.topk(5, -1)
        assert torch.equal(ids[:, 0], top.indices[:, 0])
        assert torch.allclose(p, top.values, atol=2e-3)
        assert torch.equal(ids[plen - 1:-1, 0], toks[plen:])            # greedy: the text itself
    with pytest.raises(SpecvizError, match="already holds soft labels"):
        make_soft_labels(target, ro, k=3)


def test_slot_rows_and_soft_ce():
    ids = torch.arange(40).view(10, 4)
    p = torch.full((10, 4), 0.25)
    sid, sp = slot_soft_targets((ids, p), torch.tensor([2, 8]), 4)
    assert sid.shape == (2, 3, 4)
    assert sid[0, :, 0].tolist() == [8, 12, 16]        # slot k of the block at a: row a + k - 1
    assert sid[1, :, 0].tolist() == [32, 36, 36]       # past the end: clamped (masked by caller)
    logits = torch.randn(2, 3, 50)
    one_hot_p = torch.zeros(2, 3, 4)
    one_hot_p[..., 0] = 1.0
    hard = F.cross_entropy(logits.view(-1, 50), sid[..., 0].reshape(-1), reduction="none")
    assert torch.allclose(soft_ce(logits, sid, one_hot_p, None).view(-1), hard, atol=1e-5)
    # restricted support: words outside it are dropped and the rest renormalised
    vocab = torch.tensor([8, 9, 12, 13, 16, 17, 32, 33, 36, 37])
    got = soft_ce(logits[..., :10], sid, sp, vocab)
    logq = F.log_softmax(logits[..., :10], -1)
    assert torch.allclose(got[0, 0], -(logq[0, 0, 0] + logq[0, 0, 1]) / 2, atol=1e-5)


def test_training_with_soft_labels(tmp_path):
    from specviz.train.dflash_setup import TrainConfig
    from specviz.train.dflash_train import train_dflash

    target = make_tiny_target(seed=1)
    ro = _rollouts(tmp_path, target, n=6, name="ro", holdout=0.3)
    cfg = TrainConfig(block_size=4, steps=30, batch_size=3, anchors_per_seq=6, eval_every=15,
                      eval_rollouts=2, lr=3e-3, soft_weight=0.5)
    with pytest.raises(SpecvizError, match="soft-labels --rollouts"):
        train_dflash(target, ro, tmp_path / "d", cfg)
    make_soft_labels(target, ro, k=4)
    out = train_dflash(target, ro, tmp_path / "d", cfg)
    assert out["steps_run"] == 30 and out["eval"] is not None
    assert sum(out["losses"][-5:]) < 0.9 * sum(out["losses"][:5])
    with pytest.raises(SettingsError, match="soft-weight"):
        TrainConfig(soft_weight=1.5).validate()


def test_soft_label_bad_input(tmp_path):
    from specviz.cli import main

    target = make_tiny_target(seed=3)
    ro = _rollouts(tmp_path, target, n=2)
    make_soft_labels(target, ro, k=2)
    rs = RolloutSet(ro)
    (ro / sidecar_name(rs.rows[0]["shard"])).write_bytes(b"not a safetensors file")
    with pytest.raises(SpecvizError, match="cannot be read"):
        read_soft(rs, 0)
    assert main(["train", "soft-labels", "--rollouts", str(tmp_path / "nope")]) != 0
    assert main(["train", "soft-labels", "--rollouts", str(ro), "--topk", "0"]) != 0
