"""DFlash drafter (docs/methods/dflash.md) on tiny random targets: the published checkpoint layout
loads strictly, greedy output is lossless, the context cache stays consistent, a drafter that knows
the answer gets its tokens accepted, sampling keeps the target distribution, bad input fails
clearly."""
import json
import random

import pytest
import torch

from specviz.analysis.lossless import compare_outputs
from specviz.drafters import make_drafter
from specviz.drafters.dflash.checkpoint import (load_dflash_checkpoint, new_dflash_for_target,
                                                save_dflash_checkpoint)
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.drafters.dflash.model import default_target_layer_ids
from specviz.engine import DecodeSettings, Session
from specviz.errors import SettingsError, SpecvizError
from specviz.models import ModelLoadError
from specviz.run import generate

from conftest import (assert_same_law, finish_tiny_target, first_two_token_counts,
                      sampling_pair, real_prompt_sets)


def make_tiny_qwen3(vocab_size=128, seed=0, layers=4, eos=1):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512, eos_token_id=eos, bos_token_id=0,
                      pad_token_id=eos, tie_word_embeddings=False, rope_theta=1e6)
    return finish_tiny_target(Qwen3ForCausalLM(cfg), vocab_size, eos, f"tiny-qwen3-{seed}")


@pytest.fixture(scope="module")
def qwen3_target():
    return make_tiny_qwen3()


