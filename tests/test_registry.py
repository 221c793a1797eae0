"""The method registry: one entry per method feeds make_drafter, the CLI's
--method/--param, the bench's fail-fast check, the app sidebar and the README's methods table."""
from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz import appstate
from specviz.bench import check_methods
from specviz.cli import parse_params
from specviz.drafters import METHODS, make_drafter, method_spec, methods_of, register
from specviz.drafters.adapld.drafter import AdaPLDDrafter
from specviz.drafters.base import Draft
from specviz.drafters.base import Drafter
from specviz.drafters.dflash.checkpoint import new_dflash_for_target, save_dflash_checkpoint
from specviz.drafters.docs import methods_markdown, methods_text, readme_section, with_section
from specviz.drafters.registry import ParamSpec
from specviz.drafters.registry import MethodSpec
from specviz.drafters.registry import KINDS
from specviz.engine import DecodeSettings
from specviz.errors import SettingsError
from specviz.run import generate

ROOT = Path(__file__).resolve().parents[1]
ALL_PARAMS = [(m, p) for m, s in METHODS.items() for p in s.params]


@pytest.fixture(scope="module")
def dflash_checkpoint(tmp_path_factory, tiny_target):
    """A DFlash drafter sized for the tiny target (the bundled one fits only the embedded model)."""
    model = new_dflash_for_target(tiny_target, num_layers=1, block_size=4, seed=1)
    return str(save_dflash_checkpoint(model, tmp_path_factory.mktemp("dflash") / "ck"))


def retrace_checkpoint(dflash_checkpoint: str) -> str:
    """A ReTrace fusion for the tiny target, on the tiny DFlash checkpoint."""
    from specviz.drafters.dflash.checkpoint import load_dflash_checkpoint
    from specviz.drafters.dflash.retrace import ReTraceFusion, fusion_config, save_retrace

    model = load_dflash_checkpoint(dflash_checkpoint)
    fusion = ReTraceFusion(model.hidden_size)
    folder = Path(dflash_checkpoint).parent / "retrace"
    return str(save_retrace(fusion, fusion_config(fusion, model, dflash_checkpoint), folder))


def defaults_of(spec: MethodSpec, checkpoint: str) -> dict:
    params = {p.name: p.default for p in spec.params}
    if spec.name == "retrace":
        params["checkpoint"] = retrace_checkpoint(checkpoint)
    elif "checkpoint" in params:
        params["checkpoint"] = checkpoint
    return params


# ---------------------------------------------------------------- every registered method
def test_registry_entries_are_complete():
    assert list(METHODS)[:2] == ["ar", "pld"]
    assert {"adapld", "adapld_lex", "adapld_sem", "dflash"} <= set(METHODS)
    for name, spec in METHODS.items():
        assert spec.name == name and spec.display and spec.description, name
        assert spec.kind in KINDS, name
        for p in spec.params:
            assert p.label and p.help and p.type in (int, float, bool, str), (name, p.name)
            assert p.range is None or p.type in (int, float)
            assert p.default is None or p.check(p.default) == p.default, (name, p.name)
    for m in ("dflash", "dspark", "retrace", "dflash_adapld"):
        assert METHODS[m].kind == "learned" and METHODS[m].needs_target
    assert not any(s.needs_target for m, s in METHODS.items()
                   if m not in ("dflash", "dspark", "retrace", "dflash_adapld"))
    assert methods_of(AdaPLDDrafter) == ("adapld", "adapld_nohist", "adapld_lex", "adapld_sem")
    assert METHODS["adapld_lex"].preset == {"ablation": "lexical"}


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_builds_with_its_defaults_and_decodes(method, tiny_target,
                                                           dflash_checkpoint):
    spec = METHODS[method]
    params = defaults_of(spec, dflash_checkpoint)
    drafter = make_drafter(method, tiny_target, **params)
    assert isinstance(drafter, Drafter)
    cfg = drafter.config()
    for name, value in params.items():  # what the drafter ended up with is the registry default
        if name in cfg and value not in (None, 0, ""):
            assert cfg[name] == value, (method, name)
    trace = generate(tiny_target, method, [5, 6, 7, 5, 6], DecodeSettings(max_new_tokens=4),
                     **params)
    assert 1 <= len(trace.output_ids) <= 4


@pytest.mark.parametrize("method", list(METHODS))
def test_drafter_signature_defaults_match_the_registry(method):
    """The drafter's keyword defaults and the registry's defaults are the same values (None in
    a signature means "unset": the registry default applies)."""
    spec = METHODS[method]
    sig = inspect.signature(spec.factory).parameters
    for p in spec.params:
        assert p.name in sig, (method, p.name)
        d = sig[p.name].default
        if d is not None and d is not inspect.Parameter.empty and p.name not in (
                "semantic", "branches", "history"):   # set by the ablation preset when unset
            assert d == p.default, (method, p.name, d, p.default)


