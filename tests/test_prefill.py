"""Prefill-labelled training data (#10 item 1): exact-prefix labels equal the target's real
greedy reply on every labelled slot; store, CLI and training read it."""
from __future__ import annotations

import json

import pytest
import torch

from specviz.train.prefill import (TextPair, encode_pair, exact_prefix_labels, load_pairs,
                                   make_prefill_set, prefill_batch, reference_reply,
                                   rollout_labels)
from specviz.train.rollout_store import RolloutSet

from conftest import make_tiny_target


def greedy_tokens(target, prefix: list[int], n: int) -> list[int]:
    out = target.model.generate(torch.tensor([prefix]), max_new_tokens=n, do_sample=False,
                                min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(prefix):].tolist()


def check_labels_against_generate(target, tokens: list[int], start: int, B: int) -> int:
    """Every valid label of blocks anchored at start.. equals real greedy decoding from
    tokens[:a+1]; returns how many labelled slots were compared."""
    hid, greedy = prefill_batch(target, [tokens], [0])
    t = torch.tensor(tokens)
    anchors = torch.arange(start, len(tokens) - 1)
    labels, valid = exact_prefix_labels(t, greedy[0].long(), anchors, B)
    n = 0
    for j, a in enumerate(anchors.tolist()):
        ref = greedy_tokens(target, tokens[:a + 1], B - 1)
        assert bool(valid[j, 0])  # slot 1 is always exact
        for k in range(B - 1):
            if valid[j, k]:
                assert int(labels[j, k]) == ref[k], (a, k)
                n += 1
            else:  # masked exactly where the text left the greedy path (or ran out)
                assert a + k >= len(tokens) - 1 or tokens[a + 1:a + k + 1] != ref[:k]
    return n


def test_exact_prefix_labels_match_greedy_tiny():
    target = make_tiny_target(seed=3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, 64, (30,), generator=g).tolist()
    # make part of the text follow the greedy path so that later slots are labelled too
    tokens = tokens[:12] + greedy_tokens(target, tokens[:12], 10) + tokens[22:]
    assert check_labels_against_generate(target, tokens, 5, 6) > 30


def test_rollout_labels_are_the_text():
    t = torch.arange(10)
    lab, ok = rollout_labels(t, torch.tensor([0, 7]), 4)
    assert lab[0].tolist() == [1, 2, 3] and ok[0].all()
    assert lab[1, :2].tolist() == [8, 9] and ok[1].tolist() == [True, True, False]


def test_greedy_text_labels_equal_rollout_labels():
    """On a text that IS the greedy path, the exact-prefix labels are all valid and equal the
    rollout labels (the two kinds of data agree)."""
    target = make_tiny_target(seed=5)
    seq = [3, 9, 4] + greedy_tokens(target, [3, 9, 4], 20)
    _, greedy = prefill_batch(target, [seq], [0])
    a = torch.arange(2, len(seq) - 8)
    l1, v1 = exact_prefix_labels(torch.tensor(seq), greedy[0].long(), a, 8)
    l2, v2 = rollout_labels(torch.tensor(seq), a, 8)
    assert v1.all() and v2.all() and torch.equal(l1, l2)


def test_reference_reply_formats():
    assert reference_reply({"question": "q", "answer": "a = <<2*3=6>>6\n#### 6"}) == \
        "a = 6\nThe answer is 6"
    assert reference_reply({"text": "t", "code": "x=1\r\ny=2", "test_list": []}) == "x=1\ny=2"
    assert reference_reply({"turns": ["q"], "category": "qa"}) is None
    assert reference_reply({"instruction": "i", "instances": [{"input": "", "output": "o"}]}) == "o"


