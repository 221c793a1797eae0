"""The shared pause-and-probe schedule of AdaPLD's sources and DFlash's forward gate."""
from specviz.drafters.adapld.control import SourceStats
from specviz.drafters.dflash.block_cut import ForwardGate
from specviz.drafters.probes import Paused


def test_pause_probes_back_off_and_a_paying_probe_resumes():
    p = Paused()
    assert p.due(0)
    p.pause(10, (4, 32))
    assert not p.due(13) and p.due(14) and p.gap == 8
    p.probed(14, paid=False, gaps=(4, 32))              # next probe 8 rounds on, gap doubled
    assert not p.due(22) and p.due(23) and p.gap == 16
    for r in (23, 40, 73):
        p.probed(r, paid=False, gaps=(4, 32))
    assert p.gap == 32                                  # capped
    p.probed(200, paid=True, gaps=(4, 32))
    assert not p.off and p.gap == 4 and p.due(201)


def test_sources_and_the_gate_share_it_and_keep_their_positional_fields():
    st = SourceStats(9.0, 1.0, 5.0, 5.0)
    assert abs(st.a1 - 0.9) < 1e-9 and not st.off and isinstance(st, Paused)
    gate = ForwardGate()
    for i in range(8):                                  # drafted rounds that never pay
        gate.observe(i, committed=1, cost=1.5)
    assert gate.off and not gate.wants(gate.next_probe - 1) and gate.wants(gate.next_probe)