PUBLISHED_GLOBAL = ["fc.weight", "hidden_norm.weight", "norm.weight"]
PUBLISHED_LAYER = ["input_layernorm.weight", "post_attention_layernorm.weight",
                   "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                   "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                   "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]


def published_config(**over):
    """A config.json as the released z-lab checkpoints write it, sized for the tiny Qwen3."""
    cfg = {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 4, "bos_token_id": 0,
        "dflash_config": {"mask_token_id": 127, "target_layer_ids": [0, 1, 2]},
        "dtype": "float32", "eos_token_id": 1, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
        "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 512,
        "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "num_target_layers": 4,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": False, "transformers_version": "4.57.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 128,
    }
    cfg.update(over)
    return cfg


def published_weights(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    H, I, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    k = len(cfg["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (H, k * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (nq, H), p + "self_attn.k_proj.weight": (nkv, H),
                       p + "self_attn.v_proj.weight": (nkv, H), p + "self_attn.o_proj.weight": (H, nq),
                       p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I)})
    return {n: (1.0 + 0.1 * torch.randn(s, generator=g)) if len(s) == 1
            else 0.05 * torch.randn(s, generator=g) for n, s in shapes.items()}


def write_checkpoint(folder, cfg, weights):
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def random_prompt(rng, vocab, lo=1, hi=30):
    return [rng.randrange(2, vocab) for _ in range(rng.randint(lo, hi))]


def reference_slot_logits(drafter, tokens):
    """No-cache recompute: one full target forward over tokens[:-1], then the model's forward."""
    target, m = drafter.target, drafter.model
    B = drafter.block_size
    with torch.no_grad():
        hs = target.model(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        ctx = torch.cat([hs[i] for i in drafter.hidden_state_layers], -1)
        emb = target.model.get_input_embeddings()(torch.tensor([[tokens[-1]] * B]))
        if m.learned_mask:
            emb[0, 1:] = m.mask_embedding
        else:
            emb[0, 1:] = target.model.get_input_embeddings().weight[m.mask_token_id]
        h = m(emb, ctx)[:, 1:]
        return target.model.get_output_embeddings()(h)[0].float()


# ----------------------------------------------------------------------------- format
def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25]
    for L in (1, 2, 3, 4, 8):
        for k in (1, 2, 5):
            ids = default_target_layer_ids(L, k)
            assert ids and all(0 <= i < L for i in ids) and ids == sorted(set(ids))


def test_published_layout_loads_strictly_and_runs(tmp_path, qwen3_target):
    cfg = published_config()
    weights = published_weights(cfg)
    folder = write_checkpoint(tmp_path / "ckpt", cfg, weights)
    drafter = make_drafter("dflash", qwen3_target, checkpoint=str(folder), cut="off",
                           tree=0)  # whole blocks, as a chain
    assert isinstance(drafter, DFlashDrafter)
    want = PUBLISHED_GLOBAL + [f"layers.{i}.{n}" for i in range(2) for n in PUBLISHED_LAYER]
    sd = drafter.model.state_dict()
    assert sorted(sd) == sorted(want)
    for k, v in weights.items():
        assert torch.equal(sd[k], v), k
    assert drafter.hidden_state_layers == [1, 2, 3] and drafter.block_size == 4
    ids = [5, 17, 33, 9, 60, 2]
    s = DecodeSettings(max_new_tokens=16)
    tr = Session(qwen3_target, drafter, ids, s).run()
    assert tr.output_ids == generate(qwen3_target, "ar", ids, s).output_ids
    r = tr.rounds[0]
    assert r.extras["block_size"] == 4 and len(r.extras["confidence"]) == len(r.draft) == 3
    json.dumps(r.extras)
    # the cached path equals a from-scratch recompute of the same block
    tokens = ids + tr.output_ids[:5]
    Session(qwen3_target, drafter, tokens, s)  # begin() refills the cache from the prefill
    assert torch.allclose(drafter.block_logits(tokens), reference_slot_logits(drafter, tokens),
                          atol=1e-4, rtol=1e-4)
    # save -> load round trip writes the same layout
    out = save_dflash_checkpoint(drafter.model, tmp_path / "saved")
    again = load_dflash_checkpoint(out)
    assert sorted(again.state_dict()) == sorted(want)
    saved_cfg = json.loads((out / "config.json").read_text())
    assert saved_cfg["architectures"] == ["DFlashDraftModel"] and saved_cfg["model_type"] == "qwen3"
    assert saved_cfg["dflash_config"] == cfg["dflash_config"] and saved_cfg["block_size"] == 4


def test_learned_mask_embedding_round_trip(tmp_path, tiny_target):
    m = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=3)
    assert m.learned_mask and "mask_embedding" in m.state_dict()
    folder = save_dflash_checkpoint(m, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["dflash_config"]["learned_mask_embedding"] is True
    d = make_drafter("dflash", tiny_target, checkpoint=str(folder), block_size=3)
    assert d.block_size == 3
    assert torch.equal(d.model.mask_embedding, m.mask_embedding)


def test_draft_vocabulary_round_trip_and_restriction(tmp_path, tiny_target):
    from safetensors.torch import load_file, save_file

    m = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=4)
    vocab = tiny_target.model.config.vocab_size
    dv = torch.arange(2, vocab, 3)
    m.draft_vocab = dv.clone()
    folder = save_dflash_checkpoint(m, tmp_path / "dv")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["dflash_config"]["draft_vocab_size"] == dv.numel()
    d = make_drafter("dflash", tiny_target, checkpoint=str(folder))
    assert torch.equal(d.model.draft_vocab, dv) and d.config()["draft_vocab_size"] == dv.numel()
    # restricted logits equal the full head on the draft vocabulary, -inf elsewhere
    h = torch.randn(3, m.hidden_size)
    head = tiny_target.model.get_output_embeddings()
    with torch.no_grad():
        full, got = head(h), d.model.slot_logits(h, head)
    assert torch.allclose(got[:, dv], full[:, dv], atol=1e-5)
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[dv] = False
    assert torch.isinf(got[:, outside]).all()
    # drafts only use draft-vocabulary words, and greedy output is still plain greedy
    rng = random.Random(5)
    allowed = set(dv.tolist())
    for _ in range(4):
        prompt = random_prompt(rng, vocab)
        ar = generate(tiny_target, "ar", prompt, DecodeSettings(max_new_tokens=20))
        tr = generate(tiny_target, "dflash", prompt, DecodeSettings(max_new_tokens=20),
                      checkpoint=str(folder))
        assert tr.output_ids == ar.output_ids
        assert all(t in allowed for r in tr.rounds for t in r.draft)
    # a corrupt draft vocabulary (unsorted / outside the vocab) is named
    for bad in (torch.tensor([5, 3]), torch.tensor([1, vocab + 7])):
        state = load_file(str(folder / "model.safetensors"))
        state["draft_vocab"] = bad
        bf = tmp_path / f"bad{int(bad[1])}"
        bf.mkdir()
        (bf / "config.json").write_text((folder / "config.json").read_text())
        save_file(state, str(bf / "model.safetensors"))
        with pytest.raises(ModelLoadError, match="draft_vocab"):
            make_drafter("dflash", tiny_target, checkpoint=str(bf))


