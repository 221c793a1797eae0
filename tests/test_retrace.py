"""ReTrace (docs/methods/retrace.md) on tiny random targets: an untrained or gate-off ReTrace drafts
exactly what its DFlash backbone drafts, round for round; a trained-looking (random) fusion changes
drafts but never the output (greedy and sampled); no extra forward; bad checkpoints named."""
import json
import random

import pytest
import torch

from specviz.analysis.lossless import compare_outputs
from specviz.drafters import make_drafter
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.drafters.dflash.retrace import (ReTraceDrafter, ReTraceFusion, align, build_memory,
                                             fusion_config, load_retrace, save_retrace)
from specviz.engine import DecodeSettings, Session
from specviz.errors import SettingsError
from specviz.models import ModelLoadError
from specviz.run import generate

from conftest import assert_same_law, first_two_token_counts, sampling_pair, real_prompt_sets


def random_fusion(H, seed=0, scale=0.5):
    f = ReTraceFusion(H)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        f.proj.weight.copy_(torch.randn(f.proj.weight.shape, generator=g) * scale)
        f.gate.bias.fill_(1.0)
    return f


def rounds_of(target, drafter, ids, n):
    sess = Session(target, drafter, ids, DecodeSettings(max_new_tokens=n))
    return sess.run()


def test_memory_alignment_shifts_by_absolute_position():
    emb = torch.nn.Embedding(10, 4)
    h = torch.arange(7 * 4, dtype=torch.float32).view(7, 4)
    # block anchored at position 20 drafted 7 slots; 2 accepted, slot 3 was the first mismatch
    mem = build_memory(h, [1, 2, 3, 4, 5, 6, 7], 2, [1, 2, 9, 4, 0, 6, 0, 0], 20, emb)
    assert mem.slots == [4, 5, 6, 7] and mem.positions == [24, 25, 26, 27]
    assert mem.agree.tolist() == [1.0, 0.0, 1.0, 0.0]   # draft 4 vs target 4, 5 vs 0, ...
    assert torch.equal(mem.h[0], h[3])
    # next block's anchor (the correction token) sits at 20 + 2 + 1 = 23: slot j = P - 23
    assert align(mem, 23, 8) == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert align(mem, 23, 3) == [(1, 0), (2, 1)]          # slots past the block are dropped
    assert build_memory(h, [1, 2, 3], 2, [1, 2, 5, 0], 20, emb) is None  # nothing after it


@pytest.mark.parametrize("mode", ["untrained", "gate_off"])
def test_equals_backbone_round_for_round(mode, tiny_target):
    rng = random.Random(3)
    H = tiny_target.model.config.hidden_size
    for i in range(6):
        model = new_dflash_for_target(tiny_target, num_layers=1, block_size=rng.choice([4, 6]),
                                      seed=i)
        fusion = ReTraceFusion(H) if mode == "untrained" else random_fusion(H, i)
        ids = [rng.randrange(2, 64) for _ in range(rng.randint(2, 20))]
        base = rounds_of(tiny_target, DFlashDrafter(tiny_target, model=model, cut="off", tree=0), ids, 24)
        rt = rounds_of(tiny_target, ReTraceDrafter(tiny_target, model=model, fusion=fusion,
                                                   cut="off", gate="learned" if mode ==
                                                   "untrained" else "off"), ids, 24)
        assert [r.draft for r in rt.rounds] == [r.draft for r in base.rounds]
        assert [r.accepted for r in rt.rounds] == [r.accepted for r in base.rounds]
        fused = [r for r in rt.rounds if "retrace" in r.extras]
        assert fused or all(r.accepted >= len(r.draft) - 1 for r in rt.rounds)
        # the record says so: nothing was added to any slot (the page's "added nothing" note)
        assert all(v == 0 for r in fused for v in r.extras["retrace"]["residual"])
        # ... and whether the gate was forced off (the page then says that, not "untrained")
        assert all(bool(r.extras["retrace"].get("gate_off")) == (mode == "gate_off") for r in fused)


def count_forwards(target):
    calls = {"n": 0}

    def hook(*_):
        calls["n"] += 1
    return calls, target.model.register_forward_hook(hook)


