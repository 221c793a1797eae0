"""The forward gate's state probe (specviz.drafters.dflash.state_probe, specviz.train.gate_probe):
a ridge read-out of the target's tapped state that predicts the drafter's accepted length."""
from __future__ import annotations

import random

import pytest
import torch

from specviz.analysis.lossless import compare_outputs
from specviz.costs import CostModel
from specviz.drafters.dflash.checkpoint import new_dflash_for_target
from specviz.drafters.dflash.drafter import DFlashDrafter
from specviz.drafters.dflash.state_probe import (PROBE_NAME, StateProbe, checkpoint_sha256,
                                                 fit_state_probe, load_state_probe,
                                                 save_state_probe, skips)
from specviz.engine import DecodeSettings, Session
from specviz.models import ModelLoadError
from specviz.run import generate

from conftest import counted_lossless_run, make_tiny_rollouts, repetitive_prompt


def _linear_data(n=600, f=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g) * torch.linspace(0.5, 3.0, f) + 4.0
    y = 0.8 * (x[:, 0] - 4.0) / 0.5 - 0.3 * (x[:, 3] - 4.0) + 1.0 + 0.05 * torch.randn(n, generator=g)
    return x, y


def test_ridge_fit_recovers_a_linear_rule_and_round_trips(tmp_path):
    x, y = _linear_data()
    probe = fit_state_probe(x[:500], y[:500], layers=[0, 1], alpha=1.0, drafter_sha256="")
    pred = probe.predict(x[500:])
    assert torch.corrcoef(torch.stack([pred, y[500:]]))[0, 1] > 0.98
    assert abs(float(pred.mean() - y[500:].mean())) < 0.1
    probe.report = {"alpha": 1.0}
    save_state_probe(probe, tmp_path)
    back = load_state_probe(tmp_path, [0, 1], 12)
    assert torch.equal(back.predict(x), probe.predict(x)) and back.report == {"alpha": 1.0}
    assert load_state_probe(tmp_path / "nowhere", [0, 1], 12) is None   # no probe: none used


def test_a_probe_of_another_drafter_is_refused_with_one_clear_error(tmp_path):
    x, y = _linear_data(f=6)
    (tmp_path / "model.safetensors").write_bytes(b"weights v1")
    probe = fit_state_probe(x, y, [0, 1], drafter_sha256=checkpoint_sha256(tmp_path))
    save_state_probe(probe, tmp_path)
    assert load_state_probe(tmp_path, [0, 1], 6) is not None
    with pytest.raises(ModelLoadError, match="target layers"):
        load_state_probe(tmp_path, [1, 2], 6)
    with pytest.raises(ModelLoadError, match="features"):
        load_state_probe(tmp_path, [0, 1], 8)
    (tmp_path / "model.safetensors").write_bytes(b"weights v2, retrained")
    with pytest.raises(ModelLoadError, match="other drafter weights"):
        load_state_probe(tmp_path, [0, 1], 6)
    (tmp_path / PROBE_NAME).write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot be read"):
        load_state_probe(tmp_path, [0, 1], 6)


def test_skip_rule_is_the_forward_plus_the_smallest_verify():
    probe = StateProbe(torch.zeros(3), 0.4, torch.zeros(3), torch.ones(3), [0])
    skip, y_hat, thr = skips(probe, torch.ones(3), c2=1.2, draft_cost=0.25)
    assert skip and y_hat == pytest.approx(0.4) and thr == pytest.approx(0.45)
    assert not skips(probe, torch.ones(3), c2=1.05, draft_cost=0.1)[0]   # a flatter machine


def _constant_probe(drafter, value):
    f = len(drafter.hidden_state_layers) * int(drafter.model.hidden_size)
    return StateProbe(torch.zeros(f), float(value), torch.zeros(f), torch.ones(f),
                      list(drafter.model.target_layer_ids))


@pytest.mark.parametrize("value", [-5.0, 50.0])
def test_dflash_with_a_probe_skips_forwards_and_stays_lossless(tiny_target, monkeypatch, value):
    """A probe predicting nothing skips every forward (all plain steps, counted); one predicting
    a lot never skips, so the run equals the run without a probe round for round."""
    import specviz.drafters.dflash.drafter as dflash_mod
    # a long step: the drafter's measured forward is ~0 steps, so every choice is timing-free
    flat = CostModel.from_points([(1, 1.0), (2, 1.05), (4, 1.1), (8, 1.2)], 100.0)
    monkeypatch.setattr(dflash_mod, "cost_curve", lambda *a, **k: flat)
    ids = repetitive_prompt(random.Random(3), 64, 30)
    s = DecodeSettings(max_new_tokens=32)
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=6, seed=2)
    plain = Session(tiny_target, DFlashDrafter(tiny_target, model=model, cut="auto"), ids, s).run()
    drafter = DFlashDrafter(tiny_target, model=model, cut="auto")
    drafter.state_probe = _constant_probe(drafter, value)
    tr, forwards = counted_lossless_run(monkeypatch, tiny_target, drafter, ids, s)
    judged = [r for r in tr.rounds if "state_probe" in r.extras]   # asked before each forward
    verdicts = [r.extras["state_probe"] for r in judged]
    if value < 0:   # never a forward, so the gate never pauses: every round is judged
        assert len(judged) >= len(tr.rounds) - 2   # (the last rounds: no budget left)
        assert not forwards and all(v["skip"] and not r.draft for v, r in zip(verdicts, judged))
        assert all(r.extras["cut"]["paused"] for r in judged)
        from specviz.viz.charts import gate_rounds            # the decode page says why
        from specviz.viz.extras import describe_extras
        assert set(gate_rounds(tr)["kind"]) == {"skipped (state probe)"}
        assert "state probe" in describe_extras(judged[0])
    else:           # judged exactly where the gate wanted a forward, never skipped
        assert judged and not any(v["skip"] for v in verdicts) and len(judged) == forwards
        assert [r.draft for r in tr.rounds] == [r.draft for r in plain.rounds]
        assert forwards == sum(1 for r in plain.rounds
                                 if r.extras.get("cut") and not r.extras["cut"].get("paused"))


