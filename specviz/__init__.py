"""specviz: run real speculative decoding step by step and see why it speeds a model up.

Library layout, from the core up:

* core -- ``models`` (targets), ``tree`` and ``verify`` (token trees, lossless verification ->
  Verdict), ``kvcache`` (cache surgery after a round), ``engine`` (Session: propose -> verify ->
  commit -> record), ``trace`` (Round/Trace JSON, checked by ``trace_schema``), ``metrics`` (the
  one definition of each headline number), ``costs``, ``numerics``, ``kernels``, ``attention``;
  the drafter interface is ``drafters.base``;
* ``drafters`` -- the method registry and the methods: PLD, AdaPLD (``drafters.adapld`` on the
  lookup pieces of ``drafters.lookup``), DFlash with DSpark and ReTrace (``drafters.dflash``),
  DFlash + AdaPLD (``drafters.hybrid``); ``run.generate`` runs a method by name;
* ``analysis`` (lossless checks, offline replay and expected rounds), ``bench`` (prompt sets and
  the side-by-side runner), ``train`` (rollouts, drafter training), ``viz`` (Plotly figures,
  token HTML, tables), ``cli`` and ``appstate`` (the command line and the app's state).
"""
__version__ = "0.1.0"