def test_greedy_draft_scores_only_the_draft_vocabulary(tiny_target):
    """The greedy path's softmax over the draft-vocabulary columns gives the very draft,
    confidence and top-k that the softmax over the whole vocabulary (-inf elsewhere) gives."""
    from specviz.drafters.base import DraftContext

    m = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=7)
    m.draft_vocab = torch.arange(1, tiny_target.model.config.vocab_size, 2)
    d = make_drafter("dflash", tiny_target, model=m, cut="off", tree=0)
    rng = random.Random(3)
    for max_draft in (8, 2, 3):    # the whole block, and shorter budgets (head over k slots)
        ids = random_prompt(rng, tiny_target.model.config.vocab_size)
        with torch.inference_mode():
            out = tiny_target.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
        d.begin(tiny_target, ids, out.hidden_states)
        draft = d.propose(DraftContext(tokens=ids, prompt_len=len(ids), max_draft=max_draft,
                                            round_index=0))
        probs = torch.softmax(d.block_logits(ids), -1)[:min(max_draft, 4)]
        conf, top = probs.max(-1)
        tk_p, tk_i = probs.topk(4, -1)
        assert draft.tokens == top.tolist()
        assert draft.extras["confidence"] == pytest.approx(conf.tolist(), abs=1e-5)
        assert draft.extras["topk"] == tk_i.tolist()
        assert torch.allclose(torch.tensor(draft.extras["topk_p"]), tk_p, atol=2e-3)
        assert set(draft.tokens) <= set(m.draft_vocab.tolist())


# ----------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_lossless_and_cache_consistent(kind, tiny_target, qwen3_target):
    target = tiny_target if kind == "llama" else qwen3_target
    vocab = target.model.config.vocab_size
    rng = random.Random(11)
    for i in range(12):
        model = new_dflash_for_target(target, num_layers=rng.randint(1, 2),
                                      block_size=rng.choice([2, 4, 8]), seed=i,
                                      mask_token_id=None if i % 2 else vocab - 1)
        ids = random_prompt(rng, vocab)
        s = DecodeSettings(max_new_tokens=rng.randint(8, 24))
        drafter = DFlashDrafter(target, model=model, cut="off")
        sess = Session(target, drafter, ids, s)
        assert drafter.context_len == len(ids) - 1
        while sess.step() is not None:
            assert drafter.context_len == len(sess.tokens) - 1
        ar = generate(target, "ar", ids, s)
        rep = compare_outputs(target, ids, ar.output_ids, sess.trace().output_ids)
        assert rep.ok, f"{kind} prompt {i}: diverged at {rep.first_divergence}"
        if i < 3 and not sess.tokens[-1] in target.eos_token_ids:
            toks = list(sess.tokens)
            assert torch.allclose(drafter.block_logits(toks), reference_slot_logits(drafter, toks),
                                  atol=1e-4, rtol=1e-4)


def test_drafter_that_knows_the_answer_is_accepted(monkeypatch, tiny_target):
    """Force the drafter's slot logits to the target's greedy reply: long accepts, same
    output -- the accept path works end to end (tau > 1)."""
    target = tiny_target
    rng = random.Random(5)
    for i in range(4):
        ids = random_prompt(rng, 64, 3, 20)
        s = DecodeSettings(max_new_tokens=24)
        ar = generate(target, "ar", ids, s).output_ids
        truth = ids + ar + [0] * 16
        drafter = DFlashDrafter(target, model=new_dflash_for_target(target, block_size=6, seed=i),
                                cut="off", tree=0)

        def oracle(tokens, k, _d=drafter, _truth=truth):
            nxt = _truth[len(tokens):len(tokens) + _d.block_size - 1]
            logits = torch.full((_d.block_size - 1, 64), -10.0)
            logits[torch.arange(len(nxt)), torch.tensor(nxt)] = 10.0
            return logits[:k], None

        monkeypatch.setattr(drafter, "greedy_scores", oracle)
        sess = Session(target, drafter, ids, s)
        while sess.step() is not None:
            assert drafter.context_len == len(sess.tokens) - 1
        tr = sess.trace()
        assert tr.output_ids == ar and tr.tau > 1.0
        if len(ar) >= 12:
            assert tr.tau > 3.0, tr.tau
        assert all(r.accepted == len(r.draft) for r in tr.rounds[:-1])


