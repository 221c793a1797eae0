"""Rollouts + DFlash training (docs/methods/dflash.md) on tiny random targets: batched greedy
rollouts equal per-prompt decoding and store exactly the tapped hidden states; runs resume; training
lowers the loss, writes the published layout, and the simulated tau equals a real greedy Session's
tau."""
import json
import random

import pytest
import torch

from specviz.bench import PromptItem
from specviz.cli import main
from specviz.drafters import make_drafter
from specviz.drafters.dflash.checkpoint import load_dflash_checkpoint, new_dflash_for_target
from specviz.drafters.dflash.offline import (anchor_logits, block_embeddings, forward_blocks,
                                             sequence_context)
from specviz.engine import DecodeSettings, Session
from specviz.run import generate
from specviz.train.dflash_setup import TrainConfig
from specviz.train.dflash_train import sequence_loss, slot_weights, step_vocab, train_dflash
from specviz.train.rollout_store import RolloutSet, read_manifest
from specviz.train.rollouts import generate_batch, make_rollouts, split_of
from specviz.train.simulated_tau import simulated_tau, simulated_tau_one

from conftest import make_tiny_target


def items(n, seed=0, vocab=64, lo=1, hi=24):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(2, vocab) for _ in range(rng.randint(lo, hi))]
        out.append(PromptItem(f"p{i}", "toy", " ".join(f"t{t}" for t in ids), "toy.jsonl"))
    return out


@pytest.fixture(scope="module")
def target():
    return make_tiny_target(seed=3, layers=3)


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory, target):
    out = tmp_path_factory.mktemp("roll")
    summary = make_rollouts(target, items(40), out, max_new_tokens=24, batch_size=8,
                            layer_ids=[0, 2], holdout=0.2, store_dtype="float32")
    return out, summary


# ----------------------------------------------------------------------------- rollouts
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_batched_rollouts_equal_generate_and_full_forward(kind, target):
    if kind == "qwen3":
        from test_dflash import make_tiny_qwen3

        target = make_tiny_qwen3(vocab_size=64, layers=3)
    its = items(7, seed=5)
    prompts = [target.encode_prompt(it.text) for it in its]
    assert len({len(p) for p in prompts}) > 2  # real left padding
    res = generate_batch(target, prompts, 20, [0, 2], store_dtype=torch.float32)
    for p, reply, hid, stop in zip(prompts, res.replies, res.hidden, res.stops):
        ref = generate(target, "ar", p, DecodeSettings(max_new_tokens=20)).output_ids
        assert reply == ref
        assert stop == ("eos" if reply[-1] in target.eos_token_ids else "max_new_tokens")
        with torch.no_grad():
            hs = target.model(torch.tensor([p + reply]), output_hidden_states=True).hidden_states
        full = torch.cat([hs[1], hs[3]], -1)[0]
        assert hid.shape == full.shape
        assert torch.allclose(hid, full, atol=1e-4, rtol=1e-4)


def test_rollout_store_manifest_split_and_resume(tmp_path, target, rollouts):
    out, summary = rollouts
    rows = read_manifest(out)
    assert summary["generated"] == 40 and len(rows) == 40
    meta = json.loads((out / "meta.json").read_text())
    assert meta["target_layer_ids"] == [0, 2] and meta["dtype"] == "float32"
    splits = {r["split"] for r in rows}
    assert splits == {"train", "eval"}
    for r in rows:
        assert r["split"] == split_of(r["key"], 0.2)
    rs = RolloutSet(out)
    t, h, p = rs.load(0)
    assert t.shape[0] == h.shape[0] == p + rs.rows[0]["reply_len"] and h.shape[1] == 2 * 32
    # float16 by default; a second run skips every prompt already done
    out2 = tmp_path / "r2"
    make_rollouts(target, items(5), out2, max_new_tokens=6, batch_size=2, layer_ids=[1])
    assert RolloutSet(out2).load(0)[1].dtype == torch.float16
    again = make_rollouts(target, items(8), out2, max_new_tokens=6, batch_size=2, layer_ids=[1])
    assert again["generated"] == 3 and again["skipped"] == 5 and again["total"] == 8
    assert len({r["key"] for r in read_manifest(out2)}) == 8


