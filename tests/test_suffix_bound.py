"""The rejected-suffix bound (analysis.suffix_bound) on hand-made chain and tree traces."""
from __future__ import annotations

from specviz.analysis.suffix_bound import bound_rows, branch_gains, main_path, suffix_bound
from specviz.trace import Round, Trace


def chain_trace() -> Trace:
    """Prompt [1, 2]; output 10 11 | 12 | 13 14 15.

    Round 0 drafts 10 99 12 13 for positions 2..5 and accepts 10 (the target says 11 at 3): its
    rejected main path is 99 12 13 at positions 3, 4, 5. Round 1 drafts 77 78 from position 4
    and misses at once: carried at offset 0, the rejected 12 13 sit exactly at 4, 5 -> 2 tokens.
    Round 2 is the last: nothing follows it."""
    r0 = Round(index=0, start=2, drafter="dflash", draft=[10, 99, 12, 13], accepted=1,
               committed=[10, 11])
    r1 = Round(index=1, start=4, drafter="dflash", draft=[77, 78], accepted=0, committed=[12])
    r2 = Round(index=2, start=5, drafter="dflash", draft=[13, 14, 15], accepted=3,
               committed=[13, 14, 15])
    return Trace(meta={}, prompt_ids=[1, 2], rounds=[r0, r1, r2])


def tree_trace() -> Trace:
    """A DFlash tree round whose accepted path leaves the main (rank-0) path at depth 1: nodes
    10 (slot 1, rank 0), 99 (slot 2, rank 0), 11 (slot 2, rank 1), 12 (slot 3 under 99). The
    path 10 -> 11 is accepted, the target adds 12 at position 4. The next round misses at
    position 5, where the final text repeats 12: the rejected 12 (drafted for 4) one position
    later (offset +1) is 1 token. A lookup tree without ranks is skipped."""
    r0 = Round(index=0, start=2, drafter="dflash", draft=[10, 99, 11, 12], accepted=2,
               committed=[10, 11, 12], parents=[-1, 0, 0, 1], accepted_path=[0, 2],
               extras={"tree_ranks": [0, 0, 1, 0], "tree_slots": [1, 2, 2, 3]})
    r1 = Round(index=1, start=5, drafter="dflash", draft=[13], accepted=0, committed=[12])
    lookup = Round(index=2, start=6, drafter="adapld", draft=[5, 6], accepted=0, committed=[7],
                   parents=[-1, -1], accepted_path=[])
    r3 = Round(index=3, start=7, drafter="dflash", draft=[], accepted=0, committed=[8])
    return Trace(meta={}, prompt_ids=[1, 2], rounds=[r0, r1, lookup, r3])


def test_chain_gain_by_offset():
    gains = branch_gains(chain_trace())
    assert [g.round for g in gains] == [0, 1]
    g0 = gains[0]
    assert g0.rejected == 3 and g0.accepted_next == 0
    assert g0.gain == {-1: 0, 0: 2, 1: 0, 2: 0} and g0.best == 2
    assert gains[1].gain == {-1: 0, 0: 0, 1: 0, 2: 0}   # round 2 missed past the output's end


def test_tree_main_path_and_shifted_gain():
    tr = tree_trace()
    assert main_path(tr.rounds[0]) == ([10, 99, 12], 1)
    assert main_path(tr.rounds[2]) is None               # no ranks: not a block tree
    gains = branch_gains(tr)
    # round 1 (a chain) is carried into the lookup round; the lookup tree and the empty draft
    # carry nothing
    assert [g.round for g in gains] == [0, 1]
    assert gains[0].gain == {-1: 0, 0: 0, 1: 1, 2: 0} and gains[1].best == 0


def test_summary_and_rows():
    b = suffix_bound([chain_trace(), tree_trace()])
    assert b.rounds == 7 and b.tokens == 6 + 6 and b.carried == 4
    assert b.by_offset == {-1: 0, 0: 2, 1: 1, 2: 0} and b.best == 3
    assert abs(b.tau - 12 / 7) < 1e-12 and abs(b.tau_bound - 15 / 7) < 1e-12
    empty = suffix_bound([])
    assert empty.tau is None and empty.tau_bound is None
    rows = bound_rows({"dflash": {"code": [chain_trace()], "qa": [tree_trace()]}})
    by = {r["category"]: r for r in rows}
    assert by["code"]["gain_+0"] == 2 and by["qa"]["gain_+1"] == 1
    assert by["all"]["gain_best"] == 3 and by["all"]["carried"] == 4


def test_align_cli_prints_and_writes_the_bound(tmp_path, capsys):
    from specviz.cli import main

    folder = tmp_path / "traces" / "dflash" / "code"
    folder.mkdir(parents=True)
    chain_trace().save(folder / "p1.json")
    assert main(["align", str(tmp_path / "traces"), "--bound-out", str(tmp_path / "b.csv")]) == 0
    out = capsys.readouterr().out
    assert "What the rejected suffix could add" in out and "tau bound" in out
    lines = (tmp_path / "b.csv").read_text().splitlines()
    assert lines[0].startswith("method,category,rounds,tau,carried,gain_-1")
    assert lines[-1].startswith("dflash,all,3,2.0,2,0,2,0,0,2,")