# ----------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("mode", ["argmax_point_mass", "sampled_q"])
def test_sampling_keeps_target_distribution(mode):
    target, model = sampling_pair()
    temp = 1.0 if mode == "sampled_q" else 0.0
    used = {"accepted": 0}

    def on_trace(tr):
        used["accepted"] += sum(r.accepted for r in tr.rounds)

    def drafter_fn(seed):
        return DFlashDrafter(target, model=model, draft_temperature=temp, seed=seed, cut="off")

    counts, exact = first_two_token_counts(target, [3, 7, 5], drafter_fn, 3000,
                                           dict(temperature=0.9, top_p=0.95), on_trace=on_trace)
    assert_same_law(counts, exact, tv_tol=0.13)
    assert used["accepted"] > 100  # drafts were really accepted sometimes


# ----------------------------------------------------------------------------- bad input
def test_bad_checkpoints_fail_clearly(tmp_path, qwen3_target, tiny_target):
    cfg = published_config()
    w = published_weights(cfg)
    good = write_checkpoint(tmp_path / "good", cfg, w)

    with pytest.raises(SettingsError, match="checkpoint"):
        make_drafter("dflash", qwen3_target)
    with pytest.raises(ModelLoadError, match="hidden size 64 != target hidden size 32"):
        make_drafter("dflash", tiny_target, checkpoint=str(good))
    with pytest.raises(SettingsError, match="block size 4"):
        make_drafter("dflash", qwen3_target, checkpoint=str(good), block_size=16)

    bad = write_checkpoint(tmp_path / "mask", published_config(
        dflash_config={"mask_token_id": 151669, "target_layer_ids": [0, 1, 2]}), w)
    with pytest.raises(ModelLoadError, match="mask_token_id 151669"):
        make_drafter("dflash", qwen3_target, checkpoint=str(bad))
    bad = write_checkpoint(tmp_path / "vocab", published_config(vocab_size=151936), w)
    with pytest.raises(ModelLoadError, match="vocab size 151936"):
        make_drafter("dflash", qwen3_target, checkpoint=str(bad))
    bad = write_checkpoint(tmp_path / "layers", published_config(
        dflash_config={"mask_token_id": 127, "target_layer_ids": [1, 9, 33]}), w)
    with pytest.raises(ModelLoadError, match=r"target_layer_ids \[9, 33\]"):
        make_drafter("dflash", qwen3_target, checkpoint=str(bad))

    bad = write_checkpoint(tmp_path / "extra", cfg, {**w, "embed_tokens.weight": torch.zeros(128, 64)})
    with pytest.raises(ModelLoadError, match="unexpected weight keys: embed_tokens.weight"):
        make_drafter("dflash", qwen3_target, checkpoint=str(bad))
    w2 = dict(w)
    del w2["layers.1.mlp.up_proj.weight"]
    bad = write_checkpoint(tmp_path / "missing", cfg, w2)
    with pytest.raises(ModelLoadError, match="missing weight keys: layers.1.mlp.up_proj.weight"):
        make_drafter("dflash", qwen3_target, checkpoint=str(bad))
    w3 = {**w, "fc.weight": torch.zeros(64, 128)}
    bad = write_checkpoint(tmp_path / "shape", cfg, w3)
    with pytest.raises(ModelLoadError, match="fc.weight"):
        make_drafter("dflash", qwen3_target, checkpoint=str(bad))

    nocfg = tmp_path / "nocfg"
    nocfg.mkdir()
    (nocfg / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="config.json"):
        make_drafter("dflash", qwen3_target, checkpoint=str(nocfg))
    noweights = tmp_path / "noweights"
    noweights.mkdir()
    (noweights / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        make_drafter("dflash", qwen3_target, checkpoint=str(noweights))
    other = write_checkpoint(tmp_path / "other", {**cfg, "architectures": ["LlamaForCausalLM"]}, w)
    with pytest.raises(ModelLoadError, match="not a DFlash drafter"):
        make_drafter("dflash", qwen3_target, checkpoint=str(other))
    with pytest.raises(SpecvizError):  # not a folder, not cached, hub offline in tests
        make_drafter("dflash", qwen3_target, checkpoint="nobody/no-such-dflash")


# ----------------------------------------------------------------------------- embedded model
def test_bundled_drafter_only_for_its_target(tiny_target):
    from specviz.drafters.dflash.checkpoint import BUNDLED, BUNDLED_DIR, bundled_checkpoint

    folder = BUNDLED_DIR / BUNDLED["SmolLM2-135M-Instruct"]
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert (folder / "model.safetensors").stat().st_size < 30 * 2 ** 20
    assert bundled_checkpoint(tiny_target) is None
    with pytest.raises(SettingsError, match="checkpoint=PATH_OR_HUB_ID"):
        make_drafter("dflash", tiny_target)

    class Named:
        name = "SmolLM2-135M-Instruct (embedded)"
    assert bundled_checkpoint(Named()) == folder



def test_bundled_drafters_by_name():
    from specviz.drafters.dflash.checkpoint import BUNDLED_DIR, resolve_checkpoint

    names = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())
    assert "dflash-smollm2-135m-instruct" in names
    for n in names:
        assert resolve_checkpoint(n) == BUNDLED_DIR / n
        assert (BUNDLED_DIR / n / "model.safetensors").stat().st_size < 30 * 2 ** 20
    with pytest.raises(ModelLoadError, match="bundled drafter \\(.*dflash-smollm2-135m-instruct"):
        resolve_checkpoint("no-such-drafter")


