"""The code-editing dev set built from MBPP: deterministic, every prompt carries the code
and an instruction, every kind appears, renames name real identifiers, slices are disjoint."""
import ast
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from specviz.bench import PromptItem, load_prompts
from specviz.editset import (CATEGORY, KINDS, build_edit_set, load_edit_prompts, load_edit_spec,
                             main, make_edit, parse_edit_spec)
from specviz.editset_code import (clean_code, has_one_liner, identifiers, indent_unit,
                                  local_names, main_function)
from specviz.errors import SpecvizError

MBPP = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mbpp.jsonl"
pytestmark = pytest.mark.skipif(not MBPP.exists(), reason="../shared/data/mbpp.jsonl not present")

CODE = "def f(xs, n):\n\ttotal = 0\n\tfor x in xs: total += x * n\n\treturn total"


@pytest.fixture(scope="module")
def edit_set():
    return build_edit_set(MBPP, limit=60, seed=0)


def test_deterministic_for_a_seed_and_different_for_another():
    a = [(i.id, i.text) for i in load_edit_prompts(MBPP, limit=30, seed=3)]
    b = [(i.id, i.text) for i in load_edit_prompts(MBPP, limit=30, seed=3)]
    c = [(i.id, i.text) for i in load_edit_prompts(MBPP, limit=30, seed=4)]
    assert a == b
    assert a != c


def test_every_prompt_has_the_code_and_an_instruction(edit_set):
    for ep in edit_set:
        item = ep.item
        assert isinstance(item, PromptItem) and item.category == CATEGORY == "code_edit"
        assert item.source == "mbpp.jsonl"
        assert ep.code in item.text
        assert ep.edit.instruction in item.text
        assert len(item.text) > len(ep.code) + 20
        assert "\r" not in item.text
        ast.parse(ep.code)
    assert len({ep.item.id for ep in edit_set}) == len(edit_set)


def test_all_kinds_represented_even_in_a_small_slice(edit_set):
    counts = Counter(ep.edit.kind for ep in edit_set)
    assert set(counts) == set(KINDS)
    assert min(counts.values()) >= 6  # roughly balanced over 60 rows
    assert {ep.edit.kind for ep in build_edit_set(MBPP, limit=8, seed=1, start=200)} == set(KINDS)


def test_wording_and_layout_vary(edit_set):
    for kind in KINDS:
        texts = [ep.edit.instruction for ep in edit_set if ep.edit.kind == kind]
        firsts = {t.split()[0] for t in texts}
        assert len(set(texts)) > 1 and (len(firsts) > 1 or kind == "reformat"), (kind, texts)
    starts = {ep.item.text[:8] for ep in edit_set}
    assert len(starts) > 5
    assert sum("```" in ep.item.text for ep in edit_set) not in (0, len(edit_set))


def test_renames_name_a_real_identifier_and_a_fresh_one(edit_set):
    renames = [ep for ep in edit_set if ep.edit.kind.startswith("rename")]
    assert len(renames) >= 15
    for ep in renames:
        old, new = ep.edit.detail["old"], ep.edit.detail["new"]
        tree = ast.parse(ep.code)
        names = identifiers(tree)
        assert old in names and new not in names and new.isidentifier() and new != old
        assert old in ep.edit.instruction and new in ep.edit.instruction
        if ep.edit.kind == "rename_function":
            assert old in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        else:
            fn = main_function(tree)
            fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
            assert any(old in sum(local_names(f), []) for f in fns), (old, fn.name)


def test_reformat_asks_for_what_the_code_needs(edit_set):
    for ep in (e for e in edit_set if e.edit.kind == "reformat"):
        style = ep.edit.detail["style"]
        unit = indent_unit(ep.code)
        assert style != "tabs" or unit == "tabs"
        assert style != "to2" or unit == "4"
        assert style != "expand" or has_one_liner(ast.parse(ep.code))


def test_code_analysis_helpers():
    assert clean_code("def f():\r\n  return 1 \r\n\r\n") == "def f():\n  return 1"
    tree = ast.parse(CODE)
    assert indent_unit(CODE) == "tabs" and has_one_liner(tree)
    assert indent_unit("def f():\n  return 1") == "2" and not has_one_liner(ast.parse("x = 1"))
    assert local_names(main_function(tree)) == (["xs", "n"], ["total", "x"])
    assert main_function(ast.parse("def a(): pass\ndef b(): pass"), "assert a() == 1").name == "a"
    edit = make_edit(CODE, "rename_variable", random.Random(0))
    assert edit.detail["old"] in {"xs", "n", "total", "x"}
    assert make_edit("x = 1", "rename_function", random.Random(0)) is None  # no function
    assert make_edit("def f(:", "reformat", random.Random(0)) is None       # no valid code


def test_a_function_sharing_its_name_with_a_variable_is_not_renamed():
    code = "def sq(nums):\n  sq = [x * x for x in nums]\n  return sq"
    assert make_edit(code, "rename_function", random.Random(0)) is None


def test_start_and_limit_pick_disjoint_slices_and_a_row_does_not_depend_on_its_slice():
    dev = build_edit_set(MBPP, limit=20, seed=0, start=0)
    held = build_edit_set(MBPP, limit=20, seed=0, start=500)
    assert not {e.task_id for e in dev} & {e.task_id for e in held}
    assert [e.task_id for e in held][:3] == [501, 502, 503]  # MBPP task ids start at 1
    one = build_edit_set(MBPP, limit=1, seed=0, start=7)[0]
    assert one.item == dev[7].item


def test_spec_parsing_and_the_bench_hook():
    assert parse_edit_spec("edit:../shared/data/mbpp.jsonl") == ("../shared/data/mbpp.jsonl",
                                                                 None, 0)
    assert parse_edit_spec("edit:a/b.jsonl:30") == ("a/b.jsonl", 30, 0)
    assert parse_edit_spec("edit:a/b.jsonl:30:500") == ("a/b.jsonl", 30, 500)
    with pytest.raises(SpecvizError):
        parse_edit_spec("../shared/data/mbpp.jsonl:30")
    with pytest.raises(SpecvizError):
        parse_edit_spec("edit::30")
    items = load_edit_spec(f"edit:{MBPP}:5:100")
    assert len(items) == 5 and items[0].id.startswith("edit-101-")
    # the rollout loader takes the same spec (a history store counted from editing replies)
    from specviz.train.rollouts import load_items
    mixed = load_items([f"edit:{MBPP}:5:100", f"{MBPP}:2"])
    assert [it.id for it in mixed[:5]] == [it.id for it in items] and len(mixed) == 7


def test_bad_input_raises_a_specviz_error(tmp_path):
    with pytest.raises(SpecvizError):
        load_edit_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(SpecvizError):
        load_edit_prompts(MBPP, limit=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(SpecvizError):
        load_edit_prompts(bad)


def test_cli_writes_jsonl_the_bench_loader_reads(tmp_path, capsys):
    assert main([str(MBPP), "--limit", "6", "--start", "30"]) == 0
    out = tmp_path / "edit.jsonl"
    out.write_text(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and {r["kind"] for r in rows} == set(KINDS)
    items = load_prompts(out)
    assert [i.category for i in items] == [CATEGORY] * 6
    assert [i.text for i in items] == [i.text for i in load_edit_prompts(MBPP, 6, start=30)]
    assert main([str(tmp_path / "missing.jsonl")]) == 2