# ---------------------------------------------------------------- ParamSpec checks
def bad_values(p: ParamSpec) -> list:
    """Values ``p`` must refuse: out of range, wrong type."""
    if p.type is bool:
        return ["maybe", 1, 0.5]
    if p.choices:
        return ["no-such-choice", 3, True]
    if p.type is str:
        return [3, 2.5, True]
    lo, hi = p.range
    out = [lo - 1, hi + 1, "many", True, float("nan"), [lo]]
    if p.type is int:
        out += [lo + 0.5, f"{lo}.5"]
    return out


@pytest.mark.parametrize("method,p", ALL_PARAMS, ids=[f"{m}-{p.name}" for m, p in ALL_PARAMS])
def test_each_param_refuses_out_of_range_and_wrong_type_by_its_label(method, p):
    for value in bad_values(p):
        with pytest.raises(SettingsError) as exc:
            p.check(value)
        msg = str(exc.value)
        assert msg.startswith(f"{p.label} must be ") and p.expected() in msg, msg
        assert p.name not in msg or p.name in p.label.lower(), msg  # the label, not the name
        with pytest.raises(SettingsError):  # make_drafter runs the same check
            method_spec(method).check({p.name: value})


def test_param_check_types_text_and_does_not_truncate():
    draft_len = METHODS["pld"].param("num_output_tokens")
    assert draft_len.check("3") == 3 and draft_len.check(" 7 ") == 7 and draft_len.check(4.0) == 4
    with pytest.raises(SettingsError,
                       match=r"^Draft length must be a whole number from 1 to 128, got 3\.5$"):
        draft_len.check(3.5)
    with pytest.raises(SettingsError, match="Draft length must be a whole number"):
        make_drafter("pld", num_output_tokens=3.5)
    assert make_drafter("pld", num_output_tokens="3").num_output_tokens == 3
    temp = METHODS["dflash"].param("draft_temperature")
    assert temp.check("0.5") == 0.5 and temp.check(2) == 2.0 and isinstance(temp.check(2), float)
    assert math.isclose(temp.check("1e-1"), 0.1)
    assert METHODS["adapld"].param("adaptive").check("No") is False
    assert METHODS["adapld"].param("semantic").check(" OFF ") == "off"
    assert METHODS["adapld"].param("sim_threshold").check(None) is None  # unset: derived
    assert draft_len.check(None) == 10


def test_unknown_settings_and_methods_are_clear():
    with pytest.raises(SettingsError, match=r"bad settings: unknown setting 'nope' for method "
                                            r"'pld' \(valid: max_matching_ngram_size, "
                                            r"num_output_tokens\)"):
        make_drafter("pld", nope=1)
    with pytest.raises(SettingsError, match="unknown method 'x' .*ar, pld, adapld"):
        make_drafter("x")
    with pytest.raises(SettingsError, match="unknown setting 'ablation'"):  # fixed by the preset
        make_drafter("adapld_lex", ablation="semantic")
    assert make_drafter(" PLD ").num_output_tokens == 10  # names: case and spaces ignored


# ---------------------------------------------------------------- the CLI and the bench
def test_cli_param_parsing_is_typed_by_the_registry():
    assert parse_params("pld", ["num_output_tokens=3", "max_matching_ngram_size=4"]) == \
        {"num_output_tokens": 3, "max_matching_ngram_size": 4}
    got = parse_params("adapld", ["max_draft=5", "adaptive=false", "semantic=OFF",
                                  "sim_threshold=0.7", "cost=flat"])
    assert got == {"max_draft": 5, "adaptive": False, "semantic": "off", "sim_threshold": 0.7,
                   "cost": "flat"}
    assert type(got["max_draft"]) is int and type(got["sim_threshold"]) is float
    assert parse_params("dflash", ["checkpoint=runs/dflash-b8", "block_size=4"]) == \
        {"checkpoint": "runs/dflash-b8", "block_size": 4}
    assert parse_params("ar", None) == {}
    with pytest.raises(SettingsError, match="Draft length must be a whole number .*got '3.5'"):
        parse_params("pld", ["num_output_tokens=3.5"])
    with pytest.raises(SettingsError, match=r"--param: unknown setting 'ngram' for method 'pld' "
                                            r"\(valid: max_matching_ngram_size, "
                                            r"num_output_tokens\)"):
        parse_params("pld", ["ngram=3"])
    with pytest.raises(SettingsError, match="method 'ar' .*has no settings"):
        parse_params("ar", ["x=1"])
    with pytest.raises(SettingsError, match="key=value"):
        parse_params("pld", ["num_output_tokens"])
    with pytest.raises(SettingsError, match="unknown method"):
        parse_params("nope", [])


def test_cli_help_lists_the_registry():
    text = methods_text()
    for name, spec in METHODS.items():
        assert f"  {name} " in text
        for p in spec.params:
            assert f"{p.name} = {p.expected()}" in text


def test_cli_unknown_param_is_one_clear_line_before_loading_a_model():
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "specviz", "run", "--prompt", "hi", "--model",
                        "/no/such/model", "--param", "num_outputs=3"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("error: --param: unknown setting 'num_outputs' for method 'pld' "
                                "(valid: max_matching_ngram_size, num_output_tokens)")


