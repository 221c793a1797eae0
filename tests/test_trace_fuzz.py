"""Every trace file a user brings either loads and renders, or says why in one sentence.

Property-based (hypothesis, derandomized: the same cases every run) over mutations of real
traces (tests/data/traces: PLD greedy and sampled, AdaPLD, DFlash, DFlash + AdaPLD, ReTrace,
recorded on the embedded model): values replaced by any JSON value (wrong types, NaN, huge and
negative numbers, strings, nesting), keys and list items dropped or repeated, bytes truncated,
a byte-order mark, deep nesting. Each case goes through what the "Open a saved trace" page does
(:func:`specviz.appstate.load_trace_bytes`, then the page's own ``trace_view`` with its downloads,
the AdaPLD and ReTrace pages' views) and through ``specviz show``. Anything but a
:class:`TraceError` with a one-line message escaping is a failure. The counts (cases, loaded,
messages by kind) go to test-artifacts/trace-fuzz.json.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz import appstate
from specviz.errors import TraceError
from specviz.trace import Trace
from specviz.viz.stats import trace_prefix
from specviz.viz.tables import position_table, rounds_table, to_csv_bytes

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted((ROOT / "tests" / "data" / "traces").glob("*.json"))
ARTIFACTS = ROOT / "test-artifacts"
#: what a message must never show: Python's own words
INTERNALS = re.compile(r"Traceback|object has no attribute|NoneType|invalid literal|could not "
                       r"convert|unhashable|not subscriptable|index out of range|KeyError|"
                       r"is not iterable|unsupported operand|input should be|after validation|"
                       r"pydantic", re.IGNORECASE)
#: a message names a round, a field, or says what is wrong with the file as a whole
NAMES_WHERE = re.compile(r"^round \d+[: ]|'[A-Za-z_.]+'|^the trace file |^not a specviz trace|"
                         r"schema_version|^the trace has no rounds|nests more than")

logging.getLogger("streamlit").setLevel(logging.ERROR)


def _seed_docs() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in SEEDS}


DOCS = _seed_docs()


# ---------------------------------------------------------------- rendering, as the pages do
def render_everywhere(trace: Trace) -> None:
    """What the pages do with a loaded trace: the explorer (tokens, metrics, rounds, charts,
    downloads), the first round alone (the scrubber), the AdaPLD and ReTrace views, the CLI."""
    from pages import ui
    from specviz.analysis.suffix_bound import suffix_bound
    from specviz.cli import render_terminal
    from specviz.viz import adapld as va
    from specviz.viz import retrace as vr
    from specviz.viz.adapld_context import context_spans_html

    ui.trace_view(trace, prefix="fz", downloads=True)
    if len(trace.rounds) > 1:
        ui.trace_view(trace_prefix(trace, 1), prefix="fz1", downloads=False)
    trace.to_json()
    to_csv_bytes(rounds_table(trace))
    to_csv_bytes(position_table(trace))
    render_terminal(trace, color=True)
    if trace.rounds:
        i = va.default_round(trace)
        va.chains_only(trace), va.round_summary_html(trace, i), va.matches_table(trace, i)
        context_spans_html(trace, i, collapse=12), va.branch_tree_figure(trace, i)
        va.retrieval_counts(trace), va.fig_retrieval(trace, i), va.retrieval_table(trace)
        vr.no_memory_note(trace), vr.no_pairs_note(trace), vr.slot_table([trace])
        vr.fig_match_heatmap([trace]), vr.fig_suffix_bound(suffix_bound([trace]))
        if vr.has_retrace(trace):
            vr.fig_gates(trace), vr.gate_forced_off(trace), vr.fusion_inert(trace)
        for r in trace.rounds:
            if vr.pair_rows(trace, r.index) is not None:
                vr.alignment_grid_html(trace, r.index)
        vr.fig_progress(trace, trace), vr.side_by_side(trace, trace)


def show_cli(data: bytes, path: Path) -> tuple[int, str]:
    """``specviz show FILE``: (exit code, what it printed on stderr)."""
    from specviz.cli import main

    path.write_bytes(data)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(["show", str(path), "--no-color"])
    return rc, err.getvalue()


def check_message(msg: str) -> None:
    assert "\n" not in msg and 0 < len(msg) <= 300, msg
    assert not INTERNALS.search(msg), msg
    assert NAMES_WHERE.search(msg), msg


def outcome(data: bytes, tmp: Path) -> str | None:
    """None when the file loads and renders; its message when it does not (checked)."""
    try:
        trace = appstate.load_trace_bytes(data)
    except TraceError as exc:
        msg = str(exc)
        check_message(msg)
        rc, err = show_cli(data, tmp)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, (rc, err)
        return msg
    render_everywhere(trace)
    rc, err = show_cli(data, tmp)
    assert rc == 0, err
    return None


# ---------------------------------------------------------------- mutations
LEAVES = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2 ** 40, max_value=2 ** 40),
    st.sampled_from([-1, 0, 1, 2, 10 ** 6, 1_000_000_100, 2 ** 31, 2 ** 63, 10 ** 30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -3.0, 0.5, 1.5, -0.0]),
    st.text(max_size=12),
    st.sampled_from(["hello", "hot", "", "5", "null", "[]", "\u202e", "<b>&amp;</b>"]),
)
VALUES = st.recursive(LEAVES, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=8)


def _paths(doc, prefix=(), out=None, depth=0):
    """Every (container, key) in the document, with its depth."""
    out = [] if out is None else out
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) \
        if isinstance(doc, list) else ()
    for k, v in items:
        out.append((prefix + (k,), depth))
        if isinstance(v, (dict, list)):
            _paths(v, prefix + (k,), out, depth + 1)
    return out


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated_file(draw) -> bytes:
    name = draw(st.sampled_from(sorted(DOCS)))
    doc = json.loads(json.dumps(DOCS[name]))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        # half the time a field near the top (a round's or the meta's own fields), where a
        # uniform pick over ~5,000 leaves would rarely land
        shallow = [p for p, d in paths if d <= 3 and "token_texts" not in p]
        pool = shallow if shallow and draw(st.booleans()) else [p for p, _ in paths]
        if not pool:
            break
        path = draw(st.sampled_from(pool))
        parent, key = _get(doc, path[:-1]), path[-1]
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "duplicate",
                                   "stringify", "negate", "scale", "retext", "cut_rounds"]))
        old = parent[key]
        if op == "cut_rounds":   # a shorter run, or none
            doc["rounds"] = doc["rounds"][:draw(st.integers(0, len(doc["rounds"])))]
        elif op == "retext" and isinstance(old, str):   # any text where text is (token texts)
            parent[key] = draw(st.text(max_size=30) | st.sampled_from(
                ["<script>alert(1)</script>", "\n\n", "&quot;", "' OR 1", "\u0000", "é" * 50]))
        elif op == "replace":
            parent[key] = draw(VALUES)
        elif op == "delete":
            del parent[key]
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(old)))
        elif op == "stringify":
            parent[key] = str(old)
        elif op in ("negate", "scale") and isinstance(old, (int, float)) \
                and not isinstance(old, bool):
            parent[key] = -old if op == "negate" else old * draw(
                st.sampled_from([10 ** 6, 10 ** 300, 1e-300, 2]))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), allow_nan=True)
    data = text.encode("utf-8")
    wrap = draw(st.sampled_from(["none"] * 6 + ["bom", "truncate", "byte", "deep", "empty"]))
    if wrap == "bom":
        data = b"\xef\xbb\xbf" + data
    elif wrap == "truncate":
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif wrap == "byte":
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    elif wrap == "deep":
        n = draw(st.sampled_from([70, 1_000, 100_000]))
        data = b'{"schema_version": 1, "rounds": ' + b"[" * n + b"]" * n + b"}"
    elif wrap == "empty":
        data = draw(st.sampled_from([b"", b"   \n", b"\xef\xbb\xbf"]))
    return data


# ---------------------------------------------------------------- the tests
def test_seed_traces_load_and_render(tmp_path):
    assert len(SEEDS) >= 6
    for p in SEEDS:
        assert outcome(p.read_bytes(), tmp_path / "t.json") is None, p.name
        assert outcome(b"\xef\xbb\xbf" + p.read_bytes(), tmp_path / "t.json") is None


def _kind(msg: str) -> str:
    """A message with its values taken out: what kind of problem it names."""
    return re.sub(r"\d+|got .*|item .*|is .*?;", "#", msg)[:90]


@pytest.mark.parametrize("cases", [pytest.param(150, id="150-cases"),
                                   pytest.param(500, id="500-cases", marks=pytest.mark.slow)])
def test_fuzzed_traces_load_and_render_or_say_why(tmp_path, cases):
    counts: Counter = Counter()
    kinds: Counter = Counter()
    examples: dict[str, str] = {}

    @settings(max_examples=cases, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated_file())
    def one(data: bytes) -> None:
        counts["cases"] += 1
        msg = outcome(data, tmp_path / "case.json")   # an escaping exception fails here
        if msg is None:
            counts["loaded and rendered"] += 1
        else:
            counts["clear message"] += 1
            kinds[_kind(msg)] += 1
            examples.setdefault(_kind(msg), msg)

    t0 = time.perf_counter()
    one()
    counts["escapes"] = 0   # one() raised otherwise
    report = {"cases": dict(counts), "seconds": round(time.perf_counter() - t0, 1),
              "messages": {examples[k]: n for k, n in kinds.most_common()}}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "trace-fuzz.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(json.dumps(report["cases"]), f"{len(kinds)} kinds of message")
    assert counts["cases"] >= cases * 0.9
    # both outcomes are exercised: mutations that stay valid, and ones that are refused
    assert counts["loaded and rendered"] >= 10 and counts["clear message"] >= cases / 3
    assert len(kinds) >= 20


@pytest.mark.parametrize("mutate, expect", [
    (lambda d: d["rounds"].__setitem__(slice(None), [None, None]),
     "round 1 must be an object of round fields, got None"),
    (lambda d: d.__setitem__("prompt_ids", ["hello"] + d["prompt_ids"]),
     "'prompt_ids' must be a list of token ids; item 1 is 'hello'"),
    (lambda d: d.__setitem__("token_texts", ["a", "b"]), "'token_texts' must be an object"),
    (lambda d: d["meta"].__setitem__("settings", "greedy"), "'settings' must be an object"),
    (lambda d: d["meta"]["settings"].__setitem__("temperature", "hot"),
     "meta: 'settings.temperature' must be a number from 0"),
    (lambda d: d["meta"]["settings"].__setitem__("temperature", float("nan")),
     "meta: 'settings.temperature' must be a number from 0 \\(greedy\\) to 10, got nan"),
    (lambda d: d["rounds"][2].__setitem__("t_verify", float("nan")),
     "round 3: 't_verify' must be a number of seconds from 0 to 86400, got nan"),
    (lambda d: d["rounds"][0].__setitem__("p_draft", [float("nan")] * len(d["rounds"][0]["draft"])),
     "round 1: 'p_draft' must be a list of probabilities \\(0 to 1\\); item 1 is nan"),
    (lambda d: d["meta"].__setitem__("drafter_config", {"x": [1, float("inf")]}),
     "meta: 'drafter_config.x' is inf; a trace holds finite numbers only"),
    (lambda d: d["rounds"][0]["draft"].__setitem__(0, 1_000_000_100),
     "round 1: 'draft': token id 1000000100 is outside the model's vocabulary"),
    (lambda d: d["rounds"][0]["draft"].__setitem__(0, -5),
     "round 1: 'draft' must be a list of token ids; item 1 is -5"),
    (lambda d: d["rounds"][3].__setitem__("index", -1), "round 4: 'index' must be a whole"),
    (lambda d: d["rounds"][3].__setitem__("start", 2), "round 4: 'start' is 2 but"),
    (lambda d: d["rounds"][1].__setitem__("t_draft", -3.0), "round 2: 't_draft' must be a "
                                                            "number of seconds"),
    (lambda d: d["rounds"][1].__setitem__("t_draft", 1e308), "round 2: 't_draft' must be a "
                                                             "number of seconds"),
    (lambda d: d.__setitem__("rounds", {"0": d["rounds"][0]}), "'rounds' must be a list"),
    (lambda d: d.__setitem__("rounds", "none"), "'rounds' must be a list"),
])
def test_each_reported_problem_has_its_sentence(mutate, expect, tmp_path):
    doc = json.loads(json.dumps(DOCS["pld"]))
    mutate(doc)
    data = json.dumps(doc, allow_nan=True).encode()
    with pytest.raises(TraceError, match=expect):
        appstate.load_trace_bytes(data)
    assert outcome(data, tmp_path / "t.json") is not None


def test_tree_structure_is_checked(tmp_path):
    doc = DOCS["dflash_adapld"]
    i = next(k for k, r in enumerate(doc["rounds"]) if r["parents"] and len(r["parents"]) > 2)
    for mutate, expect in [
        (lambda r: r["parents"].pop(), "'parents' has"),             # shorter than the draft
        (lambda r: r["parents"].__setitem__(0, 1), "parent comes before its child"),  # a cycle
        (lambda r: r["parents"].__setitem__(1, 1), "parent comes before its child"),  # a loop
        (lambda r: r.__setitem__("accepted_path", [5, 0]), "not a path down the draft tree"),
    ]:
        d = json.loads(json.dumps(doc))
        mutate(d["rounds"][i])
        data = json.dumps(d).encode()
        with pytest.raises(TraceError, match=f"round {i + 1}: .*{expect}"):
            appstate.load_trace_bytes(data)
        assert outcome(data, tmp_path / "t.json") is not None


def test_empty_and_deep_files_say_the_same_in_cli_and_page(tmp_path):
    for data, expect in [(b"", "the trace file is empty"), (b"\xef\xbb\xbf  ", "empty"),
                         (b"[" * 100_000 + b"]" * 100_000, "nests JSON too deeply"),
                         (b'{"schema_version": 1, "rounds": [], "meta": {"notes": '
                          + b"[" * 80 + b"]" * 80 + b"}}", "meta: 'notes' nests more than")]:
        with pytest.raises(TraceError, match=expect):
            appstate.load_trace_bytes(data)
        rc, err = show_cli(data, tmp_path / "t.json")
        assert rc == 2 and expect in err and err.count("\n") == 1, err


def big_trace_bytes(target_mb: float) -> bytes:
    """A valid trace of about ``target_mb`` MB: a real run's rounds repeated."""
    doc = json.loads(json.dumps(DOCS["dflash_adapld"]))
    base = doc["rounds"]
    rounds, start = [], len(doc["prompt_ids"])
    per_round = len(json.dumps(base)) / len(base)
    for k in range(int(target_mb * 2 ** 20 / per_round)):
        r = dict(base[k % len(base)], index=k, start=start)
        start += len(r["committed"])
        rounds.append(r)
    doc["rounds"] = rounds
    return json.dumps(doc).encode()


def test_a_20_mb_trace_loads_and_renders_in_bounded_time(tmp_path):
    data = big_trace_bytes(20)
    assert len(data) >= 19 * 2 ** 20
    t0 = time.perf_counter()
    trace = appstate.load_trace_bytes(data)
    t_load = time.perf_counter() - t0
    from pages import ui
    t0 = time.perf_counter()
    ui.trace_view(trace, prefix="big", downloads=True)
    t_view = time.perf_counter() - t0
    # a broken 20 MB file is refused as fast: the last round's start is off
    doc = json.loads(data)
    doc["rounds"][-1]["start"] += 1
    t0 = time.perf_counter()
    with pytest.raises(TraceError, match=f"round {len(doc['rounds'])}: 'start'"):
        appstate.load_trace_bytes(json.dumps(doc).encode())
    t_refuse = time.perf_counter() - t0
    print(f"20 MB trace ({trace.num_rounds} rounds): load {t_load:.1f} s, view {t_view:.1f} s, "
          f"refused {t_refuse:.1f} s")
    assert t_load < 30 and t_refuse < 30 and t_view < 120