def test_prefill_store_and_training(tmp_path):
    from specviz.bench import PromptItem
    from specviz.train.dflash_setup import TrainConfig
    from specviz.train.dflash_train import train_dflash
    from specviz.train.rollouts import make_rollouts
    from specviz.train.train_data import TrainData, reply_vocab

    target = make_tiny_target(seed=1)
    pairs = [TextPair(f"f:{i}", "c", f"t{i} t{i + 3}", " ".join(f"t{(i * 7 + j) % 60 + 2}"
                                                              for j in range(12)))
             for i in range(6)]
    res = make_prefill_set(target, pairs, tmp_path / "pf", layer_ids=[0, 1], batch_tokens=40)
    assert res["texts"] == 6 and res["tokens"] > 0
    again = make_prefill_set(target, pairs, tmp_path / "pf", layer_ids=[0, 1])
    assert again["texts"] == 0 and again["total"] == 6          # resumable: nothing redone
    rs = RolloutSet(tmp_path / "pf")
    t, h, p = rs.load(0)
    g = rs.greedy(0)
    assert h.shape == (t.shape[0], 64) and g.shape == t.shape
    ids, plen = encode_pair(target, pairs[[r["key"] for r in rs.rows].index(rs.rows[0]["key"])])
    assert t.tolist() == ids and p == plen
    items = [PromptItem(f"e{i}", "c", f"t{i} t5", "e") for i in range(3)]
    make_rollouts(target, items, tmp_path / "ro", max_new_tokens=10, layer_ids=[0, 1],
                  holdout=0.9999)
    data = TrainData(tmp_path / "ro", [tmp_path / "pf"])
    assert len(data) == 6 and data.greedy(0) is not None
    vocab = set(reply_vocab(data).tolist())
    assert set(g[p - 1:].tolist()) <= vocab
    cfg = TrainConfig(block_size=4, steps=40, batch_size=3, anchors_per_seq=8, eval_every=20,
                      eval_rollouts=3, lr=3e-3)
    out = train_dflash(target, tmp_path / "ro", tmp_path / "d", cfg, prefill=[tmp_path / "pf"])
    assert out["steps_run"] == 40 and out["eval"]["rollouts"] == 3
    losses = out["losses"]
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])


def test_retap_greedy_rollouts_at_other_layers(tmp_path):
    """Rollouts stored with one tapped layer (the history store's) are re-tapped at others: token
    ids as stored, features equal the generating pass's at those layers, every slot labelled
    and the labels equal the rollout's own (the text is the greedy path)."""
    from specviz.bench import PromptItem
    from specviz.cli import main
    from specviz.train.prefill import rollout_texts
    from specviz.train.rollouts import make_rollouts

    target = make_tiny_target(seed=2)
    items = [PromptItem(f"e{i}", "c", f"t{i} t{i + 4} t9", "e") for i in range(4)]
    make_rollouts(target, items, tmp_path / "one", max_new_tokens=12, layer_ids=[1], holdout=0,
                  store_dtype="float32")
    make_rollouts(target, items, tmp_path / "two", max_new_tokens=12, layer_ids=[0, 1],
                  holdout=0, store_dtype="float32")
    texts = rollout_texts(tmp_path / "one")
    assert len(texts) == 4
    make_prefill_set(target, texts, tmp_path / "re", layer_ids=[0, 1], store_dtype="float32")
    re, two = RolloutSet(tmp_path / "re"), RolloutSet(tmp_path / "two")
    by_key = {r["key"]: i for i, r in enumerate(two.rows)}
    for i, row in enumerate(re.rows):
        t, h, p = re.load(i)
        t2, h2, p2 = two.load(by_key[row["key"]])
        assert t.tolist() == t2.tolist() and p == p2 and row["stop"] == "rollout"
        assert torch.allclose(h, h2, atol=1e-4)
        a = torch.arange(p - 1, len(t) - 1)
        lab, ok = exact_prefix_labels(t, re.greedy(i), a, 4)
        lab2, ok2 = rollout_labels(t, a, 4)
        # every slot the rollout labels is labelled the same (prefill also labels the target's
        # next token after the stored text, exact too)
        assert bool(ok[ok2].all()) and torch.equal(lab[ok2], lab2[ok2])
        assert int((ok & ~ok2).sum()) <= 3
    assert main(["train", "prefill", "--out", str(tmp_path / "x")]) != 0   # nothing to prefill
    assert main(["train", "prefill", "--rollouts", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "x")]) != 0


