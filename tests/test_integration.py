"""Integration on the embedded SmolLM2-135M-Instruct: PLD is lossless on real prompts."""
import pytest

from specviz.analysis.stats import compare_outputs
from specviz.engine import DecodeSettings, generate

from conftest import example_prompts

pytestmark = pytest.mark.integration


def test_pld_greedy_lossless_on_real_prompts(embedded_target):
    prompts = example_prompts(5)  # 5 categories x 5 = 25 real prompts
    assert len(prompts) >= 20
    settings = DecodeSettings(max_new_tokens=40)
    identical = near_ties = accepted = 0
    for row in prompts:
        ar = generate(embedded_target, "ar", row["prompt"], settings)
        pld = generate(embedded_target, "pld", row["prompt"], settings)
        rep = compare_outputs(embedded_target, pld.prompt_ids, ar.output_ids, pld.output_ids)
        assert rep.ok, (f"{row['id']}: PLD diverged from greedy at token {rep.first_divergence} "
                        f"(top-2 gap {rep.top2_gap})")
        identical += rep.identical
        near_ties += rep.near_tie
        accepted += sum(r.accepted for r in pld.rounds)
        assert pld.target_forwards <= ar.target_forwards
    assert identical >= len(prompts) - 2, f"only {identical}/{len(prompts)} identical"
    assert accepted > 100  # PLD drafts really were accepted on these prompts


def test_sampling_run_is_reproducible_from_seed(embedded_target):
    s = DecodeSettings(max_new_tokens=24, temperature=0.8, top_p=0.9, seed=7)
    a = generate(embedded_target, "pld", "Write a haiku about the sea.", s)
    b = generate(embedded_target, "pld", "Write a haiku about the sea.", s)
    assert a.output_ids == b.output_ids and a.tau >= 1.0