# ----------------------------------------------------------------------------- training
def test_forward_blocks_equals_reference_path(target):
    m = new_dflash_for_target(target, num_layers=2, block_size=4, target_layer_ids=[0, 2], seed=1)
    rng = random.Random(0)
    tokens = torch.tensor([rng.randrange(2, 64) for _ in range(20)])
    hid = torch.randn(20, 64)
    anchors = torch.tensor([0, 3, 9, 16])
    with torch.no_grad():
        ctx = sequence_context(m, hid, 20)
        x = block_embeddings(m, target, tokens[anchors], 4)
        got = forward_blocks(m, x, anchors, ctx)
        for j, a in enumerate(anchors.tolist()):
            ref = m.forward_block(x[j:j + 1], [(k[:, :, :a], v[:, :, :a]) for k, v in ctx], a)
            assert torch.allclose(got[j], ref[0], atol=1e-5)


def test_training_lowers_loss_saves_layout_and_tau_matches_session(tmp_path, target, rollouts):
    out, _ = rollouts
    ck = tmp_path / "drafter"
    cfg = TrainConfig(block_size=4, num_layers=1, steps=30, batch_size=4, anchors_per_seq=8,
                      lr=3e-3, warmup=0.1, eval_every=15, eval_rollouts=8)
    res = train_dflash(target, out, ck, cfg)
    losses = res["losses"]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses
    assert (ck / "config.json").is_file() and (ck / "model.safetensors").is_file()
    m = load_dflash_checkpoint(ck)
    assert m.learned_mask and m.target_layer_ids == [0, 2] and m.block_size == 4
    # the simulated tau on eval rollouts equals the tau of real greedy Sessions
    ev = RolloutSet(out, split="eval")
    assert len(ev) >= 2
    drafter_taus = []
    for i in range(len(ev)):
        t, h, p = ev.load(i)
        new, rounds = simulated_tau_one(m, target, t, h, p)
        d = make_drafter("dflash", target, checkpoint=str(ck), cut="off", tree=0)
        tr = Session(target, d, t[:p].tolist(), DecodeSettings(max_new_tokens=24)).run()
        assert tr.output_ids == t[p:].tolist()
        assert (len(tr.output_ids), tr.num_rounds) == (new, rounds)
        drafter_taus.append(tr.tau)
    assert max(drafter_taus) > 1.0  # the check exercises accepted drafts, not just 1/round
    est = simulated_tau(m, target, ev)
    assert est["rounds"] > 0 and est["tau"] >= 1.0
    # resume continues from the saved step
    cfg2 = TrainConfig(**{**cfg.__dict__, "steps": 32})
    res2 = train_dflash(target, out, ck, cfg2, resume=True)
    assert res2["steps_run"] == 2
    with pytest.raises(Exception, match="--resume"):
        train_dflash(target, out, ck, cfg2)


def test_init_from_target_copies_top_layers(target):
    from specviz.drafters.dflash.checkpoint import init_from_target

    m = new_dflash_for_target(target, num_layers=2, block_size=4, target_layer_ids=[0, 2], seed=1)
    init_from_target(m, target)
    src = target.model.model.layers
    assert torch.equal(m.layers[0].mlp.up_proj.weight, src[1].mlp.up_proj.weight)
    assert torch.equal(m.layers[1].self_attn.q_proj.weight, src[2].self_attn.q_proj.weight)
    assert torch.equal(m.norm.weight, target.model.model.norm.weight)
    feats = torch.randn(1, 5, 2 * 32)
    assert torch.allclose(m.fc(feats), feats[..., 32:])  # the last tapped layer passes through
    with pytest.raises(Exception, match="cannot initialise"):
        init_from_target(new_dflash_for_target(target, num_layers=4, block_size=4), target)
    cfg = TrainConfig(init="target", steps=1)
    assert cfg.validate().init == "target"
    with pytest.raises(Exception, match="--init"):
        TrainConfig(init="magic").validate()