def test_fusion_changes_drafts_not_outputs_and_adds_no_forward(tiny_target):
    rng = random.Random(7)
    H = tiny_target.model.config.hidden_size
    changed = 0
    for i in range(10):
        model = new_dflash_for_target(tiny_target, num_layers=1, block_size=6, seed=i)
        ids = [rng.randrange(2, 64) for _ in range(rng.randint(2, 20))]
        s = DecodeSettings(max_new_tokens=24)
        dr = ReTraceDrafter(tiny_target, model=model, fusion=random_fusion(H, i), cut="off")
        calls, hd = count_forwards(tiny_target)
        tr = Session(tiny_target, dr, ids, s).run()
        hd.remove()
        assert calls["n"] == tr.num_rounds + 1         # prefill + one verify per round
        ar = generate(tiny_target, "ar", ids, s)
        assert compare_outputs(tiny_target, ids, ar.output_ids, tr.output_ids).ok
        base = rounds_of(tiny_target, DFlashDrafter(tiny_target, model=model, cut="off", tree=0), ids, 24)
        changed += [r.draft for r in tr.rounds] != [r.draft for r in base.rounds]
        for r in tr.rounds:
            info = r.extras.get("retrace")
            if info:
                assert min(info["slots"]) >= 1 and all(0 < g < 1 for g in info["gate"])
                assert len(info["slots"]) == len(info["from_positions"]) == len(info["agree"])
                assert len(info["residual"]) == len(info["slots"])
                assert any(v > 0 for v in info["residual"])   # a trained fusion adds something
    assert changed >= 3


def test_sampling_keeps_target_distribution():
    target, model = sampling_pair()
    fusion = random_fusion(target.model.config.hidden_size, 3, scale=2.0)

    def drafter_fn(seed):
        return ReTraceDrafter(target, model=model, fusion=fusion, draft_temperature=1.0,
                              seed=seed, cut="off")

    counts, exact = first_two_token_counts(target, [3, 7, 5], drafter_fn, 3000,
                                           dict(temperature=0.9, top_p=0.95))
    assert_same_law(counts, exact, tv_tol=0.13)


def test_checkpoint_round_trip_and_bad_input(tmp_path, tiny_target):
    H = tiny_target.model.config.hidden_size
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=4, seed=0)
    from specviz.drafters.dflash.checkpoint import save_dflash_checkpoint

    save_dflash_checkpoint(model, tmp_path / "bb")
    f = random_fusion(H, 1)
    save_retrace(f, fusion_config(f, model, str(tmp_path / "bb")), tmp_path / "rt")
    g, cfg = load_retrace(tmp_path / "rt")
    assert torch.equal(g.proj.weight, f.proj.weight) and cfg["backbone_block_size"] == 4
    d = make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "rt"), cut="off")
    assert d.config()["backbone"] == str(tmp_path / "bb")
    # a backbone with another block size -> one error naming the mismatch
    other = new_dflash_for_target(tiny_target, num_layers=1, block_size=6, seed=0)
    save_dflash_checkpoint(other, tmp_path / "bb6")
    with pytest.raises(SettingsError, match="block size 4 \\(checkpoint\\) vs 6"):
        make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "rt"),
                     backbone=str(tmp_path / "bb6"))
    (tmp_path / "rt" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match="could not be loaded"):
        make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "rt"))
    with pytest.raises(ModelLoadError, match="not a ReTrace checkpoint"):
        make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "bb"))
    with pytest.raises(SettingsError, match="ReTrace checkpoint"):
        make_drafter("retrace", tiny_target)