@pytest.mark.integration
@pytest.mark.parametrize("per_category", real_prompt_sets(4))
def test_bundled_drafter_greedy_lossless_on_real_prompts(embedded_target, per_category):
    from conftest import lossless_on_examples

    # whole blocks (cut="off"): the drafter's own tau, whatever this machine's verify cost
    # (the default cost-aware cut verifies less on a busy machine; it is lossless-tested with
    # DSpark below and on the EDR drafter)
    runs = lossless_on_examples(embedded_target, "dflash", per_category, 1, start=1,
                                cut="off")
    for _, df, _ in runs:
        assert all(len(r.extras["confidence"]) == len(r.draft) for r in df.rounds)
    tokens = sum(len(df.output_ids) for _, df, _ in runs)
    rounds = sum(df.num_rounds for _, df, _ in runs)
    assert tokens / rounds > 1.2, f"the bundled drafter's tau is only {tokens / rounds:.2f}"


@pytest.mark.integration
@pytest.mark.slow   # ~1.5 min; the default cut on real prompts runs with trees (test_block_tree)
def test_bundled_drafter_with_the_cost_aware_cut_is_lossless_on_real_prompts(embedded_target):
    """The default cut (verify only the prefix of the block that pays on this machine) never
    changes the output: greedy lossless on 20 prompts, every round drafting what the cut kept."""
    from conftest import lossless_on_examples

    runs = lossless_on_examples(embedded_target, "dflash", 4, 1)  # cut="auto", 5 x 4 prompts
    cut_rounds = [r for _, df, _ in runs for r in df.rounds if r.extras.get("cut")]
    assert cut_rounds, "no round recorded its cut"
    for r in cut_rounds:
        c = r.extras["cut"]
        # the budget may clip; a chain keeps at most the block's slots, a tree (the default) at
        # most its node budget over at most the block's slots
        assert r.accepted <= len(r.draft) <= c["kept"] <= (16 if c.get("tree") else c["block"])
        assert not r.draft or max(r.tree.depths) <= c["block"]


@pytest.mark.integration
def test_bundled_edr_t1_drafter_by_name_on_real_prompts(embedded_target):
    """The EDR-fine-tuned (sampled, T = 1) DFlash drafter, selected by its bundled name:
    greedy output identical to AR, and a sampled run drafts with the drafter's own q."""
    from conftest import example_prompts, greedy_lossless_runs

    name = "dflash-edr-t1-smollm2-135m-instruct"
    runs = greedy_lossless_runs(embedded_target, "dflash", example_prompts(1), 32,
                                checkpoint=name)
    assert all(rep.identical for _, _, rep in runs)
    d = make_drafter("dflash", embedded_target, checkpoint=name, draft_temperature=1.0,
                     cut="off")   # whole blocks: the forward gate may pause it in 24 tokens
    ids = embedded_target.encode_prompt("Natalia sold clips to 48 friends. How many?")
    tr = Session(embedded_target, d, ids, DecodeSettings(max_new_tokens=24, temperature=1.0,
                                                         seed=1)).run()
    assert tr.output_ids and any(r.draft for r in tr.rounds)
