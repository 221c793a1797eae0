"""Integration on the embedded SmolLM2-135M-Instruct: PLD is lossless on real prompts."""
import pytest

from specviz.engine import DecodeSettings
from specviz.run import generate

from conftest import lossless_on_examples, real_prompt_sets

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("per_category", real_prompt_sets(5))
def test_pld_greedy_lossless_on_real_prompts(embedded_target, per_category):
    runs = lossless_on_examples(embedded_target, "pld", per_category, 2)
    assert all(pld.target_forwards <= ar.target_forwards for ar, pld, _ in runs)
    accepted = sum(r.accepted for _, pld, _ in runs for r in pld.rounds)
    assert accepted > 10 * len(runs)  # PLD drafts really were accepted on these prompts


def test_sampling_run_is_reproducible_from_seed(embedded_target):
    s = DecodeSettings(max_new_tokens=24, temperature=0.8, top_p=0.9, seed=7)
    a = generate(embedded_target, "pld", "Write a haiku about the sea.", s)
    b = generate(embedded_target, "pld", "Write a haiku about the sea.", s)
    assert a.output_ids == b.output_ids and a.tau >= 1.0