# ----------------------------------------------------------------------------- training
def test_simulated_round_memory_equals_the_engine(tiny_target):
    """The training simulation's round-r memory (draft, acceptance, the target's verify argmax
    at every rejected position, the drafter states) equals what the live engine builds."""
    from specviz.train.retrace_train import round_examples
    from specviz.train.rollouts import generate_batch

    rng = random.Random(2)
    checked = 0
    for i in range(8):
        model = new_dflash_for_target(tiny_target, num_layers=1, block_size=6, seed=i,
                                      target_layer_ids=[0, 1])
        ids = [rng.randrange(2, 64) for _ in range(rng.randint(3, 12))]
        res = generate_batch(tiny_target, [ids], 30, [0, 1], store_dtype=torch.float32)
        tokens = torch.tensor(ids + res.replies[0])
        dr = ReTraceDrafter(tiny_target, model=model, fusion=ReTraceFusion(32), cut="off")
        sess = Session(tiny_target, dr, ids, DecodeSettings(max_new_tokens=30))
        while (rnd := sess.step()) is not None:
            mem = dr.memory
            if mem is None or len(rnd.draft) < 5 or rnd.start + len(rnd.draft) >= len(tokens):
                continue
            ex = round_examples(model.float(), tiny_target, tokens, res.hidden[0], None, len(ids),
                                0, rng, anchors=torch.tensor([rnd.start - 1]))
            assert ex is not None
            sim = ex.memory[0]
            assert sim.positions == mem.positions and torch.equal(sim.agree, mem.agree)
            assert torch.allclose(sim.c, mem.c) and torch.allclose(sim.h, mem.h, atol=1e-4)
            assert int(ex.anchors2[0]) == rnd.start + rnd.accepted
            checked += 1
    assert checked >= 5


def tiny_retrace_setup(tmp_path, target, n: int = 10, stride: int = 5):
    """Tiny greedy rollouts (``tmp_path/ro``) and a random backbone saved in ``tmp_path/bb``."""
    from specviz.bench import PromptItem
    from specviz.drafters.dflash.checkpoint import save_dflash_checkpoint
    from specviz.train.rollouts import make_rollouts

    items = [PromptItem(f"p{i}", "c", " ".join(f"t{(i * stride + j) % 60 + 2}" for j in range(6)),
                        "x") for i in range(n)]
    make_rollouts(target, items, tmp_path / "ro", max_new_tokens=24, layer_ids=[0, 1],
                  holdout=0.3)
    model = new_dflash_for_target(target, num_layers=1, block_size=6, seed=0,
                                  target_layer_ids=[0, 1])
    save_dflash_checkpoint(model, tmp_path / "bb")
    return model


def test_training_runs_resumes_and_loads(tmp_path, tiny_target):
    from specviz.train.retrace_train import ReTraceTrainConfig, train_retrace

    model = tiny_retrace_setup(tmp_path, tiny_target)
    cfg = ReTraceTrainConfig(steps=6, batch_size=2, anchors_per_seq=8, eval_every=3,
                             eval_sequences=4)
    res = train_retrace(tiny_target, model, str(tmp_path / "bb"), [tmp_path / "ro"],
                        tmp_path / "ro", tmp_path / "rt", cfg)
    assert res["steps_run"] == 6 and res["losses"] and res["eval"]["examples"] > 0
    # early stopping: the best held-out eval's checkpoint is kept in rt/best and loads
    evals = [json.loads(x) for x in (tmp_path / "rt" / "train_log.jsonl").read_text().splitlines()
             if "accepted_fused" in x]
    top = max(evals, key=lambda e: e["accepted_fused"])   # the first of equal ones
    # step 0: the untrained fusion (= the backbone) is early stopping's first candidate
    assert [e["step"] for e in evals] == [0, 3, 6] and res["best"]["step"] == top["step"]
    assert evals[0]["accepted_fused"] == evals[0]["accepted_backbone"]
    kept = json.loads((tmp_path / "rt" / "best" / "config.json").read_text())
    assert kept["specviz_training"]["step"] == top["step"]
    make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "rt" / "best"), cut="off")
    with pytest.raises(Exception, match="--resume"):
        train_retrace(tiny_target, model, str(tmp_path / "bb"), [tmp_path / "ro"], None,
                      tmp_path / "rt", cfg)
    cfg.steps = 8
    res2 = train_retrace(tiny_target, model, str(tmp_path / "bb"), [tmp_path / "ro"], None,
                         tmp_path / "rt", cfg, resume=True)
    assert res2["steps_run"] == 2
    d = make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "rt"), cut="off")
    assert float(d.fusion.proj.weight.abs().sum()) > 0   # it trained away from zero
    ids = [5, 9, 13]
    s = DecodeSettings(max_new_tokens=20)
    assert Session(tiny_target, d, ids, s).run().output_ids == \
        generate(tiny_target, "ar", ids, s).output_ids