def test_bench_fail_fast_check_reads_the_registry():
    assert check_methods(["ar", "pld"], {"pld": {"num_output_tokens": "5"}}) == \
        {"ar": {}, "pld": {"num_output_tokens": 5}}
    with pytest.raises(SettingsError, match="Draft length"):
        check_methods(["pld"], {"pld": {"num_output_tokens": 0}})
    with pytest.raises(SettingsError, match="unknown method 'nope'"):
        check_methods(["pld"], {"nope": {}})
    with pytest.raises(SettingsError, match="unknown method 'nope'"):
        check_methods(["nope"])
    with pytest.raises(SettingsError, match="map each method"):
        check_methods(["pld"], {"pld": 5})


# ---------------------------------------------------------------- the app sidebar
def test_sidebar_widgets_come_from_the_registry():
    for name, spec in METHODS.items():
        specs = appstate.method_param_specs(name)
        assert specs == [p for p in spec.params if not p.advanced]
    names = [p.name for p in appstate.method_param_specs("adapld")]
    assert "node_budget" in names and "sim_threshold" not in names  # advanced: CLI / code only
    assert appstate.method_param_specs("nope") == []
    cfg = appstate.build_config(model="default", method="pld",
                                params={"num_output_tokens": "4"}, sampling=False,
                                temperature=0.7, top_p=0.9, max_new_tokens=8, seed=0,
                                chat_template=True, prompt="hi")
    assert cfg.params == {"num_output_tokens": 4}


# ---------------------------------------------------------------- a new method: one entry
class EchoDrafter(Drafter):
    """A toy drafter: proposes the last token ``repeat`` times."""

    name = "echo"

    def __init__(self, repeat: int = 2):
        self.repeat = ECHO_PARAMS[0].check(repeat)

    def propose(self, ctx):
        return Draft(tokens=[ctx.tokens[-1]] * self.repeat)

    def config(self):
        return {"repeat": self.repeat}


ECHO_PARAMS = (ParamSpec("repeat", int, 2, range=(1, 8), label="Repeats",
                         help="How often the last token is proposed again."),)
ECHO = MethodSpec("echo", EchoDrafter, "Echo", "Toy: repeats the last token",
                  params=ECHO_PARAMS, hint="A toy method.")


@pytest.fixture
def echo_registered():
    register(ECHO)
    yield ECHO
    del METHODS["echo"]


def test_a_new_method_is_one_registry_entry(echo_registered, tiny_target):
    # make_drafter, typed
    assert make_drafter("echo", repeat="3").repeat == 3
    with pytest.raises(SettingsError, match="Repeats must be a whole number from 1 to 8, got 9"):
        make_drafter("echo", repeat=9)
    trace = generate(tiny_target, "echo", [5, 6, 7], DecodeSettings(max_new_tokens=6), repeat=2)
    assert trace.meta["method"] == "echo" and len(trace.output_ids) == 6
    # the CLI's --param parsing and help
    assert parse_params("echo", ["repeat=4"]) == {"repeat": 4}
    with pytest.raises(SettingsError, match=r"unknown setting 'times' .*\(valid: repeat\)"):
        parse_params("echo", ["times=4"])
    assert "echo" in methods_text() and "repeat = a whole number from 1 to 8" in methods_text()
    # the bench's fail-fast check
    assert check_methods(["echo"], {"echo": {"repeat": "5"}}) == {"echo": {"repeat": 5}}
    # the app sidebar and its config
    assert [(p.name, p.label, p.range) for p in appstate.method_param_specs("echo")] == \
        [("repeat", "Repeats", (1, 8))]
    cfg = appstate.build_config(model="default", method="echo", params={"repeat": 3},
                                sampling=False, temperature=0.7, top_p=0.9, max_new_tokens=8,
                                seed=0, chat_template=True, prompt="hi")
    assert cfg.params == {"repeat": 3}
    # the docs
    assert "| `echo` | Echo | model-free | no | Toy: repeats the last token | `repeat` |" in \
        methods_markdown()


# ---------------------------------------------------------------- the docs
def test_readme_methods_section_is_generated_from_the_registry():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_section(readme) == methods_markdown(), \
        "README's methods table is stale: run `python -m specviz.drafters.docs`"


def test_methods_markdown_lists_every_method_and_setting():
    md = methods_markdown()
    for name, spec in METHODS.items():
        assert f"| `{name}` | {spec.display} | {spec.kind} |" in md
        for p in spec.params:
            assert f"| `{p.name}` |" in md and p.help in md.replace("\\|", "|")
    assert "| `num_output_tokens` | `pld` | int | `10` | a whole number from 1 to 128 |" in md
    assert with_section("a\n<!-- methods table: generated by `python -m specviz.drafters.docs`, "
                        "do not edit -->\nold\n<!-- end of methods table -->\nb", "new") == \
        ("a\n<!-- methods table: generated by `python -m specviz.drafters.docs`, do not edit -->"
         "\nnew\n<!-- end of methods table -->\nb")