def test_sampled_softmax_loss(target):
    m = new_dflash_for_target(target, num_layers=1, block_size=4, target_layer_ids=[0, 2], seed=2)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, 64, (30,), generator=g)
    hid = torch.randn(30, 64, generator=g)
    w = slot_weights(4, 4.0)
    full = sequence_loss(m, target, tokens, hid, 5, 6, w, random.Random(1))
    # the whole vocabulary as the support == the full head
    same = sequence_loss(m, target, tokens, hid, 5, 6, w, random.Random(1), torch.arange(64))
    assert torch.allclose(full[0], same[0], atol=1e-5) and torch.equal(full[1], same[1])
    # a subset: CE over exactly those rows of the head, labels re-indexed
    labels = tokens[5:].unique()
    sub = torch.cat([labels, torch.tensor([0, 1])]).unique()
    got, wsum = sequence_loss(m, target, tokens, hid, 5, 6, w, random.Random(1), sub)
    rng = random.Random(1)
    anchors = torch.tensor(sorted(rng.sample(list(range(4, 29)), 6)))
    with torch.no_grad():
        lg = anchor_logits(m, target, tokens, hid, anchors)[..., sub]
    tpos = anchors.view(-1, 1) + torch.arange(1, 4).view(1, -1)
    valid = tpos < 30
    lab = torch.searchsorted(sub, tokens[tpos.clamp(max=29)])
    ce = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1),
                                           reduction="none").view_as(tpos)
    ref = (ce * w.view(1, -1) * valid).sum()
    assert torch.allclose(got.detach(), ref, atol=1e-4) and float(got) < float(full[0])
    with pytest.raises(Exception, match="missing from the training vocabulary"):
        sequence_loss(m, target, tokens, hid, 5, 6, w, random.Random(1),
                      sub[sub != tokens[tpos[0, 0]]])
    # the step support: every active id + the requested number of distinct other ids
    active = torch.tensor([3, 7, 9])
    sup = step_vocab(active, 64, 10, g)
    assert sup.numel() == 13 and set(active.tolist()) <= set(sup.tolist())
    assert torch.equal(sup, sup.sort().values) and sup.unique().numel() == 13
    assert torch.equal(step_vocab(active, 64, 0, g), active)


# ----------------------------------------------------------------------------- CLI
def test_cli_errors(tmp_path, capsys):
    assert main(["train", "dflash", "--rollouts", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "d")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "r").mkdir()
    assert main(["train", "dflash", "--rollouts", str(tmp_path / "r"), "--out",
                 str(tmp_path / "d")]) == 2
    assert "not a rollouts folder" in capsys.readouterr().err
    assert main(["train", "dflash", "--rollouts", str(tmp_path / "r"), "--out",
                 str(tmp_path / "d"), "--block-size", "1"]) == 2
    assert "block-size" in capsys.readouterr().err
    assert main(["train", "rollouts", "--data", str(tmp_path / "missing.jsonl"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    assert main(["train", "rollouts", "--data", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "unrecognised prompt format" in err
    good = tmp_path / "good.txt"
    good.write_text("one\ntwo\nthree\n")
    assert main(["train", "rollouts", "--data", f"{good}:2", "--exclude", str(good),
                 "--out", str(tmp_path / "o")]) == 2
    assert "left no prompts" in capsys.readouterr().err
    assert main(["train", "rollouts", "--data", str(bad), "--out", str(tmp_path / "o"),
                 "--holdout", "1.5"]) == 2
    assert "holdout" in capsys.readouterr().err