def test_the_probe_reads_the_position_before_the_anchor(tiny_target, monkeypatch):
    """Live, the probe sees the tapped features of position len(tokens) - 2 -- the rows the
    rollouts store at p - 2 + n, which the probe is fitted on."""
    ids = repetitive_prompt(random.Random(5), 64, 20)
    s = DecodeSettings(max_new_tokens=20)
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=1)
    drafter = DFlashDrafter(tiny_target, model=model, cut="auto")
    drafter.state_probe = _constant_probe(drafter, 50.0)
    seen = []
    real = drafter.propose
    monkeypatch.setattr(drafter, "propose",
                        lambda ctx: seen.append((len(ctx.tokens), drafter._probe_x.clone()))
                        or real(ctx))
    tr = Session(tiny_target, drafter, ids, s).run()
    full = torch.tensor([list(ids) + list(tr.output_ids)])
    with torch.no_grad():
        out = tiny_target.model(full, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in drafter.hidden_state_layers], -1)[0]
    assert len(seen) == len(tr.rounds)
    for n, x in seen:
        assert torch.allclose(x, feats[n - 2].float(), atol=1e-4)


def test_probe_labels_are_the_live_drafters_accepted_length(tiny_target, tmp_path):
    """The label of state 0 equals what the live drafter (whole block, chain) accepted in its
    first round on the same prompt."""
    from specviz.train.gate_probe import fit_gate_probe, probe_examples
    from specviz.train.rollout_store import RolloutSet

    folder = make_tiny_rollouts(tiny_target, tmp_path / "ro", n=6, max_new_tokens=16)
    rs = RolloutSet(folder)
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=4,
                                  target_layer_ids=[0, 1])
    for i in range(len(rs)):
        x, y = probe_examples(model, tiny_target, rs, [i], progress=False)
        tokens, hidden, p = rs.load(i)
        assert x.shape == (len(tokens) - p, hidden.shape[1]) and torch.equal(x[0], hidden[p - 2].float())
        live = DFlashDrafter(tiny_target, model=model, cut="off", tree=0)
        tr = Session(tiny_target, live, tokens[:p].tolist(),
                     DecodeSettings(max_new_tokens=len(tokens) - p)).run()
        assert int(y[0]) == tr.rounds[0].accepted
    probe = fit_gate_probe(model, tiny_target, [rs], holdout=0.34, alphas=(1.0, 10.0),
                           progress=False)
    assert probe.report["held_out"]["states"] > 0 and probe.report["alpha"] in (1.0, 10.0)


def test_cli_gate_probe_bad_input_is_one_clear_line(tmp_path, capsys):
    from specviz.cli import main

    for argv in (["--rollouts", str(tmp_path / "missing")],
                 ["--rollouts", str(tmp_path), "--holdout", "1.5"]):
        assert main(["train", "gate-probe", *argv]) != 0
        err = capsys.readouterr().err
        assert err.startswith("error:") and "Traceback" not in err


def test_measured_gate_cost_charges_the_rounds_own_times(tiny_target, monkeypatch):
    """gate_cost="measured": the gate is told (t_draft + t_forward) / step of each drafted
    round; "model" leaves it to the curve (measured is the default). Lossless either way."""
    from specviz.drafters.dflash.block_cut import BlockCut

    ids = repetitive_prompt(random.Random(9), 64, 30)
    s = DecodeSettings(max_new_tokens=24)
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=5, seed=6)
    ar = generate(tiny_target, "ar", ids, s)
    real = BlockCut.observe
    for mode in ("model", "measured"):
        told = []

        def spy(self, *a, **k):
            told.append((k.get("gate_cost"), self.cost.step_time))
            return real(self, *a, **k)
        monkeypatch.setattr(BlockCut, "observe", spy)
        drafter = DFlashDrafter(tiny_target, model=model, cut="auto", gate_cost=mode)
        tr = Session(tiny_target, drafter, ids, s).run()
        assert compare_outputs(tiny_target, ids, ar.output_ids, tr.output_ids).ok
        drafted = [r for r in tr.rounds
                   if r.extras.get("cut") and not r.extras["cut"].get("paused")]
        assert drafted and len(told) == len(drafted)
        if mode == "model":
            assert all(c is None for c, _ in told)
        else:
            for (c, step), r in zip(told, drafted):
                assert c == pytest.approx((r.t_draft + r.t_forward) / step)


def test_the_bundled_probe_belongs_to_the_bundled_drafter():
    """Fitted by `train gate-probe` for the bundled weights (SHA-256 checked); the checkpoint
    loader does not take it for drafter weights."""
    from specviz.drafters.dflash.checkpoint import BUNDLED, BUNDLED_DIR, load_dflash_checkpoint

    folder = BUNDLED_DIR / BUNDLED["SmolLM2-135M-Instruct"]
    model = load_dflash_checkpoint(folder)
    layers = list(model.target_layer_ids)
    probe = load_state_probe(folder, layers, len(layers) * int(model.hidden_size))
    assert probe is not None and probe.drafter_sha256 == checkpoint_sha256(folder)
    assert probe.report["held_out"]["pearson_r"] > 0.3 and probe.report["fit_states"] > 10000