def test_joint_training_moves_the_backbone_and_saves_it_inside(tmp_path, tiny_target):
    import json

    from specviz.drafters.dflash.checkpoint import load_dflash_checkpoint
    from specviz.train.retrace_train import ReTraceTrainConfig, train_retrace

    model = tiny_retrace_setup(tmp_path, tiny_target, n=8, stride=7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = ReTraceTrainConfig(steps=4, batch_size=2, anchors_per_seq=8, eval_every=2,
                             eval_sequences=3, backbone_lr=1e-2)
    train_retrace(tiny_target, model, str(tmp_path / "bb"), [tmp_path / "ro"], tmp_path / "ro",
                  tmp_path / "rt", cfg)
    conf = json.loads((tmp_path / "rt" / "config.json").read_text())
    assert conf["backbone"] == "included"
    saved = load_dflash_checkpoint(tmp_path / "rt" / "backbone")
    moved = [k for k, v in saved.state_dict().items()   # saved in bfloat16
             if not torch.equal(v.to(torch.bfloat16), before[k].to(torch.bfloat16))]
    assert moved, "the jointly trained backbone did not move"
    d = make_drafter("retrace", tiny_target, checkpoint=str(tmp_path / "rt"), cut="off")
    assert d.checkpoint == str(tmp_path / "rt" / "backbone")
    ids, s = [5, 9, 13], DecodeSettings(max_new_tokens=16)
    assert Session(tiny_target, d, ids, s).run().output_ids == \
        generate(tiny_target, "ar", ids, s).output_ids
    cfg.steps = 6                     # resumes with the fine-tuned backbone's state
    res = train_retrace(tiny_target, new_dflash_for_target(tiny_target, num_layers=1,
                                                           block_size=6, seed=0,
                                                           target_layer_ids=[0, 1]),
                        str(tmp_path / "bb"), [tmp_path / "ro"], None, tmp_path / "rt", cfg,
                        resume=True)
    assert res["steps_run"] == 2


# ----------------------------------------------------------------------------- the bundled one
def test_bundled_retrace_is_for_the_bundled_backbone(tiny_target):
    from specviz.drafters.dflash.checkpoint import (BUNDLED as DF_BUNDLED, BUNDLED_DIR,
                                                    load_dflash_checkpoint)
    from specviz.drafters.dflash.retrace import BUNDLED, check_backbone

    folder = BUNDLED_DIR / BUNDLED["SmolLM2-135M-Instruct"]
    assert (folder / "model.safetensors").stat().st_size < 30 * 2 ** 20
    fusion, cfg = load_retrace(folder)                       # strict load
    assert cfg["backbone"] == "bundled"
    check_backbone(cfg, load_dflash_checkpoint(BUNDLED_DIR / DF_BUNDLED["SmolLM2-135M-Instruct"]))
    # the bundled fusion is the held-out best of its training run (early stopping): the
    # untrained one (step 0, a zero projection = the backbone) where no trained step beat the
    # backbone, as on the bundled backbone now; otherwise a trained one, away from zero
    log = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines() if x]
    evals = [r for r in log if "accepted_fused" in r]
    best = max(evals, key=lambda r: r["accepted_fused"])     # the first best wins a tie
    assert cfg["specviz_training"]["step"] == best["step"]
    moved = float(fusion.proj.weight.abs().sum())
    assert (moved == 0) if best["step"] == 0 else (moved > 0)
    with pytest.raises(SettingsError, match="ReTrace checkpoint"):
        make_drafter("retrace", tiny_target)


@pytest.mark.integration
@pytest.mark.parametrize("per_category", real_prompt_sets(4))
def test_bundled_retrace_greedy_lossless_on_real_prompts(embedded_target, per_category):
    from conftest import lossless_on_examples

    runs = lossless_on_examples(embedded_target, "retrace", per_category, 1, start=5)
    fused = sum(1 for _, tr, _ in runs for r in tr.rounds if "retrace" in r.extras)
    assert fused > 0   # the memory was really used on real prompts
