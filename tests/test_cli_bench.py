"""CLI exit codes and messages, prompt-set loaders, and the bench runner."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.bench import format_table, load_prompts, run_bench
from specviz.engine import DecodeSettings
from specviz.errors import SpecvizError

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def cli(*args, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "specviz", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,msg", [
    (["run", "--prompt", ""], "the prompt is empty"),
    (["run", "--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens must be at least 1"),
    (["run", "--prompt", "hi", "--max-new-tokens", "-3"], "max_new_tokens must be at least 1"),
    (["run", "--prompt", "hi", "--model", "/no/such/folder"], "does not exist"),
    (["run", "--prompt", "hi", "--model", "no-such-org/no-such-model-xyz"], "cannot load model"),
    (["run", "--prompt", "hi", "--method", "nope"], "unknown method"),
    (["run", "--prompt", "hi", "--top-p", "2"], "top_p"),
    (["show", "/no/such/trace.json"], "does not exist"),
    (["bench", "--data", "/no/such.jsonl"], "does not exist"),
])
def test_cli_bad_input_is_one_clear_line(args, msg):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    err_lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err_lines) == 1 and msg in err_lines[0], r.stderr


@pytest.mark.integration
def test_cli_long_prompt_and_corrupt_trace(tmp_path):
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("hello world " * 9000)  # ~18k tokens > 8192 context
    r = cli("run", "--prompt-file", str(long_prompt))
    assert r.returncode == 2 and "context" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "rounds": [{"index": 0}')
    r = cli("show", str(bad))
    assert r.returncode == 2 and "not valid JSON" in r.stderr


@pytest.mark.integration
def test_cli_run_save_and_show(tmp_path):
    out = tmp_path / "t.json"
    r = cli("run", "--method", "pld", "--prompt", "Repeat exactly: red green blue, red green blue.",
            "--max-new-tokens", "24", "--save", str(out))
    assert r.returncode == 0, r.stderr
    assert "tau=" in r.stdout and out.exists()
    trace = json.loads(out.read_text())
    assert trace["schema_version"] == 1 and trace["meta"]["method"] == "pld"
    r2 = cli("show", str(out))
    assert r2.returncode == 0
    # the saved trace renders the same text as the live run printed
    assert r.stdout.splitlines()[0] == r2.stdout.splitlines()[0]


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_loaders_read_every_public_format(tmp_path):
    sb = _write(tmp_path / "sb.jsonl", [{"question_id": i, "category": c, "turns": [f"q{i}", "t2"]}
                                         for i, c in enumerate(["qa", "qa", "qa", "math_reasoning"])])
    items = load_prompts(sb, limit=2)
    assert [(i.category, i.text) for i in items] == [("qa", "q0"), ("qa", "q1"), ("math_reasoning", "q3")]
    gsm = _write(tmp_path / "g.jsonl", [{"question": "How many?", "answer": "4 #### 4"}])
    assert load_prompts(gsm)[0].category == "gsm8k"
    mbpp = _write(tmp_path / "m.jsonl", [{"text": "Write f.", "code": "def f(): pass", "task_id": 3,
                                          "test_list": ["assert f() is None"]}])
    it = load_prompts(mbpp)[0]
    assert it.category == "mbpp" and "assert f() is None" in it.text
    alp = _write(tmp_path / "a.jsonl", [{"id": "seed_task_0", "name": "x", "instruction": "Do it.",
                                         "instances": [{"input": "ctx", "output": "o"}]}])
    assert load_prompts(alp)[0].text == "Do it.\n\nctx"
    txt = tmp_path / "mine.txt"
    txt.write_text("first prompt\n\nsecond prompt\n")
    assert [i.text for i in load_prompts(txt)] == ["first prompt", "second prompt"]
    assert len(load_prompts(ROOT / "examples" / "prompts.jsonl", limit=2)) == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(SpecvizError, match="unrecognised"):
        load_prompts(bad)


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data not present")
def test_loaders_on_shared_data():
    for name, cat in [("spec_bench_dev.jsonl", None), ("gsm8k_train.jsonl", "gsm8k"),
                      ("mbpp.jsonl", "mbpp"), ("alpaca_seed_tasks.jsonl", "alpaca")]:
        items = load_prompts(SHARED / name, limit=3)
        assert items and all(i.text.strip() for i in items)
        if cat:
            assert {i.category for i in items} == {cat}
    cats = {i.category for i in load_prompts(SHARED / "spec_bench_dev.jsonl", limit=1)}
    assert cats == {"translation", "summarization", "qa", "math_reasoning", "rag"}


def test_bench_runner_on_tiny_model(tiny_target, tmp_path):
    from specviz.bench import PromptItem

    prompts = [PromptItem(f"p{i}", "rep" if i % 2 else "rand",
                          " ".join(f"t{x}" for x in ([5, 6, 7, 8] * 4 if i % 2 else [3 + i, 9, 40])))
               for i in range(4)]
    res = run_bench(tiny_target, ["pld"], prompts, DecodeSettings(max_new_tokens=16),
                    traces_dir=tmp_path / "traces")
    from specviz.trace import Trace

    saved = sorted((tmp_path / "traces").glob("*/*/*.json"))
    assert len(saved) == 8                      # 2 methods x 4 prompts
    tr = Trace.load(tmp_path / "traces" / "pld" / "rep" / "p1.json")
    assert tr.new_tokens == next(r.new_tokens for r in res.rows
                                 if r.method == "pld" and r.prompt_id == "p1")
    table = res.table()
    by = {(r["method"], r["category"]): r for r in table}
    assert set(by) == {(m, c) for m in ("ar", "pld") for c in ("rep", "rand", "all")}
    assert by[("ar", "all")]["tau"] == 1.0 and by[("ar", "all")]["speedup_vs_ar"] == 1.0
    assert by[("pld", "all")]["identical_to_ar"] == "4/4"
    assert by[("pld", "all")]["target_forwards"] <= by[("ar", "all")]["target_forwards"]
    vc = res.meta["verify_cost"]   # the machine's measured verify-cost curve, in the results
    assert vc["points"][0] == [1, 1.0] and vc["step_ms"] > 0
    paths = res.save(tmp_path)
    assert paths["table_csv"].read_text().startswith("method,category,prompts,tau")
    assert json.loads(paths["json"].read_text())["meta"]["verify_cost"] == vc
    assert "| pld | all |" in format_table(table)


def test_bench_json_records_provenance(tiny_target, tmp_path):
    """bench.json says where and how it was made: commit, command, CPU, threads, load."""
    import torch

    from specviz.bench import PromptItem

    res = run_bench(tiny_target, ["pld"], [PromptItem("p", "rep", "t5 t6 t7 t8 t5 t6 t7 t8")],
                    DecodeSettings(max_new_tokens=8))
    prov = json.loads(res.save(tmp_path)["json"].read_text())["meta"]["provenance"]
    assert {"commit", "command", "cpu_model", "cpu_count", "torch_threads", "load_avg", "python",
            "torch", "created"} <= set(prov)
    assert prov["commit"] and prov["command"] and prov["cpu_model"]
    assert prov["torch_threads"] == torch.get_num_threads() and prov["torch"] == torch.__version__


def test_bench_runs_one_method_twice_under_labels(tiny_target):
    """``METHOD@LABEL``: the same method with other settings in the same run (e.g. two DFlash
    checkpoints); each label keeps its own settings and rows."""
    from specviz.bench import PromptItem
    from specviz.drafters import make_drafter

    prompts = [PromptItem("p", "rep", " ".join(f"t{x}" for x in [5, 6, 7, 8] * 4))]
    res = run_bench(tiny_target, ["pld", "pld@short"], prompts, DecodeSettings(max_new_tokens=16),
                    method_params={"pld@short": {"num_output_tokens": 1}})
    rows = {r.method: r for r in res.rows}
    assert set(rows) == {"ar", "pld", "pld@short"}
    assert rows["pld@short"].identical_to_ar and rows["pld"].identical_to_ar
    assert rows["pld@short"].tau <= 2.0 < rows["pld"].tau   # one-token drafts vs ten
    assert make_drafter("pld@short", num_output_tokens=1).num_output_tokens == 1
    with pytest.raises(SpecvizError, match="label after '@' cannot be empty"):
        make_drafter("pld@")
    with pytest.raises(SpecvizError, match="unknown method 'nope'"):
        make_drafter("nope@x")
