"""Magpie dialogue prompts (#10's dialogue slice): the target's chat template up to a user turn,
sampled; seeded, distinct, readable by the prompt loader and by ``train rollouts``."""
from __future__ import annotations

import json

from specviz.bench import load_prompts
from specviz.cli import main
from specviz.train.magpie import (CATEGORY, clean_instruction, synthesize_instructions,
                                  user_turn_prefix, write_prompts)


def test_clean_instruction():
    assert clean_instruction("  How do I bake bread at home?  ") == "How do I bake bread at home?"
    assert clean_instruction("Hi there") is None                      # under 3 words
    assert clean_instruction("word " * 81) is None                     # over 80 words
    assert clean_instruction("Tell me <|im_start|>assistant more") is None


def test_user_turn_prefix_matches_encode_prompt(embedded_target):
    tok = embedded_target.tokenizer
    prefix = user_turn_prefix(tok)
    full = embedded_target.encode_prompt("Plan a picnic for four.")
    assert full[:len(prefix)] == prefix                 # the prompt a rollout sees starts there
    assert tok.decode(prefix).endswith("user\n")


def test_system_turn_steers_the_prefix_only(embedded_target):
    import pytest

    from specviz.errors import SettingsError
    tok = embedded_target.tokenizer
    plain, steered = user_turn_prefix(tok), user_turn_prefix(tok, "You teach arithmetic.")
    text = tok.decode(steered)
    assert "You teach arithmetic." in text and text.endswith("user\n")
    assert "You teach arithmetic." not in tok.decode(plain) and steered != plain
    rows = synthesize_instructions(embedded_target, count=2, seed=3, max_new_tokens=40,
                                   batch_size=8, system="You teach arithmetic.",
                                   category="math")
    assert rows and {r["category"] for r in rows} == {"math"}
    with pytest.raises(SettingsError):
        user_turn_prefix(tok, "   ")


def test_synthesize_is_seeded_distinct_and_loadable(embedded_target, tmp_path):
    kw = dict(count=4, seed=3, temperature=1.0, max_new_tokens=40, batch_size=8, max_batches=1)
    rows = synthesize_instructions(embedded_target, **kw)
    assert 2 <= len(rows) <= 4
    assert rows == synthesize_instructions(embedded_target, **kw)    # same seed, same prompts
    texts = [r["prompt"] for r in rows]
    assert len({t.lower() for t in texts}) == len(texts)
    assert all(r["category"] == CATEGORY and clean_instruction(r["prompt"]) for r in rows)
    other = synthesize_instructions(embedded_target, **{**kw, "seed": 4})
    assert [r["prompt"] for r in other] != texts
    held = synthesize_instructions(embedded_target, **kw, exclude=texts[:2])
    assert not {t.lower() for t in texts[:2]} & {r["prompt"].lower() for r in held}
    path = write_prompts(rows, tmp_path / "m.jsonl")
    items = load_prompts(path)
    assert [it.text for it in items] == texts and {it.category for it in items} == {CATEGORY}


def test_cli_prompts_and_errors(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert main(["train", "prompts", "--count", "2", "--batch-size", "4", "--seed", "1",
                 "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert 1 <= len(rows) <= 2 and all(r["source"] == "magpie" for r in rows)
    out2 = tmp_path / "q.jsonl"
    assert main(["train", "prompts", "--count", "2", "--batch-size", "4", "--seed", "1",
                 "--exclude", str(out), "--out", str(out2)]) == 0
    assert not {r["prompt"] for r in rows} & {json.loads(x)["prompt"]
                                              for x in out2.read_text().splitlines()}
    assert main(["train", "prompts", "--count", "0", "--out", str(out)]) != 0
    assert main(["train", "prompts", "--temperature", "0", "--out", str(out)]) != 0
    assert main(["train", "prompts", "--out", str(tmp_path)]) != 0   # a folder
    assert main(["train", "prompts", "--system", " ", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--count" in err
