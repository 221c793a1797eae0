"""scripts/compare_rounds.py: two benches' rows compared by rounds and new tokens."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("compare_rounds",
                                                  ROOT / "scripts" / "compare_rounds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _csv(path: Path, rows: list[tuple]) -> str:
    head = "prompt_id,category,method,rounds,new_tokens,accepted,tau,wall_s\n"
    path.write_text(head + "".join(f"{p},cat,{m},{r},{n},0,1.0,{w}\n" for p, m, r, n, w in rows))
    return str(path)


def test_equal_rounds_pass_and_any_difference_is_named(tmp_path, capsys):
    tool = _tool()
    before = _csv(tmp_path / "a.csv", [("p1", "ar", 48, 48, 9.1), ("p1", "pld", 30, 48, 7.0)])
    same = _csv(tmp_path / "b.csv", [("p1", "ar", 48, 48, 5.0), ("p1", "pld", 30, 48, 3.2)])
    assert tool.main([before, same]) == 0   # wall times may differ
    assert "2/2 (prompt, method) rows" in capsys.readouterr().out
    other = _csv(tmp_path / "c.csv", [("p1", "ar", 48, 48, 5.0), ("p1", "pld", 31, 48, 3.2)])
    assert tool.main([before, other]) == 1
    out = capsys.readouterr().out
    assert "1/2" in out and "p1 pld: before (30, 48), after (31, 48)" in out
    missing = _csv(tmp_path / "d.csv", [("p1", "ar", 48, 48, 5.0)])
    assert tool.main([before, missing]) == 1
    assert tool.main([before]) == 2