def test_prefill_errors(tmp_path):
    from specviz.cli import main
    from specviz.errors import SpecvizError

    with pytest.raises(SpecvizError, match="does not exist"):
        load_pairs(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(SpecvizError, match="unrecognised"):
        load_pairs(str(bad))
    assert main(["train", "prefill", "--data", str(tmp_path / "nope.jsonl"),
                 "--out", str(tmp_path / "o")]) != 0


@pytest.mark.integration
def test_exact_prefix_labels_match_greedy_embedded(embedded_target):
    """On the embedded model and a real GSM8K reference answer: every labelled slot equals the
    token real greedy decoding produces there."""
    row = {"question": "Tom has 3 apples and buys 5 more. How many apples does he have?",
           "answer": "Tom has 3 + 5 = <<3+5=8>>8 apples.\n#### 8"}
    pr = TextPair("x:0", "gsm8k", row["question"], reference_reply(row))
    ids, plen = encode_pair(embedded_target, pr)
    assert check_labels_against_generate(embedded_target, ids, plen - 1, 6) >= len(ids) - plen


def test_training_continues_from_a_checkpoint(tmp_path):
    from specviz.drafters.dflash.checkpoint import (load_dflash_checkpoint, new_dflash_for_target,
                                                    save_dflash_checkpoint)
    from specviz.errors import SpecvizError
    from specviz.train.dflash_setup import TrainConfig
    from specviz.train.dflash_train import train_dflash

    target = make_tiny_target(seed=1)
    pairs = [TextPair(f"f:{i}", "c", f"t{i} t{i + 3}", " ".join(f"t{(i * 7 + j) % 60 + 2}"
                                                              for j in range(12)))
             for i in range(4)]
    make_prefill_set(target, pairs, tmp_path / "pf", layer_ids=[0, 1])
    from specviz.bench import PromptItem
    from specviz.train.rollouts import make_rollouts

    make_rollouts(target, [PromptItem("e", "c", "t1 t2", "e")], tmp_path / "ro",
                  max_new_tokens=8, layer_ids=[0, 1], holdout=0.9999)
    init = new_dflash_for_target(target, num_layers=1, block_size=4, seed=9,
                                 target_layer_ids=[0, 1])
    init.draft_vocab = torch.tensor([1, 5, 63])     # words of earlier training data
    save_dflash_checkpoint(init, tmp_path / "init")
    cfg = TrainConfig(block_size=4, num_layers=1, steps=1, batch_size=1, anchors_per_seq=2,
                      eval_every=0, lr=1e-9, init=str(tmp_path / "init"))
    train_dflash(target, tmp_path / "ro", tmp_path / "d", cfg, prefill=[tmp_path / "pf"])
    got = load_dflash_checkpoint(tmp_path / "d")
    assert torch.allclose(got.fc.weight, init.fc.weight, atol=1e-6)
    # the continued drafter keeps its earlier draft words and adds the new data's
    assert {1, 5, 63} <= set(got.draft_vocab.tolist()) and got.draft_vocab.numel() > 3
    # ... and keeps them across --resume, also from a training state saved without them
    # (a resumed continued run must not save only the new data's words)
    for drop in (False, True):
        state = torch.load(tmp_path / "d" / "train_state.pt", weights_only=False)
        assert {1, 5, 63} <= set(state["draft_vocab"].tolist())
        if drop:
            del state["draft_vocab"]
            torch.save(state, tmp_path / "d" / "train_state.pt")
        cfg.steps += 1
        train_dflash(target, tmp_path / "ro", tmp_path / "d", cfg, prefill=[tmp_path / "pf"],
                     resume=True)
        again = load_dflash_checkpoint(tmp_path / "d")
        assert set(again.draft_vocab.tolist()) == set(got.draft_vocab.tolist())
    cfg2 = TrainConfig(block_size=6, num_layers=1, steps=1, batch_size=1, eval_every=0,
                       init=str(tmp_path / "init"))
    with pytest.raises(SpecvizError, match="block size 4"):
        train_dflash(target, tmp_path / "ro", tmp_path / "d2", cfg2, prefill=[tmp_path / "pf"])
